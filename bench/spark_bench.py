"""Spark source throughput: rows/s of 1 KB messages from a real broker into Parquet on local[2].

Starts a name server and a single-node broker (local commit log) in a temp dir, produces
``--messages`` bodies of ``--size`` bytes to a 4-queue topic over HTTP, then runs the pipeline job
itself (``pipeline.job.build_spark`` + ``start_query``: the ``ledgermq`` source pulling the
broker's binary page, Parquet partitioned by date, the job's Parquet settings) with
Trigger.AvailableNow and ``maxOffsetsPerTrigger`` = messages / ``--batches``:

- ``--warmup-passes`` full passes over the same topic into scratch output first: a fresh JVM
  spends its first ~600k rows JIT-compiling (C2 threads take as much CPU as the tasks), which a
  long-running job pays once; the first pass is reported as the cold figure;
- the measured pass: ``rows_per_s_sustained`` = rows / (end of the last micro-batch - start of the
  first), i.e. what a running job keeps up with, gaps between batches included; the wall time
  including query start is reported beside it;
- the output is verified: row count, distinct (queueId, queueOffset) pairs and distinct body ids
  must all equal ``--messages`` and every body must have ``--size`` bytes;
- CPU-seconds of each process during the measured pass, its query start included (broker, JVM
  split into task threads, JIT and GC, Python workers, the streaming source runner, this driver)
  from /proc, and the load average (the 2 cores are shared).

Prints a table and writes bench/results/spark_bench.json.

    .venv/bin/python bench/spark_bench.py [--messages 200000] [--size 1024] [--batches 2] [--warmup-passes 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
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


_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(stat_path: str) -> float:
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TCK  # utime + stime


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _thread_group(name: str) -> str:
    if name.startswith("Executor task"):
        return "jvm_tasks"
    if "CompilerThre" in name:
        return "jvm_jit"
    if name.startswith(("GC Thread", "G1 ")) or name == "VM Thread":
        return "jvm_gc"
    return "jvm_other"


def _python_group(pid: int) -> str:
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    return "python_source_runner" if b"streaming_source_runner" in cmd else "python_workers"


def cpu_snapshot(broker_pid: int, namesrv_pid: int) -> dict[tuple[str, int], float]:
    """CPU-seconds so far, keyed by (group, pid or thread id): the broker, the name server, this
    driver, the Spark JVM's threads (by thread group) and the Python processes the JVM started."""
    snap = {
        ("broker", broker_pid): _cpu_s(f"/proc/{broker_pid}/stat"),
        ("namesrv", namesrv_pid): _cpu_s(f"/proc/{namesrv_pid}/stat"),
        ("bench_driver", os.getpid()): _cpu_s("/proc/self/stat"),
    }
    for pid in _children(os.getpid()):
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"java"):
                continue
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                stat = (task / "stat").read_text()
            except OSError:  # a thread that just ended
                continue
            group = _thread_group(stat[stat.index("(") + 1 : stat.rindex(")")])
            fields = stat.rsplit(")", 1)[1].split()
            snap[(group, int(task.name))] = (int(fields[11]) + int(fields[12])) / _TCK
        todo = _children(pid)
        while todo:  # the Python daemon, its forked workers and the streaming source runner
            child = todo.pop()
            try:
                snap[(_python_group(child), child)] = _cpu_s(f"/proc/{child}/stat")
                todo += _children(child)
            except OSError:
                continue
    return snap


