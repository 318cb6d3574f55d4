"""Edges of group consumption (`broker/service/pop.py`): what the receipt routes do when
the ground moves under a group — topic deleted and created again, read queues lowered, a DLQ write
that fails, retention past the read pointer, an ack racing a receive that dead-letters — checked
on real broker processes where they can reach the state, else in-process on a real store.

Each test asserts what RocketMQ 5's simple consumer promises (docs/RELIABILITY.md, row 12): one
live receipt per message, a replaced handle never acks OK, nothing delivered again after an OK ack,
and nothing lost that is still on disk."""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from broker.config import BrokerConfig
from broker.http.consumers import received_json
from broker.message import Message
from broker.service import ANONYMOUS
from tests.integration._ledgermq_procs import (
    CONF,
    ProcessGroup,
    namesrv_and_broker,
    start_broker,
    start_dledger_set,
    start_namesrv,
    wait_master,
)
from tests.ports import free_port

DEADLINE_S = 15.0  # generous: a loaded 2-core machine; every wait below polls until it holds


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Any:
    workdir = tmp_path_factory.mktemp("pop-edges")
    with namesrv_and_broker(workdir, "broker-s", maxReconsumeTimes="1") as (_, _, addr):
        yield f"http://{addr}"


def produce(url: str, topic: str, *bodies: str, queue_id: int = 0) -> None:
    r = httpx.post(
        f"{url}/topics/{topic}/messages",
        json={"messages": [{"body": b, "queueId": queue_id} for b in bodies]},
    )
    assert r.status_code == 200, r.text


def receive(url: str, group: str, topic: str, **fields: Any) -> httpx.Response:
    return httpx.post(f"{url}/consumers/{group}/receive", json={"topic": topic, **fields}, timeout=30)


def settle(url: str, action: str, group: str, topic: str, *handles: str) -> list[str]:
    r = httpx.post(
        f"{url}/consumers/{group}/{action}", json={"topic": topic, "receiptHandles": list(handles)}
    )
    assert r.status_code == 200, r.text
    return [x["status"] for x in r.json()["results"]]


def committed(url: str, group: str, topic: str) -> dict[int, int]:
    offs = httpx.get(f"{url}/consumers/{group}/offsets", params={"topic": topic}).json()["offsets"]
    return {o["queueId"]: o["offset"] for o in offs}


def receive_until(url: str, group: str, topic: str, want: int, **fields: Any) -> list[dict]:
    """Receive (long polling) until `want` messages came back or the deadline passes."""
    got: list[dict] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < want and time.monotonic() < deadline:
        r = receive(url, group, topic, maxMessages=want - len(got), waitMs=1000, **fields)
        assert r.status_code == 200, r.text
        got += r.json()["messages"]
    return got


# -- real processes --------------------------------------------------------------------------------


def test_a_deleted_and_recreated_topic_is_received_from_its_start(broker):
    """The old read pointer (3) must not hide the new topic's offsets 0 and 1."""
    url = broker
    assert httpx.put(f"{url}/topics/again", json={"readQueueNums": 1, "writeQueueNums": 1}).status_code == 200
    produce(url, "again", "a0", "a1", "a2")
    first = receive(url, "ga", "again", maxMessages=10).json()["messages"]
    assert [m["body"] for m in first] == ["a0", "a1", "a2"]
    assert settle(url, "ack", "ga", "again", *(m["receiptHandle"] for m in first)) == ["OK"] * 3
    assert committed(url, "ga", "again") == {0: 3}

    assert httpx.delete(f"{url}/topics/again").status_code == 200
    assert httpx.put(f"{url}/topics/again", json={"readQueueNums": 1, "writeQueueNums": 1}).status_code == 200
    produce(url, "again", "b0", "b1")
    got = receive_until(url, "ga", "again", 2, invisibleMs=60000)
    assert [(m["body"], m["queueOffset"]) for m in got] == [("b0", 0), ("b1", 1)]
    # An old handle (offset 1 of the deleted topic) settles nothing of the new one.
    assert settle(url, "ack", "ga", "again", first[1]["receiptHandle"]) == ["EXPIRED"]
    assert settle(url, "ack", "ga", "again", *(m["receiptHandle"] for m in got)) == ["OK", "OK"]
    assert committed(url, "ga", "again") == {0: 2}


