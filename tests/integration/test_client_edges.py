"""SDK edge cases against a real name server and a real broker container (broker-c1 and broker-c2,
two local-mode broker sets whose commit logs both start at offset 0): names that need
percent-escaping, message ids that two brokers share an offset of, resending a Message object,
per-message queue ids in a batch, and ack/nack across broker sets."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from client import (
    Admin,
    AsyncPullConsumer,
    AsyncSimpleConsumer,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    SimpleConsumer,
)
from client.admin import AsyncAdmin
from client.errors import (
    BadRequestError,
    BrokerUnreachableError,
    InvalidTopicError,
    MessageNotFoundError,
    QueueNotExistError,
    ServerError,
    TopicNotExistError,
)
from client.producer import AsyncProducer
from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_namesrv, wait_http, write_conf
from tests.ports import free_port

BROKERS = ("broker-c1", "broker-c2")


def _start_container(group: ProcessGroup, workdir: Path, ns: str) -> dict[str, str]:
    """broker-c1 and broker-c2 in one container process; returns {brokerName: host:port}.
    maxReconsumeTimes=0: a message given back once goes to the DLQ on its next delivery."""
    addrs, paths = {}, []
    for name in BROKERS:
        port = free_port()
        addrs[name] = f"127.0.0.1:{port}"
        paths.append(
            write_conf(
                CONF / "container" / f"{name}.conf",
                workdir / f"{name}.conf",
                {
                    "listenPort": str(port),
                    "storePathRootDir": str(workdir / f"store-{name}"),
                    "maxReconsumeTimes": "0",
                    "grpcServerPort": "0",
                },
            )
        )
    cport = free_port()
    conf = write_conf(
        CONF / "container" / "broker-container.conf",
        workdir / "container.conf",
        {
            "listenHost": "127.0.0.1",
            "listenPort": str(cport),
            "namesrvAddr": ns,
            "brokerConfigPaths": ":".join(p.name for p in paths),
        },
    )
    proc = group.start("container", "broker.container", "-c", str(conf))
    for addr in addrs.values():
        wait_http(f"http://{addr}/health", proc=proc, timeout_s=20)
    return addrs


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("client-edges")
    group = ProcessGroup(workdir)
    try:
        ns = start_namesrv(group, workdir)
        addrs = _start_container(group, workdir, ns)
        # The first message of each commit log: both at physical offset 0, so their ids differ
        # only in the store host.
        seeds = {}
        for name, addr in addrs.items():
            r = httpx.post(
                f"http://{addr}/topics/seed/messages", json={"messages": [{"body": f"seed-{name}"}]}
            )
            assert r.status_code == 200, r.text
            seeds[name] = r.json()["results"][0]["msgId"]
        yield {"ns": ns, "addrs": addrs, "seeds": seeds}
    finally:
        group.stop_all()


def wait_until(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """Poll `check` until it returns something truthy (and return that)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def create_topic(env: dict[str, Any], topic: str, queues: int, broker_name: str | None = None) -> None:
    """Create `topic` (on one broker set or both) and wait until the name server routes it there."""
    with Admin(env["ns"]) as admin:
        admin.update_topic(topic, queues, queues, broker_name=broker_name)
    want = {broker_name} if broker_name else set(BROKERS)

    def routed() -> bool:
        from urllib.parse import quote

        r = httpx.get(f"http://{env['ns']}/routes/{quote(topic, safe='')}")
        return r.status_code == 200 and {b["brokerName"] for b in r.json()["brokers"]} == want

    wait_until(routed)


# -- 1. names are percent-escaped in URLs -------------------------------------------------------
def test_names_with_percent_and_hex_digits_reach_the_broker_unchanged(env):
    topic, group = "pct%41-%de", "grp%41%2F"  # unescaped, '%41' would arrive as 'A', '%de' as a byte
    create_topic(env, topic, 1, "broker-c1")
    with Admin(env["ns"]) as admin:
        assert topic in admin.topic_list()
        assert "pctA-%de" not in admin.topic_list()
        with Producer(env["ns"]) as p:
            sent = p.send(topic, "hello")
        assert sent.broker_name == "broker-c1"
        with PullConsumer(env["ns"]) as c:
            got = c.pull(topic, 0, 0)
            assert [(m.topic, m.body) for m in got.messages] == [(topic, b"hello")]
            c.commit_offset(group, topic, {0: 1})
            assert c.committed_offsets(group, topic) == {0: 1}
        rows = admin.consumer_progress(group, topic)
        assert [(r["brokerName"], r["offset"], r["lag"]) for r in rows if r["topic"] == topic] == [
            ("broker-c1", 1, 0)
        ]
        assert [r["maxOffset"] for r in admin.topic_status(topic)] == [1]
        assert admin.query_msg_by_id(sent.msg_id)["topic"] == topic
        assert admin.delete_topic(topic) == ["broker-c1"]


