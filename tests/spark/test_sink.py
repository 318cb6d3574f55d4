"""The ``ledgermq`` sink against a real broker: round trips and replays without duplicates."""

from __future__ import annotations

import socket
import threading

import httpx
import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import StringType, StructField, StructType

from client.errors import LedgerMQError
from pipeline.sink import SinkOptions, write_batches
from tests.integration._ledgermq_procs import ProcessGroup, start_namesrv
from tests.ports import free_port

pytestmark = pytest.mark.spark


def _user_props(props: dict | None) -> dict:
    # The broker adds its own (upper-case) properties such as KEYS, TAGS, UNIQ_KEY.
    return {k: v for k, v in (props or {}).items() if k.startswith("u.")}


def _read_topic(spark, cluster, topic: str):
    return (
        spark.read.format("ledgermq")
        .option("namesrvAddr", cluster.namesrv)
        .option("topic", topic)
        .option("includeProperties", "true")
        .load()
    )


def test_batch_write_then_read_back_is_equal(spark, cluster, topic_name):
    cluster.create_topic(topic_name, queues=2)
    rows = [
        (
            bytes([i % 256, 0, 255]) + f"v{i}".encode(),
            f"k{i}",
            "even" if i % 2 == 0 else None,
            {"u.n": str(i)},
        )
        for i in range(500)
    ]
    df = spark.createDataFrame(rows, "value binary, key string, tags string, properties map<string,string>")
    df.write.format("ledgermq").option("namesrvAddr", cluster.namesrv).option("topic", topic_name).mode(
        "append"
    ).save()

    back = _read_topic(spark, cluster, topic_name).collect()
    got = sorted((bytes(r.value), r.key, r.tags, _user_props(r.properties)) for r in back)
    assert got == sorted(rows)


def test_stream_to_topic_exactly_once_even_when_a_task_fails_mid_write(spark, cluster, topic_name, tmp_path):
    src, dst = f"{topic_name}_src", f"{topic_name}_dst"
    cluster.create_topic(src, queues=2)
    cluster.create_topic(dst, queues=2)
    # Queue 0's task (100 rows) completes and produces; queue 1's task fails near its end.
    cluster.produce(src, [f"m{i:05d}".encode() for i in range(100)], queue_id=0)
    cluster.produce(src, [f"m{i:05d}".encode() for i in range(100, 1200)], queue_id=1)
    marker = tmp_path / "fail-once"
    marker.write_text("x")
    marker_path = str(marker)
    dst_url = f"http://{cluster.wait_master()}/topics/{dst}"

    from pyspark.sql import functions as F

    @F.udf("binary")
    def fail_after_some_rows(value, queue_id, queue_offset):
        import os
        import time

        import httpx

        # Fails queue 1's task part-way: the batch aborts after other rows were already produced.
        # The UDF's worker can run ahead of the sink, so it waits until the sink has stored some
        # rows: otherwise a loaded machine could fail the task before anything was written.
        if queue_id == 1 and queue_offset >= 1000 and os.path.exists(marker_path):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                queues = httpx.get(dst_url, timeout=5).json()["queues"]
                if sum(q["maxOffset"] - q["minOffset"] for q in queues) >= 100:
                    break
                time.sleep(0.1)
            raise RuntimeError("injected sink-side task failure")
        return value

    def start():
        df = (
            spark.readStream.format("ledgermq")
            .option("namesrvAddr", cluster.namesrv)
            .option("topic", src)
            .option("startingOffsets", "earliest")
            .load()
        )
        out = df.select(fail_after_some_rows("value", "queueId", "queueOffset").alias("value"), "key")
        return (
            out.writeStream.format("ledgermq")
            .option("namesrvAddr", cluster.namesrv)
            .option("topic", dst)
            .option("batchSize", "50")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )

    old = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")  # stream rows into the sink
    try:
        q = start()
        with pytest.raises(StreamingQueryException, match="injected sink-side task failure"):
            q.awaitTermination(120)
        partial = sum(hi - lo for lo, hi in cluster.queue_ranges(dst).values())
        assert 100 <= partial < 1200, partial  # the failed batch left some rows in the topic

        marker.unlink()
        q = start()  # replays batch 0 from the checkpoint with the same idempotency keys
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old)

    bodies = sorted(m["value"] for m in cluster.pull_all(dst))
    assert bodies == [f"m{i:05d}".encode() for i in range(1200)]


