"""A blocking client the program never closes is closed when the interpreter exits (the clients'
I/O threads are daemons: without that, a producer's `send_async`s not yet sent would vanish with
the process, and a consumer's coalesced acks with it). Each case is a real Python process against
a real name server and broker; an address that is not host:port fails at construction."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from client import Producer, PullConsumer, PushConsumer, SimpleConsumer
from tests.integration._ledgermq_procs import namesrv_and_broker, wait_http
from tests.integration.test_batching_producer import create, read_queue

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    with namesrv_and_broker(tmp_path_factory.mktemp("exit"), "broker-s") as (group, ns, broker):
        wait_http(f"http://{ns}/cluster", ok=lambda r: "broker-s" in r.json()["brokers"])
        yield group, ns, broker


def run_script(body: str, ns: str) -> subprocess.CompletedProcess[str]:
    """`body` as a fresh interpreter's whole program (NS bound to the name server); it ends
    without closing what it made."""
    code = f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nNS = {ns!r}\n" + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def one_queue_topic(broker: str, ns: str, topic: str, bodies: list[str]) -> None:
    create(broker, ns, topic, 1)
    with Producer(ns) as p:
        p.send_batch(topic, bodies)


def offsets(broker: str, group: str, topic: str) -> dict[int, int]:
    doc = httpx.get(f"http://{broker}/consumers/{group}/offsets", params={"topic": topic}, timeout=10).json()
    return {o["queueId"]: o["offset"] for o in doc["offsets"]}


def receive_within(ns: str, group: str, topic: str, n: int, seconds: float) -> list[str]:
    """The bodies of up to `n` messages `group` receives (and acks) within `seconds`."""
    rest: list[str] = []
    with SimpleConsumer(group, topic, ns) as c:
        deadline = time.monotonic() + seconds
        while len(rest) < n and time.monotonic() < deadline:
            got = c.receive(max_messages=32, wait_ms=1000)
            if got:
                c.ack(*got)
            rest += [m.text for m in got]
    return rest


def test_an_unclosed_producer_sends_what_it_was_given_before_the_process_exits(single):
    _, ns, broker = single
    create(broker, ns, "exit-produce", 2)
    done = run_script(
        """
        from client import Producer
        p = Producer(NS, linger_ms=200)
        p.send("exit-produce", "first")
        futures = [p.send_async("exit-produce", f"m{i}") for i in range(2000)]
        print("unresolved", sum(not f.done() for f in futures))
        """,
        ns,
    )
    assert int(done.stdout.split()[-1]) > 0  # the exit, not the script, had them sent
    assert "event=client_closed_at_exit client=Producer" in done.stderr
    bodies = [m["body"] for q in (0, 1) for m in read_queue(broker, "exit-produce", q)]
    assert sorted(bodies) == sorted(["first", *(f"m{i}" for i in range(2000))])


def test_an_async_producer_never_closed_sends_what_it_was_given_before_its_event_loop_ends(single):
    # asyncio.run cancels every task left once the program's coroutine returns: the producer's
    # requests in flight or not yet started among them, its batches not yet drained too.
    _, ns, broker = single
    create(broker, ns, "exit-async", 2)
    done = run_script(
        """
        import asyncio
        from client import AsyncProducer
        async def main():
            p = AsyncProducer(NS, linger_ms=200, batch_max_messages=100)
            await p.send("exit-async", "first")
            futures = [await p.send_async("exit-async", f"m{i}") for i in range(3000)]
            print("unresolved", sum(not f.done() for f in futures))
        asyncio.run(main())
        """,
        ns,
    )
    assert int(done.stdout.split()[-1]) > 0  # the loop's end, not the program, had them sent
    assert "event=producer_closed_at_loop_end" in done.stderr
    assert "Task was destroyed" not in done.stderr
    bodies = [m["body"] for q in (0, 1) for m in read_queue(broker, "exit-async", q)]
    assert sorted(bodies) == sorted(["first", *(f"m{i}" for i in range(3000))])  # each once


def test_a_dropped_idle_producer_lives_until_exit_and_many_are_reported(single):
    # Dropped unclosed clients keep their I/O threads: held until exit, not collected under their
    # running loop (asyncio's "Task was destroyed but it is pending!"), and their number is told.
    _, ns, broker = single
    create(broker, ns, "exit-dropped", 1)
    done = run_script(
        """
        import gc
        from client import Producer
        def handle_request(i):
            Producer(NS).send("exit-dropped", f"d{i}")  # a producer per request, never closed
        for i in range(64):
            handle_request(i)
        gc.collect()
        print("sent")
        """,
        ns,
    )
    assert "Task was destroyed" not in done.stderr
    assert "event=many_unclosed_clients count=64" in done.stderr
    assert done.stderr.count("event=client_closed_at_exit client=Producer") == 64
    stored = [m["body"] for m in read_queue(broker, "exit-dropped", 0)]
    assert sorted(stored) == sorted(f"d{i}" for i in range(64))


def test_an_unclosed_simple_consumer_sends_its_queued_acks_and_gives_back_what_it_received_ahead(single):
    _, ns, broker = single
    one_queue_topic(broker, ns, "exit-simple", [f"s{i}" for i in range(100)])
    run_script(
        """
        from client import SimpleConsumer
        c = SimpleConsumer("exit-simple-g", "exit-simple", NS)
        got = c.receive(max_messages=10, wait_ms=5000, invisible_ms=60000)
        c.ack_async(*got)
        print(len(got))
        """,
        ns,
    )
    assert offsets(broker, "exit-simple-g", "exit-simple")[0] == 10  # the ten acks went out
    # Received ahead but never handed out: visible again at once, not after the 60 s.
    rest = receive_within(ns, "exit-simple-g", "exit-simple", 90, 20)
    assert sorted(rest) == sorted(f"s{i}" for i in range(10, 100))


def test_an_async_simple_consumer_never_closed_sends_its_acks_and_gives_back_what_it_received_ahead(single):
    _, ns, broker = single
    one_queue_topic(broker, ns, "exit-asimple", [f"s{i}" for i in range(100)])
    done = run_script(
        """
        import asyncio
        from client import AsyncSimpleConsumer
        async def main():
            c = AsyncSimpleConsumer("exit-asimple-g", "exit-asimple", NS, receive_ahead=True)
            got = await c.receive(max_messages=10, wait_ms=5000, invisible_ms=60000)
            for m in got:
                c.ack_async(m)  # coalesced: still waiting when main returns
            print(len(got))
        asyncio.run(main())
        """,
        ns,
    )
    assert "event=simple_consumer_closed_at_loop_end" in done.stderr
    assert offsets(broker, "exit-asimple-g", "exit-asimple")[0] == 10  # the ten acks went out
    # Received ahead but never handed out: visible again at once, not after the 60 s.
    rest = receive_within(ns, "exit-asimple-g", "exit-asimple", 90, 20)
    assert sorted(rest) == sorted(f"s{i}" for i in range(10, 100))


@pytest.mark.parametrize("turns", [1, 3])
def test_a_receive_ahead_on_the_wire_when_the_loop_ends_gives_back_what_the_broker_handed_it(single, turns):
    # asyncio.run cancels the receive sent ahead a few loop turns after it left: the broker has
    # handed it the next messages by then. Its answer is still read, and they are given back.
    _, ns, broker = single
    topic = f"exit-wire{turns}"
    one_queue_topic(broker, ns, topic, [f"w{i}" for i in range(100)])
    done = run_script(
        f"""
        import asyncio
        from client import AsyncSimpleConsumer
        async def main():
            c = AsyncSimpleConsumer("{topic}-g", "{topic}", NS, receive_ahead=True)
            got = await c.receive(max_messages=10, wait_ms=5000, invisible_ms=60000)
            for m in got:
                c.ack_async(m)
            for _ in range({turns}):
                await asyncio.sleep(0)
        asyncio.run(main())
        """,
        ns,
    )
    assert "event=simple_consumer_closed_at_loop_end" in done.stderr
    assert offsets(broker, f"{topic}-g", topic)[0] == 10
    # Visible again at once, not after the 60 s.
    assert sorted(receive_within(ns, f"{topic}-g", topic, 90, 20)) == sorted(f"w{i}" for i in range(10, 100))


def test_a_receive_ahead_long_polling_when_the_loop_ends_is_hung_up_on_and_takes_nothing(single):
    _, ns, broker = single
    one_queue_topic(broker, ns, "exit-poll", [f"p{i}" for i in range(10)])
    started = time.monotonic()
    run_script(
        """
        import asyncio
        from client import AsyncSimpleConsumer
        async def main():
            c = AsyncSimpleConsumer("exit-poll-g", "exit-poll", NS, receive_ahead=True)
            got = await c.receive(max_messages=10, wait_ms=20000, invisible_ms=60000)
            for m in got:
                c.ack_async(m)
            await asyncio.sleep(0.2)  # the receive ahead long-polls the drained queue
        asyncio.run(main())
        """,
        ns,
    )
    assert time.monotonic() - started < 10  # hung up on, not waited for up to its 20 s
    with Producer(ns) as p:
        p.send_batch("exit-poll", [f"q{i}" for i in range(5)])
    # The broker handed the hung-up receive nothing: the new messages are not invisible for 60 s.
    assert sorted(receive_within(ns, "exit-poll-g", "exit-poll", 5, 10)) == [f"q{i}" for i in range(5)]


def test_an_unclosed_pull_consumer_commits_up_to_the_message_in_hand_not_past_it(single):
    _, ns, broker = single
    one_queue_topic(broker, ns, "exit-pull", [f"p{i}" for i in range(50)])
    run_script(
        """
        from client import PullConsumer
        c = PullConsumer(NS)
        it = c.iterate("exit-pull", "exit-pull-g", start="earliest", commit_interval_ms=3_600_000)
        for m in it:
            if m.queue_offset == 20:
                break  # as if the program died handling p20
        """,
        ns,
    )
    assert offsets(broker, "exit-pull-g", "exit-pull")[0] == 20
    with PullConsumer(ns) as c:
        first = next(iter(c.iterate("exit-pull", "exit-pull-g")))
    assert first.text == "p20"


def test_an_async_pull_iterator_never_closed_commits_up_to_the_message_in_hand_as_its_loop_ends(single):
    _, ns, broker = single
    one_queue_topic(broker, ns, "exit-apull", [f"p{i}" for i in range(50)])
    done = run_script(
        """
        import asyncio
        from client import AsyncPullConsumer
        async def main():
            c = AsyncPullConsumer(NS)
            it = await c.iterate("exit-apull", "exit-apull-g", start="earliest", commit_interval_ms=3_600_000)
            async for m in it:
                if m.queue_offset == 20:
                    break  # as if the program died handling p20
        asyncio.run(main())
        """,
        ns,
    )
    assert "event=pull_iterator_closed_at_loop_end" in done.stderr
    assert offsets(broker, "exit-apull-g", "exit-apull")[0] == 20


def test_an_unclosed_push_consumer_lets_its_running_handler_finish_and_acks_it(single):
    _, ns, broker = single
    one_queue_topic(broker, ns, "exit-push", ["slow"])
    done = run_script(
        """
        import threading, time
        from client import ConsumeResult, PushConsumer
        started = threading.Event()
        def handle(m):
            started.set()
            time.sleep(2)  # still running when the program ends
            print("handled", m.text, flush=True)
            return ConsumeResult.SUCCESS
        c = PushConsumer("exit-push-g", "exit-push", handle, NS, invisible_ms=60000, wait_ms=2000)
        c.start()
        assert started.wait(30)
        """,
        ns,
    )
    assert "handled slow" in done.stdout
    assert offsets(broker, "exit-push-g", "exit-push")[0] == 1


def test_an_address_that_is_not_host_port_fails_at_construction():
    """The mistake is named at once (not an unreachable server on the first send), and the
    refused client leaves no I/O thread behind."""
    threads = threading.active_count()
    with pytest.raises(ValueError, match=r"'no-port'.*no port"):
        Producer("no-port")
    with pytest.raises(ValueError, match="'h:99999'"):
        PullConsumer("h:99999")
    with pytest.raises(ValueError, match=r"'not an address'.*no host"):
        SimpleConsumer("g", "t", "not an address")
    with pytest.raises(ValueError, match=r"'127\.0\.0\.1:x'"):
        PushConsumer("g", "t", lambda m: True, "127.0.0.1:x")
    assert threading.active_count() == threads
