"""The source keeps reading through a master failover of a 3-member DLedger broker set."""

from __future__ import annotations

import signal
import time

import pytest

from tests.spark.test_source import bodies, read_parquet

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_stream_survives_sigkill_of_the_master_exactly_once(spark, dledger_cluster, topic_name, tmp_path):
    c = dledger_cluster
    c.create_topic(topic_name, queues=4)
    acked = dict(zip(c.produce(topic_name, bodies(3000, "f1"), batch=500), bodies(3000, "f1"), strict=True))

    df = (
        spark.readStream.format("ledgermq")
        .option("namesrvAddr", c.namesrv)
        .option("topic", topic_name)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .option("pollTimeoutMs", "60000")
        .load()
    )
    q = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 90
        while (q.lastProgress is None or q.lastProgress["batchId"] < 1) and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.05)
        old_master = c.wait_master()
        name = f"n{c.brokers.index(old_master)}"
        c.procs.kill(name, signal.SIGKILL)  # mid-stream: 3000 messages need 8 batches of 400

        new_master = c.wait_master(timeout_s=60, exclude=old_master)
        assert new_master != old_master
        more = bodies(1000, "f2")
        acked.update(zip(c.produce(topic_name, more, batch=250), more, strict=True))

        q.processAllAvailable()
        assert q.exception() is None, q.exception()
    finally:
        q.stop()

    got = read_parquet(spark, tmp_path / "out")  # also asserts no (queue, offset) twice
    for pair, body in acked.items():
        assert got.get(pair) == body, f"acknowledged message {pair} missing or altered"
    # Nothing beyond what the topic holds (an unacknowledged produce may still have been committed).
    in_topic = {(m["queueId"], m["queueOffset"]): m["value"] for m in c.pull_all(topic_name)}
    assert got == in_topic
