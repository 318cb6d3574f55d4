"""The ``ledgermq`` source against a real broker: exactness, restarts, admission control, offsets."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import job

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def bodies(n: int, tag: str, size: int = 24) -> list[bytes]:
    """Distinct bodies, padded to ``size`` bytes, including non-UTF-8 bytes to prove binary safety."""
    return [(f"{tag}-{i:07d}-".encode() + b"\xff\x00" * size)[:size] for i in range(n)]


def expected_map(produced: list[tuple[int, int]], data: list[bytes]) -> dict[tuple[int, int], bytes]:
    """(queueId, queueOffset) → body, from the produce results."""
    out = dict(zip(produced, data, strict=True))
    assert len(out) == len(data), "broker returned a (queue, offset) twice"
    return out


def read_parquet(spark, out: Path) -> dict[tuple[int, int], bytes]:
    """The job's output as (queueId, queueOffset) → value, asserting no pair appears twice."""
    rows = spark.read.parquet(str(out)).select("queueId", "queueOffset", "value").collect()
    got = {(r.queueId, r.queueOffset): bytes(r.value) for r in rows}
    assert len(got) == len(rows), f"{len(rows) - len(got)} duplicate (queue, offset) rows in the output"
    return got


def job_args(cluster, topic: str, tmp: Path, *extra: str) -> object:
    """Parsed pipeline.job arguments writing to tmp/out with checkpoint tmp/ckpt."""
    return job.parse_args(
        [
            "--topic",
            topic,
            "--out",
            str(tmp / "out"),
            "--checkpoint",
            str(tmp / "ckpt"),
            "--namesrv",
            cluster.namesrv,
            *list(extra),
        ]
    )


def stream(spark, cluster, topic: str, **options: str):
    """A ``ledgermq`` streaming DataFrame on ``topic``."""
    reader = spark.readStream.format("ledgermq").option("namesrvAddr", cluster.namesrv).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def run_available_now(df, out: Path, checkpoint: Path):
    """Run ``df`` into Parquet at ``out`` with Trigger.AvailableNow; returns the finished query."""
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    return q


def rows_of(spark, out: Path) -> list:
    """All rows a file sink committed at ``out`` (empty if it committed none)."""
    if not (out / "_spark_metadata").exists():
        return []
    return spark.read.parquet(str(out)).collect()


def test_available_now_job_writes_exactly_the_50k_messages(spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, queues=4)
    data = bodies(50_000, "a", size=40)
    expected = expected_map(cluster.produce(topic_name, data), data)
    assert {q for q, _ in expected} == {0, 1, 2, 3}

    q = job.start_query(spark, job_args(cluster, topic_name, tmp_path, "--trigger", "availableNow"))
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()

    assert read_parquet(spark, tmp_path / "out") == expected
    dates = {r.date for r in spark.read.parquet(str(tmp_path / "out")).select("date").distinct().collect()}
    assert dates and all(d is not None for d in dates)  # partitioned by date