def test_lowering_read_queue_nums_keeps_the_group_receiving(broker):
    """A group that read 4 queues keeps working once the topic has 2 (was: 400 QUEUE_NOT_EXIST)."""
    url = broker
    assert (
        httpx.put(f"{url}/topics/shrink", json={"readQueueNums": 4, "writeQueueNums": 4}).status_code == 200
    )
    assert receive(url, "gs", "shrink").json()["messages"] == []
    assert (
        httpx.put(f"{url}/topics/shrink", json={"readQueueNums": 2, "writeQueueNums": 2}).status_code == 200
    )
    produce(url, "shrink", "s1", queue_id=1)
    r = receive(url, "gs", "shrink", maxMessages=10)
    assert r.status_code == 200, r.text
    assert [m["body"] for m in r.json()["messages"]] == ["s1"]
    handle = r.json()["messages"][0]["receiptHandle"]
    assert settle(url, "ack", "gs", "shrink", handle) == ["OK"]


def test_a_replaced_receipt_handle_never_acks_once_the_live_one_did(broker):
    """After a redelivery, only the latest handle acks; retrying that ack answers OK again, the
    replaced handle EXPIRED (it used to answer OK: "already settled")."""
    url = broker
    produce(url, "repl", "r0")
    old = receive(url, "gr", "repl", invisibleMs=100).json()["messages"][0]
    new = receive_until(url, "gr", "repl", 1, invisibleMs=60000)[0]
    assert new["reconsumeTimes"] == 1 and new["receiptHandle"] != old["receiptHandle"]
    assert settle(url, "ack", "gr", "repl", new["receiptHandle"], new["receiptHandle"]) == ["OK", "OK"]
    assert settle(url, "ack", "gr", "repl", old["receiptHandle"]) == ["EXPIRED"]
    assert settle(url, "ack", "gr", "repl", new["receiptHandle"]) == ["OK"]  # a retry is harmless
    assert settle(url, "nack", "gr", "repl", new["receiptHandle"]) == ["EXPIRED"]
    assert receive(url, "gr", "repl", waitMs=300).json()["messages"] == []


