"""The batching producer (issue 14) against real brokers: concurrent sends are batched, each message
keeps its own result and a queue's messages are stored in the order they were sent; a message the
broker refuses fails alone, its batch-mates are stored; a full buffer blocks for `max_block_ms`,
then raises `ProducerBufferFullError`; a master SIGKILL during 20 s of batched sends loses no
message whose future succeeded and stores none twice."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from client import ConsumeResult, Message, Producer, PushConsumer, SimpleConsumer, TransactionResolution
from client.errors import BadRequestError, LedgerMQError, ProducerBufferFullError, SendOutcomeUnknownError
from client.outcome import Delivery, delivery_of
from client.producer import AsyncProducer
from tests.integration._ledgermq_procs import (
    REPO,
    ProcessGroup,
    namesrv_and_broker,
    start_dledger_set,
    start_namesrv,
    wait_http,
    wait_master,
)
from wire.groups import queue_of_group


def read_queue(addr: str, topic: str, queue_id: int) -> list[dict]:
    out, offset = [], 0
    while True:
        doc = httpx.get(
            f"http://{addr}/topics/{topic}/queues/{queue_id}/messages",
            params={"offset": offset, "maxMessages": 1024},
            timeout=10,
        ).json()
        out += doc["messages"]
        if doc["nextOffset"] >= doc["maxOffset"]:
            return out
        offset = doc["nextOffset"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    with namesrv_and_broker(tmp_path_factory.mktemp("batching"), "broker-s") as (group, ns, broker):
        wait_http(f"http://{ns}/cluster", ok=lambda r: "broker-s" in r.json()["brokers"])
        yield group, ns, broker


def create(addr: str, ns: str, topic: str, queues: int, message_type: str | None = None) -> None:
    body: dict = {"readQueueNums": queues, "writeQueueNums": queues}
    if message_type:
        body["attributes"] = {"message.type": message_type}
    r = httpx.put(f"http://{addr}/topics/{topic}", json=body)
    assert r.status_code == 200, r.text
    wait_http(f"http://{ns}/routes/{topic}", ok=lambda r: r.status_code == 200)


async def test_concurrent_sends_are_batched_and_each_keeps_its_result_and_queue_order(single):
    _, ns, broker = single
    create(broker, ns, "batched", 4)
    async with AsyncProducer(ns, linger_ms=5) as p:
        # Per queue, one coroutine sends its sequence; unpinned sends run beside them.
        async def ordered(q: int) -> list:
            futs = [await p.send_async("batched", f"q{q}-{i}", queue_id=q) for i in range(300)]
            return [await f for f in futs]

        async def free(n: int) -> list:
            return [await p.send("batched", f"free-{n}-{i}") for i in range(50)]

        results = await asyncio.gather(*(ordered(q) for q in range(4)), *(free(n) for n in range(16)))
        assert p.stats["requests"] < (4 * 300 + 16 * 50) / 5, f"not batched: {p.stats}"
    by_queue = {q: read_queue(broker, "batched", q) for q in range(4)}
    where = {(q, m["queueOffset"]): m["body"] for q, ms in by_queue.items() for m in ms}
    for q in range(4):
        res = results[q]
        assert [r.queue_id for r in res] == [q] * 300
        offsets = [r.queue_offset for r in res]
        assert offsets == sorted(offsets), f"queue {q}: stored out of send order"
        assert [where[(q, r.queue_offset)] for r in res] == [f"q{q}-{i}" for i in range(300)]
    for n, res in enumerate(results[4:]):
        assert [where[(r.queue_id, r.queue_offset)] for r in res] == [f"free-{n}-{i}" for i in range(50)]
    bodies = [b for b in where.values()]
    assert len(bodies) == len(set(bodies)) == 4 * 300 + 16 * 50


async def test_a_message_the_broker_refuses_fails_alone_and_its_batch_mates_are_stored(single):
    _, ns, broker = single
    create(broker, ns, "refused", 1)
    async with AsyncProducer(ns, linger_ms=20) as p:
        futs = [await p.send_async("refused", f"ok-{i}") for i in range(5)]
        futs.append(await p.send_async("refused", Message("bad", properties={"KEYS": "reserved"})))
        futs += [await p.send_async("refused", f"ok-{i}") for i in range(5, 10)]
        done = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(done[5], BadRequestError) and delivery_of(done[5]) is Delivery.REFUSED
    ok = [d for i, d in enumerate(done) if i != 5]
    assert all(not isinstance(d, BaseException) for d in ok), ok
    stored = [m["body"] for m in read_queue(broker, "refused", 0)]
    assert sorted(stored) == sorted(f"ok-{i}" for i in range(10))


def test_a_full_buffer_blocks_for_max_block_ms_then_raises(single):
    group, ns, broker = single
    create(broker, ns, "full", 1)
    with Producer(ns, buffer_max_bytes=16 * 1024, max_block_ms=300, send_timeout_s=30) as p:
        p.send("full", b"route and connection ready")
        group.procs["broker-s"].send_signal(signal.SIGSTOP)  # the broker stops answering
        try:
            pending = []
            with pytest.raises(ProducerBufferFullError) as info:
                for i in range(100):
                    pending.append(p.send_async("full", "x" * 1024 + str(i)))
            blocked_from = time.monotonic()
            with pytest.raises(ProducerBufferFullError):
                p.send_async("full", "y" * 1024)
            blocked = time.monotonic() - blocked_from
            assert 0.25 <= blocked < 2.0, f"blocked {blocked:.2f} s for max_block_ms=300"
            assert "buffer_max_bytes" in str(info.value)
            assert 8 <= len(pending) <= 16
        finally:
            group.procs["broker-s"].send_signal(signal.SIGCONT)
        p.flush(30)
        assert all(f.result(0).queue_id == 0 for f in pending), (
            "accepted messages are stored once the broker answers"
        )
    stored = [m["body"] for m in read_queue(broker, "full", 0)]
    assert len(stored) == len(set(stored)) == 1 + len(pending)


def produce_across_master_sigkill(
    tmp_path, topic: str, produce: Callable[[str, threading.Event], None], before_s: float, after_s: float
) -> list[dict]:
    """On a fresh 3-member set with `topic` (2 queues), `produce(namesrv, stop)` runs on a thread
    while the master is SIGKILLed `before_s` in and restarted; `after_s` later `stop` is set. Returns
    what the set's master then stores in the topic."""
    group = ProcessGroup(tmp_path)
    try:
        ns = start_namesrv(group, tmp_path)
        addrs = start_dledger_set(group, tmp_path, ns)
        master = wait_master(addrs, timeout_s=30)
        create(addrs[master], ns, topic, 2)
        stop = threading.Event()
        th = threading.Thread(target=produce, args=(ns, stop))
        th.start()
        time.sleep(before_s)
        group.kill(master, signal.SIGKILL)
        group.start(master, "broker", "-c", str(tmp_path / f"{master}.conf"))
        time.sleep(after_s)
        stop.set()
        th.join(60)
        assert not th.is_alive()
        new = addrs[wait_master(addrs, timeout_s=30)]
        return read_queue(new, topic, 0) + read_queue(new, topic, 1)
    finally:
        group.stop_all()


