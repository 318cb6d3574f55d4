"""Benchmarks of the message model on a real 3-member broker set over HTTP (issue 15).

- `delay`: produce 10,000 delayed messages (batches of 100) due over the next few seconds: produce
  throughput, then how late each became visible to a long-polling puller (delivered store time and
  first-seen time minus its due time), and the fire rate of a burst due in the same second;
- `pending`: 1,000,000 pending timers (due in an hour): produce throughput and the master's
  resident memory growth, with the index resident and with `timerResidentMax` at 100,000 (spilled);
- `fifo`: 100 message groups on a FIFO topic, receive + ack throughput with 4 consumers;
- `filter`: pull throughput over 100,000 messages with a tag filter matching 1 in 10, a SQL92
  filter matching 1 in 10, and unfiltered.

Prints a table and writes bench/results/msgmodel_broker_bench.json.

    .venv/bin/python bench/msgmodel_broker_bench.py [--only delay|pending|fifo|filter] [--pending 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.integration._ledgermq_procs import ProcessGroup, start_dledger_set, wait_master

RESULTS = Path(__file__).resolve().parent / "results"


def rss_anon_mb(pid: int) -> float:
    """Anonymous resident memory (the heap: what the timer index costs); the commit log and the
    consume queues are file-backed maps and would count in VmRSS as they are touched."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class BrokerSet:
    def __init__(self, overrides: dict[str, str]) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="mm-bench-"))
        self.group = ProcessGroup(self.workdir)
        self.addrs = start_dledger_set(self.group, self.workdir, None, **overrides)
        self.master_id = wait_master(self.addrs, 30)
        self.url = f"http://{self.addrs[self.master_id]}"

    def master_pid(self) -> int:
        return self.group.procs[self.master_id].pid

    def topic(self, name: str, kind: str, queues: int = 4) -> None:
        r = httpx.put(
            f"{self.url}/topics/{name}",
            json={
                "readQueueNums": queues,
                "writeQueueNums": queues,
                "perm": 6,
                "attributes": {"message.type": kind},
            },
        )
        r.raise_for_status()

    def stop(self) -> None:
        self.group.stop_all()


async def produce(url: str, topic: str, batches: list[list[dict[str, Any]]], concurrency: int = 4) -> float:
    """Send the batches with `concurrency` clients; seconds taken."""
    queue = list(reversed(batches))
    async with httpx.AsyncClient(timeout=60) as http:

        async def worker() -> None:
            while queue:
                batch = queue.pop()
                r = await http.post(f"{url}/topics/{topic}/messages", json={"messages": batch})
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0


async def watch(
    url: str, topic: str, queues: int, expect: int, timeout_s: float
) -> list[tuple[int, int, int]]:
    """Long-poll every queue until `expect` messages are seen: (due, store time, seen time) each."""
    out: list[tuple[int, int, int]] = []
    async with httpx.AsyncClient(timeout=30) as http:

        async def follow(q: int) -> None:
            offset = 0
            while len(out) < expect:
                r = await http.get(
                    f"{url}/topics/{topic}/queues/{q}/messages",
                    params={"offset": offset, "maxMessages": 256, "waitMs": 500},
                )
                page = r.json()
                now = int(time.time() * 1000)
                for m in page["messages"]:
                    out.append((int(m["properties"]["TIMER_DELIVER_MS"]), m["storeTimestamp"], now))
                offset = page["nextOffset"]

        await asyncio.wait_for(asyncio.gather(*(follow(q) for q in range(queues))), timeout_s)
    return out


def pct(values: list[int], p: float) -> int:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def bench_delay(n: int = 10_000, spread_ms: int = 60_000) -> list[dict[str, Any]]:
    s = BrokerSet({})
    try:
        s.topic("delay", "DELAY")
        t0 = int(time.time() * 1000) + 8_000
        spread = [
            [{"body": f"d{i}", "deliverAt": t0 + (i * 7919) % spread_ms} for i in range(j, j + 100)]
            for j in range(0, n, 100)
        ]
        secs = asyncio.run(produce(s.url, "delay", spread))
        assert int(time.time() * 1000) < t0, "produce took longer than the head start"
        seen = asyncio.run(watch(s.url, "delay", 4, n, spread_ms / 1000 + 60))
        store_late = [st - due for due, st, _ in seen]
        seen_late = [now - due for due, _, now in seen]
        rows = [
            {
                "bench": "delay_spread",
                "due_over_s": spread_ms // 1000,
                "timers": n,
                "produce_per_s": round(n / secs),
                "early": sum(1 for v in store_late if v < 0),
                "store_late_ms_p50": pct(store_late, 0.5),
                "store_late_ms_p99": pct(store_late, 0.99),
                "store_late_ms_max": max(store_late),
                "seen_late_ms_p50": pct(seen_late, 0.5),
                "seen_late_ms_p99": pct(seen_late, 0.99),
                "seen_late_ms_max": max(seen_late),
            }
        ]
        s.topic("burst", "DELAY")
        t1 = int(time.time() * 1000) + 8_000
        burst = [[{"body": f"b{i}", "deliverAt": t1} for i in range(j, j + 100)] for j in range(0, n, 100)]
        asyncio.run(produce(s.url, "burst", burst))
        seen = asyncio.run(watch(s.url, "burst", 4, n, 120))
        last = max(st for _, st, _ in seen)
        rows.append(
            {
                "bench": "delay_burst_same_ms",
                "timers": n,
                "fired_per_s": round(n / max(1, last - t1) * 1000),
                "last_fired_after_ms": last - t1,
                "early": sum(1 for due, st, _ in seen if st < due),
            }
        )
        return rows
    finally:
        s.stop()


