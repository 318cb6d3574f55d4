"""`ledgermq-run` (`make run`): a name server, the 3-member DLedger set broker-a and the console
on loopback.

Starts `mqnamesrv -c conf/namesrv.conf`, `mqbroker -c conf/dledger/broker-n{0,1,2}.conf` and
`mqdashboard -n <name server> --port 8080` as separate processes with a fresh temporary store
directory (or `--store-dir`), waits until a master is elected, prints curl lines to produce and
consume and the console's address, and stops everything on Ctrl-C / SIGTERM. A process that exits
is reported, never a reason to abort the others.
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

from broker.config import load_broker_config

log = logging.getLogger("ledgermq.run")

REPO_CONF = Path(__file__).resolve().parents[1] / "conf"


class DevCluster:
    """The processes of `make run`. Caller: `main`."""

    def __init__(self, conf_dir: Path, store_dir: Path, console_port: int = 8080) -> None:
        self.conf_dir = conf_dir
        self.console_port = console_port
        self.store_dir = store_dir
        self.log_dir = store_dir / "logs"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.broker_addrs: dict[str, str] = {}
        self.grpc_addrs: dict[str, str] = {}  # members serving the RocketMQ 5 gRPC endpoint
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
        for i in range(3):
            conf = self.conf_dir / "dledger" / f"broker-n{i}.conf"
            store = self.store_dir / f"n{i}"
            try:
                cfg = load_broker_config(str(conf), {"storePathRootDir": str(store)})
                self.broker_addrs[f"n{i}"] = cfg.broker_addr
                if cfg.grpc_addr:
                    self.grpc_addrs[f"n{i}"] = cfg.grpc_addr
                self.namesrv_addr = cfg.namesrv_addr_list[0] if cfg.namesrv_addr_list else self.namesrv_addr
            except Exception as exc:  # report and keep going: the broker itself will say more
                print(f"  ! {conf}: {exc}", flush=True)
            self._spawn(f"n{i}", ["broker", "-c", str(conf), "-D", f"storePathRootDir={store}"])
        self._spawn("console", ["console", "-n", self.namesrv_addr, "--port", str(self.console_port)])

    def check_exits(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and name not in self.reported:
                self.reported.add(name)
                print(
                    f"  ! {name} exited with status {proc.returncode}; see {self.log_dir / (name + '.log')}",
                    flush=True,
                )

    def master(self) -> tuple[str, str] | None:
        for sid, addr in self.broker_addrs.items():
            try:
                st = httpx.get(f"http://{addr}/status", timeout=0.5).json()
            except (httpx.HTTPError, ValueError):
                continue
            if st.get("role") == "MASTER":
                return sid, addr
        return None

    def wait_master(self, timeout_s: float) -> tuple[str, str] | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_exits()
            found = self.master()
            if found:
                return found
            time.sleep(0.2)
        return None

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


def banner(master: tuple[str, str] | None, cluster: DevCluster) -> str:
    lines = ["", "LedgerMQ dev cluster: name server " + cluster.namesrv_addr + ", broker set broker-a:"]
    for sid, addr in cluster.broker_addrs.items():
        role = "master" if master and master[0] == sid else "slave"
        grpc = f"  grpc {cluster.grpc_addrs[sid]}" if sid in cluster.grpc_addrs else ""
        lines.append(f"  {sid}  http://{addr}{grpc}  ({role})")
    if master is None:
        lines.append("  (no master elected yet; the curl lines below need one)")
    m = master[1] if master else next(iter(cluster.broker_addrs.values()), "127.0.0.1:10911")
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
                f"  endpoints = \"{';'.join(cluster.grpc_addrs.values())}\"",
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
    p.add_argument("--console-port", type=int, default=8080, help="port of the web console (mqdashboard)")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One line per request from our own httpx clients (registration, probes) is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    temp = args.store_dir is None
    store_dir = Path(args.store_dir or tempfile.mkdtemp(prefix="ledgermq-run-")).resolve()
    store_dir.mkdir(parents=True, exist_ok=True)
    cluster = DevCluster(Path(args.conf_dir), store_dir, args.console_port)
    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_requested.append(signum)

    # SIGHUP too: closing the terminal must stop the cluster like Ctrl-C (each child runs in its
    # own session, so the hang-up reaches only this process).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    print(f"Starting name server, broker-a (n0, n1, n2), console; logs in {cluster.log_dir}", flush=True)
    cluster.start()
    failed = True  # until the loop below says otherwise; keeps the logs of a failed start
    try:
        master = cluster.wait_master(args.wait_master_s) if not stop_requested else None
        if not stop_requested:
            print(banner(master, cluster), flush=True)
        last = master
        failed = False
        while not stop_requested:
            time.sleep(0.5)
            cluster.check_exits()
            if len(cluster.reported) == len(cluster.procs):
                print("  ! every process has exited", flush=True)
                failed = True
                break
            now = cluster.master()
            if now and now != last:
                print(f"  master is now {now[0]} at http://{now[1]}", flush=True)
                last = now
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
