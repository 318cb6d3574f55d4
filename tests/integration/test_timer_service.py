"""TimerService on a real store (local log, and a one-member DLedger log), driven by an injected
clock, one fire round at a time: due messages delivered once and never early, recall, the delete
markers retiring timers on every path, and the index rebuilt from the timer queue at restart."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.errors import BrokerCode, BrokerError
from broker.message import Message
from broker.role_change import wait_until_master
from broker.timer.levels import DEFAULT_DELAY_LEVELS, parse_delay_levels
from broker.timer.service import TIMER_TOPIC, TimerService
from tests.integration.test_broker_store import make_config

T0 = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


async def open_with_timers(cfg: BrokerConfig, clock: Clock) -> tuple[BrokerController, TimerService]:
    ctl = BrokerController(cfg)
    timers = TimerService(
        ctl.store,
        delay_levels_ms=parse_delay_levels(DEFAULT_DELAY_LEVELS),
        max_delay_ms=3 * 86_400_000,
        clock_ms=clock,
    )
    timers.install()
    await ctl.start()
    await wait_until_master(ctl.store, timeout_s=10)
    return ctl, timers


async def schedule(timers: TimerService, topic: str, body: bytes, due: int, queue_id: int | None = 0):
    msg = timers.timer_message(Message(topic, body, tags="tg", properties={"k": "v"}), topic, queue_id, due)
    (res,) = await timers.store.put_messages(TIMER_TOPIC, [msg], 0, _system=True)
    return res


def delivered(store, topic: str) -> list:
    if store.topics.get(topic) is None:
        return []
    return store.get_messages(topic, 0, 0, 100).messages


@pytest.fixture(params=["local", "dledger"])
def cfg(request, tmp_path) -> BrokerConfig:
    return make_config(request.param, str(tmp_path))


async def test_due_timers_fire_once_never_early(cfg: BrokerConfig) -> None:
    clock = Clock()
    ctl, timers = await open_with_timers(cfg, clock)
    try:
        await ctl.store.topics.create_or_update("T", 1, 1)
        for i, delay in enumerate((1_000, 2_000, 60_000)):
            await schedule(timers, "T", b"m%d" % i, T0 + delay)
        assert len(timers.index) == 3
        clock.now = T0 + 999
        await timers._round()
        assert delivered(ctl.store, "T") == []
        clock.now = T0 + 2_000
        await timers._round()
        got = delivered(ctl.store, "T")
        assert [m.body for m in got] == [b"m0", b"m1"]
        assert [m.properties["TIMER_DELIVER_MS"] for m in got] == [str(T0 + 1_000), str(T0 + 2_000)]
        assert got[0].tags == "tg" and got[0].user_properties["k"] == "v"
        assert "TIMER_OUT_MS" not in got[0].properties and "REAL_TOPIC" not in got[0].properties
        assert len(timers.index) == 1 and not timers.index.inflight  # the markers retired both
        await timers._round()
        assert len(delivered(ctl.store, "T")) == 2  # nothing fires twice
    finally:
        await ctl.shutdown()


async def test_recall_before_due_and_not_after(cfg: BrokerConfig) -> None:
    clock = Clock()
    ctl, timers = await open_with_timers(cfg, clock)
    try:
        await ctl.store.topics.create_or_update("T", 1, 1)
        res = await schedule(timers, "T", b"recall-me", T0 + 5_000)
        uniq = ctl.store.get_messages(TIMER_TOPIC, 0, res.queue_offset, 1).messages[0].uniq_key
        handle = timers.recall_handle("T", res.queue_offset, T0 + 5_000, uniq)
        other = await schedule(timers, "T", b"keep", T0 + 5_000)
        assert await timers.recall("T", handle) == uniq
        with pytest.raises(BrokerError) as err:
            await timers.recall("T", handle)
        assert err.value.code == BrokerCode.RECALL_FAILED
        clock.now = T0 + 6_000
        await timers._round()
        assert [m.body for m in delivered(ctl.store, "T")] == [b"keep"]
        late = timers.recall_handle(
            "T", other.queue_offset, T0 + 5_000, delivered(ctl.store, "T")[0].uniq_key
        )
        with pytest.raises(BrokerError) as err:
            await timers.recall("T", late)
        assert err.value.code == BrokerCode.RECALL_FAILED
        for bad in ("", "not-base64!", timers.recall_handle("T", 99, T0, "x")):
            with pytest.raises(BrokerError) as err:
                await timers.recall("T", bad)
            assert err.value.code in (BrokerCode.INVALID_REQUEST, BrokerCode.MESSAGE_NOT_FOUND)
    finally:
        await ctl.shutdown()


async def test_restart_rebuilds_the_pending_timers_from_the_timer_queue(cfg: BrokerConfig) -> None:
    clock = Clock()
    ctl, timers = await open_with_timers(cfg, clock)
    await ctl.store.topics.create_or_update("T", 1, 1)
    for i in range(5):
        await schedule(timers, "T", b"r%d" % i, T0 + 1_000 * (i + 1))
    clock.now = T0 + 2_000
    await timers._round()
    await ctl.shutdown()
    ctl, timers = await open_with_timers(cfg, clock)
    try:
        assert len(timers.index) == 3
        clock.now = T0 + 10_000
        await timers._round()
        assert sorted(m.body for m in delivered(ctl.store, "T")) == [b"r%d" % i for i in range(5)]
        assert len(timers.index) == 0
    finally:
        await ctl.shutdown()


async def test_a_deleted_real_topic_retires_its_timers(cfg: BrokerConfig) -> None:
    clock = Clock()
    ctl, timers = await open_with_timers(cfg, clock)
    try:
        await ctl.store.topics.create_or_update("Gone", 1, 1)
        await ctl.store.topics.create_or_update("T", 1, 1)
        await schedule(timers, "Gone", b"x", T0 + 1_000)
        await schedule(timers, "T", b"y", T0 + 1_000)
        await ctl.store.topics.delete("Gone")
        clock.now = T0 + 1_000
        await timers._round()
        assert [m.body for m in delivered(ctl.store, "T")] == [b"y"] and len(timers.index) == 0
    finally:
        await ctl.shutdown()


def test_due_time_rules() -> None:
    timers = TimerService.__new__(TimerService)
    timers.delay_levels_ms = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    timers.max_delay_ms = 3 * 86_400_000
    timers.enabled = True
    now = T0
    assert timers.due_ms({"DELAY": "3"}, now) == now + 10_000
    assert timers.due_ms({"DELAY": "99"}, now) == now + 7_200_000  # above 18: the last level
    assert timers.due_ms({"DELAY": "0"}, now) is None and timers.due_ms({}, now) is None
    assert timers.due_ms({"TIMER_DELIVER_MS": str(now - 1)}, now) is None  # past: deliver at once
    assert timers.due_ms({"TIMER_DELAY_MS": "1500"}, now) == now + 1_500
    assert timers.due_ms({"TIMER_DELAY_SEC": "2", "TIMER_DELAY_MS": "1"}, now) == now + 2_000
    for bad in ({"DELAY": "x"}, {"TIMER_DELIVER_MS": "soon"}, {"TIMER_DELAY_MS": str(3 * 86_400_000 + 1)}):
        with pytest.raises(BrokerError) as err:
            timers.due_ms(bad, now)
        assert err.value.code == BrokerCode.ILLEGAL_DELIVERY_TIME
    assert parse_delay_levels("1s 2m 1h 1d") == (1_000, 120_000, 3_600_000, 86_400_000)
    with pytest.raises(ValueError):
        parse_delay_levels("1x")
