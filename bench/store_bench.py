"""Benchmark of DLedgerMmapFileStore: append_as_leader (single and batch of 100) with 100 B, 1 KB and
64 KB bodies, get, and SYNC_FLUSH group commit with 64 concurrent appenders.

Prints a table and writes bench/results/store_bench.json. Targets (issue 2, ASYNC_FLUSH): batch
>= 300k entries/s at 100 B, >= 150k/s at 1 KB, >= 500 MB/s at 64 KB; get >= 300k/s; SYNC_FLUSH with
group commit >= 20k appends/s.

    .venv/bin/python bench/store_bench.py [--dir /tmp] [--seconds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import struct
import sys
import tempfile
import time

import uvloop

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dledger.config import DLedgerConfig
from dledger.entry import DLedgerEntry
from dledger.store.mmap_store import DLedgerMmapFileStore

PHY_POS = struct.Struct(">q")
SIZES = ((100, 300_000), (1024, 150_000), (64 * 1024, 6_000))
TARGETS = {("batch100", 100): ("entries/s", 300_000), ("batch100", 1024): ("entries/s", 150_000),
           ("batch100", 64 * 1024): ("MB/s", 500), ("get", 100): ("entries/s", 300_000),
           ("get", 1024): ("entries/s", 300_000), ("sync_flush_64", 100): ("entries/s", 20_000)}


def stamp_physical_offset(entry: DLedgerEntry, view: memoryview, body_offset: int) -> None:
    """What broker/store/dledger_commitlog.py's hook does: pos + BODY_OFFSET at PHY_POS_POSITION."""
    if len(view) >= body_offset + 36:
        PHY_POS.pack_into(view, body_offset + 28, entry.pos + body_offset)


def make_store(base: str, flush_disk_type: str = "ASYNC_FLUSH") -> DLedgerMmapFileStore:
    cfg = DLedgerConfig(store_base_dir=base, flush_disk_type=flush_disk_type,
                        mapped_file_size_for_entry_data=1024 * 1024 * 1024,
                        mapped_file_size_for_entry_index=32 * 1024 * 1024)
    return DLedgerMmapFileStore(cfg)


