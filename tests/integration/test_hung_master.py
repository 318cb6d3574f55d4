"""The SDK across a master that stops answering without closing its connections (SIGSTOP: a hung
process, or one cut off by a partition). The set elects another master within a second or two;
the clients must move to it instead of waiting out their request timeouts on the old one: a
producer's request unanswered for `client.sender.MASTER_WATCH_S` (1 s), and a consumer's for
`client.consumer.MASTER_WATCH_S` (3 s: a receive's long poll or a pull), has the set's master looked
up again and goes to the new one if the set elected another. Nothing is lost or stored twice."""

from __future__ import annotations

import collections
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from client import ConsumeResult, Producer, PushConsumer, SimpleConsumer
from client.consumer import PullConsumer
from tests.integration._ledgermq_procs import ProcessGroup, start_dledger_set, start_namesrv, wait_master
from tests.integration.test_batching_producer import create, read_queue

pytestmark = pytest.mark.slow


@pytest.fixture
def hung_set(tmp_path) -> Iterator[tuple[str, dict[str, str], Callable[[], str]]]:
    """(name server, {selfId: addr}, hang): a fresh 3-member set; `hang()` SIGSTOPs its master and
    waits until the others elect a new one, returning the new master's selfId. Every stopped
    process is continued before the set is stopped."""
    group = ProcessGroup(tmp_path)
    stopped: list[str] = []
    try:
        ns = start_namesrv(group, tmp_path)
        addrs = start_dledger_set(group, tmp_path, ns)
        wait_master(addrs, timeout_s=30)

        def hang() -> str:
            old = wait_master(addrs, timeout_s=30)
            group.procs[old].send_signal(signal.SIGSTOP)
            stopped.append(old)
            return wait_master(addrs, timeout_s=30, exclude={old})

        yield ns, addrs, hang
    finally:
        for name in stopped:
            group.procs[name].send_signal(signal.SIGCONT)
        group.stop_all()


def test_sends_move_to_the_new_master_while_the_old_one_hangs(hung_set):
    ns, addrs, hang = hung_set
    create(addrs[wait_master(addrs)], ns, "hung", 2)
    # request_timeout_s far above the watch: a send that waited for its request to time out on the
    # hung master would take 10 s or more.
    with Producer(ns, request_timeout_s=10) as p:
        p.send("hung", "before")  # route and connection to the master that will hang
        took: list[tuple[float, float]] = []  # (when, how long) of each blocking send
        futures = {}
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                p.send("hung", f"s{i}")
                took.append((started, time.monotonic() - started))
                futures[f"a{i}"] = p.send_async("hung", f"a{i}")
                i += 1
                time.sleep(0.002)

        th = threading.Thread(target=produce)
        th.start()
        try:
            time.sleep(1.0)
            hung_at = time.monotonic()
            new = hang()
            time.sleep(6.0)  # the old master still hung all along
            stop.set()
            th.join(60)
            assert not th.is_alive()
        finally:
            stop.set()
        p.flush(30)
    assert all(f.exception() is None for f in futures.values()), "every send_async succeeded"
    longest = max(d for _, d in took)
    assert longest < 5.0, f"a send waited {longest:.1f} s on the hung master (request_timeout_s=10)"
    after = [d for t, d in took if t >= hung_at + longest]
    assert len(after) > 100, f"sends kept going on the new master while the old one hung: {len(after)}"
    stored = [m["body"] for q in (0, 1) for m in read_queue(addrs[new], "hung", q)]
    sent = {"before"} | {f"s{i}" for i in range(len(took))} | set(futures)
    counts = collections.Counter(stored)
    missing, unexpected = sorted(sent - set(counts))[:5], sorted(set(counts) - sent)[:5]
    assert set(counts) == sent, f"missing {missing}, unexpected {unexpected}"
    assert max(counts.values()) == 1, "no message stored twice"


def test_consumers_long_polling_a_hung_master_move_to_the_new_one(hung_set):
    ns, addrs, hang = hung_set
    create(addrs[wait_master(addrs)], ns, "idle", 2)
    pushed: list[str] = []
    received: list[str] = []
    pulled: list[str] = []

    def on_message(msg) -> ConsumeResult:
        pushed.append(msg.body.decode())
        return ConsumeResult.SUCCESS

    stop = threading.Event()
    with (
        PushConsumer("push-g", "idle", on_message, ns) as _,
        SimpleConsumer("simple-g", "idle", ns) as simple,
        PullConsumer(ns) as puller,
    ):
        def simple_loop() -> None:
            while not stop.is_set():
                for m in simple.receive(32, wait_ms=20_000):
                    received.append(m.body.decode())
                    simple.ack(m)

        def pull_loop() -> None:
            for m in puller.iterate("idle", "pull-g", start="earliest", wait_ms=1000):
                pulled.append(m.body.decode())
                if stop.is_set():
                    return

        threads = [threading.Thread(target=loop, daemon=True) for loop in (simple_loop, pull_loop)]
        for t in threads:
            t.start()
        time.sleep(2.0)  # every consumer is now long-polling the idle topic's master
        hang()
        with Producer(ns) as p:
            sent = [f"m{i}" for i in range(50)]
            for body in sent:
                p.send("idle", body)
        deadline = time.monotonic() + 15  # the old code waited out its requests: 30 s and more
        while time.monotonic() < deadline and not set(sent) <= set(pushed) & set(received) & set(pulled):
            time.sleep(0.2)
        stop.set()
        assert set(sent) <= set(pushed), f"push consumer missed {len(set(sent) - set(pushed))} of 50"
        assert set(sent) <= set(received), f"simple consumer missed {len(set(sent) - set(received))} of 50"
        assert set(sent) <= set(pulled), f"pull iterator missed {len(set(sent) - set(pulled))} of 50"
        with Producer(ns) as p:  # wakes the pull iterator's thread so it sees `stop`
            p.send("idle", "last")
        for t in threads:
            t.join(30)
            assert not t.is_alive()
