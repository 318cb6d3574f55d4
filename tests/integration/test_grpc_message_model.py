"""The message model through the gRPC endpoint with the official Python client 5.1.2, unchanged,
on a real name server + 3-member DLedger set (one for the module): FIFO topics and groups, delay
messages and their recall, transactions ended by the producer and checked back over its
Telemetry stream, tag and SQL92 filters, a consumer group's settings (fifo flag, retry policy).
The same services as HTTP's (tests/integration/test_message_model.py holds the failovers)."""

from __future__ import annotations

import threading
import time

import grpc
import httpx
import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import FilterType

from broker.grpc.convert import duration, timestamp
from broker.grpc.protocol import Code, pb, spb, spb_grpc
from tests.integration._grpc_harness import GrpcSet, grpc_set

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> GrpcSet:
    with grpc_set(
        tmp_path_factory.mktemp("grpc-model"),
        enablePropertyFilter="true",
        transactionTimeOut="3000",
        transactionCheckInterval="1000",
        transactionCheckMax="30",
    ) as s:
        yield s


def config(cluster: GrpcSet) -> ClientConfiguration:
    return ClientConfiguration(cluster.access_points, Credentials(), request_timeout=5)


def create_topic(cluster: GrpcSet, topic: str, message_type: str, queues: int = 4) -> None:
    master = cluster.http[cluster.master()]
    r = httpx.put(
        f"http://{master}/topics/{topic}",
        json={
            "readQueueNums": queues,
            "writeQueueNums": queues,
            "perm": 6,
            "attributes": {"message.type": message_type},
        },
        timeout=10,
    )
    assert r.status_code == 200, r.text
    cluster.wait_routed(topic)


def message(topic: str, body: bytes, tag: str | None = None, **props: str) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag is not None:
        m.tag = tag
    for k, v in props.items():
        m.add_property(k, v)
    return m


def receive_until(consumer: SimpleConsumer, n: int, timeout_s: float = 60, invisible_s: int = 30) -> list:
    got: dict[str, object] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        for m in consumer.receive(32, invisible_s):
            got[m.message_id] = m
            consumer.ack(m)
    return list(got.values())


def test_fifo_topic_groups_in_order_and_one_head_at_a_time(cluster: GrpcSet) -> None:
    """FIFO sends (message_group) land in their group's queue; a FIFO group's receive hands out
    a message group's next message only after its head is acked; other groups go on; every
    message comes with its group. A NORMAL message to a FIFO topic is refused by type."""
    topic = "grpc-fifo"
    create_topic(cluster, topic, "FIFO")
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    sent: dict[str, list[str]] = {f"g{j}": [] for j in range(5)}
    try:
        for i in range(20):
            for group, ids in sent.items():
                m = message(topic, f"{group}-{i}".encode())
                m.message_group = group
                ids.append(producer.send(m).message_id)
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(cluster), "g-fifo", {topic: FilterExpression()}, await_duration=3)
    consumer.startup()
    seen: dict[str, list[str]] = {g: [] for g in sent}
    try:
        deadline = time.monotonic() + 90
        while sum(map(len, seen.values())) < 100 and time.monotonic() < deadline:
            batch = consumer.receive(32, 30)
            groups = [m.message_group for m in batch]
            assert len(groups) == len(set(groups)), f"two heads of one group at once: {groups}"
            for m in batch:
                seen[m.message_group].append(m.message_id)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert seen == sent

    with grpc.insecure_channel(cluster.grpc[cluster.master()]) as channel:
        normal = pb.Message(
            topic=pb.Resource(name=topic),
            system_properties=pb.SystemProperties(
                message_id="0102FC0000000000000000000000000001", message_type=pb.NORMAL
            ),
            body=b"x",
        )
        resp = spb_grpc.MessagingServiceStub(channel).SendMessage(
            spb.SendMessageRequest(messages=[normal]), metadata=[("x-mq-client-id", "t")], timeout=10
        )
    assert resp.status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, resp.status


