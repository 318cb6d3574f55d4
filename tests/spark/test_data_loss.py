"""``failOnDataLoss``: offsets deleted by retention before the query read them."""

from __future__ import annotations

import os
import time

import pytest
from pyspark.errors import StreamingQueryException

from tests.spark.test_source import bodies, rows_of, run_available_now

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _expire_commit_log(store: str, queue_lo_wanted: int, c, topic: str, timeout_s: float = 40.0) -> int:
    """Age the commit-log files by 2 h so retention (fileReservedTime=1) deletes them; wait for it."""
    old = time.time() - 2 * 3600
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name in os.listdir(os.path.join(store, "commitlog")):
            os.utime(os.path.join(store, "commitlog", name), (old, old))
        lo, _ = c.queue_ranges(topic)[0]
        if lo >= queue_lo_wanted:
            return lo
        time.sleep(0.5)
    raise AssertionError(f"retention did not delete the head of {topic} within {timeout_s}s")


def test_fail_on_data_loss_fails_clearly_or_skips(spark, retention_cluster, topic_name, tmp_path):
    c = retention_cluster
    c.create_topic(topic_name, queues=1)
    c.produce(topic_name, bodies(50, "dl1", size=900), queue_id=0)
    df = (
        spark.readStream.format("ledgermq")
        .option("namesrvAddr", c.namesrv)
        .option("topic", topic_name)
        .option("startingOffsets", "earliest")
    )
    run_available_now(df.load(), tmp_path / "out", tmp_path / "ckpt")  # reads 0..49
    assert len(rows_of(spark, tmp_path / "out")) == 50

    c.produce(topic_name, bodies(300, "dl2", size=900), queue_id=0)  # rolls several 64 KB files
    lo = _expire_commit_log(str(c.tmp / "store-r"), 51, c, topic_name)

    q = (
        df.load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match=r"data loss.*next offset 50 < earliest available"):
        q.awaitTermination(120)
    assert "failOnDataLoss=false" in str(q.exception())

    run_available_now(df.option("failOnDataLoss", "false").load(), tmp_path / "out", tmp_path / "ckpt")
    offsets = sorted(r.queueOffset for r in rows_of(spark, tmp_path / "out"))
    assert offsets == list(range(50)) + list(range(lo, 350))  # the deleted ones skipped, nothing else
