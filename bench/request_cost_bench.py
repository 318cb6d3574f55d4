"""What one produce request costs the 3-member set, apart from what its messages cost.

Starts a fresh name server and 3-member DLedger set (`http_bench.Cluster`), then sends keyed
produce requests shaped as the SDK sends them (`http_bench.keyed_requests`: fresh idempotency keys
as one run, 1 KB bodies, the queue named) one at a time over one raw keep-alive socket, for
batches of 1, 8, 64 and 256 messages (`--batches`), each for `--seconds`. One request at a time
keeps every member's work on the request's path: the CPU each member spends per request, read from
/proc, divides into a fixed part per request and a part per message (least squares over the batch
sizes). The SDK's 64-coroutine phase sends exactly such 64-message requests one after another.

Then the same batches once more on the same set: on this machine kind the per-message part grows
with the set's page cache (see docs/PERFORMANCE.md, "the page cache's first touch"), the fixed part
does not.

    .venv/bin/python bench/request_cost_bench.py [--seconds 3] [--batches 1,8,64,256] [--rounds 2]

Prints a table and writes bench/results/request_cost_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_bench import QUEUES, RESULTS, TOPIC, Cluster, cpu_seconds, keyed_requests


def _answer(sock: socket.socket) -> bytes:
    """Read one HTTP response (Content-Length framed) and return it whole."""
    buf = b""
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        buf += chunk
        head = buf.find(b"\r\n\r\n")
        if head >= 0:
            length = int(buf[:head].lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(buf) >= head + 4 + length:
                return buf


def measure(addr: str, pids: dict[str, int], batch: int, seconds: float) -> dict[str, Any]:
    """Serial requests of `batch` messages for `seconds`: latency and each member's CPU per request."""
    host, port = addr.split(":")
    requests = keyed_requests(addr, batch, 1024)
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(100):  # warm-up: connection, topic, caches
            sock.sendall(next(requests))
            _answer(sock)
        cpu0 = {sid: cpu_seconds(pid) for sid, pid in pids.items()}
        lat: list[float] = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            sock.sendall(next(requests))
            answer = _answer(sock)
            lat.append(time.perf_counter() - t)
            if not answer.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"refused: {answer[:300]!r}")
        elapsed = time.perf_counter() - t0
        cpu1 = {sid: cpu_seconds(pid) for sid, pid in pids.items()}
    lat.sort()
    n = len(lat)
    return {
        "batch": batch,
        "requests": n,
        "msgs_per_s": round(n * batch / elapsed),
        "p10_us": round(lat[n // 10] * 1e6),
        "p50_us": round(lat[n // 2] * 1e6),
        "cpu_us_per_request": {sid: round((cpu1[sid] - cpu0[sid]) * 1e6 / n) for sid in pids},  # type: ignore[operator]
    }


def fit(rows: list[dict[str, Any]], member: str) -> tuple[float, float]:
    """(µs per request, µs per message) of `member`: least squares of cpu = fixed + batch * each."""
    xs = [r["batch"] for r in rows]
    ys = [r["cpu_us_per_request"][member] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return round(my - slope * mx), round(slope, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each batch size")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the batch sizes on the same set")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="request-cost-"))
    cluster = Cluster(workdir, "ASYNC_FLUSH")
    report: dict[str, Any] = {"bench": "request_cost_bench", "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "load_average_start": os.getloadavg(), "rounds": []}
    try:
        cluster.start()
        master = cluster.wait_master()
        addr = cluster.addrs[master]
        httpx.put(f"http://{addr}/topics/{TOPIC}",
                  json={"readQueueNums": QUEUES, "writeQueueNums": QUEUES}).raise_for_status()
        followers = [sid for sid in cluster.addrs if sid != master]
        pids = {"master": cluster.procs[master].pid, "follower1": cluster.procs[followers[0]].pid,
                "follower2": cluster.procs[followers[1]].pid}
        print(f"{'round':>5} {'batch':>5} {'msgs/s':>8} {'p10 us':>7} {'p50 us':>7}   CPU us per request: "
              "master follower1 follower2")
        for rnd in range(1, args.rounds + 1):
            rows = []
            for batch in batches:
                row = measure(addr, pids, batch, args.seconds)
                rows.append(row)
                cpu = row["cpu_us_per_request"]
                print(f"{rnd:>5} {batch:>5} {row['msgs_per_s']:>8} {row['p10_us']:>7} {row['p50_us']:>7}   "
                      f"{cpu['master']:>24} {cpu['follower1']:>9} {cpu['follower2']:>9}")
            fits = {member: fit(rows, member) for member in pids} if len(batches) > 1 else {}
            for member, (fixed, each) in fits.items():
                print(f"      round {rnd} {member}: {fixed} us per request + {each} us per message")
            report["rounds"].append({"rows": rows, "fit_us": {m: {"per_request": f[0], "per_message": f[1]}
                                                              for m, f in fits.items()}})
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report["load_average_end"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "request_cost_bench.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