def test_replaying_a_task_outside_spark_writes_each_row_once(spark, cluster, topic_name):
    cluster.create_topic(topic_name, queues=2)
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("value", StringType())])
    opts = SinkOptions.parse({"namesrvAddr": cluster.namesrv, "topic": topic_name, "batchSize": "40"}, schema)
    batch = pa.RecordBatch.from_pydict({"value": [f"r{i}" for i in range(100)]})
    first = write_batches(iter([batch]), opts, key_prefix="q1/7", partition_id=3, attempt=0, batch_id=7)
    again = write_batches(iter([batch]), opts, key_prefix="q1/7", partition_id=3, attempt=1, batch_id=7)
    assert (first.rows, again.rows, first.requests) == (100, 100, 3)
    assert sorted(m["value"] for m in cluster.pull_all(topic_name)) == sorted(
        f"r{i}".encode() for i in range(100)
    )


def test_sink_refuses_bad_input_clearly(spark, cluster, topic_name):
    df = spark.createDataFrame([("a",)], "body string")
    with pytest.raises(Exception, match="needs a 'value' column"):
        df.write.format("ledgermq").option("namesrvAddr", cluster.namesrv).option("topic", topic_name).mode(
            "append"
        ).save()
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(Exception, match="set option 'topic' or provide a 'topic' column"):
        df.write.format("ledgermq").option("namesrvAddr", cluster.namesrv).mode("append").save()


class _ReadThenVanish(threading.Thread):
    """A listening socket that reads one whole request, then closes it and itself: a broker
    killed after it read a produce (later connections are refused)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.read_bytes = 0

    def run(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                int(h.split(b":")[1]) for h in head.lower().split(b"\r\n") if h.startswith(b"content-length")
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.read_bytes = len(body)
        self.sock.close()


@pytest.mark.parametrize("broker", ["vanishing", "dead"])
def test_a_failed_produce_says_whether_it_may_have_stored_the_rows(tmp_path, broker):
    """A task whose broker read the batch and died fails as SEND_OUTCOME_UNKNOWN naming the set;
    a task that never reached a broker fails as UNREACHABLE, nothing stored."""
    procs = ProcessGroup(tmp_path)
    server = _ReadThenVanish() if broker == "vanishing" else None
    addr = server.addr if server else f"127.0.0.1:{free_port()}"
    try:
        ns = start_namesrv(procs, tmp_path)
        r = httpx.post(
            f"http://{ns}/brokers/register",
            json={
                "clusterName": "c",
                "brokerName": "broker-x",
                "brokerId": 0,
                "brokerAddr": addr,
                "topics": {"t": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}},
            },
        )
        assert r.status_code == 200, r.text
        if server:
            server.start()
        schema = StructType([StructField("value", StringType())])
        opts = SinkOptions.parse({"namesrvAddr": ns, "topic": "t", "produceTimeoutMs": "800"}, schema)
        batch = pa.RecordBatch.from_pydict({"value": ["a", "b"]})
        with pytest.raises(LedgerMQError) as info:
            write_batches(iter([batch]), opts, key_prefix="q/1", partition_id=0, attempt=0, batch_id=1)
    finally:
        procs.stop_all()
    err = info.value
    assert "broker set broker-x" in str(err) and "q/1/0/0 .. q/1/0/1" in str(err)
    if server:
        server.join(5)
        assert server.read_bytes > 0
        assert err.code == "SEND_OUTCOME_UNKNOWN" and err.broker_name == "broker-x"
    else:
        assert err.code == "UNREACHABLE" and "nothing stored" in str(err)
