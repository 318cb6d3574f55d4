"""HTTP produce/consume benchmark against a real 3-member DLedger broker set.

Starts a name server and broker-a's three members from conf/ (fresh ports and store dirs), then
drives the master from separate load-generator processes (a minimal keep-alive HTTP/1.1 client on
uvloop, so the generator is not the bottleneck that httpx would be):

  1. single-message produce, 1 KB body, `--clients` concurrent connections (default 32);
  2. batched produce, 100 x 1 KB per request;
  3. pull, 256 messages per request, every queue read to its end.

Prints a table and writes bench/results/http_bench.json: msgs/s, p50/p99 latency per request, the
brokers' CPU seconds per phase (msgs per broker CPU-second: comparable across machine loads, since
this 2-core machine is shared), and each broker's resident memory without mapped files (RssAnon) at
the start, after each phase and at the end, with its growth per 1,000 stored messages; sampled
twice a second during each phase, so the growth over the second half of the batched produce (steady
state, warm-up excluded) is reported too: it must be ~0.

    .venv/bin/python bench/http_bench.py [--seconds 10] [--clients 32] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
RESULTS = REPO / "bench" / "results"
TOPIC = "bench"
QUEUES = 8


# -- a minimal HTTP/1.1 keep-alive client (load generator side) -----------------------------------
class Conn:
    """One persistent connection; `request` sends prepared bytes and reads one response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        r, w = await asyncio.open_connection(host, port, limit=16 * 1024 * 1024)
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(r, w)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    def close(self) -> None:
        self.writer.close()


def http_request(
    method: str, host: str, path: str, body: bytes = b"", ctype: str = "application/json"
) -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def produce_body(batch: int, size: int) -> bytes:
    text = "x" * size
    return orjson.dumps({"messages": [{"body": text} for _ in range(batch)]})


def keyed_requests(host: str, batch: int, size: int) -> Iterator[bytes]:
    """Requests of messages as the SDK sends them: the queue the batch sticks to (the next of the
    topic's queues each request) on every message, and fresh idempotency keys for all of them as
    one run (`firstIdempotencyKey`: 32 lower-case hex digits, the next counters each request, so
    the brokers' key tables fill as they do behind the SDK)."""
    prefix = os.urandom(8).hex().encode()
    n = 0
    requests = 0
    while True:
        queue = requests % QUEUES
        requests += 1
        part = b'{"body":"' + b"x" * size + b'","queueId":%d}' % queue
        body = b'{"messages":[' + b",".join([part] * batch) + b'],"firstIdempotencyKey":"%s%016x"}' % (
            prefix, n
        )
        n += batch
        yield http_request("POST", host, f"/topics/{TOPIC}/messages", body)


async def produce_worker(
    host: str, port: int, clients: int, seconds: float, batch: int, size: int, keyed: bool = False,
    rate: float = 0,
) -> dict:
    """`clients` connections producing batches for `seconds`: each as fast as it is answered, or,
    with `rate` (messages a second for the whole worker), each on a fixed schedule."""
    raw = http_request("POST", host, f"/topics/{TOPIC}/messages", produce_body(batch, size))
    keyed_raw = keyed_requests(host, batch, size) if keyed else None
    lat: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    interval = clients * batch / rate if rate else 0.0

    async def client(n: int) -> None:
        nonlocal errors
        conn = await Conn.open(host, port)
        due = time.perf_counter() + interval * n / clients
        try:
            while time.perf_counter() < deadline:
                if interval:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    due += interval
                req = next(keyed_raw) if keyed_raw is not None else raw
                t0 = time.perf_counter()
                status, _ = await conn.request(req)
                if status == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    return {
        "requests": len(lat),
        "messages": len(lat) * batch,
        "elapsed": time.perf_counter() - t0,
        "latencies": lat,
        "errors": errors,
    }