class Timer:
    """Wall and CPU time of a block. CPU time shows the store's own cost when the shared machine is
    loaded (wall-clock figures then mostly measure the neighbours)."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def row(mode: str, body: int, n: int, timer: Timer) -> dict:
    return {"mode": mode, "body_bytes": body, "entries": n, "seconds": round(timer.wall, 4),
            "cpu_seconds": round(timer.cpu, 4), "entries_per_s": round(n / timer.wall),
            "mb_per_s": round(n * body / timer.wall / 1e6, 1),
            "cpu_entries_per_s": round(n / max(timer.cpu, 1e-9))}


def bench_bare(base: str, body_len: int, n: int) -> dict:
    """The issue's yardstick: a bare loop of struct.pack_into + mmap slice writes (no store), run
    now on the same machine, so the store's figures can be read against the machine's load."""
    import mmap
    import struct

    header = struct.Struct(">iiqqqiiii")
    path = os.path.join(base, "bare")
    size = n * (48 + body_len) + 4096
    with open(path, "wb") as f:
        f.truncate(size)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), size)
    body = b"b" * body_len
    pos = 0
    with Timer() as t:
        for i in range(n):
            header.pack_into(mm, pos, 1, 48 + body_len, i, 1, pos, 0, 0, 0, body_len)
            mm[pos + 48:pos + 48 + body_len] = body
            pos += 48 + body_len
    r = row("bare_loop", body_len, n, t)
    mm.close()
    return r


def warm_up(base: str, nbytes: int) -> None:
    """Write and delete a scratch file as large as the run's data, untimed. On a VM the first touch
    of never-used guest memory is several times slower than steady state (a long-running broker
    recycles its page cache), and it made the first run in a process look 2-4x slower."""
    import mmap

    path = os.path.join(base, "warm-up")
    with open(path, "wb") as f:
        f.truncate(nbytes)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), nbytes)
    chunk = b"w" * (1 << 20)
    for pos in range(0, nbytes - len(chunk) + 1, len(chunk)):
        mm[pos:pos + len(chunk)] = chunk
    mm.close()
    os.unlink(path)


async def bench_async(base: str, body_len: int, n: int) -> list[dict]:
    store = make_store(base)
    await store.start()
    body = b"b" * body_len
    out = []
    try:
        # batch of 100: the entries are built before timing (the caller's work, not the store's)
        batches = [[DLedgerEntry(body=body) for _ in range(100)] for _ in range(n // 100)]
        with Timer() as t:
            for batch in batches:
                store.batch_append_as_leader(batch, 1)
                await asyncio.sleep(0)  # let the flush service run, as in a server
        out.append(row("batch100", body_len, n // 100 * 100, t))
        del batches
        singles = [DLedgerEntry(body=body) for _ in range(n)]
        append = store.append_as_leader
        with Timer() as t:
            for k in range(0, n, 100):
                for e in singles[k:k + 100]:
                    append(e, 1)
                await asyncio.sleep(0)
        out.append(row("single", body_len, n, t))
        del singles
        # The broker's case: a hook stamps the physical offset into every message (DLedgerCommitLog).
        store.add_append_hook(stamp_physical_offset)
        batches = [[DLedgerEntry(body=body) for _ in range(100)] for _ in range(n // 100)]
        with Timer() as t:
            for batch in batches:
                store.batch_append_as_leader(batch, 1)
                await asyncio.sleep(0)
        out.append(row("batch100_hook", body_len, n // 100 * 100, t))
        del batches
        get = store.get
        total = store.ledger_end_index + 1
        with Timer() as t:
            for i in range(total):
                get(i)
        out.append(row("get", body_len, total, t))
    finally:
        await store.shutdown()
    return out


async def bench_sync_flush(base: str, seconds: float, appenders: int = 64, body_len: int = 100) -> dict:
    store = make_store(base, "SYNC_FLUSH")
    await store.start()
    body = b"s" * body_len
    done = 0
    stop = time.perf_counter() + seconds

    async def appender() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            e = store.append_as_leader(DLedgerEntry(body=body), 1)
            await store.wait_flushed(e.index)
            done += 1

    try:
        with Timer() as t:
            await asyncio.gather(*(appender() for _ in range(appenders)))
        r = row(f"sync_flush_{appenders}", body_len, done, t)
        r["fsync_rounds"] = store.flush_rounds
    finally:
        await store.shutdown()
    return r


async def run(args: argparse.Namespace) -> list[dict]:
    results = []
    for body_len, n in SIZES:
        n = n // 10 if args.quick else n
        base = tempfile.mkdtemp(prefix="store-bench-", dir=args.dir)
        try:
            warm_up(base, 3 * n * (body_len + 48 + 32))
            results.append(bench_bare(base, body_len, n))
            results += await bench_async(base, body_len, n)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    base = tempfile.mkdtemp(prefix="store-bench-", dir=args.dir)
    try:
        results.append(await bench_sync_flush(base, args.seconds / (3 if args.quick else 1)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to put the temporary stores")
    parser.add_argument("--seconds", type=float, default=3.0, help="SYNC_FLUSH run time")
    parser.add_argument("--quick", action="store_true", help="a tenth of the entries")
    args = parser.parse_args()
    results = uvloop.run(run(args))
    sys.stdout.write(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    header = f"{'mode':<16}{'body':>8}{'entries':>10}{'entries/s':>12}{'MB/s':>9}{'cpu ent/s':>12}  target"
    lines = [header, "-" * len(header)]
    for r in results:
        unit, goal = TARGETS.get((r["mode"], r["body_bytes"]), ("", None))
        got = r["entries_per_s"] if unit == "entries/s" else r["mb_per_s"]
        r["target"] = None if goal is None else {"unit": unit, "min": goal, "met": got >= goal}
        mark = "" if goal is None else f">= {goal:,} {unit} {'ok' if got >= goal else 'MISSED'}"
        lines.append(f"{r['mode']:<16}{r['body_bytes']:>8}{r['entries']:>10}{r['entries_per_s']:>12,}"
                     f"{r['mb_per_s']:>9.1f}{r['cpu_entries_per_s']:>12,}  {mark}")
    sys.stdout.write("\n".join(lines) + "\n")
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "store_bench.json"), "w") as f:
        json.dump({"bench": "store_bench", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "python": sys.version.split()[0], "load_average": os.getloadavg(),
                   "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
