"""`ledgermq-run` (`make run`): a name server, 3-member DLedger broker sets and the console on
loopback.

Starts `mqnamesrv -c conf/namesrv.conf`, for each of `--sets N` (default 1) broker sets
`mqbroker -c conf/dledger/broker-n{0,1,2}.conf`, and `mqdashboard -n <name server> --port 8080` as
separate processes with a fresh temporary store directory (or `--store-dir`), waits until every set
has elected a master, prints curl lines to produce and consume and the console's address, and
stops everything on Ctrl-C / SIGTERM. A process that exits is reported, never a reason to abort
the others.

Set k (0-based) is `broker-a`, `broker-b`, …: the same three files with brokerName and dLegerGroup
renamed and every port (listenPort, the dLegerPeers ports, grpcServerPort) moved up by
`SET_PORT_STEP` * k, so the sets of one machine never share a port.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from broker.config import load_broker_config, parse_properties
from dledger.config import parse_peers

log = logging.getLogger("ledgermq.run")

REPO_CONF = Path(__file__).resolve().parents[1] / "conf"
MEMBERS = ("n0", "n1", "n2")
# Set k's ports are the files' ports + SET_PORT_STEP * k (broker-b: HTTP 11011, 11021, 11031).
SET_PORT_STEP = 100
MAX_SETS = 9
_PORT_KEYS = ("listenPort", "grpcServerPort")


def set_name(k: int) -> str:
    """The brokerName of set k: broker-a, broker-b, …"""
    return f"broker-{chr(ord('a') + k)}"


def set_overrides(conf: Path, k: int) -> dict[str, str]:
    """The `-D` overrides that turn member file `conf` (written for broker-a) into set k's: its
    name, DLedger group and every port moved by SET_PORT_STEP * k. Set 0 is the file as it is."""
    if k == 0:
        return {}
    step = SET_PORT_STEP * k
    values = {key: value for _, key, value in parse_properties(conf.read_text(encoding="utf-8"))}
    name = set_name(k)
    out = {"brokerName": name, "dLegerGroup": name}
    for key in _PORT_KEYS:
        if key in values:
            out[key] = str(int(values[key]) + step)
    if "dLegerPeers" in values:
        peers = parse_peers(values["dLegerPeers"])
        moved = []
        for sid, addr in peers.items():
            host, _, port = addr.rpartition(":")
            moved.append(f"{sid}-{host}:{int(port) + step}")
        out["dLegerPeers"] = ";".join(moved)
    return out


class DevCluster:
    """The processes of `make run`. Caller: `main`."""

    def __init__(self, conf_dir: Path, store_dir: Path, sets: int = 1, console_port: int = 8080) -> None:
        self.conf_dir = conf_dir
        self.console_port = console_port
        self.store_dir = store_dir
        self.sets = sets
        self.log_dir = store_dir / "logs"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # set name -> selfId -> HTTP address, and the members serving the RocketMQ 5 gRPC endpoint
        self.broker_addrs: dict[str, dict[str, str]] = {}
        self.grpc_addrs: dict[str, dict[str, str]] = {}
        self.namesrv_addr = "127.0.0.1:9876"
        self.reported: set[str] = set()

    def _spawn(self, name: str, args: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start(self) -> None:
        ns_conf = self.conf_dir / "namesrv.conf"
        self._spawn("namesrv", ["namesrv", "-c", str(ns_conf)])
        for k in range(self.sets):
            self._start_set(k)
        self._spawn("console", ["console", "-n", self.namesrv_addr, "--port", str(self.console_port)])

    def _start_set(self, k: int) -> None:
        name = set_name(k)
        addrs = self.broker_addrs.setdefault(name, {})
        for sid in MEMBERS:
            conf = self.conf_dir / "dledger" / f"broker-{sid}.conf"
            overrides = {**set_overrides(conf, k), "storePathRootDir": str(self.store_dir / name / sid)}
            try:
                cfg = load_broker_config(str(conf), overrides)
                addrs[sid] = cfg.broker_addr
                if cfg.grpc_addr:
                    self.grpc_addrs.setdefault(name, {})[sid] = cfg.grpc_addr
                self.namesrv_addr = cfg.namesrv_addr_list[0] if cfg.namesrv_addr_list else self.namesrv_addr
            except Exception as exc:  # report and keep going: the broker itself will say more
                print(f"  ! {conf}: {exc}", flush=True)
            args = [arg for key, value in overrides.items() for arg in ("-D", f"{key}={value}")]
            self._spawn(f"{name}-{sid}", ["broker", "-c", str(conf), *args])

    def check_exits(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and name not in self.reported:
                self.reported.add(name)
                print(
                    f"  ! {name} exited with status {proc.returncode}; see {self.log_dir / (name + '.log')}",
                    flush=True,
                )

    def master(self, name: str) -> tuple[str, str] | None:
        """(selfId, address) of set `name`'s master, if one answers."""
        for sid, addr in self.broker_addrs.get(name, {}).items():
            try:
                st = httpx.get(f"http://{addr}/status", timeout=0.5).json()
            except (httpx.HTTPError, ValueError):
                continue
            if st.get("role") == "MASTER":
                return sid, addr
        return None

    def masters(self) -> dict[str, tuple[str, str] | None]:
        """Every set's master (None while it has none)."""
        return {name: self.master(name) for name in self.broker_addrs}

    def wait_masters(self, timeout_s: float) -> dict[str, tuple[str, str] | None]:
        """Until every set has a master or `timeout_s` passed; the masters found."""
        deadline = time.monotonic() + timeout_s
        found = self.masters()
        while time.monotonic() < deadline and not all(found.values()):
            self.check_exits()
            time.sleep(0.2)
            found = self.masters()
        return found

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 8
        for name, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  ! {name} did not stop in time; killing pid {proc.pid}", flush=True)
                proc.kill()
                proc.wait(5)


