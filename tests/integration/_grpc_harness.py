"""Shared set-up of the gRPC endpoint tests: a real name server + 3-member DLedger set serving
gRPC, and the official RocketMQ clients that are not this venv's own.

- Python `rocketmq-python-client` 5.1.2 is a dependency of the project (its generated protocol
  code is the endpoint's), so tests import it directly.
- 5.1.1 (its startup waits for the server's Settings) runs in a venv of its own, built once by
  `python_client(version)` under `.venv/clients/` and kept (keyed by the version).
- Node.js `rocketmq-client-nodejs` 1.0.8 comes from `tests/nodejs/package-lock.json`: when node
  and npm are present, `node_client()` installs it once (`npm ci`, again only when the lockfile
  changes), so `make test` runs it; without node the test skips saying so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.integration._ledgermq_procs import CONF, REPO, ProcessGroup, start_broker, start_namesrv, wait_http
from tests.ports import free_ports

CLIENTS_DIR = REPO / ".venv" / "clients"
NODE_DIR = REPO / "tests" / "nodejs"
SCRIPTS = Path(__file__).resolve().parent / "grpc_clients"


@dataclass
class GrpcSet:
    """A name server and broker-a's three members, each with an HTTP and a gRPC endpoint."""

    group: ProcessGroup
    workdir: Path
    namesrv: str
    http: dict[str, str] = field(default_factory=dict)  # selfId -> host:port
    grpc: dict[str, str] = field(default_factory=dict)

    @property
    def access_points(self) -> str:
        """Every member's gRPC endpoint, as a client configures them (`a;b;c`)."""
        return ";".join(self.grpc.values())

    def master(self, timeout_s: float = 20.0, exclude: frozenset[str] = frozenset()) -> str:
        """The selfId of the member that reports MASTER."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for sid, addr in self.http.items():
                if sid in exclude or self.group.procs[sid].poll() is not None:
                    continue
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    if httpx.get(f"http://{addr}/status", timeout=1).json()["role"] == "MASTER":
                        return sid
            time.sleep(0.05)
        raise AssertionError(f"no master among {self.http} after {timeout_s}s")

    def wait_routed(self, topic: str, timeout_s: float = 15.0) -> None:
        """Until the name server routes `topic` to the set's master gRPC endpoint."""

        def ok(r: httpx.Response) -> bool:
            return r.status_code == 200 and all(b.get("masterGrpcAddr") for b in r.json()["brokers"])

        wait_http(f"http://{self.namesrv}/routes/{topic}", timeout_s=timeout_s, ok=ok)

    def create_topic(self, topic: str, queues: int = 4) -> None:
        master = self.http[self.master()]
        r = httpx.put(
            f"http://{master}/topics/{topic}",
            json={"readQueueNums": queues, "writeQueueNums": queues, "perm": 6},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        self.wait_routed(topic)


@contextlib.contextmanager
def grpc_set(workdir: Path, **overrides: str) -> Iterator[GrpcSet]:
    """Start the set (stopped by PID on exit); yields once every member is up and one leads."""
    group = ProcessGroup(workdir)
    try:
        ns = start_namesrv(group, workdir)
        peer_ports = free_ports(3)
        grpc_ports = free_ports(3)
        peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(peer_ports))
        s = GrpcSet(group, workdir, ns)
        for i in range(3):
            sid = f"n{i}"
            s.http[sid] = start_broker(
                group,
                workdir,
                CONF / "dledger" / f"broker-{sid}.conf",
                sid,
                ns,
                wait=False,
                dLegerPeers=peers,
                grpcServerPort=str(grpc_ports[i]),
                registerNameServerPeriod="1000",
                **overrides,
            )
            s.grpc[sid] = f"127.0.0.1:{grpc_ports[i]}"
        for sid, addr in s.http.items():
            wait_http(f"http://{addr}/health", proc=group.procs[sid], timeout_s=30)
        s.master()
        yield s
    finally:
        group.stop_all()


def python_client(version: str) -> Path:
    """The python of a venv holding `rocketmq-python-client==version`, built once and kept."""
    venv = CLIENTS_DIR / f"rocketmq-python-client-{version}"
    py = venv / "bin" / "python"
    stamp = venv / ".installed"
    CLIENTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(CLIENTS_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build even if several test processes ask
        if not stamp.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [
                    str(py),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    f"rocketmq-python-client=={version}",
                ],
                check=True,
            )
            stamp.write_text(version + "\n")
    return py


def node_client() -> tuple[str | None, str]:
    """(node binary, "") with the locked Node.js client installed, else (None, why not)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return None, "node/npm are not installed: the official Node.js client cannot run here"
    lock_file = NODE_DIR / "package-lock.json"
    stamp = NODE_DIR / "node_modules" / ".installed"
    with open(NODE_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.stat().st_mtime < lock_file.stat().st_mtime:
            subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=NODE_DIR,
                check=True,
                timeout=300,
            )
            stamp.touch()
    return node, ""


def run_client(argv: list[str], timeout_s: float = 120.0, env: dict[str, str] | None = None) -> dict:
    """Run a client script that prints one JSON document as its last line; that document."""
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})}, cwd=REPO
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, (
        f"{argv[:2]} exited {proc.returncode}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    )
    return json.loads(lines[-1])
