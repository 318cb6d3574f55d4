"""The Python SDK at the broker's speed: the SDK against a real 3-member DLedger broker set, beside
NATS JetStream R3 driven by nats-py in the same run (issue 14's targets).

Starts a name server and broker-a's three members (bench/http_bench.py's Cluster), then runs each
client phase in a process of its own (spawned; the brokers are processes of their own too), 1 KB
bodies, no batches built by the caller:

  async_send_64     64 coroutines awaiting `AsyncProducer.send`          target >= 50,000 msgs/s, >= 1.5x NATS
  send_async_flush  one thread calling `Producer.send_async`, then flush target >= 50,000 msgs/s
  send_loop         `Producer.send` in a loop                            target p50 < 1 ms
  simple_32         `SimpleConsumer.receive(32)` + acks, the topic drained target >= 30,000 msgs/s
  push              `PushConsumer`, a listener that counts, drained        target >= 30,000 msgs/s
  pull_iterator     `PullConsumer.iterate` over every queue, drained       target >= 150,000 msgs/s
  keyed_vs_plain    broker CPU per message, every message with an SDK-shaped key against none,
                    batches of 100 from bench/http_bench.py's raw client   target <= 1.2x
                    flat out, and again with the same load offered to both (--keyed-rate,
                    20,000 msgs/s by default: under what either kind reaches)

The NATS peer: three nats-server processes (Debian's `nats-server`), a stream with 3 replicas on
file storage, nats-py: 64 coroutines awaiting `js.publish` (the same shape as async_send_64) and
`publish_async` with 4,000 in flight (the peer table's figure). Skipped with a note when
`nats-server` or `nats-py` is missing (`apt-get install nats-server`, `pip install nats-py`).

`--baseline REF` also runs every client phase with the `client/` package of git revision REF
(e.g. `main`), back to back with the working tree's, against the same brokers; a phase whose API
REF lacks is reported as n/a. The machine is shared: the load average at start and end is in
the report; compare rows of one run.

Prints a table, writes bench/results/sdk_bench.json.

    .venv/bin/python bench/sdk_bench.py [--seconds 5] [--baseline main] [--phases ...] [--keyed-rounds 3]
        [--keyed-rate 20000]
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
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
import http_bench  # noqa: E402
from http_bench import Cluster, run_phase  # noqa: E402  (the benches' one cluster runner)

RESULTS = BENCH / "results"
TOPIC = "sdkbench"
QUEUES = 8
BODY = "x" * 1024


# ---- client phases (each in a spawned process) ---------------------------------------------------
def _percentile(lat: list[float], q: float) -> float | None:
    if not lat:
        return None
    lat = sorted(lat)
    return round(lat[min(len(lat) - 1, int(len(lat) * q))] * 1000, 3)


async def _async_send(ns: str, seconds: float, coroutines: int) -> dict[str, Any]:
    from client.producer import AsyncProducer

    lat: list[float] = []
    count = 0
    stop = 0.0

    async def worker(p: AsyncProducer) -> None:
        nonlocal count
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await p.send(TOPIC, BODY)
            lat.append(time.perf_counter() - t)
            count += 1

    async with AsyncProducer(ns) as p:
        stop = time.perf_counter() + 1.0  # warm-up: connections, routes
        await asyncio.gather(*(worker(p) for _ in range(coroutines)))
        count, lat = 0, []
        cpu0, t0 = time.process_time(), time.perf_counter()
        stop = t0 + seconds
        await asyncio.gather(*(worker(p) for _ in range(coroutines)))
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    return {"messages": count, "elapsed": elapsed, "client_cpu_s": cpu, "latencies": lat}


def phase_async_send_64(ns: str, seconds: float) -> dict[str, Any]:
    import uvloop

    return uvloop.run(_async_send(ns, seconds, 64))


def phase_send_async_flush(ns: str, seconds: float) -> dict[str, Any]:
    from client.producer import Producer

    with Producer(ns) as p:
        warm = [p.send_async(TOPIC, BODY) for _ in range(2000)]
        p.flush()
        assert all(f.result() for f in warm)
        futures = []
        cpu0, t0 = time.process_time(), time.perf_counter()
        stop = t0 + seconds
        while time.perf_counter() < stop:
            for _ in range(100):
                futures.append(p.send_async(TOPIC, BODY))
        p.flush()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        failed = sum(1 for f in futures if f.exception() is not None)
    return {"messages": len(futures) - failed, "errors": failed, "elapsed": elapsed, "client_cpu_s": cpu}


def phase_send_loop(ns: str, seconds: float) -> dict[str, Any]:
    from client.producer import Producer

    lat: list[float] = []
    with Producer(ns) as p:
        for _ in range(200):
            p.send(TOPIC, BODY)
        cpu0, t0 = time.process_time(), time.perf_counter()
        stop = t0 + seconds
        while time.perf_counter() < stop:
            t = time.perf_counter()
            p.send(TOPIC, BODY)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    return {"messages": len(lat), "elapsed": elapsed, "client_cpu_s": cpu, "latencies": lat}


def phase_simple_32(ns: str, seconds: float) -> dict[str, Any]:
    """`SimpleConsumer.receive(32)` then `ack_async` of the batch, until the topic is drained
    (or `seconds` * 3 have passed)."""
    from client.consumer import SimpleConsumer

    count = 0
    with SimpleConsumer(_group("bench-simple"), TOPIC, ns, **_ahead(SimpleConsumer)) as c:
        ack = getattr(c, "ack_async", c.ack)  # a baseline without ack_async acks in line
        cpu0, t0 = time.process_time(), time.perf_counter()
        stop = t0 + seconds * 3
        idle = 0
        while time.perf_counter() < stop and idle < 3:
            msgs = c.receive(32, wait_ms=200)
            idle = 0 if msgs else idle + 1
            count += len(msgs)
            if msgs:
                ack(*msgs)
        if hasattr(c, "flush_acks"):
            c.flush_acks()
        elapsed = time.perf_counter() - t0 - (0.2 * idle)
        cpu = time.process_time() - cpu0
    return {"messages": count, "elapsed": elapsed, "client_cpu_s": cpu}


def _ahead(cls: type) -> dict[str, Any]:
    """receive_ahead=True where the consumer has it (a baseline may not)."""
    import inspect

    return {"receive_ahead": True} if "receive_ahead" in inspect.signature(cls._async_cls).parameters else {}


def phase_push(ns: str, seconds: float) -> dict[str, Any]:
    """`PushConsumer` with a listener that only counts, until the topic is drained."""
    from client.push import PushConsumer

    lock = threading.Lock()
    count = 0
    last = [time.perf_counter()]

    def listener(m: Any) -> None:
        nonlocal count
        with lock:
            count += 1
            last[0] = time.perf_counter()

    c = PushConsumer(_group("bench-push"), TOPIC, listener, ns, wait_ms=200)
    cpu0, t0 = time.process_time(), time.perf_counter()
    c.start()
    while time.perf_counter() - max(last[0], t0) < 1.0 and time.perf_counter() - t0 < seconds * 3:
        time.sleep(0.05)
    elapsed = last[0] - t0
    cpu = time.process_time() - cpu0
    c.shutdown(10)
    return {"messages": count, "elapsed": elapsed, "client_cpu_s": cpu}


def phase_pull_iterator(ns: str, seconds: float) -> dict[str, Any]:
    """`PullConsumer.iterate` over every queue from the start, until the end is reached."""
    from client.consumer import PullConsumer

    with PullConsumer(ns) as c:
        total = sum(
            q["maxOffset"] for q in httpx.get(f"http://{_master_of(ns)}/topics/{TOPIC}").json()["queues"]
        )
        it = c.iterate(TOPIC, _group("bench-pull"), start="earliest", wait_ms=200)
        cpu0, t0 = time.process_time(), time.perf_counter()
        count = 0
        for _ in it:
            count += 1
            if count >= total:
                break
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        it.close()
    return {"messages": count, "elapsed": elapsed, "client_cpu_s": cpu}


def _master_of(ns: str) -> str:
    return httpx.get(f"http://{ns}/routes/{TOPIC}").json()["brokers"][0]["masterAddr"]


PHASES = {
    "async_send_64": phase_async_send_64,
    "send_async_flush": phase_send_async_flush,
    "send_loop": phase_send_loop,
    "simple_32": phase_simple_32,
    "push": phase_push,
    "pull_iterator": phase_pull_iterator,
}


def _group(name: str) -> str:
    """A consumer phase's group: the baseline's own, so it reads what the SDK's phase read."""
    return name + os.environ.get("SDK_BENCH_GROUP_SUFFIX", "")