def test_delay_message_is_not_seen_before_its_time_and_a_recalled_one_never(cluster: GrpcSet) -> None:
    topic = "grpc-delay"
    create_topic(cluster, topic, "DELAY")
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    try:
        due_s = int(time.time()) + 4  # the 5.1.2 client sends delivery_timestamp in seconds
        kept = message(topic, b"kept")
        kept.delivery_timestamp = due_s
        kept_receipt = producer.send(kept)
        recalled = message(topic, b"recalled")
        recalled.delivery_timestamp = due_s
        receipt = producer.send(recalled)
        assert receipt.recall_handle
        assert producer.recall_message(topic, receipt.recall_handle) == receipt.message_id
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(cluster), "g-delay", {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        got = receive_until(consumer, 1, timeout_s=30)
        seen_at = time.time()
        assert [m.message_id for m in got] == [kept_receipt.message_id]
        assert seen_at >= due_s - 0.1, "delivered early"
        assert got[0].delivery_timestamp == due_s * 1000
        assert receive_until(consumer, 1, timeout_s=5) == []  # the recalled one never comes
    finally:
        consumer.shutdown()


class Checker(TransactionChecker):
    """Commits the transactions whose body says so, rolls back the rest; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, bytes]] = []
        self.lock = threading.Lock()

    def check(self, message: Message) -> TransactionResolution:
        with self.lock:
            self.asked.append((message.topic, message.message_id, message.body))
        return (
            TransactionResolution.COMMIT
            if message.body.startswith(b"commit")
            else TransactionResolution.ROLLBACK
        )


def test_transactions_end_by_the_producer_or_by_a_check_over_telemetry(cluster: GrpcSet) -> None:
    """Commit and rollback by the producer; two transactions left open are checked back over the
    producer's Telemetry stream (RecoverOrphanedTransactionCommand, the message under its real
    topic) and resolved by its checker. Consumers see exactly the committed ones."""
    topic = "grpc-tx"
    create_topic(cluster, topic, "TRANSACTION")
    checker = Checker()
    producer = Producer(config(cluster), (topic,), checker)
    producer.startup()
    try:
        ids = {}
        for body, end in (
            (b"by-producer-commit", "commit"),
            (b"by-producer-rollback", "rollback"),
            (b"commit-on-check", None),
            (b"rollback-on-check", None),
        ):
            tx = producer.begin_transaction()
            receipt = producer.send(message(topic, body), tx)
            assert receipt.transaction_id
            ids[body] = receipt.message_id
            if end == "commit":
                tx.commit()
            elif end == "rollback":
                tx.rollback()
        deadline = time.monotonic() + 30
        while len({a[1] for a in checker.asked}) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        asked = {mid for _, mid, _ in checker.asked}
        assert asked == {ids[b"commit-on-check"], ids[b"rollback-on-check"]}
        assert {t for t, _, _ in checker.asked} == {topic}
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(cluster), "g-tx", {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        got = receive_until(consumer, 2, timeout_s=30)
        assert sorted(m.body for m in got) == [b"by-producer-commit", b"commit-on-check"]
        assert receive_until(consumer, 1, timeout_s=3) == []
    finally:
        consumer.shutdown()


def test_tag_and_sql92_filters_on_receive(cluster: GrpcSet) -> None:
    topic = "grpc-filter"
    create_topic(cluster, topic, "NORMAL")
    producer = Producer(config(cluster), (topic,))
    producer.startup()
    try:
        for i in range(30):
            producer.send(message(topic, f"m{i}".encode(), "A" if i % 3 == 0 else "B", n=str(i)))
    finally:
        producer.shutdown()
    by_tag = SimpleConsumer(config(cluster), "g-tag", {topic: FilterExpression("A")}, await_duration=2)
    by_sql = SimpleConsumer(
        config(cluster),
        "g-sql",
        {topic: FilterExpression("n >= 20 AND TAGS = 'B'", FilterType.SQL)},
        await_duration=2,
    )
    by_tag.startup()
    by_sql.startup()
    try:
        tagged = receive_until(by_tag, 10, timeout_s=30)
        assert sorted(int(m.properties["n"]) for m in tagged) == list(range(0, 30, 3))
        assert receive_until(by_tag, 1, timeout_s=3) == []
        selected = receive_until(by_sql, 7, timeout_s=30)
        assert sorted(int(m.properties["n"]) for m in selected) == [20, 22, 23, 25, 26, 28, 29]
        assert receive_until(by_sql, 1, timeout_s=3) == []
    finally:
        by_tag.shutdown()
        by_sql.shutdown()


def test_consumer_settings_carry_the_groups_fifo_flag_and_retry_policy(cluster: GrpcSet) -> None:
    """The Telemetry answer to a consumer's Settings: fifo for a group on a FIFO topic, and the
    group's retry policy (admin API) as its backoff, attempts = retryMaxTimes + 1."""
    topic = "grpc-settings"
    create_topic(cluster, topic, "FIFO")
    master = cluster.master()
    r = httpx.put(
        f"http://{cluster.http[master]}/consumers/g-settings/config",
        json={
            "retryMaxTimes": 4,
            "retryPolicy": {"type": "EXPONENTIAL", "initialMs": 2000, "maxMs": 60000, "multiplier": 3},
        },
        timeout=10,
    )
    assert r.status_code == 200, r.text
    settings = pb.Settings(
        client_type=pb.SIMPLE_CONSUMER,
        subscription=pb.Subscription(
            group=pb.Resource(name="g-settings"),
            subscriptions=[
                pb.SubscriptionEntry(
                    topic=pb.Resource(name=topic), expression=pb.FilterExpression(type=pb.TAG, expression="*")
                )
            ],
            long_polling_timeout=duration(5000),
        ),
    )
    with grpc.insecure_channel(cluster.grpc[master]) as channel:
        stream = spb_grpc.MessagingServiceStub(channel).Telemetry(
            iter([spb.TelemetryCommand(settings=settings)]), metadata=[("x-mq-client-id", "t")], timeout=10
        )
        reply = next(iter(stream))
    assert reply.status.code == Code.OK, reply.status
    assert reply.settings.subscription.fifo is True
    backoff = reply.settings.backoff_policy
    assert backoff.max_attempts == 5
    assert backoff.WhichOneof("strategy") == "exponential_backoff"
    assert (
        backoff.exponential_backoff.initial.seconds,
        backoff.exponential_backoff.max.seconds,
        backoff.exponential_backoff.multiplier,
    ) == (2, 60, 3.0)