async def pull_worker(host: str, port: int, queues: list[tuple[int, int]], per_request: int) -> dict:
    """Read each (queueId, maxOffset) to its end, one connection per queue."""
    lat: list[float] = []
    count = 0

    async def drain(qid: int, end: int) -> None:
        nonlocal count
        conn = await Conn.open(host, port)
        offset = 0
        try:
            while offset < end:
                raw = http_request(
                    "GET",
                    host,
                    f"/topics/{TOPIC}/queues/{qid}/messages?offset={offset}&maxMessages={per_request}",
                )
                t0 = time.perf_counter()
                status, body = await conn.request(raw)
                lat.append(time.perf_counter() - t0)
                doc = orjson.loads(body)
                if status != 200:
                    raise RuntimeError(f"pull failed: {status} {body[:200]!r}")
                count += len(doc["messages"])
                offset = doc["nextOffset"]
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(drain(q, end) for q, end in queues))
    return {
        "messages": count,
        "elapsed": time.perf_counter() - t0,
        "latencies": lat,
        "requests": len(lat),
        "errors": 0,
    }


def _run_worker(kind: str, args: tuple, out: Any) -> None:
    import uvloop

    coro = produce_worker(*args) if kind == "produce" else pull_worker(*args)
    out.put(uvloop.run(coro))


