"""The pipeline job: stream a LedgerMQ topic into Parquet (partitioned by date), exactly once.

    python -m pipeline.job --topic orders --out /data/orders --checkpoint /data/orders.ckpt \\
        --namesrv 127.0.0.1:9876 [--trigger availableNow|processingTime=5s|once] [--format parquet|delta]
        [--token T] [--ca-file ca.pem]   (a cluster with ACL / TLS; also $LEDGERMQ_TOKEN, $LEDGERMQ_CA_FILE)

Progress: one log line per micro-batch (``event=batch``) with the batch id, rows, duration, end
offsets and lag (messages on the brokers not yet read). Exactly once: the source replays a failed
batch's exact offset ranges from the checkpoint, and the file sink commits each batch once through
its ``_spark_metadata`` log, so a killed and restarted job neither loses nor repeats a row.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from typing import Any

log = logging.getLogger("ledgermq.pipeline.job")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line of the job."""
    p = argparse.ArgumentParser(prog="python -m pipeline.job", description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", help="topic name or comma list")
    p.add_argument("--topic-pattern", help="regex of topic names (instead of --topic)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--checkpoint", required=True, help="checkpoint directory (keep it to resume exactly once)"
    )
    p.add_argument("--namesrv", help="name server address(es), 'host:port[;host:port]'")
    p.add_argument("--broker", help="broker address(es) instead of a name server")
    p.add_argument("--trigger", default="processingTime=5s", help="availableNow | once | processingTime=<n>s")
    p.add_argument(
        "--starting-offsets", default="earliest", help="earliest | latest | JSON (new queries only)"
    )
    p.add_argument("--max-offsets-per-trigger", type=int, help="cap of messages per micro-batch")
    p.add_argument("--consumer-group", help="commit progress to this consumer group (for lag tools)")
    p.add_argument("--fail-on-data-loss", default="true", choices=["true", "false"])
    p.add_argument("--format", default="parquet", choices=["parquet", "delta"], help="output format")
    p.add_argument("--token", default=os.environ.get("LEDGERMQ_TOKEN"),
                   help="ACL bearer token (default: $LEDGERMQ_TOKEN)")
    p.add_argument("--ca-file", default=os.environ.get("LEDGERMQ_CA_FILE"),
                   help="PEM CA: every name server and broker over TLS, verified against it "
                        "(default: $LEDGERMQ_CA_FILE)")
    p.add_argument("--client-cert", help="PEM client certificate (with its key, or see --client-key)")
    p.add_argument("--client-key", help="PEM key of --client-cert, when it is a separate file")
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"))
    p.add_argument("--log-level", default="INFO", help="Python log level of the job")
    args = p.parse_args(argv)
    if bool(args.topic) == bool(args.topic_pattern):
        p.error("give exactly one of --topic and --topic-pattern")
    if not args.namesrv and not args.broker:
        p.error("give --namesrv (or --broker)")
    try:
        args.trigger_kw = trigger_kwargs(args.trigger)
    except ValueError as exc:
        p.error(str(exc))
    return args


def trigger_kwargs(spec: str) -> dict[str, Any]:
    """``availableNow`` | ``once`` | ``processingTime=5s`` → kwargs of ``DataStreamWriter.trigger``."""
    if spec == "availableNow":
        return {"availableNow": True}
    if spec == "once":
        return {"once": True}
    m = re.fullmatch(r"processingTime=(\d+(?:\.\d+)?)\s*(ms|s|m)?", spec.strip())
    if not m:
        raise ValueError(f"--trigger: expected availableNow, once or processingTime=<n>s, got {spec!r}")
    unit = {"ms": "milliseconds", "s": "seconds", "m": "minutes", None: "seconds"}[m.group(2)]
    return {"processingTime": f"{m.group(1)} {unit}"}


def lag_of(end: dict | None, latest: dict | None) -> int | None:
    """Messages on the brokers beyond ``end`` (both offsets documents of the source)."""
    if not end or not latest:
        return None
    return sum(
        max(0, off - end.get(topic, {}).get(key, 0))
        for topic, queues in latest.items()
        for key, off in queues.items()
    )


def progress_line(progress: dict) -> str:
    """One ``event=batch`` log line from a query progress dict."""
    src = (progress.get("sources") or [{}])[0]
    end = _as_dict(src.get("endOffset"))
    latest = _as_dict(src.get("latestOffset"))
    return (
        f"event=batch batchId={progress.get('batchId')} rows={progress.get('numInputRows')} "
        f"durationMs={(progress.get('durationMs') or {}).get('triggerExecution')} "
        f"rowsPerSec={progress.get('processedRowsPerSecond')} lag={lag_of(end, latest)} "
        f"offsets={json.dumps(end, separators=(',', ':'))}"
    )


def _as_dict(value: Any) -> dict | None:
    if value is None or isinstance(value, dict):
        return value
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return None


def build_spark(master: str):
    """A SparkSession for the job with the ``ledgermq`` source registered."""
    import pipeline

    spark = pipeline.session(
        "ledgermq-pipeline",
        master,
        **{
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.showConsoleProgress": "false",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class _ProgressLogger:
    """Builds the StreamingQueryListener that logs one line per finished micro-batch."""

    @staticmethod
    def create():
        from pyspark.sql.streaming import StreamingQueryListener

        class ProgressLogger(StreamingQueryListener):
            def onQueryStarted(self, event) -> None:
                log.info("event=query_started id=%s runId=%s", event.id, event.runId)

            def onQueryProgress(self, event) -> None:
                log.info(progress_line(json.loads(event.progress.json)))

            def onQueryIdle(self, event) -> None:
                pass

            def onQueryTerminated(self, event) -> None:
                log.info("event=query_terminated id=%s exception=%s", event.id, event.exception)

        return ProgressLogger()


def start_query(spark, args: argparse.Namespace):
    """Start the topic → files streaming query described by ``args`` on ``spark``; returns the query."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("ledgermq")
    opts = {
        "namesrvAddr": args.namesrv,
        "brokerAddr": args.broker,
        "topic": args.topic,
        "topicPattern": args.topic_pattern,
        "startingOffsets": args.starting_offsets,
        "maxOffsetsPerTrigger": args.max_offsets_per_trigger,
        "consumerGroup": args.consumer_group,
        "failOnDataLoss": args.fail_on_data_loss,
        "token": args.token,
        "caFile": args.ca_file,
        "clientCert": args.client_cert,
        "clientKey": args.client_key,
    }
    for k, v in opts.items():
        if v is not None:
            reader = reader.option(k, str(v))
    # storeTimestamp is a UTC instant; the date column follows the session time zone (UTC in the job).
    df = reader.load().withColumn("date", F.to_date(F.col("storeTimestamp")))
    return (
        df.writeStream.format(args.format)
        .partitionBy("date")
        .option("checkpointLocation", args.checkpoint)
        .option("path", args.out)
        .trigger(**args.trigger_kw)
        .queryName("ledgermq_pipeline")
        .start()
    )


def run(args: argparse.Namespace) -> int:
    """Start the query, log progress per batch, and wait until it ends (or SIGTERM/SIGINT stops it)."""
    if args.format == "delta":
        try:
            import delta  # noqa: F401
        except ImportError:
            log.error("event=delta_unavailable detail='pip install delta-spark' to use --format delta")
            return 2
    spark = build_spark(args.master)
    spark.streams.addListener(_ProgressLogger.create())
    query = start_query(spark, args)

    def _stop(signum, _frame) -> None:
        log.info("event=stopping signal=%s", signum)
        query.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        query.awaitTermination()
    finally:
        exc = query.exception()
        spark.stop()
    if exc is not None:
        log.error("event=query_failed error=%s", str(exc).splitlines()[0] if str(exc) else exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pipeline.job``."""
    args = parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per py4j callback otherwise
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