def _client_process(name: str, source: str | None, args: tuple, out: Any) -> None:
    if source:
        sys.path.insert(0, source)  # the baseline's client/ package first
        os.environ["SDK_BENCH_GROUP_SUFFIX"] = "-baseline"
    try:
        out.put({"ok": PHASES[name](*args)})
    except (AttributeError, TypeError, ImportError) as exc:
        out.put({"na": f"{type(exc).__name__}: {exc}"})
    except Exception as exc:
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def run_client(name: str, source: str | None, args: tuple, timeout_s: float = 600) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_client_process, args=(name, source, args, q))
    p.start()
    try:
        got = q.get(timeout=timeout_s)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    if "ok" not in got:
        return got
    r = got["ok"]
    res: dict[str, Any] = {
        "messages": r["messages"],
        "seconds": round(r["elapsed"], 3),
        "msgs_per_s": round(r["messages"] / r["elapsed"]) if r["elapsed"] else 0,
        "client_cpu_us_per_msg": round(r["client_cpu_s"] / r["messages"] * 1e6, 1) if r["messages"] else None,
    }
    if "latencies" in r:
        res["p50_ms"] = _percentile(r["latencies"], 0.5)
        res["p99_ms"] = _percentile(r["latencies"], 0.99)
    if r.get("errors"):
        res["errors"] = r["errors"]
    return res