def run_phase(kind: str, worker_args: list[tuple]) -> dict:
    """Run one load phase in separate processes; merge their results."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_run_worker, args=(kind, a, q)) for a in worker_args]
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    lat = sorted(x for r in results for x in r["latencies"])
    elapsed = max(r["elapsed"] for r in results)
    msgs = sum(r["messages"] for r in results)
    return {
        "messages": msgs,
        "requests": sum(r["requests"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(msgs / elapsed) if elapsed else 0,
        "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2) if lat else None,
        "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
    }


# -- cluster side -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_conf(src: Path, dst: Path, overrides: dict[str, str]) -> Path:
    lines, seen = [], set()
    for line in src.read_text().splitlines():
        k, sep, v = line.partition("=")
        if not sep or line.lstrip().startswith("#"):
            continue
        k = k.strip()
        seen.add(k)
        lines.append(f"{k}={overrides.get(k, v.strip())}")
    lines += [f"{k}={v}" for k, v in overrides.items() if k not in seen]
    dst.write_text("\n".join(lines) + "\n")
    return dst


def rss_anon_mb(pid: int) -> float | None:
    """Resident anonymous memory (heap etc., mapped store files excluded), MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time the process has used so far (from /proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler(threading.Thread):
    """Samples each broker's RssAnon twice a second during a phase, so growth after warm-up (the
    second half of the phase) can be told from the one-off growth of the first seconds."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.samples: list[dict[str, float | None]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append(self.cluster.memory())
            self._halt.wait(0.5)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.samples.append(self.cluster.memory())

    def second_half_growth(self, messages: int) -> dict[str, float | None]:
        """KB per 1,000 messages between the middle and the end of the phase (median of three
        samples at each end, the load being steady in between)."""
        n = len(self.samples)
        if n < 8 or not messages:
            return {}
        mid, end = self.samples[n // 2 - 1 : n // 2 + 2], self.samples[-3:]
        out: dict[str, float | None] = {}
        for sid in self.cluster.addrs:
            a = [m[sid] for m in mid if m[sid] is not None]
            b = [m[sid] for m in end if m[sid] is not None]
            out[sid] = (
                round((statistics.median(b) - statistics.median(a)) * 1024 * 1000 / (messages / 2), 1)
                if a and b else None
            )  # fmt: skip
        return out


class Cluster:
    def __init__(self, workdir: Path, flush: str, broker_overrides: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.addrs: dict[str, str] = {}
        self.flush = flush
        self.broker_overrides = broker_overrides or {}

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "ab") as log:
            p = subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = p
        return p

    def start_single(self) -> None:
        """One local-mode broker (no replication): separates HTTP cost from DLedger's."""
        port = free_port()
        conf = write_conf(
            CONF / "broker-single.conf",
            self.workdir / "single.conf",
            {
                "listenPort": str(port),
                "namesrvAddr": "",
                "storePathRootDir": str(self.workdir / "store-single"),
                "flushDiskType": self.flush,
                "grpcServerPort": "0",
                **self.broker_overrides,
            },
        )
        self.addrs["single"] = f"127.0.0.1:{port}"
        self.spawn("single", ["broker", "-c", str(conf), "--log-level", "WARNING"])

    def start(self) -> None:
        ns_port = free_port()
        self.spawn(
            "namesrv",
            [
                "namesrv",
                "-c",
                str(
                    write_conf(CONF / "namesrv.conf", self.workdir / "ns.conf", {"listenPort": str(ns_port)})
                ),
            ],
        )
        peers = ";".join(f"n{i}-127.0.0.1:{free_port()}" for i in range(3))
        for i in range(3):
            port = free_port()
            conf = write_conf(
                CONF / "dledger" / f"broker-n{i}.conf",
                self.workdir / f"n{i}.conf",
                {
                    "listenPort": str(port),
                    "dLegerPeers": peers,
                    "namesrvAddr": f"127.0.0.1:{ns_port}",
                    "storePathRootDir": str(self.workdir / f"store-n{i}"),
                    "flushDiskType": self.flush,
                    "grpcServerPort": "0",
                    **self.broker_overrides,
                },
            )
            self.addrs[f"n{i}"] = f"127.0.0.1:{port}"
            self.spawn(f"n{i}", ["broker", "-c", str(conf), "--log-level", "WARNING"])

    def wait_master(self, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for sid, addr in self.addrs.items():
                try:
                    if httpx.get(f"http://{addr}/status", timeout=1).json()["role"] == "MASTER":
                        return sid
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"no master elected; logs in {self.workdir}")

    def memory(self) -> dict[str, float | None]:
        return {sid: rss_anon_mb(self.procs[sid].pid) for sid in self.addrs}

    def cpu(self) -> dict[str, float | None]:
        return {sid: cpu_seconds(self.procs[sid].pid) for sid in self.addrs}

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of each produce phase")
    ap.add_argument("--clients", type=int, default=32, help="concurrent connections for single produces")
    ap.add_argument("--batch-clients", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1, help="load-generator processes")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    ap.add_argument("--keep", action="store_true", help="keep the store/log directory")
    ap.add_argument(
        "--phases", default="single,batch,pull",
        help="comma-separated subset of single,batch,pull (e.g. 'batch' to profile one phase)",
    )
    ap.add_argument("--single", action="store_true", help="one local-mode broker instead of the DLedger set")
    ap.add_argument(
        "--keyed", action="store_true",
        help="every message carries a fresh idempotency key, as behind the SDK (the key tables fill)",
    )
    ap.add_argument("--idempotency-max-keys", type=int, help="the brokers' idempotencyMaxKeys")
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="http-bench-"))
    overrides = {}
    if args.idempotency_max_keys:
        overrides["idempotencyMaxKeys"] = str(args.idempotency_max_keys)
    cluster = Cluster(workdir, args.flush, overrides)
    cluster.start_single() if args.single else cluster.start()
    report: dict[str, Any] = {
        "config": vars(args),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
    }
    try:
        master = cluster.wait_master()
        addr = cluster.addrs[master]
        host, port = addr.split(":")
        r = httpx.put(
            f"http://{addr}/topics/{TOPIC}", json={"readQueueNums": QUEUES, "writeQueueNums": QUEUES}
        )
        r.raise_for_status()
        mem: list[dict[str, float | None]] = [cluster.memory()]
        w = args.workers

        def phase(name: str, kind: str, worker_args: list[tuple]) -> None:
            # Broker CPU seconds per phase: msgs per CPU-second is comparable across machine loads.
            before = cluster.cpu()
            sampler = RssSampler(cluster)
            sampler.start()
            report[name] = res = run_phase(kind, worker_args)
            sampler.stop()
            res["rss_anon_mb_during"] = sampler.samples
            res["rss_anon_growth_kb_per_1k_msgs_second_half"] = sampler.second_half_growth(res["messages"])
            after = cluster.cpu()
            res["broker_cpu_s"] = {
                sid: round(after[sid] - before[sid], 2) if after[sid] is not None and before[sid] is not None
                else None
                for sid in cluster.addrs
            }
            cpu_all = sum(v for v in res["broker_cpu_s"].values() if v)
            res["msgs_per_broker_cpu_s"] = round(res["messages"] / cpu_all) if cpu_all else None
            res["master_cpu_s"] = res["broker_cpu_s"].get(master)
            mem.append(cluster.memory())

        phases = set(args.phases.split(","))
        if "single" in phases:
            per = max(1, args.clients // w)
            single = (host, int(port), per, args.seconds, 1, args.size, args.keyed)
            phase("produce_single", "produce", [single] * w)
        if "batch" in phases:
            perb = max(1, args.batch_clients // w)
            batched = (host, int(port), perb, args.seconds, 100, args.size, args.keyed)
            phase("produce_batch100", "produce", [batched] * w)
        topic = httpx.get(f"http://{addr}/topics/{TOPIC}").json()
        queues = [(q["queueId"], q["maxOffset"]) for q in topic["queues"]]
        if "pull" in phases:
            shards = [queues[i::w] for i in range(w)]
            phase("pull_256", "pull", [(host, int(port), s, 256) for s in shards if s])
        report["stored_messages"] = sum(e for _, e in queues)
        report["rss_anon_mb"] = {sid: max((m[sid] or 0) for m in mem) for sid in cluster.addrs}
        report["rss_anon_mb_start"] = mem[0]
        report["rss_anon_mb_end"] = mem[-1]
        stored = report["stored_messages"]
        report["rss_anon_growth_kb_per_1k_msgs"] = {
            sid: round(((mem[-1][sid] or 0) - (mem[0][sid] or 0)) * 1024 * 1000 / stored, 1)
            if stored
            else None
            for sid in cluster.addrs
        }
        report["rss_anon_mb_samples"] = mem
        report["master"] = master
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "http_bench" + ("_single" if args.single else "") + ("_keyed" if args.keyed else "") + ".json"
    (RESULTS / name).write_text(json.dumps(report, indent=2))
    targets = {
        "produce_single": ("msgs_per_s", 5000),
        "produce_batch100": ("msgs_per_s", 50000),
        "pull_256": ("msgs_per_s", 60000),
    }
    print(f"load average at start: {report['machine']['loadavg_at_start']}")
    print(
        f"{'phase':<18}{'msgs/s':>10}{'req':>9}{'err':>6}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'msg/cpu-s':>11}{'master cpu':>11}  target"
    )
    for phase, (_key, target) in targets.items():
        if phase not in report:
            continue
        r = report[phase]
        print(
            f"{phase:<18}{r['msgs_per_s']:>10}{r['requests']:>9}{r['errors']:>6}{r['p50_ms']!s:>9}"
            f"{r['p99_ms']!s:>9}{r['msgs_per_broker_cpu_s']!s:>11}{r['master_cpu_s']!s:>11}"
            f"  >= {target} msgs/s"
        )
    if "produce_single" in report:
        print(
            f"p99 single produce target < 25 ms at {args.clients} clients: "
            f"{report['produce_single']['p99_ms']} ms"
        )
    print(
        f"broker RssAnon max MB (mapped files excluded): {report['rss_anon_mb']}; "
        f"stored {report['stored_messages']} messages"
    )
    print(f"RssAnon MB at start {report['rss_anon_mb_start']} -> end {report['rss_anon_mb_end']}")
    print(f"RssAnon growth KB per 1k stored messages, start to end (warm-up included): "
          f"{report['rss_anon_growth_kb_per_1k_msgs']}")
    if "produce_batch100" in report:
        print("RssAnon growth KB per 1k messages over the second half of the batched produce (steady state): "
              f"{report['produce_batch100']['rss_anon_growth_kb_per_1k_msgs_second_half']}")
    print(f"written {RESULTS / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