def cpu_delta(before: dict[tuple[str, int], float], after: dict[tuple[str, int], float]) -> dict[str, float]:
    """CPU-seconds per group between two snapshots. Per process/thread, so one that ended in between
    (the previous query's source runner) is not subtracted and one that started is counted whole."""
    out: dict[str, float] = {}
    for (group, ident), cpu in after.items():
        out[group] = out.get(group, 0.0) + cpu - before.get((group, ident), 0.0)
    return {k: round(v, 2) for k, v in sorted(out.items())}


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def run_pass(spark, namesrv: str, topic: str, out: Path, max_per_trigger: int, sink: str) -> dict:
    """One AvailableNow run of the job over ``topic`` into ``out``; wall time and batch figures."""
    from pipeline import job

    argv = ["--topic", topic, "--namesrv", namesrv, "--trigger", "availableNow"]
    argv += ["--out", str(out / "data"), "--checkpoint", str(out / "ckpt")]
    args = job.parse_args([*argv, "--max-offsets-per-trigger", str(max_per_trigger)])
    t0 = time.perf_counter()
    if sink == "parquet":
        q = job.start_query(spark, args)
    else:  # the source alone: same reader options, nothing written
        df = (
            spark.readStream.format("ledgermq")
            .option("namesrvAddr", namesrv)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(max_per_trigger))
            .load()
        )
        q = df.writeStream.format("noop").option("checkpointLocation", str(out / "ckpt"))
        q = q.trigger(availableNow=True).start()
    q.awaitTermination()
    wall = time.perf_counter() - t0
    prog = [p for p in q.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in prog)
    first = _ts(prog[0]["timestamp"]) if prog else 0.0
    last = max((_ts(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000 for p in prog), default=0.0)
    return {
        "rows": rows,
        "wall_s": wall,
        "batches": len(prog),
        "stream_s": last - first,
        "batch_rows_per_s": [round(p["processedRowsPerSecond"]) for p in prog],
    }


def verify(spark, path: Path, messages: int, size: int) -> dict:
    """Rows, distinct (queueId, queueOffset), distinct body ids and bodies of the wrong size."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(path))
    r = df.agg(
        F.count("*").alias("rows"),
        F.countDistinct("queueId", "queueOffset").alias("pairs"),
        F.countDistinct(F.substring("value", 1, 10)).alias("ids"),
        F.sum((F.length("value") != size).cast("int")).alias("bad"),
    ).first()
    ok = r["rows"] == r["pairs"] == r["ids"] == messages and not r["bad"]
    return {"rows_in_parquet": r["rows"], "distinct_queue_offsets": r["pairs"], "verified": ok}


def main() -> int:
    """Run the benchmark; exit status 0 even below target (it reports what it reaches), 1 if the
    output is wrong."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=2, help="micro-batches of the measured pass")
    ap.add_argument("--warmup-passes", type=int, default=3, help="full passes first (JIT warm-up)")
    ap.add_argument("--target", type=float, default=50_000.0)
    ap.add_argument("--sink", default="parquet", choices=["parquet", "noop"], help="noop isolates the source")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the broker store and Parquet output")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
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
    per_trigger = -(-args.messages // max(1, args.batches))
    procs = []
    try:
        procs.append(start("namesrv", tmp / "namesrv.conf", tmp / "namesrv.log"))
        wait_ok(f"http://{namesrv}/cluster")
        procs.append(start("broker", tmp / "broker.conf", tmp / "broker.log"))
        wait_ok(f"http://{broker}/health")
        topic = "bench_main"
        r = httpx.put(
            f"http://{broker}/topics/{topic}", json={"readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
        )
        r.raise_for_status()
        wait_ok(f"http://{namesrv}/routes/{topic}")
        produce_s = produce(broker, topic, args.messages, args.size)
        log.info("event=produced messages=%d seconds=%.1f", args.messages, produce_s)

        from pipeline import job

        spark = job.build_spark("local[2]")
        load_at_start = os.getloadavg()[0]  # the machine is shared: figures swing with its load
        warm = [
            run_pass(spark, namesrv, topic, tmp / f"warm{i}", per_trigger, args.sink)
            for i in range(args.warmup_passes)
        ]
        cpu0 = cpu_snapshot(procs[1].pid, procs[0].pid)
        res = run_pass(spark, namesrv, topic, tmp / "main", per_trigger, args.sink)
        cpu1 = cpu_snapshot(procs[1].pid, procs[0].pid)
        load_at_end = os.getloadavg()[0]
        checked = (
            verify(spark, tmp / "main" / "data", args.messages, args.size) if args.sink == "parquet" else {}
        )
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
        if not args.keep_tmp:  # ~280 MB of commit log and Parquet per run
            shutil.rmtree(tmp, ignore_errors=True)

    cpu = cpu_delta(cpu0, cpu1)
    cpu_total = sum(cpu.values())
    rows = res["rows"]
    result = {
        "benchmark": f"spark_job_to_{args.sink}",
        "master": "local[2]",
        "messages": args.messages,
        "message_bytes": args.size,
        "max_offsets_per_trigger": per_trigger,
        "rows_read": rows,
        **checked,
        "batches": res["batches"],
        "rows_per_s_sustained": round(rows / res["stream_s"], 1) if res["stream_s"] else None,
        "batch_rows_per_s": res["batch_rows_per_s"],
        "wall_s_incl_query_start": round(res["wall_s"], 2),
        "rows_per_s_wall": round(rows / res["wall_s"], 1),
        "mb_per_s_sustained": round(rows * args.size / res["stream_s"] / 1e6, 1) if res["stream_s"] else None,
        "cold_first_pass_rows_per_s_wall": round(warm[0]["rows"] / warm[0]["wall_s"], 1) if warm else None,
        "warmup_passes": args.warmup_passes,
        "cpu_s": cpu,
        "cpu_us_per_row": round(cpu_total / rows * 1e6, 1) if rows else None,
        "target_rows_per_s": args.target,
        "produce_s": round(produce_s, 1),
        "load_avg_1m_start": round(load_at_start, 2),
        "load_avg_1m_end": round(load_at_end, 2),
    }
    result["meets_target"] = bool(
        result["rows_per_s_sustained"] and result["rows_per_s_sustained"] >= args.target
    )
    width = max(len(k) for k in result)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in result.items()))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    name = "spark_bench.json" if args.sink == "parquet" else f"spark_bench_{args.sink}.json"
    (out / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if checked.get("verified", True) else 1


if __name__ == "__main__":
    sys.exit(main())
