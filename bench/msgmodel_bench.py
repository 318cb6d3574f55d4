"""Benchmarks of the message model (issue 15).

- `index`: the pending-timer index alone — adds/s, take-due/s, and its memory at 1,000,000 pending
  timers (tracemalloc, and the process's resident size), in RAM and with a resident limit (the far
  buckets spilled to disk);
- `keys`: the timers' message ids (`TimerKeys`) — adds/s, memory and one lookup's time at
  1,000,000 timer-queue units (what `GET /messages/{messageId}` costs for a pending timer);
- `sql`: SQL92 filter evaluation per message (the broker-side cost of a property filter).

Prints a table, writes bench/results/msgmodel_bench.json.

    .venv/bin/python bench/msgmodel_bench.py [--timers 1000000] [--only index|keys|sql]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker.filter import build_filter
from broker.message import new_uniq_key
from broker.timer.index import TimerIndex
from broker.timer.keys import TimerKeys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def bench_index(n: int, resident_limit: int | None) -> dict:
    """n timers due over 3 days (the maximum delay) from t0, then fire the first hour's worth."""
    rng = random.Random(15)
    t0 = 1_700_000_000_000
    dues = [t0 + rng.randrange(3 * 86_400_000) for _ in range(n)]
    gc.collect()
    spill = tempfile.mkdtemp(prefix="timerspill-") if resident_limit else None
    rss0 = rss_mb()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    idx = TimerIndex(resident_limit=resident_limit, spill_dir=spill)
    idx.advance(t0)
    started = time.perf_counter()
    for off, due in enumerate(dues):
        idx.add(due, off)
    add_s = time.perf_counter() - started
    snap1 = tracemalloc.take_snapshot()
    traced = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    tracemalloc.stop()
    rss = rss_mb() - rss0
    hour = t0 + 3_600_000
    expected = sum(1 for d in dues if d <= hour)
    started = time.perf_counter()
    taken = 0
    now = t0
    while now < hour:
        now += 1000
        for _, off in idx.take_due(now, 100_000):
            idx.remove(off)  # the marker of a fired timer
            taken += 1
    take_s = time.perf_counter() - started
    assert taken == expected, (taken, expected)
    stats = idx.stats()
    return {"bench": "timer_index", "pending": n, "resident_limit": resident_limit,
            "adds_per_s": round(n / add_s), "fired_per_s": round(taken / take_s) if take_s else None,
            "fired": taken, "traced_mb": round(traced / 1e6, 1), "bytes_per_timer": round(traced / n, 1),
            "rss_growth_mb": round(rss, 1), "spilled": stats["spilled"],
            "resident_far": stats["resident_far"]}


def bench_keys(n: int) -> dict:
    """n timers' UNIQ_KEYs indexed, then lookups of keys spread over the whole range."""
    uniqs = [new_uniq_key() for _ in range(n)]
    gc.collect()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    keys = TimerKeys()
    started = time.perf_counter()
    for off, u in enumerate(uniqs):
        keys.add(off, u)
    add_s = time.perf_counter() - started
    snap1 = tracemalloc.take_snapshot()
    traced = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    tracemalloc.stop()
    probes = uniqs[:: max(1, n // 200)]
    started = time.perf_counter()
    for off, u in zip(range(0, n, max(1, n // 200)), probes, strict=True):
        assert off in keys.candidates(u)
    lookup_s = (time.perf_counter() - started) / len(probes)
    return {"bench": "timer_keys", "units": n, "adds_per_s": round(n / add_s),
            "bytes_per_timer": round(traced / n, 1), "traced_mb": round(traced / 1e6, 1),
            "lookup_ms": round(lookup_s * 1000, 2)}


def bench_sql(n: int) -> dict:
    f = build_filter("SQL92", "(TAGS IN ('TagA', 'TagB')) AND (a BETWEEN 0 AND 100) AND region <> 'eu'", True)
    props = [{"TAGS": "TagA" if i % 2 else "TagC", "a": str(i % 200), "region": "us", "UNIQ_KEY": "X" * 32}
             for i in range(1000)]
    started = time.perf_counter()
    hits = 0
    for i in range(n):
        hits += f.matches(props[i % 1000])
    s = time.perf_counter() - started
    return {"bench": "sql92_filter", "evaluations": n, "per_s": round(n / s),
            "us_each": round(s / n * 1e6, 2), "matched": hits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--timers", type=int, default=1_000_000)
    ap.add_argument("--only", choices=("index", "keys", "sql"))
    args = ap.parse_args()
    rows = []
    if args.only in (None, "index"):
        rows.append(bench_index(args.timers, None))
        rows.append(bench_index(args.timers, args.timers // 8))
    if args.only in (None, "keys"):
        rows.append(bench_keys(args.timers))
    if args.only in (None, "sql"):
        rows.append(bench_sql(200_000))
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "msgmodel_bench.json"), "w") as f:
        json.dump({"when": time.strftime("%Y-%m-%d %H:%M"), "maxrss_mb": resource.getrusage(
            resource.RUSAGE_SELF).ru_maxrss / 1000, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
