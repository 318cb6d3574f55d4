"""Spark source throughput: rows/s of 1 KB messages from a real broker into Parquet on local[2].

Starts a name server and a single-node broker (local commit log) in a temp dir, produces
``--messages`` bodies of ``--size`` bytes to a 4-queue topic over HTTP, then runs the ``ledgermq``
source (which pulls the broker's binary page, docs/INTERFACES.md) with Trigger.AvailableNow into
Parquet, twice: a warm-up run (JVM, Python workers) on a small topic and the measured run. Prints
a table and writes bench/results/spark_bench.json.

    .venv/bin/python bench/spark_bench.py [--messages 200000] [--size 1024] [--page-size 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
log = logging.getLogger("bench.spark")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url: str, timeout_s: float = 60.0, ok=lambda r: r.status_code == 200) -> None:
    """Poll ``url`` until ``ok``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ok(httpx.get(url, timeout=2)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


def start(module: str, conf: Path, logfile: Path) -> subprocess.Popen:
    """Start ``python -m module -c conf`` with output to ``logfile``."""
    with open(logfile, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, "-c", str(conf)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def produce(addr: str, topic: str, n: int, size: int, batch: int = 500) -> float:
    """Produce ``n`` bodies of ``size`` ASCII bytes; returns seconds taken."""
    pad = "x" * size
    t0 = time.perf_counter()
    with httpx.Client(timeout=60) as http:
        for i in range(0, n, batch):
            msgs = [{"body": (f"{j:010d}" + pad)[:size]} for j in range(i, min(n, i + batch))]
            r = http.post(f"http://{addr}/topics/{topic}/messages", json={"messages": msgs})
            r.raise_for_status()
    return time.perf_counter() - t0


def run_query(spark, namesrv: str, topic: str, out: Path, page_size: int, sink: str = "parquet") -> dict:
    """AvailableNow ``ledgermq`` → Parquet (or ``noop``); returns wall time and per-batch figures."""
    df = (
        spark.readStream.format("ledgermq")
        .option("namesrvAddr", namesrv)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("pageSize", str(page_size))
        .load()
    )
    t0 = time.perf_counter()
    q = (
        df.writeStream.format(sink)
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    wall = time.perf_counter() - t0
    prog = [p for p in q.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in prog)
    exec_ms = sum(p["durationMs"]["triggerExecution"] for p in prog)
    return {"rows": rows, "wall_s": wall, "batch_exec_s": exec_ms / 1000.0, "batches": len(prog)}


def main() -> int:
    """Run the benchmark; exit status 0 even below target (it reports what it reaches)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--page-size", type=int, default=1000)
    ap.add_argument("--target", type=float, default=50_000.0)
    ap.add_argument("--sink", default="parquet", choices=["parquet", "noop"], help="noop isolates the source")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    tmp = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    ns_port, br_port = free_port(), free_port()
    namesrv = f"127.0.0.1:{ns_port}"
    broker = f"127.0.0.1:{br_port}"
    (tmp / "namesrv.conf").write_text(f"listenPort={ns_port}\n")
    (tmp / "broker.conf").write_text(
        "\n".join(
            [
                "brokerClusterName=BenchCluster",
                "brokerName=broker-bench",
                "brokerId=0",
                "brokerIP1=127.0.0.1",
                f"listenPort={br_port}",
                f"namesrvAddr={namesrv}",
                f"storePathRootDir={tmp / 'store'}",
                "enableDLegerCommitLog=false",
                "flushDiskType=ASYNC_FLUSH",
                "autoCreateTopicEnable=true",
            ]
        )
        + "\n"
    )
    procs = []
    try:
        procs.append(start("namesrv", tmp / "namesrv.conf", tmp / "namesrv.log"))
        wait_ok(f"http://{namesrv}/cluster")
        procs.append(start("broker", tmp / "broker.conf", tmp / "broker.log"))
        wait_ok(f"http://{broker}/health")
        for topic, _n in (("bench_warmup", 4000), ("bench_main", args.messages)):
            r = httpx.put(
                f"http://{broker}/topics/{topic}", json={"readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
            )
            r.raise_for_status()
            wait_ok(f"http://{namesrv}/routes/{topic}")
        produce(broker, "bench_warmup", 4000, args.size)
        produce_s = produce(broker, "bench_main", args.messages, args.size)
        log.info("event=produced messages=%d seconds=%.1f", args.messages, produce_s)

        from pyspark.sql import SparkSession

        import pipeline

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        load_at_start = os.getloadavg()[0]  # the machine is shared: figures swing with its load
        pipeline.register(spark)
        run_query(spark, namesrv, "bench_warmup", tmp / "warm", args.page_size)
        res = run_query(spark, namesrv, "bench_main", tmp / "main", args.page_size, args.sink)
        written = spark.read.parquet(str(tmp / "main" / "data")).count() if args.sink == "parquet" else None
        spark.stop()
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(5)

    result = {
        "benchmark": f"spark_source_to_{args.sink}",
        "master": "local[2]",
        "messages": args.messages,
        "message_bytes": args.size,
        "page_size": args.page_size,
        "rows_read": res["rows"],
        "rows_in_parquet": written,
        "batches": res["batches"],
        "wall_s_incl_query_start": round(res["wall_s"], 2),
        "rows_per_s_wall": round(res["rows"] / res["wall_s"], 1),
        "rows_per_s_batch_exec": round(res["rows"] / res["batch_exec_s"], 1) if res["batch_exec_s"] else None,
        "mb_per_s_wall": round(res["rows"] * args.size / res["wall_s"] / 1e6, 1),
        "target_rows_per_s": args.target,
        "produce_s": round(produce_s, 1),
        "load_avg_1m_start": load_at_start,
        "load_avg_1m": os.getloadavg()[0],
    }
    result["meets_target"] = result["rows_per_s_wall"] >= args.target
    width = max(len(k) for k in result)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in result.items()))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    name = "spark_bench.json" if args.sink == "parquet" else f"spark_bench_{args.sink}.json"
    (out / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
