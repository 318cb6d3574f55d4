"""gRPC endpoint benchmark: the official Python client (`rocketmq-python-client` 5.1.2) against a
real 3-member DLedger set, beside the same client against a do-nothing servicer in this process
(the client's own ceiling: what it reaches when the server costs nothing), in the same run.

Phases, each against both targets, with the same client settings:
  1. send: `--messages` 1 KB messages through `Producer.send_async`, `--window` in flight;
  2. receive+ack: 4 threads each `SimpleConsumer.receive(32)` and ack what they got (`ack` on a
     pool of `--window` threads) before their next receive, until `--messages` are acked.

Prints a table and writes bench/results/grpc_bench.json (msgs/s per target and the ratio
LedgerMQ / ceiling; the target is >= 0.8 for both phases), with the CPU time each message cost
this process (the client; for the ceiling also its servicer) and the set's processes — figures a
loaded machine disturbs less than the rates.

    .venv/bin/python bench/grpc_bench.py [--messages 5000] [--window 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import uvloop
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from broker.grpc.convert import from_message, timestamp  # noqa: E402
from broker.grpc.protocol import spb, spb_grpc  # noqa: E402
from broker.grpc.route import BrokerRoute, assignments, message_queues  # noqa: E402
from broker.grpc.settings import settings_reply  # noqa: E402
from broker.grpc.status import OK  # noqa: E402
from broker.message import MessageExt  # noqa: E402

CONF = REPO / "conf"
RESULTS = REPO / "bench" / "results"
TOPIC = "grpc-bench"
GROUP = "grpc-bench-group"
BODY = b"x" * 1024
QUEUES = 8
RECEIVERS = 4


# -- the ceiling: a servicer that does nothing, in this process -------------------------------------
class DoNothingServicer(spb_grpc.MessagingServiceServicer):
    """Answers every RPC the clients need, correctly shaped, at no cost: sends are not stored,
    receives hand out one pre-built message over and over, acks settle nothing."""

    def __init__(self, addr: str) -> None:
        self.route = [BrokerRoute("ceiling", addr, QUEUES, QUEUES, 6)]
        ext = MessageExt(
            topic=TOPIC,
            body=BODY,
            queue_id=0,
            queue_offset=0,
            commit_log_offset=0,
            store_size=0,
            born_timestamp=int(time.time() * 1000),
            born_host="127.0.0.1:0",
            store_timestamp=int(time.time() * 1000),
            store_host=addr,
            properties={"UNIQ_KEY": "00" * 17},
        )
        self.message = from_message(
            ext, namespace="", receipt_handle="h", delivery_attempt=1, invisible_ms=30_000
        )

    async def QueryRoute(self, request: Any, context: Any) -> Any:
        return spb.QueryRouteResponse(status=OK, message_queues=message_queues(request.topic, self.route))

    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        return spb.QueryAssignmentResponse(status=OK, assignments=assignments(request.topic, self.route))

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return spb.HeartbeatResponse(status=OK)

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        return spb.NotifyClientTerminationResponse(status=OK)

    async def Telemetry(self, request_iterator: Any, context: Any) -> Any:
        async for cmd in request_iterator:
            if cmd.WhichOneof("command") == "settings":
                reply = settings_reply(cmd.settings, max_message_size=4 << 20, max_reconsume_times=16)
                yield spb.TelemetryCommand(status=OK, settings=reply)

    async def SendMessage(self, request: Any, context: Any) -> Any:
        entries = [
            spb.SendResultEntry(status=OK, message_id=m.system_properties.message_id, offset=0)
            for m in request.messages
        ]
        return spb.SendMessageResponse(status=OK, entries=entries)

    async def ReceiveMessage(self, request: Any, context: Any) -> Any:
        yield spb.ReceiveMessageResponse(status=OK)
        for _ in range(request.batch_size):
            yield spb.ReceiveMessageResponse(message=self.message)
        yield spb.ReceiveMessageResponse(delivery_timestamp=timestamp(int(time.time() * 1000)))

    async def AckMessage(self, request: Any, context: Any) -> Any:
        entries = [
            spb.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle, status=OK)
            for e in request.entries
        ]
        return spb.AckMessageResponse(status=OK, entries=entries)


class InProcessServer(threading.Thread):
    """The do-nothing servicer on its own uvloop loop in a thread of this process."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    def run(self) -> None:
        uvloop.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = grpc.aio.server()
        spb_grpc.add_MessagingServiceServicer_to_server(DoNothingServicer(self.addr), server)
        server.add_insecure_port(self.addr)
        await server.start()
        self.ready.set()
        await self._stopping.wait()
        await server.stop(1)

    def stop(self) -> None:
        if self.loop is not None and self._stopping is not None:
            self.loop.call_soon_threadsafe(self._stopping.set)
        self.join(5)