def test_a_failed_dlq_write_keeps_the_message_until_it_is_dead_lettered(broker):
    """%DLQ%gd read-only: the receive that should dead-letter r0 still answers (r1 is delivered),
    and r0 is not lost: once the DLQ is writable again it lands there, and only then is the
    group's offset committed past it."""
    url = broker
    dlq = "%25DLQ%25gd"
    r = httpx.put(f"{url}/topics/{dlq}", json={"readQueueNums": 1, "writeQueueNums": 1, "perm": 4})
    assert r.status_code == 200, r.text
    produce(url, "dlqro", "r0")
    receive(url, "gd", "dlqro", invisibleMs=100)
    again = receive_until(url, "gd", "dlqro", 1, invisibleMs=100)
    assert [(m["body"], m["reconsumeTimes"]) for m in again] == [("r0", 1)]  # maxReconsumeTimes=1
    time.sleep(0.3)  # past invisibleMs: r0 is due, for the DLQ (was: 403, and r0 dropped for good)
    r = receive(url, "gd", "dlqro")
    assert r.status_code == 200 and r.json()["messages"] == [], r.text
    produce(url, "dlqro", "r1")
    got = receive_until(url, "gd", "dlqro", 1, invisibleMs=60000)
    assert [m["body"] for m in got] == ["r1"]
    assert settle(url, "ack", "gd", "dlqro", got[0]["receiptHandle"]) == ["OK"]
    assert committed(url, "gd", "dlqro")[0] == 0  # r0 is neither acked nor dead-lettered yet

    r = httpx.put(f"{url}/topics/{dlq}", json={"readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + DEADLINE_S
    dead: list[dict] = []
    while not dead and time.monotonic() < deadline:
        r = receive(url, "gd", "dlqro", waitMs=300)
        assert r.status_code == 200 and r.json()["messages"] == [], r.text
        dead = httpx.get(f"{url}/topics/{dlq}/queues/0/messages", params={"offset": 0}).json()["messages"]
    assert [m["body"] for m in dead] == ["r0"]
    assert committed(url, "gd", "dlqro")[0] == 2


def test_a_restart_after_delete_and_recreate_reads_the_new_topic(tmp_path):
    """The replay at start does not apply a delete's offset drop, so the group's committed offset
    of the deleted topic (3) comes back; past the new queue's end (1) it is known stale and the
    group starts over (it used to read from 3: b0..b2 were never delivered). Once the new queue
    has grown past the stale offset it cannot be told apart — that needs the replay in log order
    (broker/store/store_recovery.py)."""
    group = ProcessGroup(tmp_path)
    try:
        conf = CONF / "broker-single.conf"
        url = "http://" + start_broker(group, tmp_path, conf, "b", None)
        produce(url, "rs", "a0", "a1", "a2")
        got = receive(url, "g", "rs", maxMessages=10).json()["messages"]
        assert settle(url, "ack", "g", "rs", *(m["receiptHandle"] for m in got)) == ["OK"] * 3
        assert httpx.delete(f"{url}/topics/rs").status_code == 200
        produce(url, "rs", "b0")  # auto-created again
        group.kill("b", signal.SIGTERM)
        url = "http://" + start_broker(group, tmp_path, conf, "b", None)
        got = receive_until(url, "g", "rs", 1, invisibleMs=60000)
        produce(url, "rs", "b1", "b2", "b3")
        got += receive_until(url, "g", "rs", 3, invisibleMs=60000)
        assert [(m["body"], m["queueOffset"]) for m in got] == [("b0", 0), ("b1", 1), ("b2", 2), ("b3", 3)]
        assert settle(url, "ack", "g", "rs", *(m["receiptHandle"] for m in got)) == ["OK"] * 4
        assert committed(url, "g", "rs")[0] == 4
    finally:
        group.stop_all()


@pytest.mark.slow
def test_a_topic_delete_drops_receipt_state_on_every_member(tmp_path):
    """Acks above the mark live in replicated pop state on every member. A delete must drop them
    on the slaves too: a new master must not skip the re-created topic's offsets 2 and 3."""
    group = ProcessGroup(tmp_path)
    try:
        ns = start_namesrv(group, tmp_path)
        addrs = start_dledger_set(group, tmp_path, ns, defaultTopicQueueNums="1")
        old = wait_master(addrs)
        url = f"http://{addrs[old]}"
        produce(url, "dt", *(f"a{i}" for i in range(5)))
        got = receive(url, "g", "dt", maxMessages=10, invisibleMs=60000).json()["messages"]
        handle = {m["body"]: m["receiptHandle"] for m in got}
        assert settle(url, "ack", "g", "dt", handle["a2"], handle["a3"]) == ["OK", "OK"]  # above the mark
        assert httpx.delete(f"{url}/topics/dt").status_code == 200
        produce(url, "dt", *(f"b{i}" for i in range(5)))

        group.kill(old, signal.SIGKILL)
        new = wait_master(addrs, exclude={old}, timeout_s=DEADLINE_S)
        nurl = f"http://{addrs[new]}"
        got = receive_until(nurl, "g", "dt", 5, invisibleMs=60000)
        assert sorted(m["body"] for m in got) == [f"b{i}" for i in range(5)]
    finally:
        group.stop_all()


# -- in-process, on a real store (states a process cannot be driven into on demand) ---------------


async def _start(cfg: BrokerConfig) -> Any:
    """A started broker controller, its services and app (built first, as BrokerRuntime does: the
    services register the pop-state handler the store's replay needs)."""
    from broker.http.app import create_app
    from broker.role_change import wait_until_master
    from broker.runtime import build_controller
    from broker.service import BrokerServices

    ctl = build_controller(cfg)
    services = BrokerServices.create(ctl)
    app = create_app(services)
    await ctl.start()
    await wait_until_master(ctl.store, timeout_s=DEADLINE_S)
    return ctl, services, app


@pytest.fixture
async def local_broker(tmp_path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    cfg = BrokerConfig(
        store_path_root_dir=str(tmp_path),
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 50,
        default_topic_queue_nums=1,
        listen_port=free_port(),
    )
    cfg.file_reserved_time = 0  # every full commit-log file is expired at once
    cfg.delete_when = str(time.localtime().tm_hour)
    ctl, _, app = await _start(cfg)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as c:
            yield ctl.store, c
    finally:
        await ctl.shutdown()


async def test_retention_past_the_read_pointer_and_in_flight_offsets_skips_forward(local_broker, caplog):
    """Retention deletes offsets the group had in flight (0, 1) and had not read yet (2..lo-1):
    receives keep answering 200 (were 400 OFFSET_OUT_OF_RANGE until the next term), starting at
    the new min offset, and the committed offset moves past what is gone."""
    store, c = local_broker
    for i in range(40):
        await store.put_messages("ret", [Message("ret", b"r" * 4000 + b"%d" % i)], 0)

    async def recv(**fields: Any) -> httpx.Response:
        return await c.post("/consumers/g/receive", json={"topic": "ret", **fields})

    first = (await recv(maxMessages=2, invisibleMs=100)).json()["messages"]
    assert [m["queueOffset"] for m in first] == [0, 1]
    await store.clean_expired()  # what the store's flush loop runs every 10 s
    lo = store.min_offset("ret", 0)
    assert 3 < lo < 40

    caplog.set_level(logging.WARNING, logger="broker.service.pop")
    await asyncio.sleep(0.15)  # past invisibleMs: 0 and 1 are due for redelivery, but gone
    r = await recv(maxMessages=4, invisibleMs=60000)
    assert r.status_code == 200, r.text
    got = r.json()["messages"]
    assert [m["queueOffset"] for m in got] == [lo, lo + 1, lo + 2, lo + 3]
    assert all(m["reconsumeTimes"] == 0 for m in got)
    skips = [x.getMessage() for x in caplog.records if "event=pop_skipped_expired" in x.getMessage()]
    assert skips == [
        f"event=pop_skipped_expired group=g topic=ret queueId=0 fromOffset=2 toOffset={lo} count={lo - 2}"
    ]
    assert any(
        "event=pop_inflight_expired group=g topic=ret queueId=0 offsets=[0, 1]" in x.getMessage()
        for x in caplog.records
    )
    # An ack of a message retention deleted settles nothing; the group's mark is past the gap.
    ack = await c.post(
        "/consumers/g/ack", json={"topic": "ret", "receiptHandles": [first[0]["receiptHandle"]]}
    )
    assert ack.json()["results"][0]["status"] == "EXPIRED"
    ack = await c.post(
        "/consumers/g/ack", json={"topic": "ret", "receiptHandles": [m["receiptHandle"] for m in got]}
    )
    assert [x["status"] for x in ack.json()["results"]] == ["OK"] * 4
    assert store.offsets.query("g", "ret", 0) == lo + 4


async def test_an_ack_while_a_receive_dead_letters_is_neither_a_500_nor_an_ok(tmp_path):
    """A receive suspended in the DLQ write of m0 (DLedger: the write waits for the commit) while
    an ack comes in: the ack of m1 (live handle) is OK and the receive then skips m1 (was:
    KeyError → 500); the ack of m0 — being dead-lettered, not acked — answers EXPIRED (was: OK).
    m0 ends in %DLQ%g once, m1 is never delivered again, the committed offset passes both."""
    cfg = BrokerConfig(
        store_path_root_dir=str(tmp_path),
        default_topic_queue_nums=1,
        listen_port=free_port(),
        max_reconsume_times=1,
    )
    cfg.enable_dledger_commit_log = True
    cfg.dledger_group = "g"
    cfg.dledger_self_id = "n0"
    cfg.dledger_peers = f"n0-127.0.0.1:{free_port()}"
    ctl, services, _ = await _start(cfg)
    store, pop = ctl.store, services.pop
    try:
        await store.put_messages("race", [Message("race", b"m0"), Message("race", b"m1")], 0)
        assert len(await pop.receive(ANONYMOUS, "g", "race", 10, 100, 0)) == 2
        wait_ms = int(DEADLINE_S * 1000)
        second = [received_json(r) for r in await pop.receive(ANONYMOUS, "g", "race", 10, 100, wait_ms)]
        assert [(m["body"], m["reconsumeTimes"]) for m in second] == [("m0", 1), ("m1", 1)]
        handle = {m["body"]: m["receiptHandle"] for m in second}
        await asyncio.sleep(0.15)  # both due again; the next receive dead-letters m0, then m1

        receiving = asyncio.create_task(pop.receive(ANONYMOUS, "g", "race", 10, 60000, 0))
        # Yield one loop turn at a time until the receive is inside m0's DLQ write (the DLQ topic
        # record is applied, the DLQ message's commit is still ahead).
        deadline = time.monotonic() + DEADLINE_S
        for _turn in itertools.count():
            if "%DLQ%g" in store.topics or receiving.done() or time.monotonic() > deadline:
                break
            await asyncio.sleep(0)
        assert not receiving.done()
        acked = await pop.ack(ANONYMOUS, "g", "race", [handle["m1"], handle["m0"]])
        assert await receiving == []
        assert [a.status for a in acked] == ["OK", "EXPIRED"]

        dlq = store.get_messages("%DLQ%g", 0, 0, 10).messages
        assert [m.body for m in dlq] == [b"m0"]
        assert await pop.receive(ANONYMOUS, "g", "race", 10, 60000, 300) == []
        assert store.offsets.query("g", "race", 0) == 2
    finally:
        await ctl.shutdown()
