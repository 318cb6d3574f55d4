"""Messages cross protocols through Spark: sent by the official RocketMQ 5 Python client over gRPC
and read by the `ledgermq` source; written by the `ledgermq` sink and received by the official
client's simple consumer."""

from __future__ import annotations

import time

import httpx
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

pytestmark = pytest.mark.spark


def grpc_endpoint(cluster, topic: str) -> str:
    """The topic's broker at its gRPC endpoint, as the name server routes it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = httpx.get(f"http://{cluster.namesrv}/routes/{topic}", timeout=5)
        if r.status_code == 200 and r.json()["brokers"][0].get("masterGrpcAddr"):
            return r.json()["brokers"][0]["masterGrpcAddr"]
        time.sleep(0.2)
    raise AssertionError(f"no gRPC endpoint routed for {topic}")


def test_grpc_producer_to_spark_source(spark, cluster) -> None:
    topic = "grpc-to-spark"
    cluster.create_topic(topic)
    producer = Producer(ClientConfiguration(grpc_endpoint(cluster, topic), Credentials()), (topic,))
    producer.startup()
    sent = {}
    try:
        for i in range(50):
            m = Message()
            m.topic = topic
            m.body = f"g-{i}".encode()
            m.tag = "fromGrpc"
            sent[producer.send(m).message_id] = m.body
    finally:
        producer.shutdown()
    rows = (
        spark.read.format("ledgermq")
        .option("namesrvAddr", cluster.namesrv)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select("value", "tags")
        .collect()
    )
    assert sorted(bytes(r.value) for r in rows) == sorted(sent.values())
    assert {r.tags for r in rows} == {"fromGrpc"}


def test_spark_sink_to_grpc_simple_consumer(spark, cluster) -> None:
    topic = "spark-to-grpc"
    cluster.create_topic(topic)
    values = [f"s-{i}".encode() for i in range(50)]
    df = spark.createDataFrame([(v,) for v in values], "value binary")
    df.write.format("ledgermq").option("namesrvAddr", cluster.namesrv).option("topic", topic).mode(
        "append"
    ).save()
    config = ClientConfiguration(grpc_endpoint(cluster, topic), Credentials())
    consumer = SimpleConsumer(config, "g-spark", {topic: FilterExpression()}, await_duration=3)
    consumer.startup()
    got: dict[str, bytes] = {}
    try:
        deadline = time.monotonic() + 60
        while len(got) < len(values) and time.monotonic() < deadline:
            for m in consumer.receive(32, 30):
                got[m.message_id] = m.body
                consumer.ack(m)
    finally:
        consumer.shutdown()
    assert sorted(got.values()) == sorted(values)
