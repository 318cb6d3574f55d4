"""The SDK's consumers against a real name server and broker (issue 14): the pull consumer's
prefetching iterator over every queue with committed positions, the simple consumer's pipelined
receive and coalesced acks, and the push consumer (a failing handler gets the message again with
attempt 2 after its backoff, a handler slower than the invisible time is not redelivered
meanwhile, a shutdown in the middle loses nothing)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter

import httpx
import pytest

from client import (
    AsyncPullConsumer,
    AsyncPushConsumer,
    ConsumeResult,
    LedgerMQError,
    Producer,
    PullConsumer,
    PushConsumer,
    SimpleConsumer,
)
from tests.integration._ledgermq_procs import namesrv_and_broker, wait_http


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with namesrv_and_broker(tmp_path_factory.mktemp("consumers"), "broker-s") as (_, ns, broker):
        wait_http(f"http://{ns}/cluster", ok=lambda r: "broker-s" in r.json()["brokers"])
        yield ns, broker


def fill(env, topic: str, n: int, queues: int = 4) -> list[str]:
    ns, broker = env
    r = httpx.put(f"http://{broker}/topics/{topic}", json={"readQueueNums": queues, "writeQueueNums": queues})
    assert r.status_code == 200, r.text
    wait_http(f"http://{ns}/routes/{topic}")
    bodies = [f"{topic}-{i}" for i in range(n)]
    with Producer(ns) as p:
        futs = [p.send_async(topic, b, queue_id=i % queues) for i, b in enumerate(bodies)]
        p.flush()
        assert all(f.result() for f in futs)
    return bodies


def test_pull_iterator_reads_every_queue_in_order_and_resumes_from_its_commits(env):
    ns, _ = env
    bodies = fill(env, "iter", 1000)
    with PullConsumer(ns) as c:
        it = c.iterate("iter", "g-iter", batch=64, wait_ms=100)
        got = [next(it) for _ in range(1000)]
        assert it.lag() == 0
        it.close()
        assert sorted(m.text for m in got) == sorted(bodies)
        per_queue: dict[int, list[int]] = {}
        for m in got:
            per_queue.setdefault(m.queue_id, []).append(m.queue_offset)
        assert all(offs == sorted(offs) for offs in per_queue.values())
        assert {q: max(o) + 1 for q, o in per_queue.items()} == c.committed_offsets("g-iter", "iter")
    with Producer(ns) as p:
        p.send("iter", "after")
    with PullConsumer(ns) as c:
        it = c.iterate("iter", "g-iter", wait_ms=100)
        assert [m.text for m in it.poll(5.0)] == ["after"]
        it.close()


async def test_async_pull_iterator_commits_on_its_interval(env):
    ns, _ = env
    fill(env, "iter-async", 200, queues=2)
    async with AsyncPullConsumer(ns) as c:
        it = await c.iterate("iter-async", "g-ia", wait_ms=100, commit_interval_ms=100)
        seen = 0
        async for _ in it:
            seen += 1
            if seen == 200:
                break
        deadline = time.monotonic() + 5
        while sum((await c.committed_offsets("g-ia", "iter-async")).values()) < 198:
            assert time.monotonic() < deadline, "no periodic commit"
            await asyncio.sleep(0.05)
        # The last message of each queue is in hand: committed up to it, not past it.
        assert sum((await c.committed_offsets("g-ia", "iter-async")).values()) == 198
    async with AsyncPullConsumer(ns) as c:  # close() above committed past the last ones
        assert sum((await c.committed_offsets("g-ia", "iter-async")).values()) == 200


def test_simple_consumer_receive_ahead_and_coalesced_acks(env):
    ns, _ = env
    bodies = fill(env, "simple", 300, queues=2)
    got: list[str] = []
    with SimpleConsumer("g-simple", "simple", ns, receive_ahead=True) as c:
        deadline = time.monotonic() + 30
        while len(got) < 300 and time.monotonic() < deadline:
            msgs = c.receive(max_messages=32, wait_ms=200)
            got += [m.text for m in msgs]
            futs = c.ack_async(*msgs)
        c.flush_acks()
        assert all(f.result(5)["status"] == "OK" for f in futs)
        assert sorted(got) == sorted(bodies)
    # The receive the consumer had sent ahead was given back at close: nothing is left in flight.
    with SimpleConsumer("g-simple", "simple", ns, receive_ahead=False) as c:
        assert c.receive(max_messages=32, wait_ms=300) == []


def test_simple_consumer_hands_out_what_it_received_ahead_without_its_io_thread(env):
    """Once a receive has filled the buffer, the next receives take from it on the calling
    thread: with the I/O thread's loop held busy for 3 s they return at once, and every
    message is still handed out exactly once; the acks queued meanwhile land afterwards."""
    ns, _ = env
    bodies = fill(env, "ahead-thread", 600, queues=2)
    got: list[str] = []
    with SimpleConsumer("g-thread", "ahead-thread", ns, receive_ahead=True, receive_ahead_max=256) as c:
        deadline = time.monotonic() + 10
        while len(c._c._buffer) < 64 and time.monotonic() < deadline:  # a receive ahead has landed
            msgs = c.receive(16, wait_ms=200)
            got += [m.text for m in msgs]
            c.ack_async(*msgs)
            time.sleep(0.05)
        buffered = len(c._c._buffer)
        assert buffered >= 64, buffered
        c._bg.call_soon(time.sleep, 3.0)
        time.sleep(0.1)  # the loop is now inside the sleep
        started = time.monotonic()
        taken = [c.receive(16) for _ in range(buffered // 16)]
        took = time.monotonic() - started
        assert took < 1.5, f"{len(taken)} receives from the buffer took {took:.2f} s"
        assert all(len(batch) == 16 for batch in taken)
        futs = [f for batch in taken for f in c.ack_async(*batch)]
        got += [m.text for batch in taken for m in batch]
        while len(got) < 600 and time.monotonic() < deadline + 20:
            msgs = c.receive(32, wait_ms=200)
            got += [m.text for m in msgs]
            c.ack_async(*msgs)
        c.flush_acks()
        assert all(f.result(5)["status"] == "OK" for f in futs)
    assert sorted(got) == sorted(bodies)


def _inflight(env, group: str) -> int:
    _, broker = env
    groups = httpx.get(f"http://{broker}/admin/consumers").json()["groups"]
    return next((g["inflight"] for g in groups if g["group"] == group), 0)


def test_receive_ahead_sizes_its_batches_by_what_the_caller_takes_in_time(env):
    bodies = fill(env, "ahead-size", 1500, queues=2)
    got: list[str] = []
    with SimpleConsumer("g-ahead", "ahead-size", env[0], receive_ahead=True, invisible_ms=1500) as c:
        # A slow caller (10 every 0.2 s, 25 per third of the invisible time): what it holds
        # beyond what it took stays near that, not the 256 a fast caller fetches.
        held = []
        for _ in range(8):
            msgs = c.receive(10, wait_ms=200)
            got += [m.text for m in msgs]
            assert all(r["status"] == "OK" for r in c.ack(*msgs)["results"])
            held.append(_inflight(env, "g-ahead"))
            time.sleep(0.2)
        assert max(held) <= 60, held
        # A fast caller: the broker is asked for up to receive_ahead_max at once.
        fast = []
        while len(got) < 1500:
            msgs = c.receive(32, wait_ms=200)
            assert msgs, f"{len(got)} of 1500"
            got += [m.text for m in msgs]
            c.ack_async(*msgs)
            if len(got) > 600 and len(fast) < (len(got) - 600) // 96:
                fast.append(_inflight(env, "g-ahead"))
        c.flush_acks()
        assert max(fast) > 128, fast  # held ahead: far more than the 32 it asks for
    assert sorted(got) == sorted(bodies)  # each exactly once: nothing given back was handed out


def test_receive_ahead_never_hands_out_a_message_past_a_third_of_its_invisible_time(env):
    bodies = fill(env, "ahead-stale", 200, queues=2)
    got: list[tuple[str, int]] = []
    with SimpleConsumer("g-stale", "ahead-stale", env[0], receive_ahead=True, invisible_ms=900) as c:
        first = c.receive(16, wait_ms=200)  # a backlog: the next batch is fetched ahead
        assert len(first) == 16
        got += [(m.text, m.attempt) for m in first]
        c.ack(*first)
        time.sleep(0.5)  # the batch fetched ahead is older than a third of 900 ms
        deadline = time.monotonic() + 20
        while len(got) < 200 and time.monotonic() < deadline:
            msgs = c.receive(16, wait_ms=200)
            got += [(m.text, m.attempt) for m in msgs]
            assert all(r["status"] == "OK" for r in c.ack(*msgs)["results"])
    texts = [t for t, _ in got]
    assert sorted(texts) == sorted(bodies)  # each handed out once
    # The stale batch was given back and received anew (a second delivery), not handed out.
    assert sum(1 for _, a in got if a == 2) >= 16, Counter(a for _, a in got)


def test_push_consumer_retries_a_failing_handler_with_attempt_2_and_acks_the_rest(env):
    ns, _ = env
    bodies = fill(env, "push", 200, queues=2)
    attempts: dict[str, list[int]] = {}
    lock = threading.Lock()
    done = threading.Event()

    def listener(m) -> None:
        with lock:
            attempts.setdefault(m.text, []).append(m.attempt)
            if (
                all(a and (k != "push-7" or len(a) == 2) for k, a in attempts.items())
                and len(attempts) == 200
            ):
                done.set()
        if m.text == "push-7" and m.attempt == 1:
            raise RuntimeError("not now")

    with PushConsumer("g-push", "push", listener, ns, wait_ms=500, retry_backoff_ms=300) as c:
        assert done.wait(30), f"{len(attempts)} consumed"
        deadline = time.monotonic() + 10
        while c.lag() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert c.lag() == 0
        assert c.stats["failed"] == 1
    assert sorted(attempts) == sorted(bodies)
    assert attempts["push-7"] == [1, 2]
    assert all(a == [1] for k, a in attempts.items() if k != "push-7")


def test_push_consumer_renews_a_slow_handlers_message_instead_of_redelivering_it(env):
    ns, _ = env
    fill(env, "slow", 3, queues=1)
    calls: Counter[str] = Counter()

    def slow(m) -> None:
        calls[m.text] += 1
        time.sleep(2.5)  # longer than the invisible time: renewed at 2/3 of it

    c = PushConsumer("g-slow", "slow", slow, ns, invisible_ms=1200, wait_ms=300, consume_thread_count=3)
    c.start()
    try:
        deadline = time.monotonic() + 20
        while (c.stats["consumed"] < 3 or c.lag()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert c.stats["renewed"] >= 3
        time.sleep(1.5)  # a redelivery, if any, would have come by now
    finally:
        c.shutdown()
    assert calls == Counter({"slow-0": 1, "slow-1": 1, "slow-2": 1})


def test_push_consumer_shutdown_in_the_middle_loses_nothing(env):
    ns, _ = env
    bodies = fill(env, "shut", 400, queues=2)
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def listener(m) -> None:
        time.sleep(0.002)
        with lock:
            seen[m.text] += 1

    c = PushConsumer("g-shut", "shut", listener, ns, wait_ms=300, consume_thread_count=4)
    c.start()
    while sum(seen.values()) < 100:
        time.sleep(0.01)
    c.shutdown(timeout_s=10)
    first = sum(seen.values())
    assert c.stats["consumed"] == first and first < 400
    with PushConsumer("g-shut", "shut", listener, ns, wait_ms=300) as c2:
        deadline = time.monotonic() + 30
        while set(seen) != set(bodies) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert set(seen) == set(bodies), f"{len(set(bodies) - set(seen))} never consumed"
    # Everything consumed before the shutdown was acked, the rest given back: nothing came twice.
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:5]
    assert c2.stats["consumed"] == len(bodies) - first


def test_a_long_poll_whose_client_hangs_up_takes_no_message(env):
    """A consumer killed (or shut down) during a receive's long poll: its socket closes, and the
    broker ends that receive handing out nothing, so the next message goes to a live consumer at
    once instead of waiting out its invisible time (60 s here) unseen."""
    ns, broker = env
    fill(env, "hangup", 0, queues=1)
    host, port = broker.rsplit(":", 1)
    body = b'{"topic": "hangup", "maxMessages": 8, "invisibleMs": 60000, "waitMs": 20000}'
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /consumers/g-hangup/receive HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.5)  # the receive is long-polling now
    time.sleep(0.2)
    with Producer(ns) as p:
        p.send("hangup", "after the hang-up")
    with SimpleConsumer("g-hangup", "hangup", ns) as c:
        got = c.receive(max_messages=8, wait_ms=3000, invisible_ms=60000)
    assert [m.text for m in got] == ["after the hang-up"]


def test_push_consumer_shutdown_does_not_wait_out_its_long_polls(env):
    """Idle, every receive of the consumer is long-polling (wait_ms 20 s): shutdown hangs up on
    them instead of waiting them out, and a message sent right after goes to the next consumer at
    once (the broker gave the hung-up receives nothing)."""
    ns, _ = env
    fill(env, "idle-shut", 0, queues=2)
    seen: list[str] = []
    c = PushConsumer("g-idle-shut", "idle-shut", lambda m: seen.append(m.text), ns, wait_ms=20_000)
    c.start()
    time.sleep(1.0)
    started = time.monotonic()
    c.shutdown()
    took = time.monotonic() - started
    assert took < 5.0, f"shutdown took {took:.1f} s: it waited for its long polls"
    with Producer(ns) as p:
        p.send("idle-shut", "next")
    with SimpleConsumer("g-idle-shut", "idle-shut", ns) as s:
        got = s.receive(max_messages=8, wait_ms=3000)
    assert [m.text for m in got] == ["next"] and seen == []


async def test_async_push_consumer_runs_a_coroutine_listener(env):
    ns, _ = env
    bodies = await asyncio.to_thread(fill, env, "apush", 100, 2)
    seen: list[tuple[str, int]] = []

    async def listener(m) -> None:
        await asyncio.sleep(0)
        seen.append((m.text, m.attempt))
        if m.text == "apush-3" and m.attempt == 1:
            raise RuntimeError("later")

    c = AsyncPushConsumer("g-apush", "apush", listener, ns, wait_ms=300, retry_backoff_ms=200)
    await c.start()
    try:
        deadline = time.monotonic() + 20
        while len(seen) < 101 or await c.lag():
            assert time.monotonic() < deadline, f"{len(seen)} handled"
            await asyncio.sleep(0.05)
    finally:
        await c.shutdown()
    assert sorted({t for t, _ in seen}) == sorted(bodies)
    assert [a for t, a in seen if t == "apush-3"] == [1, 2]
    assert c.stats["consumed"] == 100 and c.stats["failed"] == 1


def test_push_listener_returning_failure_gets_the_message_again(env):
    """RocketMQ 5's listener result (and False) means "not consumed", like raising: a ported
    listener that returns ConsumeResult.FAILURE must not have its message acked. Other return
    values (SUCCESS, None, 0) ack."""
    ns, _ = env
    bodies = fill(env, "res", 30, queues=2)
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()
    answers = {"res-1": ConsumeResult.FAILURE, "res-2": False, "res-3": 0, "res-4": ConsumeResult.SUCCESS}

    def listener(m):
        with lock:
            seen.append((m.text, m.attempt))
        return answers.get(m.text) if m.attempt == 1 else None

    with PushConsumer("g-res", "res", listener, ns, wait_ms=300, retry_backoff_ms=200) as c:
        deadline = time.monotonic() + 20
        while len(seen) < 32 or c.lag():
            assert time.monotonic() < deadline, f"{len(seen)} handled, lag {c.lag()}"
            time.sleep(0.05)
    assert sorted({t for t, _ in seen}) == sorted(bodies)
    assert sorted(seen) == sorted([(b, 1) for b in bodies] + [("res-1", 2), ("res-2", 2)])
    assert c.stats["consumed"] == 30 and c.stats["failed"] == 2


def test_consumers_subscribe_with_a_tag_filter(env):
    """RocketMQ's subscription by tag (`"A || B"`): the simple and push consumers are handed only
    the matching messages, the pull iterator and a single pull read only them; `*` is everything,
    and a bad filter type is refused before anything is sent."""
    ns, broker = env
    r = httpx.put(f"http://{broker}/topics/tagged", json={"readQueueNums": 2, "writeQueueNums": 2})
    assert r.status_code == 200, r.text
    wait_http(f"http://{ns}/routes/tagged")
    tags = ("A", "B", "C")
    with Producer(ns) as p:
        futs = [p.send_async("tagged", f"m{i}", tags=tags[i % 3]) for i in range(90)]
        p.flush()
        assert all(f.result() for f in futs)
    want_ab = sorted(f"m{i}" for i in range(90) if i % 3 != 2)
    want_c = sorted(f"m{i}" for i in range(90) if i % 3 == 2)

    with SimpleConsumer("g-tag-simple", "tagged", ns, filter_expression="A || B") as c:
        got: list[str] = []
        deadline = time.monotonic() + 20
        while len(got) < 60:
            assert time.monotonic() < deadline, len(got)
            msgs = c.receive(32, 500)
            got += [m.text for m in msgs]
            if msgs:
                c.ack(*msgs)
        assert c.receive(32, 500) == []  # nothing of tag C is handed to this group
    assert sorted(got) == want_ab

    pushed: list[str] = []
    lock = threading.Lock()

    def listener(m):
        with lock:
            pushed.append(m.tags)

    with PushConsumer("g-tag-push", "tagged", listener, ns, wait_ms=300, filter_expression="C"):
        deadline = time.monotonic() + 20
        while len(pushed) < 30:
            assert time.monotonic() < deadline, len(pushed)
            time.sleep(0.05)
        time.sleep(0.5)
    assert pushed == ["C"] * 30

    with PullConsumer(ns) as c:
        it = c.iterate("tagged", "g-tag-iter", wait_ms=100, filter_expression="C")
        assert sorted(next(it).text for _ in range(30)) == want_c
        it.close()
        page = c.pull("tagged", 0, 0, 64, filter_expression="A")
        assert page.messages and {m.tags for m in page.messages} == {"A"}
        every = c.pull("tagged", 0, 0, 64, filter_expression="*").messages  # `*`: no filter
        assert len(every) == 64 and {m.tags for m in every} == set(tags)
        with pytest.raises(ValueError, match="filter_type"):
            c.pull("tagged", 0, 0, 64, filter_expression="a > 1", filter_type="SQL")

    # SQL92 on a broker without enablePropertyFilter: the push consumer's start says so, at once.
    sql = PushConsumer("g-tag-sql", "tagged", listener, ns, filter_expression="a > 1", filter_type="SQL92")
    with pytest.raises(LedgerMQError) as refused, sql:
        pass
    assert refused.value.code == "FILTER_NOT_SUPPORTED", refused.value
    # ... and the simple consumer's first receive, a pull: the same refusal, raised to the caller.
    with SimpleConsumer("g-tag-sql", "tagged", ns, filter_expression="a > 1", filter_type="SQL92") as c:
        with pytest.raises(LedgerMQError) as refused:
            c.receive(32, 100)
        assert refused.value.code == "FILTER_NOT_SUPPORTED", refused.value
    with PullConsumer(ns) as c, pytest.raises(LedgerMQError) as refused:
        c.pull("tagged", 0, 0, 64, filter_expression="a > 1", filter_type="SQL92")
    assert refused.value.code == "FILTER_NOT_SUPPORTED", refused.value
