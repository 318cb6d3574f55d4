"""DLedger replication benchmark: 3 local `python -m dledger` processes (mmap file store), one
client process (uvloop) appending over the TCP protocol.

Measures committed appends/s and p50/p99 latency for 100 B and 1 KB bodies with 1, 16 and 256
appends in flight and with batch appends of 100 bodies, in ASYNC_FLUSH and SYNC_FLUSH, and counts
elections during the run (there should be none after the first). Prints a table and writes
bench/results/dledger_bench.json.

`--peer-auth` measures what peer authentication costs instead: the same quick cases on a group
without and with a peer secret back to back (every member and the client authenticate), and the
connection setup (TCP connect + handshake + one metadata request on a fresh connection, p50/p99)
of each; writes bench/results/dledger_peer_auth.json. `--peer-tls` does the same for peer TLS
(mutual TLS 1.3 on every member's links and the client's, a throwaway CA made with `openssl`);
writes bench/results/dledger_peer_tls.json.

    .venv/bin/python bench/dledger_bench.py [--seconds 3] [--quick] [--peer-auth | --peer-tls]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dledger.client import DLedgerClient  # noqa: E402
from dledger.codes import DLedgerException  # noqa: E402
from dledger.rpc.auth import PeerAuth  # noqa: E402
from dledger.rpc.protocol import MetadataRequest  # noqa: E402
from dledger.rpc.tcp import TcpRpcService  # noqa: E402
from dledger.rpc.tls import PeerTls  # noqa: E402

GROUP = "bench"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    def __init__(self, flush: str, base: Path, secret: str | None = None,
                 tls: tuple[str, str, str] | None = None) -> None:
        self.ids = ["n0", "n1", "n2"]
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in zip(self.ids, free_ports(3), strict=True))
        self.flush = flush
        self.base = base
        self.secret = secret  # a peer secret file: members authenticate every connection
        self.tls = tls  # (certificate, key, CA): peer TLS on every link
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for m in self.ids:
            log = open(self.base / f"{m}.log", "ab")
            cmd = [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", m, "--peers", self.peers]
            cmd += ["--store-dir", str(self.base / m), "--flush-disk-type", self.flush]
            cmd += ["--log-level", "WARNING"]
            if self.secret:
                cmd += ["--peer-secret-file", self.secret]
            if self.tls:
                cert, key, ca = self.tls
                cmd += ["--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", ca]
            prof_dir = os.environ.get("DLEDGER_BENCH_PROFILE")  # cProfile each member into this dir
            if prof_dir:
                cmd[1:1] = ["-m", "cProfile", "-o", os.path.join(prof_dir, f"{m}.prof")]
            self.procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
            log.close()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def rss_mb(pid: int) -> float:
    """Anonymous resident memory of a member process (Linux /proc `RssAnon`), in MB; -1 when it is
    gone. File-backed pages of the mmapped store are left out: the kernel reclaims those freely."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return -1.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc `stat`); 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


async def run_case(c: DLedgerClient, body_size: int, inflight: int, batch: int, seconds: float) -> dict:
    body = os.urandom(body_size)
    bodies = [body] * batch
    lat: list[float] = []
    entries = 0
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal entries, errors
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            try:
                await c.append(bodies)
            except DLedgerException:
                errors += 1
                continue
            lat.append(time.perf_counter() - t0)
            entries += batch

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = time.perf_counter() - t0
    lat.sort()
    return {"body_bytes": body_size, "in_flight": inflight, "batch": batch, "seconds": round(elapsed, 2),
            "entries_per_s": round(entries / elapsed), "requests": len(lat), "errors": errors,
            "p50_ms": round(pct(lat, 0.50) * 1000, 2), "p99_ms": round(pct(lat, 0.99) * 1000, 2)}  # fmt: skip


def write_secret(path: Path) -> str:
    """A fresh peer secret file (mode 600), as an operator makes one with `openssl rand -hex 32`."""
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    return str(path)


async def connection_setup(peers: str, leader: str, secret: str | None, n: int,
                           tls: tuple[str, str, str] | None = None) -> dict:
    """Fresh connections to the leader: TCP connect (+ handshake) + one metadata request each."""
    from dledger.config import parse_peers

    peer_map = parse_peers(peers)
    times: list[float] = []
    for i in range(n):
        auth = PeerAuth.from_file(GROUP, f"bench-{i}", secret) if secret else None
        peer_tls = PeerTls(GROUP, f"bench-{i}", *tls) if tls else None
        rpc = TcpRpcService(GROUP, f"bench-{i}", peer_map, listen=False, auth=auth, tls=peer_tls)
        t0 = time.perf_counter()
        await rpc.metadata(leader, MetadataRequest(group=GROUP, remote_id=leader, local_id=f"bench-{i}"), 5.0)
        times.append(time.perf_counter() - t0)
        await rpc.shutdown()
    times.sort()
    return {"connections": n, "p50_ms": round(pct(times, 0.5) * 1000, 3),
            "p99_ms": round(pct(times, 0.99) * 1000, 3)}