def test_stop_and_restart_from_checkpoint_has_no_gap_and_no_duplicate(spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, queues=4)
    data = bodies(4000, "b")
    produced = cluster.produce(topic_name, data)

    args = job_args(
        cluster, topic_name, tmp_path, "--trigger", "processingTime=200ms", "--max-offsets-per-trigger", "500"
    )
    q = job.start_query(spark, args)
    deadline = time.monotonic() + 60
    while (q.lastProgress is None or q.lastProgress["batchId"] < 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    q.stop()  # mid-stream: 4000 messages need 8 batches of 500
    first_run = read_parquet(spark, tmp_path / "out")
    assert 0 < len(first_run) < 4000

    more = bodies(2000, "b2")
    produced += cluster.produce(topic_name, more)
    q2 = job.start_query(spark, job_args(cluster, topic_name, tmp_path, "--trigger", "availableNow"))
    q2.awaitTermination(120)
    assert q2.exception() is None, q2.exception()
    assert read_parquet(spark, tmp_path / "out") == expected_map(produced, data + more)


@pytest.mark.slow  # starts a second JVM (the job's driver)
def test_sigkill_of_the_driver_then_restart_is_exactly_once(spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, queues=4)
    data = bodies(3000, "c")
    produced = cluster.produce(topic_name, data)

    cmd = [sys.executable, "-m", "pipeline.job", "--topic", topic_name, "--out", str(tmp_path / "out")]
    cmd += [
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--namesrv",
        cluster.namesrv,
        "--trigger",
        "processingTime=500ms",
    ]
    cmd += ["--max-offsets-per-trigger", "500", "--master", "local[1]"]
    log = open(tmp_path / "job.log", "wb")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        commits = tmp_path / "ckpt" / "commits"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = [p for p in commits.glob("*") if p.name.isdigit()] if commits.exists() else []
            if done and "event=batch batchId=0 " in (tmp_path / "job.log").read_text():
                break
            assert proc.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            time.sleep(0.1)
        else:
            raise AssertionError("job committed no batch: " + (tmp_path / "job.log").read_text()[-3000:])
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, no chance to clean up
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
    assert "event=batch batchId=0 rows=500" in (tmp_path / "job.log").read_text()
    assert 500 <= len(read_parquet(spark, tmp_path / "out")) < 3000  # killed mid-stream

    more = bodies(1500, "c2")
    produced += cluster.produce(topic_name, more)
    q = job.start_query(spark, job_args(cluster, topic_name, tmp_path, "--trigger", "availableNow"))
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    assert read_parquet(spark, tmp_path / "out") == expected_map(produced, data + more)


def test_max_offsets_per_trigger_bounds_every_batch(spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, queues=4)
    cluster.produce(topic_name, bodies(2000, "d"))
    df = stream(spark, cluster, topic_name, startingOffsets="earliest", maxOffsetsPerTrigger=300)
    q = run_available_now(df, tmp_path / "out", tmp_path / "ckpt")
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert all(s <= 300 for s in sizes), sizes
    assert sum(sizes) == 2000 and len(sizes) == math.ceil(2000 / 300)
    assert len(read_parquet(spark, tmp_path / "out")) == 2000


def test_starting_offsets_earliest_latest_and_json(spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, queues=4)
    for qid in range(4):
        cluster.produce(topic_name, bodies(100, f"e{qid}"), queue_id=qid)

    # earliest (batch reader): everything
    batch = spark.read.format("ledgermq").option("namesrvAddr", cluster.namesrv).option("topic", topic_name)
    assert batch.option("startingOffsets", "earliest").load().count() == 400

    # latest: a new query sees nothing old, then exactly what arrives after it started
    df = stream(spark, cluster, topic_name, startingOffsets="latest")
    run_available_now(df, tmp_path / "out-latest", tmp_path / "ck-latest")
    assert rows_of(spark, tmp_path / "out-latest") == []
    cluster.produce(topic_name, bodies(10, "late"), queue_id=2)
    run_available_now(df, tmp_path / "out-latest", tmp_path / "ck-latest")
    rows = rows_of(spark, tmp_path / "out-latest")
    assert sorted((r.queueId, r.queueOffset) for r in rows) == [(2, o) for o in range(100, 110)]

    # JSON: queue 0 from 90, queue 1 earliest (-2), queue 2 latest (-1), queue 3 not named → earliest
    spec = json.dumps({topic_name: {"broker-s:0": 90, "broker-s:1": -2, "broker-s:2": -1}})
    df = stream(spark, cluster, topic_name, startingOffsets=spec)
    run_available_now(df, tmp_path / "out-json", tmp_path / "ck-json")
    got = {(r.queueId, r.queueOffset) for r in rows_of(spark, tmp_path / "out-json")}
    want = {(0, o) for o in range(90, 100)} | {(1, o) for o in range(100)} | {(3, o) for o in range(100)}
    assert got == want

    # a malformed spec fails with the option named
    with pytest.raises(Exception, match="startingOffsets"):
        batch.option("startingOffsets", '{"x": 1}').load().count()


def test_ending_offsets_bound_a_batch_read(spark, cluster, topic_name):
    cluster.create_topic(topic_name, queues=2)
    cluster.produce(topic_name, bodies(50, "f"), queue_id=0)
    cluster.produce(topic_name, bodies(50, "g"), queue_id=1)
    end = json.dumps({topic_name: {"broker-s:0": 20, "broker-s:1": 5}})
    start = json.dumps({topic_name: {"broker-s:0": 10}})
    df = (
        spark.read.format("ledgermq")
        .option("namesrvAddr", cluster.namesrv)
        .option("topic", topic_name)
        .option("startingOffsets", start)
        .option("endingOffsets", end)
        .load()
    )
    got = sorted((r.queueId, r.queueOffset) for r in df.collect())
    assert got == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(5)]


def test_starting_timestamp_reads_from_that_time(spark, cluster, topic_name):
    cluster.create_topic(topic_name, queues=2)
    cluster.produce(topic_name, bodies(40, "old"))
    time.sleep(0.05)
    cut_ms = int(time.time() * 1000)
    time.sleep(0.05)
    cluster.produce(topic_name, bodies(40, "new"))
    df = (
        spark.read.format("ledgermq")
        .option("namesrvAddr", cluster.namesrv)
        .option("topic", topic_name)
        .option("startingTimestamp", str(cut_ms))
        .load()
    )
    values = sorted(bytes(r.value)[:3] for r in df.select("value").collect())
    assert values == [b"new"] * 40