# -- LedgerMQ: a name server and a 3-member set, real processes ---------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_conf(src: Path, dst: Path, overrides: dict[str, str]) -> Path:
    lines, seen = [], set()
    for line in src.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and key in overrides:
            seen.add(key)
            line = f"{key}={overrides[key]}"
        lines.append(line)
    lines += [f"{k}={v}" for k, v in overrides.items() if k not in seen]
    dst.write_text("\n".join(lines) + "\n")
    return dst


class Cluster:
    """Name server + broker-a's three members with gRPC endpoints; stopped by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.http: dict[str, str] = {}
        self.grpc: dict[str, str] = {}

    def spawn(self, name: str, args: list[str]) -> None:
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> None:
        ns = f"127.0.0.1:{free_port()}"
        ns_conf = write_conf(
            CONF / "namesrv.conf", self.workdir / "ns.conf", {"listenPort": ns.split(":")[1]}
        )
        self.spawn("namesrv", ["namesrv", "-c", str(ns_conf)])
        peers = ";".join(f"n{i}-127.0.0.1:{free_port()}" for i in range(3))
        for i in range(3):
            http, grpc_port = free_port(), free_port()
            conf = write_conf(
                CONF / "dledger" / f"broker-n{i}.conf",
                self.workdir / f"n{i}.conf",
                {
                    "listenPort": str(http),
                    "grpcServerPort": str(grpc_port),
                    "dLegerPeers": peers,
                    "namesrvAddr": ns,
                    "storePathRootDir": str(self.workdir / f"store-n{i}"),
                    "registerNameServerPeriod": "1000",
                },
            )
            self.http[f"n{i}"] = f"127.0.0.1:{http}"
            self.grpc[f"n{i}"] = f"127.0.0.1:{grpc_port}"
            self.spawn(f"n{i}", ["broker", "-c", str(conf), "--log-level", "WARNING"])
        self.master()
        master = self.http[self.master()]
        r = httpx.put(
            f"http://{master}/topics/{TOPIC}",
            json={"readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6},
            timeout=10,
        )
        r.raise_for_status()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the route names the master's gRPC endpoint
            with_route = httpx.get(f"http://{ns}/routes/{TOPIC}", timeout=2)
            if with_route.status_code == 200 and with_route.json()["brokers"][0].get("masterGrpcAddr"):
                return
            time.sleep(0.2)
        raise RuntimeError("the name server never routed the bench topic to a gRPC endpoint")

    def master(self, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for sid, addr in self.http.items():
                try:
                    if httpx.get(f"http://{addr}/status", timeout=1).json()["role"] == "MASTER":
                        return sid
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
            time.sleep(0.2)
        raise RuntimeError("no master elected")

    def cpu_s(self) -> float:
        """CPU seconds the set's processes (name server and members) have used so far."""
        total = 0
        for p in self.procs.values():
            try:
                fields = Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
        return total / os.sysconf("SC_CLK_TCK")

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