def test_a_nacked_message_is_pulled_back_from_the_dead_letter_topic(env):
    # maxReconsumeTimes=0: nacked once, the next delivery moves it to %DLQ%default ('%de' inside).
    topic = "dlq-src"
    create_topic(env, topic, 1, "broker-c1")
    with Producer(env["ns"]) as p:
        sent = p.send(topic, "to-the-dlq")
    with SimpleConsumer("default", topic, env["ns"], invisible_ms=5000) as sc:
        (msg,) = wait_until(lambda: sc.receive(wait_ms=1000))
        assert msg.msg_id == sent.msg_id
        assert sc.nack(msg)["results"][0]["status"] == "OK"
        assert sc.receive(wait_ms=200) == []
    with PullConsumer(broker_addr=env["addrs"]["broker-c1"]) as c:
        got = wait_until(lambda: c.pull("%DLQ%default", 0, 0).messages)
    assert [(m.topic, m.body) for m in got] == [("%DLQ%default", b"to-the-dlq")]


def test_a_malformed_topic_name_is_a_bad_request_not_an_unreachable_name_server(env):
    # The name server refuses a 300-character name (400): that is not "no name server answered".
    with Producer(env["ns"]) as p, pytest.raises(BadRequestError):
        p.send("t" * 300, "x")
    with PullConsumer(env["ns"]) as c, pytest.raises(BadRequestError):
        c.queues("t" * 300)


def test_a_callers_mistakes_get_errors_that_name_them(env):
    """What a first program gets wrong is named by the SDK before (or instead of) a confusing
    answer: a body that is not bytes or text, an empty topic, a queue the topic does not have, an
    ack of something that was not received, a push consumer that can never consume. RocketMQ's
    space-separated keys string is taken as its keys."""
    create_topic(env, "mistakes", 2, "broker-c1")
    with Producer(env["ns"]) as p:
        for body in ({"a": 1}, 5, None):
            with pytest.raises(TypeError, match=f"body is bytes or str, got {type(body).__name__}"):
                p.send("mistakes", body)
        with pytest.raises(InvalidTopicError, match="non-empty string"):
            p.send("", "x")
        with pytest.raises(QueueNotExistError, match="queue 7 does not exist: topic 'mistakes' has 2 write"):
            p.send("mistakes", "x", queue_id=7)
        sent = p.send("mistakes", bytearray(b"from a bytearray"), keys="k1 k2", queue_id=0)
    with PullConsumer(env["ns"]) as c:
        (m,) = c.pull("mistakes", 0, sent.queue_offset, broker_name="broker-c1").messages
    assert (m.body, m.keys) == (b"from a bytearray", ["k1", "k2"])
    with SimpleConsumer("g-mistakes", "mistakes", env["ns"]) as sc:
        with pytest.raises(TypeError, match="expected a ReceivedMessage"):
            sc.ack("a receipt handle as a string")
        with pytest.raises(TypeError, match="expected a ReceivedMessage"):
            sc.ack_async(m.msg_id)
    with pytest.raises(TypeError, match="listener must be callable"):
        PushConsumer("g-mistakes", "mistakes", "handle", env["ns"])
    for kw, name in (({"consume_thread_count": 0}, "consume_thread_count"),
                     ({"invisible_ms": 10}, "invisible_ms"), ({"receive_batch": 5000}, "receive_batch")):
        with pytest.raises(ValueError, match=f"{name} must be an integer in"):
            PushConsumer("g-mistakes", "mistakes", lambda msg: None, env["ns"], **kw)


