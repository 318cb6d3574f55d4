"""`Producer.send` on its caller's thread (issue 14: "`send` (sync) stays the simple blocking call,
made as cheap as the transport allows"), against real brokers: a lone send does not go through
the producer's I/O thread; a send never overtakes the producer's earlier, still unresolved
messages; a master SIGKILL under a loop of blocking sends loses no message whose send returned
and stores none twice."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from client import Message, Producer
from client.errors import LedgerMQError
from tests.integration._ledgermq_procs import (
    namesrv_and_broker,
    wait_http,
)
from tests.integration.test_batching_producer import (
    check_outcomes,
    create,
    produce_across_master_sigkill,
    read_queue,
)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    with namesrv_and_broker(tmp_path_factory.mktemp("blocking"), "broker-s") as (group, ns, broker):
        wait_http(f"http://{ns}/cluster", ok=lambda r: "broker-s" in r.json()["brokers"])
        yield group, ns, broker


def test_a_lone_send_does_not_wait_for_the_producers_io_thread(single):
    """With the I/O thread's loop held busy for 3 s, a send still returns at once: its request
    went out and came back on the calling thread. The first send of a topic (no route cached
    yet) is the one that goes through the I/O thread."""
    _, ns, broker = single
    create(broker, ns, "lone", 2)
    with Producer(ns) as p:
        first = p.send("lone", "route fetched")
        p._loop.call_soon_threadsafe(time.sleep, 3.0)
        time.sleep(0.1)  # the loop is now inside the sleep
        started = time.monotonic()
        results = [p.send("lone", f"m{i}") for i in range(5)]
        took = time.monotonic() - started
        keyed = p.send("lone", Message("with fields", tags="t", keys=["k1"]), queue_id=1)
    assert took < 2.0, f"5 sends took {took:.2f} s: they waited for the busy I/O thread"
    stored = {(m["queueId"], m["queueOffset"]): m for q in (0, 1) for m in read_queue(broker, "lone", q)}
    for r, body in [(first, "route fetched"), *((r, f"m{i}") for i, r in enumerate(results))]:
        assert stored[(r.queue_id, r.queue_offset)]["body"] == body
    m = stored[(1, keyed.queue_offset)]
    assert keyed.queue_id == 1 and m["body"] == "with fields" and m["tags"] == "t" and m["keys"] == ["k1"]
    assert len({(r.queue_id, r.queue_offset) for r in results}) == 5


def _keys_held(broker: str) -> float:
    """The broker's idempotency table size (`ledgermq_idempotency_keys`)."""
    text = httpx.get(f"http://{broker}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ledgermq_idempotency_keys{"))


def test_every_path_of_the_producer_gives_each_message_its_own_key(single):
    """Blocking sends (on the caller's thread and through the I/O thread), `send_async` batches
    (their keys sent as one run) and `send_batch`: the broker's key table grows by one key a
    message, so a retry of any of them is answered instead of stored again."""
    _, ns, broker = single
    create(broker, ns, "every-path", 2)
    before = _keys_held(broker)
    with Producer(ns) as p:
        p.send("every-path", "route fetched")
        p.send("every-path", "direct")
        futures = [p.send_async("every-path", f"b{i}") for i in range(50)]
        [f.result(10) for f in futures]
        p.send_batch("every-path", ["x", "y", "z"])
    deadline = time.monotonic() + 5
    while _keys_held(broker) - before < 55 and time.monotonic() < deadline:
        time.sleep(0.05)  # the dispatcher remembers them just after the answers
    assert _keys_held(broker) - before == 55


def test_a_send_stays_behind_the_producers_unresolved_messages(single):
    """100 `send_async`s still waiting for the I/O thread (held busy for 1 s), then a blocking
    send to the same queue: it is stored after all of them, not ahead of them on the direct path."""
    _, ns, broker = single
    create(broker, ns, "behind", 1)
    with Producer(ns) as p:
        p.send("behind", "warm")
        p._loop.call_soon_threadsafe(time.sleep, 1.0)
        futures = [p.send_async("behind", f"a{i}", queue_id=0) for i in range(100)]
        last = p.send("behind", "last", queue_id=0)
        offsets = [f.result(10).queue_offset for f in futures]
    assert last.queue_offset > max(offsets)
    bodies = [m["body"] for m in read_queue(broker, "behind", 0)]
    assert bodies == ["warm", *(f"a{i}" for i in range(100)), "last"]


def test_blocking_sends_from_many_threads_each_get_their_own_result(single):
    """Eight threads sending at once: one at a time may take the direct path, the others are
    batched; every send returns the offset its message was stored at, each thread's messages in
    its order."""
    _, ns, broker = single
    create(broker, ns, "threads", 1)
    results: dict[int, list] = {}
    with Producer(ns) as p:
        p.send("threads", "warm")

        def sender(t: int) -> None:
            results[t] = [p.send("threads", f"t{t}-{i}", queue_id=0) for i in range(200)]

        threads = [threading.Thread(target=sender, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
    stored = {m["queueOffset"]: m["body"] for m in read_queue(broker, "threads", 0)}
    assert len(stored) == 1 + 8 * 200
    for t, res in results.items():
        offsets = [r.queue_offset for r in res]
        assert offsets == sorted(offsets), f"thread {t}: stored out of its send order"
        assert [stored[o] for o in offsets] == [f"t{t}-{i}" for i in range(200)]


@pytest.mark.slow
def test_master_sigkill_under_blocking_sends_loses_no_returned_send_and_stores_none_twice(tmp_path):
    """One thread in a `send` loop while the master is killed and restarted: every send that
    returned is stored at the offset it returned, none twice; a send that raised anything but
    `SendOutcomeUnknownError` is not stored."""
    outcomes: dict[str, object] = {}

    def produce(ns: str, stop: threading.Event) -> None:
        with Producer(ns, send_timeout_s=10) as p:
            i = 0
            while not stop.is_set():
                body = f"m{i}"
                try:
                    outcomes[body] = p.send("killed-sync", body)
                except LedgerMQError as exc:
                    outcomes[body] = exc
                i += 1

    stored = produce_across_master_sigkill(tmp_path, "killed-sync", produce, 3, 9)
    returned = check_outcomes(outcomes, stored)
    last = max(int(b[1:]) for b in outcomes)
    tail = [outcomes[f"m{i}"] for i in range(last - 99, last + 1)]
    assert not any(isinstance(o, LedgerMQError) for o in tail), "sends still failing after the failover"
    assert returned > 1000, f"only {returned} sends returned"
