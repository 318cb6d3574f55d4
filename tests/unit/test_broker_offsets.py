"""Consumer offset records and the idempotency table (plain objects, no I/O)."""

import pytest

from broker.errors import BrokerCode, BrokerError
from broker.store.offsets import ConsumerOffsetManager, IdempotencyTable, PutResult


def _res(n: int) -> PutResult:
    return PutResult(f"ID{n}", 0, n, n * 100, 100)


def test_idempotency_window():
    t = IdempotencyTable(window_ms=1000)
    t.remember("T", "k", _res(1), store_ts_ms=10_000)
    t.remember("T", "k", _res(2), store_ts_ms=10_001)  # a later duplicate never replaces the first
    assert t.get("T", "k", now_ms=10_500) == _res(1)
    assert t.get("U", "k", now_ms=10_500) is None
    assert t.get("T", "k", now_ms=11_001) is None
    t.remember("T", "k2", _res(3), store_ts_ms=20_000)  # expires older keys
    assert len(t) == 1


async def test_offset_records_applied_in_order():
    m = ConsumerOffsetManager()
    written = []

    async def writer(topic, record):
        written.append((topic, record))
        m.apply_record(record)

    m.set_writer(writer)
    await m.commit("g", "T", 1, 5)
    await m.commit_many("g", "T", {0: 2, 1: 6})
    assert m.query("g", "T", 1) == 6 and m.query("g", "T", 0) == 2 and m.query("g", "T", 3) == -1
    assert m.offsets_of("g") == {"T": {0: 2, 1: 6}} and m.groups() == ["g"]
    assert written[0] == ("RMQ_SYS_CONSUMER_OFFSETS", {"group": "g", "topic": "T", "offsets": {"1": 5}})
    m.apply_record({"bad": 1})  # a malformed record is logged, not fatal
    with pytest.raises(BrokerError) as ei:
        await m.commit("g", "T", 0, -1)
    assert ei.value.code == BrokerCode.INVALID_REQUEST


async def test_snapshot_replaces_table():
    m = ConsumerOffsetManager(snapshot_every_records=3)
    log = []

    async def writer(topic, record):
        log.append(record)
        m.apply_record(record)

    m.set_writer(writer)
    for i in range(3):
        await m.commit("g", "T", 0, i)
    assert "snapshot" in log[-1] and len(log) == 4
    fresh = ConsumerOffsetManager()
    fresh.apply_record({"group": "x", "topic": "T", "offsets": {"0": 99}})  # older state is replaced
    fresh.apply_record(log[-1])
    assert fresh.offsets_of("g") == {"T": {0: 2}} and fresh.query("x", "T", 0) == -1


async def test_snapshot_waits_for_commits_in_flight():
    import asyncio

    m = ConsumerOffsetManager(snapshot_every_records=1000)
    log = []

    async def writer(topic, record):  # a record is applied some time after it is written
        log.append(record)
        await asyncio.sleep(0.01 if "snapshot" not in record else 0)
        m.apply_record(record)

    m.set_writer(writer)
    commits = [asyncio.create_task(m.commit("g", "T", q, 10 + q)) for q in range(5)]
    await asyncio.sleep(0)
    await m.write_snapshot()
    await asyncio.gather(*commits)
    snap = next(r for r in log if "snapshot" in r)
    fresh = ConsumerOffsetManager()
    fresh.apply_record(snap)
    for r in log[log.index(snap) + 1:]:
        fresh.apply_record(r)
    assert fresh.offsets_of("g") == m.offsets_of("g") == {"T": {q: 10 + q for q in range(5)}}
