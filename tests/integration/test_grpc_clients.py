"""The official RocketMQ 5 clients against LedgerMQ's gRPC endpoint, unchanged, on a real name
server + 3-member DLedger set (one set for the whole module): Python 5.1.2 (this venv), Python
5.1.1 (its own cached venv: its startup waits for the server's Settings) and Node.js 1.0.8."""

from __future__ import annotations

import importlib.metadata
import io
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

from broker.grpc.convert import duration
from broker.grpc.protocol import Code, pb, spb, spb_grpc
from client.admin import Admin
from client.consumer import SimpleConsumer as HttpSimpleConsumer
from client.mqadmin import main as mqadmin
from client.producer import Producer as HttpProducer
from tests.integration._grpc_harness import (
    NODE_DIR,
    SCRIPTS,
    GrpcSet,
    grpc_set,
    node_client,
    python_client,
    run_client,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> GrpcSet:
    with grpc_set(tmp_path_factory.mktemp("grpc-clients")) as s:
        yield s


def config(cluster: GrpcSet) -> ClientConfiguration:
    return ClientConfiguration(cluster.access_points, Credentials(), request_timeout=5)


def message(
    topic: str, body: bytes, tag: str | None = None, keys: str | None = None, **props: str
) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag is not None:
        m.tag = tag
    if keys is not None:
        m.keys = keys
    for k, v in props.items():
        m.add_property(k, v)
    return m


def receive_all(consumer: SimpleConsumer, n: int, invisible_s: int = 30, timeout_s: float = 60) -> list:
    out: dict[str, object] = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        for m in consumer.receive(32, invisible_s):
            out[m.message_id] = m
    return list(out.values())


def test_producer_500_then_simple_consumer_acks_all(cluster: GrpcSet) -> None:
    """500 sends with tags, keys and user properties (and 50 of another tag among them); a simple
    consumer filtering on the tag receives all 500 with the same ids, tags, keys, properties and
    bodies and none of the others, acks them, and then finds nothing."""
    topic = "grpc-500"
    cluster.create_topic(topic)
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    sent, other = {}, set()
    try:
        for i in range(500):
            receipt = producer.send(message(topic, f"m-{i}".encode(), "TagA", f"k{i}", seq=str(i)))
            sent[receipt.message_id] = i
            if i % 10 == 0:
                other.add(producer.send(message(topic, f"b-{i}".encode(), "TagB", f"b{i}")).message_id)
    finally:
        producer.shutdown()
    assert len(sent) == 500 and len(other) == 50
    consumer = SimpleConsumer(config(cluster), "g-500", {topic: FilterExpression("TagA")}, await_duration=5)
    consumer.startup()
    try:
        got = receive_all(consumer, 500)
        assert {m.message_id for m in got} == set(sent)
        for m in got:
            i = sent[m.message_id]
            assert (m.body, m.tag, m.keys, m.properties) == (
                f"m-{i}".encode(),
                "TagA",
                {f"k{i}"},
                {"seq": str(i)},
            )
            assert m.delivery_attempt == 1 and m.topic == topic and m.born_host
        for m in got:
            consumer.ack(m)
        assert consumer.receive(32, 30) == []
    finally:
        consumer.shutdown()


def test_invisibility_new_handle_acks_and_unacked_comes_back(cluster: GrpcSet) -> None:
    """change_invisible_duration gives a new handle that acks; a message never acked comes back
    after its invisible time with delivery attempt 2."""
    topic = "grpc-invisible"
    cluster.create_topic(topic, queues=1)
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    try:
        ids = [producer.send(message(topic, f"x{i}".encode())).message_id for i in range(2)]
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(cluster), "g-inv", {topic: FilterExpression()}, await_duration=3)
    consumer.startup()
    try:
        first = {m.message_id: m for m in receive_all(consumer, 2, invisible_s=2)}
        assert set(first) == set(ids)
        keep, drop = first[ids[0]], first[ids[1]]
        old_handle = keep.receipt_handle
        consumer.change_invisible_duration(keep, 30)
        assert keep.receipt_handle != old_handle
        consumer.ack(keep)
        again = receive_all(consumer, 1, invisible_s=30, timeout_s=20)
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(drop.message_id, 2)]
        consumer.ack(again[0])
        assert consumer.receive(32, 30) == []
    finally:
        consumer.shutdown()


