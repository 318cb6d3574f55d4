"""The idempotency key table (`broker/store/offsets.py` `IdempotencyTable`) as the SDK fills it:
CPU per key of the put's lookup (`first_results`) and the dispatcher's insert (`remember_run`) as
the table fills to its cap and past it, the longest single call (an eviction or a dict resize
stalls the event loop for that long), and the resident memory of the process at the cap.

Batches of 64 fresh SDK-shaped keys (32 hex digits) on one topic, one batch every 2 ms of store
time (so the cap, not the window, bounds the table, as at the SDK's speeds). Each variant runs in
its own process (resident memory is the process's), this tree's table against `--baseline`'s
(default HEAD) in alternated rounds:

    .venv/bin/python bench/idempotency_bench.py [--baseline HEAD] [--max-keys 1000000] [--rounds 2]

Prints one line per variant and round and writes bench/results/idempotency_bench.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
BATCH = 64
HOST = bytes.fromhex("7F00000100002AAF")


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _measure(source: str, max_keys: int, fill_factor: int, out: Any) -> None:
    """Fill a table from `source`'s broker/ to `fill_factor` x its cap; report per fill stage."""
    sys.path.insert(0, source)
    from broker.store.offsets import IdempotencyTable

    t = IdempotencyTable(window_ms=3_600_000, max_keys=max_keys)
    units = [(i * 1_100, 1_100) for i in range(BATCH)]
    at = list(range(BATCH))
    rss0 = _rss_kb()
    stages: list[dict[str, Any]] = []
    ts, inserted = 1_000_000, 0
    stage_keys = max_keys // 4
    while inserted < fill_factor * max_keys:
        look = rem = worst = 0.0
        n = 0
        while n < stage_keys:
            keys = [os.urandom(16).hex().encode() for _ in range(BATCH)]
            strs = [k.decode() for k in keys]
            t0 = time.process_time()
            t.first_results("T", strs)
            t1 = time.process_time()
            t.remember_run("T", 0, ts, HOST, keys, inserted, units, at)
            t2 = time.process_time()
            look += t1 - t0
            rem += t2 - t1
            worst = max(worst, t2 - t1)
            ts += 2
            n += BATCH
            inserted += BATCH
        stages.append({
            "inserted": inserted,
            "held": len(t),
            "lookup_us_per_key": round(look / n * 1e6, 3),
            "remember_us_per_key": round(rem / n * 1e6, 3),
            "longest_remember_ms": round(worst * 1e3, 1),
        })
    out.put({"stages": stages, "table_rss_mb": round((_rss_kb() - rss0) / 1024, 1)})


def _run(source: str, max_keys: int, fill_factor: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_measure, args=(source, max_keys, fill_factor, q))
    p.start()
    got = q.get(timeout=1800)
    p.join(30)
    return got


def _summary(res: dict[str, Any], max_keys: int) -> dict[str, Any]:
    """Steady state: the stages after the table first reached its cap."""
    full = [s for s in res["stages"] if s["inserted"] > max_keys] or res["stages"]
    return {
        "lookup_us_per_key": round(statistics.median(s["lookup_us_per_key"] for s in full), 3),
        "remember_us_per_key": round(statistics.median(s["remember_us_per_key"] for s in full), 3),
        "longest_remember_ms": max(s["longest_remember_ms"] for s in full),
        "table_rss_mb": res["table_rss_mb"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="HEAD", help="git revision whose table to compare against")
    ap.add_argument("--max-keys", type=int, default=1_000_000)
    ap.add_argument("--fill", type=int, default=3, help="keys inserted, as a multiple of the cap")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="idem-base-") as base:
        data = subprocess.run(["git", "archive", args.baseline, "broker"], cwd=REPO, capture_output=True,
                              check=True).stdout
        with tarfile.open(fileobj=BytesIO(data)) as tar:
            tar.extractall(base, filter="data")
        variants = {"baseline": base, "this tree": str(REPO)}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                res = _run(variants[name], args.max_keys, args.fill)
                runs[name].append(res)
                print(f"round {r + 1} {name:9}: {_summary(res, args.max_keys)}", flush=True)
    report = {
        "config": vars(args),
        "summary": {name: [_summary(x, args.max_keys) for x in rs] for name, rs in runs.items()},
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "idempotency_bench.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