def test_end_transaction_and_recall_sent_to_a_slave_reach_the_master(cluster: GrpcSet) -> None:
    """Routes put some queue entries at the other members, so a client may end a transaction or
    recall a timer at a slave: the slave forwards both to the master, as it does a send. The
    message id a send answers finds the message over HTTP before delivery (HALF, SCHEDULED)
    and after (the delivered message)."""
    topic_tx, topic_delay = "grpc-slave-tx", "grpc-slave-delay"
    create_topic(cluster, topic_tx, "TRANSACTION")
    create_topic(cluster, topic_delay, "DELAY")
    master = cluster.master()
    slave = next(sid for sid in cluster.grpc if sid != master)
    meta = [("x-mq-client-id", "slave-caller")]

    def typed(topic: str, message_id: str, kind: int, **sp) -> pb.Message:
        return pb.Message(
            topic=pb.Resource(name=topic),
            system_properties=pb.SystemProperties(message_id=message_id, message_type=kind, **sp),
            body=message_id.encode(),
        )

    tx_id, delay_id = "0102FC00000000000000000000000000A1", "0102FC00000000000000000000000000A2"
    with grpc.insecure_channel(cluster.grpc[slave]) as channel:
        stub = spb_grpc.MessagingServiceStub(channel)
        sent = stub.SendMessage(
            spb.SendMessageRequest(messages=[typed(topic_tx, tx_id, pb.TRANSACTION)]),
            metadata=meta,
            timeout=10,
        )
        assert sent.status.code == Code.OK, sent.status
        half = httpx.get(f"http://{cluster.http[master]}/messages/{tx_id}", timeout=10).json()
        assert (half["state"], half["topic"], half["messageId"]) == ("HALF", topic_tx, tx_id)
        ended = stub.EndTransaction(
            spb.EndTransactionRequest(
                topic=pb.Resource(name=topic_tx),
                message_id=tx_id,
                transaction_id=sent.entries[0].transaction_id,
                resolution=pb.COMMIT,
                source=pb.SOURCE_CLIENT,
            ),
            metadata=meta,
            timeout=10,
        )
        assert ended.status.code == Code.OK, ended.status
        due = timestamp(int(time.time() * 1000) + 600_000)
        timer = stub.SendMessage(
            spb.SendMessageRequest(messages=[typed(topic_delay, delay_id, pb.DELAY, delivery_timestamp=due)]),
            metadata=meta,
            timeout=10,
        )
        assert timer.status.code == Code.OK and timer.entries[0].recall_handle, timer
        pending = httpx.get(f"http://{cluster.http[master]}/messages/{delay_id}", timeout=10).json()
        assert (pending["state"], pending["topic"]) == ("SCHEDULED", topic_delay)
        recalled = stub.RecallMessage(
            spb.RecallMessageRequest(
                topic=pb.Resource(name=topic_delay), recall_handle=timer.entries[0].recall_handle
            ),
            metadata=meta,
            timeout=10,
        )
        assert recalled.status.code == Code.OK and recalled.message_id == delay_id, recalled
    delivered = httpx.get(f"http://{cluster.http[master]}/messages/{tx_id}", timeout=10).json()
    assert "state" not in delivered and delivered["topic"] == topic_tx and delivered["queueOffset"] >= 0
    gone = httpx.get(f"http://{cluster.http[master]}/messages/{delay_id}", timeout=10).json()
    assert gone["state"] == "RECALLED"