def test_schema_properties_and_new_queue_and_consumer_group(spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, queues=2)
    cluster.produce(topic_name, bodies(30, "h"))
    group = f"g_{topic_name}"
    df = stream(
        spark, cluster, topic_name, startingOffsets="earliest", includeProperties="true", consumerGroup=group
    )
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "brokerName", "queueId", "queueOffset", "commitLogOffset", "msgId", "tags",
        "properties", "bornTimestamp", "storeTimestamp",
    ]  # fmt: skip
    run_available_now(df, tmp_path / "out", tmp_path / "ckpt")
    row = min(rows_of(spark, tmp_path / "out"), key=lambda r: (r.queueId, r.queueOffset))
    assert row.key == "k0" and row.topic == topic_name and row.brokerName == "broker-s"
    assert row.storeTimestamp is not None and row.msgId

    first_end = {qid: hi for qid, (_, hi) in cluster.queue_ranges(topic_name).items()}
    # a queue added to the topic is picked up by the next batch
    cluster.create_topic(topic_name, queues=3)
    cluster.produce(topic_name, bodies(7, "new-q"), queue_id=2)
    run_available_now(df, tmp_path / "out", tmp_path / "ckpt")
    assert sorted(r.queueOffset for r in rows_of(spark, tmp_path / "out") if r.queueId == 2) == list(range(7))

    # commit(end) advanced the consumer group on the broker. Spark commits batch N to its source
    # when it plans batch N + 1, so after the second run the group holds the first run's end.
    r = cluster.http.get(
        f"http://{cluster.brokers[0]}/consumers/{group}/offsets", params={"topic": topic_name}
    )
    assert r.status_code == 200, r.text
    offs = {o["queueId"]: o["offset"] for o in r.json()["offsets"]}
    assert offs == {0: first_end[0], 1: first_end[1], 2: -1}  # -1: nothing committed yet


def test_topic_pattern_reads_matching_topics(spark, cluster, topic_name, tmp_path):
    for suffix in ("x1", "x2"):
        cluster.create_topic(f"{topic_name}_{suffix}", queues=1)
        cluster.produce(f"{topic_name}_{suffix}", bodies(5, suffix))
    cluster.create_topic(f"{topic_name}_other", queues=1)
    cluster.produce(f"{topic_name}_other", bodies(5, "o"))
    df = (
        spark.read.format("ledgermq")
        .option("namesrvAddr", cluster.namesrv)
        .option("topicPattern", f"{topic_name}_x\\d")
        .load()
    )
    counts = {r.topic: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {f"{topic_name}_x1": 5, f"{topic_name}_x2": 5}


def test_bad_options_fail_clearly(spark, cluster):
    with pytest.raises(Exception, match="namesrvAddr"):
        spark.read.format("ledgermq").option("topic", "t").load().count()
    with pytest.raises(Exception, match="exactly one of options 'topic'"):
        spark.read.format("ledgermq").option("namesrvAddr", cluster.namesrv).load().count()
    with pytest.raises(Exception, match=r"option 'namesrvAddr': address 'nameserver' is not host:port"):
        spark.read.format("ledgermq").option("namesrvAddr", "nameserver").option("topic", "t").load().count()
    with pytest.raises(Exception, match="maxOffsetsPerTrigger"):
        (
            spark.readStream.format("ledgermq")
            .option("namesrvAddr", cluster.namesrv)
            .option("topic", "t")
            .option("maxOffsetsPerTrigger", "lots")
            .load()
            .writeStream.format("noop")
            .start()
            .awaitTermination(30)
        )


def test_tag_filter_option_reads_only_the_matching_messages(spark, cluster, topic_name):
    # filtered on the broker: the skipped offsets are gaps, the read still ends at the range's end
    cluster.create_topic(topic_name, queues=2)
    cluster._post(topic_name, [{"body": f"m{i}", "tags": "TagA" if i % 3 == 0 else "TagB", "queueId": i % 2}
                               for i in range(90)])
    df = (
        spark.read.format("ledgermq")
        .option("namesrvAddr", cluster.namesrv)
        .option("topic", topic_name)
        .option("filterType", "TAG")
        .option("filterExpression", "TagA")
        .load()
    )
    rows = df.select("tags", "value").collect()
    assert sorted(bytes(r.value).decode() for r in rows) == sorted(f"m{i}" for i in range(0, 90, 3))
    assert {r.tags for r in rows} == {"TagA"}