def bench_pending(n: int, resident: int | None) -> dict[str, Any]:
    s = BrokerSet({"timerResidentMax": str(resident)} if resident else {})
    try:
        s.topic("pending", "DELAY")
        time.sleep(1)
        before = rss_anon_mb(s.master_pid())
        due = int(time.time() * 1000) + 3_600_000
        batches = [
            [{"body": "x", "deliverAt": due + (i % 600_000)} for i in range(j, min(n, j + 500))]
            for j in range(0, n, 500)
        ]
        secs = asyncio.run(produce(s.url, "pending", batches))
        time.sleep(2)
        after = rss_anon_mb(s.master_pid())
        return {
            "bench": "pending_timers",
            "timers": n,
            "timerResidentMax": resident or "default (2M)",
            "produce_per_s": round(n / secs),
            "master_anon_growth_mb": round(after - before, 1),
            "master_anon_mb": round(after, 1),
        }
    finally:
        s.stop()


def bench_fifo(
    groups: int = 100, per_group: int = 100, consumers: int = 4, kind: str = "FIFO"
) -> dict[str, Any]:
    """Receive + ack of `groups` x `per_group` messages; kind NORMAL = the same without ordering."""
    s = BrokerSet({})
    try:
        s.topic("fifo", kind, queues=8)
        batches = [
            [
                {"body": f"{g}:{k}", **({"messageGroup": f"g{g}"} if kind == "FIFO" else {})}
                for g in range(groups)
            ]
            for k in range(per_group)
        ]
        asyncio.run(produce(s.url, "fifo", batches, concurrency=1))
        total = groups * per_group

        async def run() -> float:
            done = 0
            async with httpx.AsyncClient(timeout=30) as http:

                async def consumer() -> None:
                    nonlocal done
                    while done < total:
                        r = await http.post(
                            f"{s.url}/consumers/fifo-g/receive",
                            json={"topic": "fifo", "maxMessages": 32, "invisibleMs": 30000, "waitMs": 200},
                        )
                        batch = r.json()["messages"]
                        if batch:
                            await http.post(
                                f"{s.url}/consumers/fifo-g/ack",
                                json={"topic": "fifo", "receiptHandles": [m["receiptHandle"] for m in batch]},
                            )
                            done += len(batch)

                t0 = time.perf_counter()
                await asyncio.gather(*(consumer() for _ in range(consumers)))
                return time.perf_counter() - t0

        secs = asyncio.run(run())
        return {
            "bench": f"receive_ack_{kind.lower()}",
            "groups": groups,
            "messages": total,
            "consumers": consumers,
            "per_s": round(total / secs),
        }
    finally:
        s.stop()


def bench_filter(n: int = 100_000) -> list[dict[str, Any]]:
    s = BrokerSet({"enablePropertyFilter": "true"})
    try:
        s.topic("filtered", "NORMAL", queues=1)
        batches = [
            [
                {
                    "body": "x" * 200,
                    "tags": "hit" if i % 10 == 0 else "miss",
                    "properties": {"n": str(i)},
                    "queueId": 0,
                }
                for i in range(j, j + 500)
            ]
            for j in range(0, n, 500)
        ]
        asyncio.run(produce(s.url, "filtered", batches))
        rows = []
        for name, params in (
            ("none", {}),
            ("tag_1_in_10", {"filterType": "TAG", "filterExpression": "hit"}),
            ("sql_1_in_10", {"filterType": "SQL92", "filterExpression": "TAGS = 'hit' AND n >= 0"}),
        ):
            got, offset = 0, 0
            t0 = time.perf_counter()
            with httpx.Client(timeout=30) as http:
                while offset < n:
                    page = http.get(
                        f"{s.url}/topics/filtered/queues/0/messages",
                        params={"offset": offset, "maxMessages": 256, **params},
                    ).json()
                    got += len(page["messages"])
                    offset = page["nextOffset"]
            secs = time.perf_counter() - t0
            rows.append(
                {
                    "bench": f"pull_{name}",
                    "scanned": n,
                    "returned": got,
                    "scanned_per_s": round(n / secs),
                    "returned_per_s": round(got / secs),
                }
            )
        return rows
    finally:
        s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("delay", "pending", "fifo", "filter"))
    ap.add_argument("--pending", type=int, default=1_000_000)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    if args.only in (None, "delay"):
        rows += bench_delay()
    if args.only in (None, "pending"):
        rows.append(bench_pending(args.pending, None))
        rows.append(bench_pending(args.pending, 100_000))
    if args.only in (None, "fifo"):
        rows.append(bench_fifo())
        rows.append(bench_fifo(kind="NORMAL"))
    if args.only in (None, "filter"):
        rows += bench_filter()
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "msgmodel_broker_bench.json").write_text(
        json.dumps({"when": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