def baseline_source(ref: str, into: Path) -> str:
    """`client/` of git revision `ref`, extracted under `into` (returned as a sys.path entry)."""
    data = subprocess.run(["git", "archive", ref, "client"], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return str(into)


# ---- broker CPU: keyed against plain produce --------------------------------------------------------
def keyed_vs_plain(
    cluster: Cluster, master: str, seconds: float, rounds: int = 3, rate: float = 0
) -> dict[str, Any]:
    """Broker CPU per message for batches of 100 x 1 KB from the raw client, with and without an
    SDK-shaped key on every message (the master's CPU, and all three members').

    The two alternate in `rounds` pairs of `seconds` / 2 each (plain then keyed, keyed then plain,
    ...): on a shared machine the speed of the whole set drifts by tens of percent within a minute,
    and one plain phase followed by one keyed phase measured that drift as often as the keys. The
    ratio is of the sums over all rounds; each pair's own ratio is listed beside it.

    With `rate` (msgs/s) both kinds are offered that load on a fixed schedule instead of as fast
    as the set answers: then both do the same work a second, and the ratio is the keys' own cost.
    Flat out, the slower keyed phase also spreads the set's per-request and per-wake-up costs over
    fewer messages a second (less batching in the pushes and the fsyncs), which the ratio counts too."""
    host, port = cluster.addrs[master].split(":")
    # The raw client's topic, with the queues its keyed requests name (as the SDK names its batch's).
    httpx.put(
        f"http://{cluster.addrs[master]}/topics/{http_bench.TOPIC}",
        json={"readQueueNums": http_bench.QUEUES, "writeQueueNums": http_bench.QUEUES},
    ).raise_for_status()
    totals = {kind: {"messages": 0, "elapsed": 0.0, "master": 0.0, "all": 0.0} for kind in ("plain", "keyed")}
    pairs: list[float] = []
    for r in range(rounds):
        per_msg: dict[bool, float] = {}
        for keyed in ((False, True) if r % 2 == 0 else (True, False)):
            before = cluster.cpu()
            res = run_phase("produce", [(host, int(port), 8, seconds / 2, 100, 1024, keyed, rate)])
            after = cluster.cpu()
            if res["errors"]:  # a refused request costs the set less: it would flatter the ratio
                raise RuntimeError(f"keyed_vs_plain: {res['errors']} {'keyed' if keyed else 'plain'} "
                                   "produce requests were refused")
            used = {sid: after[sid] - before[sid] for sid in cluster.addrs if after[sid] is not None}
            t = totals["keyed" if keyed else "plain"]
            t["messages"] += res["messages"]
            t["elapsed"] += res["seconds"]
            t["master"] += used[master]
            t["all"] += sum(used.values())
            per_msg[keyed] = used[master] / res["messages"]
        pairs.append(round(per_msg[True] / per_msg[False], 2))
    out: dict[str, Any] = {
        kind: {
            "msgs_per_s": round(t["messages"] / t["elapsed"]),
            "master_cpu_us_per_msg": round(t["master"] / t["messages"] * 1e6, 1),
            "all_cpu_us_per_msg": round(t["all"] / t["messages"] * 1e6, 1),
        }
        for kind, t in totals.items()
    }
    out["offered_msgs_per_s"] = rate or "as fast as answered"
    out["ratio_master"] = round(
        out["keyed"]["master_cpu_us_per_msg"] / out["plain"]["master_cpu_us_per_msg"], 2
    )
    out["ratio_master_per_round"] = pairs
    return out


# ---- NATS JetStream R3 peer ---------------------------------------------------------------------------
def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class NatsCluster:
    """Three nats-server processes with JetStream, clustered on loopback; stopped by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        ports = _free_ports(6)
        self.client_ports, self.route_ports = ports[:3], ports[3:]
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        for i in range(3):
            store = self.workdir / f"js{i}"
            store.mkdir()
            routes = ", ".join(
                f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i
            )
            conf = self.workdir / f"n{i}.conf"
            conf.write_text(
                f"server_name: n{i}\nlisten: 127.0.0.1:{self.client_ports[i]}\nmax_payload: 1048576\n"
                f'jetstream {{ store_dir: "{store}", max_mem: 1G, max_file: 8G }}\n'
                f"cluster {{ name: sdkbench, listen: 127.0.0.1:{self.route_ports[i]}, routes: [{routes}] }}\n"
            )
            with open(self.workdir / f"n{i}.log", "ab") as log:
                self.procs.append(
                    subprocess.Popen(
                        [binary, "-c", str(conf)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)


async def _nats_run(url: str, seconds: float) -> dict[str, Any]:
    import nats
    import nats.js.api as api

    nc = None
    deadline = time.monotonic() + 30
    while nc is None:
        try:
            nc = await nats.connect(
                servers=[url], connect_timeout=2, max_reconnect_attempts=0, pending_size=256 * 1024 * 1024
            )
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)
    js = nc.jetstream(timeout=10, publish_async_max_pending=100000)
    while True:
        try:
            await js.add_stream(
                name="BENCH", subjects=["bench.>"], num_replicas=3, storage=api.StorageType.FILE
            )
            await js.publish("bench.warm", b"x")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)
    payload = BODY.encode()
    out: dict[str, Any] = {}

    # 64 coroutines awaiting js.publish: the shape of async_send_64.
    count, lat, stop = 0, [], time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await js.publish("bench.x", payload)
            lat.append(time.perf_counter() - t)
            count += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(64)))
    el = time.perf_counter() - t0
    out["publish_64_coroutines"] = {
        "msgs_per_s": round(count / el),
        "p50_ms": _percentile(lat, 0.5),
        "p99_ms": _percentile(lat, 0.99),
    }

    # publish_async with 4,000 acks outstanding (the peer table's figure).
    sem = asyncio.Semaphore(4000)
    ok = 0

    def done(f: asyncio.Future) -> None:
        nonlocal ok
        sem.release()
        if not f.cancelled() and f.exception() is None:
            ok += 1

    t0 = time.perf_counter()
    stop = t0 + seconds
    while time.perf_counter() < stop:
        await sem.acquire()
        (await js.publish_async("bench.x", payload)).add_done_callback(done)
    at_end = ok
    el = time.perf_counter() - t0
    try:
        await asyncio.wait_for(js.publish_async_completed(), timeout=10)
    except TimeoutError:
        pass
    out["publish_async_4000"] = {"msgs_per_s": round(at_end / el)}
    await nc.close()
    return out


def _nats_process(url: str, seconds: float, q: Any) -> None:
    import uvloop

    try:
        q.put({"ok": uvloop.run(_nats_run(url, seconds))})
    except Exception as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})


def nats_peer(seconds: float) -> dict[str, Any]:
    if shutil.which("nats-server") is None and not Path("/usr/sbin/nats-server").exists():
        return {"skipped": "nats-server is not installed (apt-get install nats-server)"}
    try:
        import nats  # noqa: F401
    except ImportError:
        return {"skipped": "nats-py is not installed (pip install nats-py)"}
    workdir = Path(tempfile.mkdtemp(prefix="sdk-bench-nats-"))
    cluster = NatsCluster(workdir)
    cluster.start()
    try:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(
            target=_nats_process, args=(f"nats://127.0.0.1:{cluster.client_ports[0]}", seconds, q)
        )
        p.start()
        got = q.get(timeout=300)
        p.join(30)
        return got.get("ok", got)
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# ---- main ---------------------------------------------------------------------------------------------
TARGETS = {
    "async_send_64": "msgs/s >= 50,000 and >= 1.5x NATS",
    "send_async_flush": "msgs/s >= 50,000",
    "send_loop": "p50 < 1 ms",
    "simple_32": "msgs/s >= 30,000",
    "push": "msgs/s >= 30,000",
    "pull_iterator": "msgs/s >= 150,000",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    ap.add_argument("--phases", default=",".join([*PHASES, "keyed_vs_plain", "nats"]))
    ap.add_argument("--baseline", help="git revision whose client/ also runs every client phase")
    ap.add_argument("--keep", action="store_true", help="keep the brokers' directory")
    ap.add_argument(
        "--keyed-rounds", type=int, default=3, help="alternated plain/keyed pairs of keyed_vs_plain"
    )
    ap.add_argument(
        "--keyed-rate", type=float, default=20_000,
        help="keyed_vs_plain again with this load offered (msgs/s) to both kinds; 0: not",
    )
    args = ap.parse_args(argv)
    phases = args.phases.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="sdk-bench-"))
    report: dict[str, Any] = {
        "config": vars(args),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
    }
    sources: dict[str, str | None] = {"sdk": None}
    if args.baseline:
        sources[f"baseline {args.baseline}"] = baseline_source(args.baseline, workdir / "baseline")
    cluster = Cluster(workdir / "brokers", "ASYNC_FLUSH")
    (workdir / "brokers").mkdir()
    cluster.start()
    try:
        master = cluster.wait_master()
        addr = cluster.addrs[master]
        ns_addr = _namesrv_addr(cluster)
        r = httpx.put(
            f"http://{addr}/topics/{TOPIC}", json={"readQueueNums": QUEUES, "writeQueueNums": QUEUES}
        )
        r.raise_for_status()
        _wait_route(ns_addr)
        for name in PHASES:
            if name not in phases:
                continue
            for label, source in sources.items():
                before = cluster.cpu()
                res = report.setdefault(name, {})[label] = run_client(name, source, (ns_addr, args.seconds))
                after = cluster.cpu()
                if res.get("messages"):
                    # The brokers' CPU per message: what the phase costs the set, whatever the load.
                    used = {sid: after[sid] - before[sid] for sid in cluster.addrs if after[sid] is not None}
                    res["master_cpu_us_per_msg"] = round(used[master] / res["messages"] * 1e6, 1)
                    res["brokers_cpu_us_per_msg"] = round(sum(used.values()) / res["messages"] * 1e6, 1)
                print(f"{name:<18}{label:<22}{res}", flush=True)
        if "keyed_vs_plain" in phases:
            report["keyed_vs_plain"] = keyed_vs_plain(cluster, master, args.seconds, args.keyed_rounds)
            print(f"keyed_vs_plain    {report['keyed_vs_plain']}", flush=True)
            if args.keyed_rate:
                report["keyed_vs_plain_at_rate"] = keyed_vs_plain(
                    cluster, master, args.seconds, args.keyed_rounds, args.keyed_rate
                )
                print(f"keyed_vs_plain at rate {report['keyed_vs_plain_at_rate']}", flush=True)
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if "nats" in phases:
        report["nats_r3"] = nats_peer(args.seconds)
        print(f"nats_r3           {report['nats_r3']}", flush=True)
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sdk_bench.json").write_text(json.dumps(report, indent=2))
    _print_table(report)
    print(f"written {RESULTS / 'sdk_bench.json'}")
    return 0


def _namesrv_addr(cluster: Cluster) -> str:
    conf = (cluster.workdir / "ns.conf").read_text()
    port = next(line.split("=", 1)[1] for line in conf.splitlines() if line.startswith("listenPort="))
    return f"127.0.0.1:{port}"


def _wait_route(ns: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = httpx.get(f"http://{ns}/routes/{TOPIC}")
        if r.status_code == 200 and r.json()["brokers"][0].get("writeQueueNums") == QUEUES:
            return
        time.sleep(0.1)
    raise RuntimeError(f"no route for {TOPIC}")


def _print_table(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(f"load average at start {m['loadavg_at_start']}, at end {m['loadavg_at_end']}")
    print(
        f"{'phase':<18}{'client':<22}{'msgs/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'cpu us/msg':>11}"
        f"{'master us':>10}  target"
    )
    for name, target in TARGETS.items():
        for label, r in report.get(name, {}).items():
            if "msgs_per_s" not in r:
                print(f"{name:<18}{label:<22}{'n/a':>10}  {r}")
                continue
            print(
                f"{name:<18}{label:<22}{r['msgs_per_s']:>10}{r.get('p50_ms')!s:>9}{r.get('p99_ms')!s:>9}"
                f"{r['client_cpu_us_per_msg']!s:>11}{r.get('master_cpu_us_per_msg')!s:>10}  {target}"
            )
    for key in ("keyed_vs_plain", "keyed_vs_plain_at_rate"):
        if key in report:
            k = report[key]
            offered = k["offered_msgs_per_s"]
            load = f"{offered:g} msgs/s offered" if isinstance(offered, int | float) else offered
            print(
                f"keyed vs plain master CPU per message ({load}, "
                f"{k['keyed']['msgs_per_s']} / {k['plain']['msgs_per_s']} msgs/s): "
                f"{k['keyed']['master_cpu_us_per_msg']} / {k['plain']['master_cpu_us_per_msg']} us = "
                f"{k['ratio_master']}x (target <= 1.2x); each round: {k['ratio_master_per_round']}"
            )
    nats_r = report.get("nats_r3")
    if nats_r:
        print(f"NATS JetStream R3, nats-py: {nats_r}")
        sdk = report.get("async_send_64", {}).get("sdk", {}).get("msgs_per_s")
        peer = (nats_r.get("publish_64_coroutines") or {}).get("msgs_per_s")
        if sdk and peer:
            print(f"async_send_64 / NATS 64 coroutines awaiting publish: {sdk / peer:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