def banner(masters: dict[str, tuple[str, str] | None], cluster: DevCluster) -> str:
    lines = ["", f"LedgerMQ dev cluster: name server {cluster.namesrv_addr}"]
    for name, addrs in cluster.broker_addrs.items():
        master = masters.get(name)
        lines.append(f"broker set {name}:")
        grpc_addrs = cluster.grpc_addrs.get(name, {})
        for sid, addr in addrs.items():
            role = "master" if master and master[0] == sid else "slave"
            grpc = f"  grpc {grpc_addrs[sid]}" if sid in grpc_addrs else ""
            lines.append(f"  {sid}  http://{addr}{grpc}  ({role})")
        if master is None:
            lines.append("  (no master elected yet)")
    first = next(iter(cluster.broker_addrs), "")
    master = masters.get(first)
    m = master[1] if master else next(iter(cluster.broker_addrs.get(first, {}).values()), "127.0.0.1:10911")
    if len(cluster.broker_addrs) > 1:
        lines += ["", f"The curl lines below go to {first}'s master; the SDK and mqadmin span every set."]
    lines += [
        "",
        "Produce:",
        f"  curl -s -X POST http://{m}/topics/demo/messages -H 'Content-Type: application/json' \\",
        '       -d \'{"messages": [{"body": "hello", "tags": "greeting", "queueId": 0}]}\'',
        "Consume (long poll up to 10 s):",
        f"  curl -s 'http://{m}/topics/demo/queues/0/messages?offset=0&maxMessages=32&waitMs=10000'",
        "Group consumption:",
        f"  curl -s -X POST http://{m}/consumers/demo-group/receive -H 'Content-Type: application/json' \\",
        '       -d \'{"topic": "demo", "maxMessages": 16, "invisibleMs": 30000, "waitMs": 5000}\'',
        *(
            [
                "RocketMQ 5 clients (Java, Go, Python, Node.js ...), any member is an access point:",
                f"  endpoints = \"{';'.join(a for s in cluster.grpc_addrs.values() for a in s.values())}\"",
            ]
            if cluster.grpc_addrs
            else []
        ),
        "Operate:",
        f"  mqadmin clusterList -n {cluster.namesrv_addr}     |  curl -s http://{m}/status",
        f"  API docs: http://{m}/docs     metrics: http://{m}/metrics",
        f"Console: http://127.0.0.1:{cluster.console_port}/",
        "",
        f"Store and logs: {cluster.store_dir}   (Ctrl-C stops everything)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`ledgermq-run`)."""
    p = argparse.ArgumentParser(prog="ledgermq-run", description=__doc__.splitlines()[0])
    p.add_argument("--store-dir", help="store root (default: a fresh temporary directory, removed at exit)")
    p.add_argument("--conf-dir", default=str(REPO_CONF), help="directory holding namesrv.conf and dledger/")
    p.add_argument("--wait-master-s", type=float, default=30.0)
    p.add_argument(
        "--sets",
        type=int,
        default=1,
        choices=range(1, MAX_SETS + 1),
        metavar=f"1..{MAX_SETS}",
        help="number of 3-member broker sets (broker-a, broker-b, ...)",
    )
    p.add_argument("--console-port", type=int, default=8080, help="port of the web console (mqdashboard)")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One line per request from our own httpx clients (registration, probes) is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    temp = args.store_dir is None
    store_dir = Path(args.store_dir or tempfile.mkdtemp(prefix="ledgermq-run-")).resolve()
    store_dir.mkdir(parents=True, exist_ok=True)
    cluster = DevCluster(Path(args.conf_dir), store_dir, args.sets, args.console_port)
    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_requested.append(signum)

    # SIGHUP too: closing the terminal must stop the cluster like Ctrl-C (each child runs in its
    # own session, so the hang-up reaches only this process).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    names = ", ".join(set_name(k) for k in range(args.sets))
    print(f"Starting name server, {names} (n0, n1, n2 each), console; logs in {cluster.log_dir}", flush=True)
    cluster.start()
    failed = True  # until the loop below says otherwise; keeps the logs of a failed start
    try:
        masters = cluster.wait_masters(args.wait_master_s) if not stop_requested else {}
        if not stop_requested:
            print(banner(masters, cluster), flush=True)
        last = masters
        failed = False
        while not stop_requested:
            time.sleep(0.5)
            cluster.check_exits()
            if len(cluster.reported) == len(cluster.procs):
                print("  ! every process has exited", flush=True)
                failed = True
                break
            now = cluster.masters()
            for name, master in now.items():
                if master and master != last.get(name):
                    print(f"  {name}: master is now {master[0]} at http://{master[1]}", flush=True)
            last = {name: master or last.get(name) for name, master in now.items()}
    finally:
        print("Stopping...", flush=True)
        cluster.stop()
        failed = failed and not stop_requested
        if temp and not failed:
            shutil.rmtree(store_dir, ignore_errors=True)
        elif failed:
            print(f"Logs kept in {cluster.log_dir}", flush=True)
        print("Stopped.", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