@pytest.mark.slow
def test_master_sigkill_during_20_s_of_batched_sends_loses_no_acked_message_and_stores_none_twice(tmp_path):
    futures: dict[str, object] = {}

    def produce(ns: str, stop: threading.Event) -> None:
        with Producer(ns, send_timeout_s=10) as p:
            i = 0
            while not stop.is_set():
                body = f"m{i}"
                futures[body] = p.send_async("killed", body)
                i += 1
                if i % 50 == 0:
                    time.sleep(0.005)  # a few thousand messages a second
            p.flush(30)

    stored = produce_across_master_sigkill(tmp_path, "killed", produce, 5, 15)
    acked = check_outcomes({body: fut.exception() or fut.result() for body, fut in futures.items()}, stored)
    assert acked > 5000, f"only {acked} acknowledged"
    print(f"acked={acked} failed={len(futures) - acked} stored={len(stored)}")


def check_outcomes(outcomes: dict[str, object], stored: list[dict]) -> int:
    """Each send's result or error against what the set stored: nothing twice, every result at
    the offset it named, nothing refused (any error but `SendOutcomeUnknownError`) stored.
    Returns how many sends succeeded."""
    bodies = [m["body"] for m in stored]
    assert len(bodies) == len(set(bodies)), "a message was stored twice"
    where = {m["body"]: (m["queueId"], m["queueOffset"]) for m in stored}
    acked = 0
    for body, outcome in outcomes.items():
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, LedgerMQError), outcome
            if not isinstance(outcome, SendOutcomeUnknownError):
                assert body not in where, f"{body} refused ({outcome!r}) yet stored"
            continue
        acked += 1
        r = outcome
        assert where.get(body) == (r.queue_id, r.queue_offset), (body, r, where.get(body))
    return acked