def test_push_consumer_consumes_200_once(cluster: GrpcSet) -> None:
    """A push consumer (Settings handshake, QueryAssignment, auto-renewed invisibility) consumes
    200 messages, each once."""
    topic = "grpc-push"
    cluster.create_topic(topic)
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    try:
        ids = {producer.send(message(topic, f"p{i}".encode())).message_id for i in range(200)}
    finally:
        producer.shutdown()
    seen: list[str] = []

    class Listener(MessageListener):
        def consume(self, msg) -> ConsumeResult:
            seen.append(msg.message_id)
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(config(cluster), "g-push", Listener(), {topic: FilterExpression()})
    consumer.startup()
    try:
        deadline = time.monotonic() + 60
        while len(set(seen)) < 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # anything delivered twice would show up by now
    finally:
        consumer.shutdown()
    assert set(seen) == ids
    assert len(seen) == 200


def test_python_511_round_trip(cluster: GrpcSet) -> None:
    """Python client 5.1.1, whose startup blocks until the server answers its Settings."""
    topic = "grpc-py511"
    cluster.create_topic(topic)
    py = python_client("5.1.1")
    out = run_client([str(py), str(SCRIPTS / "py_roundtrip.py"), cluster.access_points, topic, "g-511", "50"])
    assert len(out["sent"]) == 50
    assert set(out["received"]) == set(out["sent"])
    for mid, i in out["sent"].items():
        got = out["received"][mid]
        assert got == {
            "body": f"py-{i}",
            "tag": "roundtrip",
            "keys": [f"key-{i}"],
            "seq": str(i),
            "attempt": 1,
        }


def test_node_round_trip_100(cluster: GrpcSet) -> None:
    node, why = node_client()
    if node is None:
        pytest.skip(why)
    topic = "grpc-node"
    cluster.create_topic(topic)
    # Node takes one access point (its gRPC target cannot list several): a slave's, which routes
    # the client to the master.
    slave = next(sid for sid in cluster.grpc if sid != cluster.master())
    out = run_client([node, str(NODE_DIR / "roundtrip.js"), cluster.grpc[slave], topic, "g-node", "100"])
    assert len(out["sent"]) == 100
    assert set(out["received"]) == set(out["sent"])
    for mid, i in out["sent"].items():
        got = out["received"][mid]
        assert got == {
            "body": f"node-{i}",
            "tag": "node",
            "keys": [f"node-key-{i}"],
            "seq": str(i),
            "attempt": 1,
        }


def test_messages_cross_protocols(cluster: GrpcSet) -> None:
    """Sent over gRPC, read by HTTP pull; sent over HTTP, received over gRPC."""
    topic = "grpc-cross"
    cluster.create_topic(topic, queues=1)
    master = cluster.http[cluster.master()]
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    try:
        mid = producer.send(message(topic, b"from-grpc", "T1", "k1", a="1")).message_id
    finally:
        producer.shutdown()
    pulled = httpx.get(f"http://{master}/topics/{topic}/queues/0/messages?offset=0", timeout=10).json()
    [m] = pulled["messages"]
    assert (m["body"], m["tags"], m["keys"], m["properties"]) == ("from-grpc", "T1", ["k1"], {"a": "1"})
    r = httpx.post(
        f"http://{master}/topics/{topic}/messages",
        json={"messages": [{"body": "from-http", "tags": "T2", "keys": ["k2"], "properties": {"b": "2"}}]},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    consumer = SimpleConsumer(config(cluster), "g-cross", {topic: FilterExpression()}, await_duration=3)
    consumer.startup()
    try:
        got = {m.body: m for m in receive_all(consumer, 2)}
        assert set(got) == {b"from-grpc", b"from-http"}
        assert got[b"from-grpc"].message_id == mid
        h = got[b"from-http"]
        assert (h.tag, h.keys, h.properties) == ("T2", {"k2"}, {"b": "2"})
        for m in got.values():
            consumer.ack(m)
    finally:
        consumer.shutdown()


def test_forward_to_dead_letter_queue(cluster: GrpcSet) -> None:
    """ForwardMessageToDeadLetterQueue (a FIFO push consumer giving up on a message) puts the
    received message into %DLQ%{group} and settles it."""
    topic = "grpc-dlq"
    cluster.create_topic(topic, queues=1)
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    try:
        mid = producer.send(message(topic, b"doomed")).message_id
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(cluster), "g-dlq", {topic: FilterExpression()}, await_duration=3)
    consumer.startup()
    try:
        [m] = receive_all(consumer, 1)
        with grpc.insecure_channel(cluster.grpc[cluster.master()]) as channel:
            reply = spb_grpc.MessagingServiceStub(channel).ForwardMessageToDeadLetterQueue(
                spb.ForwardMessageToDeadLetterQueueRequest(
                    group=pb.Resource(name="g-dlq"),
                    topic=pb.Resource(name=topic),
                    receipt_handle=m.receipt_handle,
                    message_id=mid,
                    delivery_attempt=1,
                    max_delivery_attempts=1,
                ),
                metadata=(("x-mq-client-id", "dlq-test"),),
                timeout=10,
            )
        assert reply.status.code == Code.OK, reply.status
        assert consumer.receive(32, 30) == []  # settled: not delivered again
    finally:
        consumer.shutdown()
    master = cluster.http[cluster.master()]
    dead = httpx.get(f"http://{master}/topics/%25DLQ%25g-dlq/queues/0/messages?offset=0", timeout=10).json()
    assert [d["body"] for d in dead["messages"]] == ["doomed"]