# -- 2. query by message id picks the broker the id names ---------------------------------------
def test_query_msg_by_id_answers_from_the_broker_set_named_by_the_id(env):
    c1, c2 = env["seeds"]["broker-c1"], env["seeds"]["broker-c2"]
    assert c1[16:] == c2[16:] and c1 != c2  # same commit-log offset, different store host
    with Admin(env["ns"]) as admin:
        for name in BROKERS:
            doc = admin.query_msg_by_id(env["seeds"][name].lower())
            assert (doc["brokerName"], doc["body"], doc["msgId"]) == (
                name,
                f"seed-{name}",
                env["seeds"][name],
            )
        # Not an offset id: a client's message id, which no broker knows here.
        with pytest.raises(MessageNotFoundError):
            admin.query_msg_by_id("not-a-message-id")
        # Neither an offset id nor any client's id (over 128 characters).
        with pytest.raises(BadRequestError):
            admin.query_msg_by_id("x" * 129)


class _StubBroker:
    """An HTTP server answering every GET with 200 and `body` as JSON: stands in for broker
    answers a current broker no longer gives (no real process can be made to answer so)."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def prefix_broker(env) -> Iterator[_StubBroker]:
    """A broker as it answered before GET /messages/{msgId} checked the id's store host: any id
    with broker-c1's seed offset gets broker-c1's seed message, whatever host the id names."""
    c1 = env["addrs"]["broker-c1"]
    answer = httpx.get(f"http://{c1}/messages/{env['seeds']['broker-c1']}").content
    stub = _StubBroker(answer)
    try:
        yield stub
    finally:
        stub.stop()


async def test_query_msg_by_id_never_returns_a_message_with_another_id(env, prefix_broker):
    c2_addr, c2_id = env["addrs"]["broker-c2"], env["seeds"]["broker-c2"]
    # The old broker is listed first: scanning in order would return broker-c1's message.
    admin = AsyncAdmin(broker_addr=[prefix_broker.addr, c2_addr])
    try:
        doc = await admin.query_msg_by_id(c2_id)
        assert (doc["msgId"], doc["body"]) == (c2_id, "seed-broker-c2")
        # An id naming no listed broker: scanned, and the old broker's other message is refused.
        unknown_host = "0A000001" + "00000001" + c2_id[16:]
        with pytest.raises(MessageNotFoundError):
            await admin.query_msg_by_id(unknown_host)
    finally:
        await admin.close()


# -- 3. resending a Message object; per-message queue ids -------------------------------------
def test_resending_the_same_message_object_stores_it_again(env):
    topic = "resend"
    create_topic(env, topic, 2, "broker-c2")
    msg = Message(body="again", tags="A", queue_id=1)
    with Producer(env["ns"]) as p:
        first = p.send(topic, msg)
        second = p.send(topic, msg)
        third = p.send_batch(topic, [msg])[0]
        tagged = p.send(topic, msg, tags="B")
        keyed = Message(body="once", queue_id=1, idempotency_key="caller-key")
        once = [p.send(topic, keyed), p.send(topic, keyed)]
    assert [r.queue_offset for r in (first, second, third, tagged)] == [0, 1, 2, 3]
    assert (msg.idempotency_key, msg.tags) == (None, "A")  # the caller's object is not changed
    assert once[0] == once[1] and once[0].queue_offset == 4  # a caller's own key still dedups
    with PullConsumer(env["ns"]) as c:
        got = c.pull(topic, 1, 0).messages
    assert [(m.body, m.tags) for m in got] == [(b"again", "A")] * 3 + [(b"again", "B"), (b"once", None)]


async def test_async_resend_and_a_batch_keeps_each_message_queue_id(env):
    topic = "batch-queues"
    await asyncio.to_thread(create_topic, env, topic, 4, "broker-c1")
    msg = Message(body="same")
    async with AsyncProducer(env["ns"]) as p:
        a = await p.send(topic, msg, queue_id=0)
        b = await p.send(topic, msg, queue_id=0)
        batch = await p.send_batch(
            topic,
            [Message(body="q2", queue_id=2), Message(body="q3", queue_id=3), Message(body="q2b", queue_id=2)],
        )
    assert (a.queue_offset, b.queue_offset, msg.queue_id) == (0, 1, None)
    assert [(r.queue_id, r.queue_offset) for r in batch] == [(2, 0), (3, 0), (2, 1)]
    async with AsyncPullConsumer(env["ns"]) as c:
        q2 = (await c.pull(topic, 2, 0)).messages
        q3 = (await c.pull(topic, 3, 0)).messages
    assert [m.body for m in q2] == [b"q2", b"q2b"] and [m.body for m in q3] == [b"q3"]


# -- 4. ack / nack across broker sets -----------------------------------------------------------
def _receive_from_both(receive: Callable[[], list[Any]], n: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while len(got) < n or {m.broker_name for m in got} != set(BROKERS):
        assert time.monotonic() < deadline, f"received {[(m.broker_name, m.text) for m in got]}"
        got += receive()
    return got


def test_ack_and_nack_over_two_broker_sets_answer_every_message_in_order(env):
    topic = "settle-both"
    create_topic(env, topic, 1)
    with Producer(env["ns"]) as p:
        for i in range(4):
            p.send(topic, f"m{i}")
    with SimpleConsumer("settle-g", topic, env["ns"], invisible_ms=10_000) as sc:
        got = _receive_from_both(lambda: sc.receive(max_messages=8, wait_ms=200), 4)
        by_set = {name: [m for m in got if m.broker_name == name] for name in BROKERS}
        order = [
            by_set["broker-c2"][0],
            by_set["broker-c1"][0],
            *by_set["broker-c2"][1:],
            *by_set["broker-c1"][1:],
        ]
        nacked = sc.nack(*order[:2])["results"]
        assert [r["receiptHandle"] for r in nacked] == [m.receipt_handle for m in order[:2]]
        assert {r["status"] for r in nacked} == {"OK"}
        acked = sc.ack(*order[2:])["results"]
        assert [r["receiptHandle"] for r in acked] == [m.receipt_handle for m in order[2:]]
        assert {r["status"] for r in acked} == {"OK"}


async def test_async_ack_over_two_broker_sets_and_receive_rejects_a_zero_invisible_time(env):
    topic = "settle-async"
    await asyncio.to_thread(create_topic, env, topic, 1)
    async with AsyncProducer(env["ns"]) as p:
        for i in range(4):
            await p.send(topic, f"a{i}")
    async with AsyncSimpleConsumer("settle-ga", topic, env["ns"], invisible_ms=10_000) as sc:
        with pytest.raises(BadRequestError):
            await sc.receive(invisible_ms=0)  # not silently replaced by the default
        got: list[Any] = []
        deadline = time.monotonic() + 10
        while len(got) < 4:
            assert time.monotonic() < deadline
            got += await sc.receive(max_messages=8, wait_ms=200)
        got.sort(key=lambda m: (m.broker_name != "broker-c2", m.queue_offset))
        results = (await sc.ack(*got))["results"]
        assert [r["receiptHandle"] for r in results] == [m.receipt_handle for m in got]
        assert {r["status"] for r in results} == {"OK"}
        assert await sc.receive(wait_ms=0) == []


# -- other SDK fixes -----------------------------------------------------------------------------
def test_broker_addr_mode_lists_a_topics_queues_and_reset_offset_reports_a_missing_topic(env):
    topic = "static-queues"
    create_topic(env, topic, 3, "broker-c2")
    c2 = env["addrs"]["broker-c2"]
    with PullConsumer(broker_addr=c2) as c:
        assert [(q.broker_name, q.queue_id) for q in c.queues(topic)] == [
            (f"http://{c2}", i) for i in range(3)
        ]
        with pytest.raises(TopicNotExistError):
            c.queues("no-such-topic")
    with Admin(env["ns"]) as admin, pytest.raises(TopicNotExistError):
        admin.reset_offset_by_time("g", "no-such-topic", 0)


async def test_clients_raise_the_sdk_errors_for_an_unreachable_broker_or_a_garbled_answer(env):
    dead = f"127.0.0.1:{free_port()}"
    async with AsyncSimpleConsumer("g", "t", broker_addr=dead) as sc:
        with pytest.raises(BrokerUnreachableError):
            await sc.receive()
    async with AsyncAdmin(broker_addr=dead) as admin:
        with pytest.raises(BrokerUnreachableError):
            await admin.query_msg_by_id(env["seeds"]["broker-c1"])
    garbled = _StubBroker(b'{"topics": [')
    try:
        async with AsyncAdmin(broker_addr=garbled.addr) as admin:
            with pytest.raises(ServerError):
                await admin.topic_list()
    finally:
        garbled.stop()