# -- the phases -----------------------------------------------------------------------------------------
def config(endpoints: str) -> ClientConfiguration:
    return ClientConfiguration(endpoints, Credentials(), request_timeout=10)


def send_phase(endpoints: str, n: int, window: int) -> float:
    producer = Producer(config(endpoints), (TOPIC,))
    producer.startup()
    try:

        def message() -> Message:
            m = Message()
            m.topic = TOPIC
            m.body = BODY
            return m

        for _ in range(100):  # warm-up: channels, route, settings
            producer.send(message())
        pending: deque = deque()
        t0 = time.perf_counter()
        for _ in range(n):
            pending.append(producer.send_async(message()))
            if len(pending) >= window:
                pending.popleft().result()
        while pending:
            pending.popleft().result()
        return n / (time.perf_counter() - t0)
    finally:
        producer.shutdown()


def receive_ack_phase(endpoints: str, n: int, window: int) -> float:
    """RECEIVERS threads, each receiving 32 at a time and acking them (on a pool of `window`
    threads) before its next receive, until `n` are acked."""
    consumer = SimpleConsumer(config(endpoints), GROUP, {TOPIC: FilterExpression()}, await_duration=5)
    consumer.startup()
    # Acks from a pool of threads: 5.1.2's SimpleConsumer.ack_async returns None (the future it
    # makes is dropped), and the future behind it is an asyncio one, not to be awaited from here.
    acks = ThreadPoolExecutor(max_workers=window)
    lock = threading.Lock()
    done = [0]

    def receiver() -> None:
        while True:
            with lock:
                if done[0] >= n:
                    return
            batch = consumer.receive(32, 60)
            for f in [acks.submit(consumer.ack, m) for m in batch]:
                f.result()
            with lock:
                done[0] += len(batch)

    try:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=receiver) for _ in range(RECEIVERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return done[0] / (time.perf_counter() - t0)
    finally:
        acks.shutdown()
        consumer.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--window", type=int, default=64)
    args = p.parse_args(argv)
    results: dict[str, Any] = {"messages": args.messages, "window": args.window, "bodyBytes": len(BODY)}
    ceiling = InProcessServer()
    ceiling.start()
    ceiling.ready.wait(10)
    workdir = Path(tempfile.mkdtemp(prefix="grpc-bench-"))
    cluster = Cluster(workdir)
    try:
        cluster.start()
        targets = {"ceiling": ceiling.addr, "ledgermq": ";".join(cluster.grpc.values())}
        for phase, run in (("send", send_phase), ("receiveAck", receive_ack_phase)):
            r = results.setdefault(phase, {})
            for name, endpoints in targets.items():
                client0, set0 = time.process_time(), cluster.cpu_s()
                r[name] = round(run(endpoints, args.messages, args.window), 1)
                r[f"{name}ClientCpuUsPerMsg"] = round((time.process_time() - client0) / args.messages * 1e6)
                if name == "ledgermq":
                    r["setCpuUsPerMsg"] = round((cluster.cpu_s() - set0) / args.messages * 1e6)
            r["ratio"] = round(r["ledgermq"] / r["ceiling"], 3)
        results["loadAverage"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        cluster.stop()
        ceiling.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"{'phase':<12} {'ceiling msgs/s':>15} {'LedgerMQ msgs/s':>16} {'ratio':>7}  (target >= 0.8)"
        f"   CPU us/msg: {'ceiling':>8} {'client':>7} {'set':>6}"
    )
    for phase in ("send", "receiveAck"):
        r = results[phase]
        print(
            f"{phase:<12} {r['ceiling']:>15,.0f} {r['ledgermq']:>16,.0f} {r['ratio']:>7.2f}"
            f"{'':>27}{r['ceilingClientCpuUsPerMsg']:>8} {r['ledgermqClientCpuUsPerMsg']:>7}"
            f" {r['setCpuUsPerMsg']:>6}"
        )
    print(f"load average {results['loadAverage']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "grpc_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
