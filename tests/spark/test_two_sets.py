"""Spark over two 3-member broker sets (issue 13): the source reads one topic's queues in both sets,
the sink writes a copy spread over both, exactly once, across a failed task and the SIGKILL of
one set's master before the replay."""

from __future__ import annotations

import signal
import time

import pytest
from pyspark.errors import StreamingQueryException

from client import Admin, PullConsumer
from client.producer import Producer
from tests.integration._ledgermq_procs import (
    ProcessGroup,
    start_dledger_set,
    start_namesrv,
    wait_http,
    wait_master,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SETS = ("broker-a", "broker-b")


@pytest.fixture
def two_sets(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        ns = start_namesrv(group, tmp_path)
        addrs = {name: start_dledger_set(group, tmp_path, ns, name) for name in SETS}
        for a in addrs.values():
            wait_master(a, timeout_s=30)

        def registered(r) -> bool:
            return all(r.json().get("brokers", {}).get(n, {}).get("masterAddr") for n in SETS)

        wait_http(f"http://{ns}/cluster", timeout_s=30, ok=registered)
        yield group, ns, addrs
    finally:
        group.stop_all()


def _create(ns: str, topic: str, queues: int = 2) -> None:
    with Admin(ns) as admin:
        assert set(admin.update_topic(topic, queues, queues)) == set(SETS)

    def routed(r) -> bool:
        return r.status_code == 200 and {b["brokerName"] for b in r.json()["brokers"]} == set(SETS)

    wait_http(f"http://{ns}/routes/{topic}", timeout_s=30, ok=routed)


def _read_all(ns: str, topic: str) -> dict[str, list[bytes]]:
    """Every stored body of `topic`, per broker set."""
    out: dict[str, list[bytes]] = {n: [] for n in SETS}
    with PullConsumer(ns) as c:
        for mq in c.queues(topic):
            offset = 0
            while True:
                res = c.pull(topic, mq.queue_id, offset, max_messages=512, broker_name=mq.broker_name)
                out[mq.broker_name] += [m.body for m in res.messages]
                if res.next_offset >= res.max_offset:
                    break
                offset = res.next_offset
    return out


def test_stream_copy_over_two_sets_is_exactly_once_across_a_failed_task_and_a_master_kill(
    spark, two_sets, tmp_path
):
    group, ns, addrs = two_sets
    src, dst = "two_src", "two_dst"
    _create(ns, src)
    _create(ns, dst)
    bodies = [f"m{i:05d}".encode() for i in range(1200)]
    with Producer(ns) as p:
        for i in range(0, len(bodies), 100):
            p.send_batch(src, bodies[i : i + 100])
    stored_src = _read_all(ns, src)
    assert all(len(v) >= 400 for v in stored_src.values()), {k: len(v) for k, v in stored_src.items()}

    marker = tmp_path / "fail-once"
    marker.write_text("x")
    marker_path = str(marker)
    from pyspark.sql import functions as F

    @F.udf("binary")
    def fail_late(value, queue_offset):
        import os

        # Some task fails part-way through its rows, after earlier rows were produced.
        if queue_offset >= 250 and os.path.exists(marker_path):
            raise RuntimeError("injected sink-side task failure")
        return value

    def start():
        df = (
            spark.readStream.format("ledgermq")
            .option("namesrvAddr", ns)
            .option("topic", src)
            .option("startingOffsets", "earliest")
            .load()
        )
        return (
            df.select(fail_late("value", "queueOffset").alias("value"))
            .writeStream.format("ledgermq")
            .option("namesrvAddr", ns)
            .option("topic", dst)
            .option("batchSize", "50")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )

    old = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        q = start()
        with pytest.raises(StreamingQueryException, match="injected sink-side task failure"):
            q.awaitTermination(180)
        marker.unlink()
        master_b = wait_master(addrs["broker-b"])
        group.kill(f"broker-b-{master_b}", signal.SIGKILL)
        killed = time.monotonic()
        q = start()  # replays the batch with the same idempotency keys, to the same sets
        q.awaitTermination(180)
        assert q.exception() is None, q.exception()
        wait_master(addrs["broker-b"], exclude={master_b}, timeout_s=30)
        assert time.monotonic() - killed < 180
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old)

    copy = _read_all(ns, dst)
    assert all(copy[n] for n in SETS), "the sink wrote to one set only"
    got = sorted(b for n in SETS for b in copy[n])
    assert got == bodies, f"{len(got)} rows for {len(bodies)} (duplicates or losses)"