def test_a_slave_forwards_master_calls(cluster: GrpcSet) -> None:
    """A client whose route still names an old master (now a slave) keeps working: the slave
    passes sends, receives and acks to its master."""
    topic = "grpc-forward"
    cluster.create_topic(topic, queues=1)
    slave = next(sid for sid in cluster.grpc if sid != cluster.master())
    meta = (("x-mq-client-id", "forward-test"),)
    msg = pb.Message(
        topic=pb.Resource(name=topic),
        system_properties=pb.SystemProperties(message_id="0102FC000000016BC50B17DF61000000AA"),
        body=b"via-slave",
    )
    with grpc.insecure_channel(cluster.grpc[slave]) as channel:
        stub = spb_grpc.MessagingServiceStub(channel)
        sent = stub.SendMessage(spb.SendMessageRequest(messages=[msg]), metadata=meta, timeout=10)
        assert sent.status.code == Code.OK, sent.status
        req = spb.ReceiveMessageRequest(
            group=pb.Resource(name="g-forward"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
            batch_size=4,
            invisible_duration=duration(30_000),
            long_polling_timeout=duration(2_000),
        )
        replies = list(stub.ReceiveMessage(req, metadata=meta, timeout=10))
        [m] = [r.message for r in replies if r.WhichOneof("content") == "message"]
        assert (m.body, m.system_properties.message_id) == (
            b"via-slave",
            "0102FC000000016BC50B17DF61000000AA",
        )
        ack = stub.AckMessage(
            spb.AckMessageRequest(
                group=pb.Resource(name="g-forward"),
                topic=pb.Resource(name=topic),
                entries=[
                    spb.AckMessageEntry(
                        message_id=m.system_properties.message_id,
                        receipt_handle=m.system_properties.receipt_handle,
                    )
                ],
            ),
            metadata=meta,
            timeout=10,
        )
        assert ack.status.code == Code.OK, ack.status


def test_concurrent_sends_through_a_slave_each_get_their_own_answer(cluster: GrpcSet) -> None:
    """A slave passes concurrent sends of one client to its master together: each caller still
    gets the entry of its own message, one caller's refused message fails only that caller, and
    every accepted message is stored once."""
    topic = "grpc-forward-many"
    cluster.create_topic(topic, queues=1)
    slave = next(sid for sid in cluster.grpc if sid != cluster.master())
    meta = (("x-mq-client-id", "forward-many-test"),)

    def request(i: int, bad: bool = False) -> spb.SendMessageRequest:
        msg = pb.Message(
            topic=pb.Resource(name=topic),
            system_properties=pb.SystemProperties(message_id=f"0102FC000000016BC50B17DF6100{i:06X}"),
            user_properties={"UNIQ_KEY": "reserved"} if bad else {"i": str(i)},
            body=f"fwd-{i}".encode(),
        )
        return spb.SendMessageRequest(messages=[msg])

    bad = 17
    with grpc.insecure_channel(cluster.grpc[slave]) as channel:
        stub = spb_grpc.MessagingServiceStub(channel)
        calls = [stub.SendMessage.future(request(i, i == bad), metadata=meta, timeout=20) for i in range(60)]
        answers = [c.result() for c in calls]
    for i, a in enumerate(answers):
        if i == bad:
            assert Code.BAD_REQUEST <= a.status.code < Code.UNAUTHORIZED and not a.entries, a
            continue
        assert a.status.code == Code.OK, (i, a.status)
        [entry] = a.entries
        assert entry.message_id == f"0102FC000000016BC50B17DF6100{i:06X}"
    master = cluster.http[cluster.master()]
    page = httpx.get(
        f"http://{master}/topics/{topic}/queues/0/messages",
        params={"offset": 0, "maxMessages": 100},
        timeout=10,
    ).json()
    assert sorted(m["body"] for m in page["messages"]) == sorted(f"fwd-{i}" for i in range(60) if i != bad)


def _client_rows(namesrv: str, group: str) -> list[dict]:
    """`mqadmin clientList -g group --json`, decoded."""
    out = io.StringIO()
    assert mqadmin(["clientList", "-n", namesrv, "-g", group, "--json"], out=out) == 0
    return orjson.loads(out.getvalue())


def test_connected_grpc_clients_in_admin_api_and_mqadmin(cluster: GrpcSet) -> None:
    """A running simple consumer and producer show up — id, type, group, language, version — in
    the master's `GET /clients`, in the SDK's `Admin.client_list` and in `mqadmin clientList`
    beside an HTTP consumer of the same group (RocketMQ's console shows gRPC clients as offline);
    a shut-down client leaves the list at once."""
    topic = "grpc-admin"
    cluster.create_topic(topic)
    consumer = SimpleConsumer(config(cluster), "g-admin", {topic: FilterExpression()}, await_duration=1)
    consumer.startup()
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    master = cluster.http[cluster.master()]
    http_id = "http-consumer@admin-test"
    http_consumer = HttpSimpleConsumer("g-admin", topic, cluster.namesrv, client_id=http_id)
    try:
        assert http_consumer.receive(1) == []  # registers it, as any receive does
        deadline = time.monotonic() + 10
        mine: dict = {}
        while len(mine) < 2 and time.monotonic() < deadline:
            listed = httpx.get(f"http://{master}/clients", timeout=5).json()["clients"]
            grpc_ones = [c for c in listed if c["protocol"] == "gRPC"]
            mine = {c["clientType"]: c for c in grpc_ones if c["group"] in ("g-admin", topic)}
            time.sleep(0.1)
        assert set(mine) == {"SIMPLE_CONSUMER", "PRODUCER"}, listed
        c = mine["SIMPLE_CONSUMER"]
        assert (c["group"], c["topic"], c["protocol"], c["language"], c["version"]) == (
            "g-admin",
            topic,
            "gRPC",
            "PYTHON",
            "5.1.2",
        )
        assert mine["PRODUCER"]["group"] == topic
        with Admin(cluster.namesrv) as admin:  # the SDK, every member of every set
            assert c["clientId"] in {r["clientId"] for r in admin.client_list("g-admin")}
        out = io.StringIO()
        assert mqadmin(["clientList", "-n", cluster.namesrv, "-g", "g-admin", "--json"], out=out) == 0
        rows = {r["clientId"]: r for r in orjson.loads(out.getvalue())}
        fields = ("clientType", "group", "protocol", "language", "version")
        assert {k: rows[c["clientId"]][k] for k in fields} == {
            "clientType": "SIMPLE_CONSUMER",
            "group": "g-admin",
            "protocol": "gRPC",
            "language": "PYTHON",
            "version": "5.1.2",
        }
        assert rows[c["clientId"]]["addr"].startswith("127.0.0.1")
        assert rows[c["clientId"]]["brokers"] == ["broker-a"]  # one row, however many members saw it
        # The SDK's consumer says what it is (X-Client-Type) and which SDK (User-Agent).
        sdk = {k: rows[http_id][k] for k in fields}
        assert sdk == {
            "clientType": "SIMPLE_CONSUMER",
            "group": "g-admin",
            "protocol": "HTTP",
            "language": "PYTHON",
            "version": importlib.metadata.version("ledgermq"),
        }
        # An SDK producer is listed under its topic, as a RocketMQ 5 producer is.
        with HttpProducer(cluster.namesrv, client_id="http-producer@admin-test") as http_producer:
            http_producer.send(topic, "listed")
        producers = {r["clientId"]: r for r in _client_rows(cluster.namesrv, topic)}
        assert producers["http-producer@admin-test"]["clientType"] == "PRODUCER"
        assert producers["http-producer@admin-test"]["language"] == "PYTHON"
        # A refused produce (a topic name the broker refuses) lists nobody under that name.
        refused = httpx.post(
            f"http://{master}/topics/bad%20name/messages", json={"messages": [{"body": "x"}]},
            headers={"X-Client-Id": "refused@admin-test"}, timeout=5,
        )
        assert refused.status_code == 400, refused.text
        everyone = httpx.get(f"http://{master}/clients", timeout=5).json()["clients"]
        assert "refused@admin-test" not in {x["clientId"] for x in everyone}
        # The console command itself, every group: a plain table through a pipe.
        table = subprocess.run(
            [str(Path(sys.executable).with_name("mqadmin")), "clientList", "-n", cluster.namesrv],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.splitlines()
        header = "clientId clientType group topic protocol language version addr brokers"
        assert table[0].split() == header.split()
        listed_ids = {line.split()[0] for line in table[1:]}
        assert {c["clientId"], mine["PRODUCER"]["clientId"], http_id} <= listed_ids
    finally:
        http_consumer.close()
        consumer.shutdown()
        producer.shutdown()
    listed = httpx.get(f"http://{master}/clients", params={"group": "g-admin"}, timeout=5).json()["clients"]
    assert c["clientId"] not in {x["clientId"] for x in listed}