async def test_delayed_sends_arrive_when_due_and_a_recalled_one_never(single):
    """RocketMQ's delay messages through the SDK: the result says when (`deliver_at_ms`, offset
    -1 in the timer queue) and how to cancel (`recall_handle`); the message shows up in its queue
    once due, a recalled one never; a second recall is refused."""
    _, ns, broker = single
    create(broker, ns, "later", 1, "DELAY")
    async with AsyncProducer(ns) as p:
        before_ms = int(time.time() * 1000)
        due = await p.send("later", "due soon", delay_ms=1500)
        cancelled = await p.send("later", Message("never", deliver_at_ms=before_ms + 60_000))
        assert due.queue_offset == -1 and due.recall_handle and due.message_id
        assert before_ms + 1500 <= due.deliver_at_ms <= int(time.time() * 1000) + 1500
        assert cancelled.deliver_at_ms == before_ms + 60_000
        assert await p.recall("later", cancelled.recall_handle) == cancelled.message_id
        assert read_queue(broker, "later", 0) == []  # nothing is due yet
        with pytest.raises(LedgerMQError) as ei:
            await p.recall("later", cancelled.recall_handle, broker_name=cancelled.broker_name)
        assert ei.value.code == "RECALL_FAILED", ei.value
    deadline = time.monotonic() + 15
    while not (stored := read_queue(broker, "later", 0)):
        assert time.monotonic() < deadline, "the delayed message never arrived"
        await asyncio.sleep(0.1)
    assert [m["body"] for m in stored] == ["due soon"]
    assert int(time.time() * 1000) >= due.deliver_at_ms
    with SimpleConsumer("g-later", "later", ns) as c:  # the id the producer got, on delivery
        (got,) = await asyncio.to_thread(c.receive, 32, 2000)
        assert (got.text, got.message_id) == ("due soon", due.message_id)


async def test_fifo_groups_keep_their_send_order_through_batching_and_reach_consumers_grouped(single):
    _, ns, broker = single
    create(broker, ns, "ordered", 4, "FIFO")
    groups = [f"cart-{i}" for i in range(6)]
    async with AsyncProducer(ns, linger_ms=2) as p:
        sends = [(g, i, await p.send_async("ordered", f"{g}/{i}", message_group=g))
                 for i in range(50) for g in groups]
        results = {(g, i): await f for g, i, f in sends}
        with pytest.raises(ValueError, match="message_group"):
            await p.send("ordered", "x", message_group="")
    for g in groups:
        queues = {results[g, i].queue_id for i in range(50)}
        assert queues == {queue_of_group(g, 4)}, (g, queues)
        offsets = [results[g, i].queue_offset for i in range(50)]
        assert offsets == sorted(offsets), f"{g} stored out of send order"
    with SimpleConsumer("g-ordered", "ordered", ns) as c:
        got: dict[str, list[str]] = {}
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < 300:
            assert time.monotonic() < deadline, {g: len(v) for g, v in got.items()}
            msgs = await asyncio.to_thread(c.receive, 32, 1000)
            for m in msgs:
                got.setdefault(m.message_group, []).append(m.text)
            if msgs:
                await asyncio.to_thread(c.ack, *msgs)
    assert got == {g: [f"{g}/{i}" for i in range(50)] for g in groups}


def test_a_push_consumer_with_many_threads_handles_each_fifo_group_in_send_order(single):
    """A RocketMQ developer's FIFO pipeline: a producer sends 5 groups x 40 batched messages, a
    `PushConsumer` with 20 handler threads and a slow listener handles them — each group strictly
    in send order, never two of a group at once, and a message its listener fails comes back (attempt
    2) before the rest of its group goes on."""
    _, ns, broker = single
    create(broker, ns, "fifo-push", 4, "FIFO")
    groups = [f"order-{i}" for i in range(5)]
    with Producer(ns) as p:
        futures = [p.send_async("fifo-push", f"{g}/{i}", message_group=g) for i in range(40) for g in groups]
        p.flush()
        assert all(f.result().queue_offset >= 0 for f in futures)

    lock = threading.Lock()
    handled: dict[str, list[str]] = {g: [] for g in groups}
    busy: set[str] = set()
    overlaps: list[str] = []
    failed_once: list[tuple[str, int]] = []

    def listener(m):
        g = m.message_group
        with lock:
            if g in busy:
                overlaps.append(m.text)
            busy.add(g)
        try:
            time.sleep(0.002)
            if m.text == "order-2/7" and m.attempt == 1:
                failed_once.append((m.text, m.attempt))
                return ConsumeResult.FAILURE
            with lock:
                handled[g].append(m.text)
            return ConsumeResult.SUCCESS
        finally:
            with lock:
                busy.discard(g)

    with PushConsumer("g-fifo-push", "fifo-push", listener, ns, wait_ms=300, consume_thread_count=20,
                      retry_backoff_ms=100):
        deadline = time.monotonic() + 60
        while sum(map(len, handled.values())) < 200:
            assert time.monotonic() < deadline, {g: len(v) for g, v in handled.items()}
            time.sleep(0.05)
    assert overlaps == []
    assert failed_once == [("order-2/7", 1)]
    assert handled == {g: [f"{g}/{i}" for i in range(40)] for g in groups}