async def bench_cluster(flush: str, cases: list[tuple[int, int, int]], seconds: float,
                        peer_auth: bool = False, setup_connections: int = 0, peer_tls: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="dledger-bench-") as tmp:
        secret = None
        if peer_auth:
            secret = write_secret(Path(tmp) / "peer.secret")
        tls = None
        if peer_tls:
            from tests.tls_certs import make_pki

            pki = make_pki(Path(tmp) / "pki")
            tls = (str(pki.peer_cert), str(pki.peer_key), str(pki.ca))
        label = " auth" if peer_auth else " tls" if peer_tls else ""
        cluster = Cluster(flush, Path(tmp), secret, tls)
        cluster.start()
        try:
            async with DLedgerClient(GROUP, cluster.peers, timeout_s=10.0, peer_secret_file=secret,
                                     peer_tls=tls) as c:
                await c.find_leader()
                await c.append([b"warmup"] * 100)
                term0 = (await c.metadata(c.leader_id))["term"]  # type: ignore[arg-type]
                results = []
                for body, inflight, batch in cases:
                    cpu0 = {m: cpu_s(p.pid) for m, p in zip(cluster.ids, cluster.procs, strict=True)}
                    own0 = time.process_time()
                    r = await run_case(c, body, inflight, batch, seconds)
                    r["flush"] = flush
                    # CPU per committed entry (µs) of each member and of this client: comparable
                    # across runs on a shared machine where entries/s is not.
                    n = max(1, r["entries_per_s"] * r["seconds"])
                    r["cpu_us_per_entry"] = {
                        m: round((cpu_s(p.pid) - cpu0[m]) * 1e6 / n, 1)
                        for m, p in zip(cluster.ids, cluster.procs, strict=True)
                    }
                    r["cpu_us_per_entry"]["client"] = round((time.process_time() - own0) * 1e6 / n, 1)
                    r["leader"] = c.leader_id
                    # Resident memory must not grow with the number of stored entries (leader cache).
                    r["rss_mb"] = {m: rss_mb(p.pid) for m, p in zip(cluster.ids, cluster.procs, strict=True)}
                    results.append(r)
                    print(f"{flush:11}{label} body={body:5} inflight={inflight:4} "
                          f"batch={batch:4} "
                          f"{r['entries_per_s']:>8}/s p50={r['p50_ms']:>7}ms p99={r['p99_ms']:>7}ms "
                          f"errors={r['errors']} rss_mb={max(r['rss_mb'].values())} "
                          f"cpu_us/entry={r['cpu_us_per_entry']}", flush=True)  # fmt: skip
                mds = [await c.metadata(m) for m in cluster.ids]
                terms = {md["term"] for md in mds}
                out = {"results": results, "elections_during_run": max(terms) - term0,
                       "committed": [md["committedIndex"] for md in mds]}  # fmt: skip
                if setup_connections:
                    setup = await connection_setup(cluster.peers, c.leader_id, secret,  # type: ignore[arg-type]
                                                   setup_connections, tls)
                    print(f"{flush:11}{label} connection setup (connect"
                          f"{' + handshake' if label else ''} + 1 request): p50={setup['p50_ms']}ms "
                          f"p99={setup['p99_ms']}ms over {setup['connections']}", flush=True)
                    out["connection_setup"] = setup
                return out
        finally:
            cluster.stop()


async def main_async(args: argparse.Namespace) -> dict:
    cases = [(size, inflight, 1) for size in (100, 1024) for inflight in (1, 16, 256)]
    cases += [(100, 16, 100), (1024, 16, 100)]
    sync_cases = [(1024, 16, 1), (1024, 256, 1), (1024, 16, 100)]
    if args.quick:
        cases = [(1024, 16, 1), (1024, 16, 100)]
        sync_cases = [(1024, 16, 100)]
    if args.soak:
        # One long run at full load: the point is the election count (must stay 0).
        return {"soak": await bench_cluster("ASYNC_FLUSH", [(1024, 16, 100)], args.soak)}
    if args.peer_auth:
        quick = [(1024, 16, 1), (1024, 16, 100)]
        return {"plain": await bench_cluster("ASYNC_FLUSH", quick, args.seconds, False, 200),
                "auth": await bench_cluster("ASYNC_FLUSH", quick, args.seconds, True, 200)}
    if args.peer_tls:
        quick = [(1024, 16, 1), (1024, 16, 100)]
        return {"plain": await bench_cluster("ASYNC_FLUSH", quick, args.seconds, False, 200),
                "tls": await bench_cluster("ASYNC_FLUSH", quick, args.seconds, False, 200, peer_tls=True)}
    out = {"async": await bench_cluster("ASYNC_FLUSH", cases, args.seconds)}
    out["sync"] = await bench_cluster("SYNC_FLUSH", sync_cases, args.seconds)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--soak", type=float, default=0.0, help="only a SECONDS-long full-load run (elections)")
    p.add_argument("--peer-auth", action="store_true", help="plain vs authenticated peers, back to back")
    p.add_argument("--peer-tls", action="store_true", help="plain vs TLS peer links, back to back")
    args = p.parse_args()
    try:
        import uvloop

        out = uvloop.run(main_async(args))
    except ImportError:
        out = asyncio.run(main_async(args))
    out["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    results_dir = REPO / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    name = ("dledger_soak.json" if args.soak else "dledger_peer_auth.json" if args.peer_auth
            else "dledger_peer_tls.json" if args.peer_tls else "dledger_bench.json")
    (results_dir / name).write_text(json.dumps(out, indent=2))
    elections = {
        k: v["elections_during_run"] for k, v in out.items() if isinstance(v, dict) and "results" in v
    }
    print(f"elections during run: {elections}; wrote bench/results/{name}")


if __name__ == "__main__":
    main()