def test_the_blocking_producer_recalls_a_delayed_message(single):
    _, ns, broker = single
    create(broker, ns, "later-sync", 1, "DELAY")
    with Producer(ns) as p:
        sent = p.send("later-sync", "cancel me", delay_ms=30_000)
        assert p.recall("later-sync", sent.recall_handle) == sent.message_id
        with pytest.raises(LedgerMQError, match="RECALL_FAILED"):
            p.recall("later-sync", sent.recall_handle)


def test_transactional_sends_are_delivered_once_committed_and_never_after_a_rollback(single):
    _, ns, broker = single
    create(broker, ns, "tx-sdk", 1, "TRANSACTION")
    with Producer(ns, producer_group="pg-sdk") as p:
        yes = p.send_transactional("tx-sdk", "commit me")
        no = p.send_transactional("tx-sdk", "roll me back")
        assert yes.result.queue_offset == -1 and yes.transaction_id != no.transaction_id
        assert read_queue(broker, "tx-sdk", 0) == []  # half messages: not delivered yet
        assert yes.commit() == "COMMITTED" and yes.commit() == "COMMITTED"  # idempotent
        assert no.rollback() == "ROLLED_BACK"
        with pytest.raises(LedgerMQError, match="TRANSACTION_CONFLICT"):
            no.commit()
    assert [m["body"] for m in read_queue(broker, "tx-sdk", 0)] == ["commit me"]


CRASHING_PRODUCER = """
import os, sys
from client import Producer
p = Producer(sys.argv[1], producer_group="pg-crash")
for body in ("yes", "no", "later"):
    p.send_transactional("tx-check", body)
os._exit(0)  # gone before committing anything, as a crashed application
"""


def test_a_transaction_checker_resolves_what_a_crashed_producer_left_open(tmp_path):
    """RocketMQ's check-back: a producer process exits between its half messages and their
    commit; another producer of the same group, with a `transaction_checker`, is asked by the
    master and its answers are applied — COMMIT delivers, ROLLBACK discards, UNKNOWN is asked
    again (and answered later)."""
    fast = {"transactionTimeOut": "300", "transactionCheckInterval": "500", "transactionCheckMax": "50"}
    with namesrv_and_broker(tmp_path, "broker-tx", **fast) as (_, ns, broker):
        wait_http(f"http://{ns}/cluster", ok=lambda r: "broker-s" in r.json()["brokers"])
        create(broker, ns, "tx-check", 1, "TRANSACTION")
        crashed = subprocess.run([sys.executable, "-c", CRASHING_PRODUCER, ns], cwd=REPO, timeout=60,
                                 capture_output=True, text=True)
        assert crashed.returncode == 0, crashed.stderr
        asked: list[str] = []

        def checker(m):
            asked.append(m.text)
            if m.text == "later" and asked.count("later") == 1:
                return TransactionResolution.UNKNOWN  # not decided yet: asked again
            if m.text in ("yes", "later"):
                return TransactionResolution.COMMIT
            return TransactionResolution.ROLLBACK

        with Producer(ns, producer_group="pg-crash", transaction_checker=checker) as p:
            deadline = time.monotonic() + 30
            while sorted(m["body"] for m in read_queue(broker, "tx-check", 0)) != ["later", "yes"]:
                assert time.monotonic() < deadline, (asked, p.checks.stats)
                time.sleep(0.1)
            assert p.checks.stats["committed"] == 2 and p.checks.stats["rolled_back"] == 1
            assert asked.count("later") >= 2
