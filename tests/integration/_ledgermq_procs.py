"""Helpers for integration tests that run real LedgerMQ processes from conf files.

Each process is started with its own log file; callers kill it by PID in fixture teardown
(`ProcessGroup.stop_all`). Ports are picked by binding to port 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
PY = sys.executable


def read_conf(path: Path) -> list[tuple[str, str]]:
    """Ordered key/value pairs of a .properties file (comments dropped)."""
    pairs = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#!" or "=" not in line:
            continue
        k, _, v = line.partition("=")
        pairs.append((k.strip(), v.strip()))
    return pairs


def write_conf(src: Path, dst: Path, overrides: dict[str, str | None]) -> Path:
    """Copy `src` to `dst` with keys replaced (None removes a key; new keys are appended)."""
    out, seen = [], set()
    for k, v in read_conf(src):
        seen.add(k)
        if k in overrides:
            if overrides[k] is None:
                continue
            v = str(overrides[k])
        out.append(f"{k}={v}")
    out += [f"{k}={v}" for k, v in overrides.items() if k not in seen and v is not None]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(out) + "\n")
    return dst


class ProcessGroup:
    """Processes started by one test; `stop_all` kills each by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, module: str, *args: str, wrap: tuple[str, ...] = ()) -> subprocess.Popen:
        """`python -m module args`, behind `wrap` (e.g. `ip netns exec NS`, which execs it: the
        PID is still the module's)."""
        log = open(self.log_dir / f"{name}.log", "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [*wrap, PY, "-m", module, *args],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log_text(self, name: str) -> str:
        p = self.log_dir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(name)
        if proc and proc.poll() is None:
            os.kill(proc.pid, sig)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)


def wait_http(
    url: str, timeout_s: float = 15.0, ok=lambda r: r.status_code == 200, proc=None
) -> httpx.Response:
    """Poll `url` until `ok(response)`; fails with the last error (and early if `proc` died)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} while waiting for {url}")
        try:
            r = httpx.get(url, timeout=2)
            if ok(r):
                return r
            last = f"{r.status_code} {r.text[:300]}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready after {timeout_s}s: {last}")


def start_namesrv(group: ProcessGroup, workdir: Path, name: str = "namesrv", **overrides: str) -> str:
    """A name server from conf/namesrv.conf on a free port (or `listenPort`); returns its `host:port`."""
    port = int(overrides.pop("listenPort", 0)) or free_port()
    conf = write_conf(CONF / "namesrv.conf", workdir / f"{name}.conf", {"listenPort": str(port), **overrides})
    proc = group.start(name, "namesrv", "-c", str(conf))
    wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
    return f"127.0.0.1:{port}"


def start_broker(
    group: ProcessGroup,
    workdir: Path,
    src_conf: Path,
    name: str,
    namesrv: str | None,
    wait: bool = True,
    **overrides: str,
) -> str:
    """A broker from `src_conf` with a fresh port and store dir; returns its `host:port`."""
    port = free_port()
    values = {
        "listenPort": str(port),
        "storePathRootDir": str(workdir / f"store-{name}"),
        "namesrvAddr": namesrv or "",
        "grpcServerPort": "0",  # the confs' fixed gRPC ports would collide; gRPC tests pass one
        **overrides,
    }
    conf = write_conf(src_conf, workdir / f"{name}.conf", values)
    proc = group.start(name, "broker", "-c", str(conf))
    if wait:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
    return f"127.0.0.1:{port}"


@contextlib.contextmanager
def namesrv_and_broker(
    workdir: Path, name: str, src_conf: Path = CONF / "broker-single.conf", **overrides: str
) -> Iterator[tuple[ProcessGroup, str, str]]:
    """A name server and one broker from `src_conf` (default conf/broker-single.conf), stopped
    by PID on exit; yields (group, namesrv host:port, broker host:port)."""
    group = ProcessGroup(workdir)
    try:
        ns = start_namesrv(group, workdir)
        yield group, ns, start_broker(group, workdir, src_conf, name, ns, **overrides)
    finally:
        group.stop_all()


def start_dledger_set(
    group: ProcessGroup,
    workdir: Path,
    namesrv: str | None,
    broker_name: str | None = None,
    **overrides: str,
) -> dict[str, str]:
    """broker-a's 3 members from conf/dledger/broker-n{0,1,2}.conf with fresh HTTP and peer ports;
    returns {selfId: http addr}. Waits until every member answers /health. With `broker_name` the
    set (and its DLedger group) is named so, and its processes, confs and stores are
    `{broker_name}-n{i}` (restart one with `group.start(name, "broker", "-c", workdir/f"{name}.conf")`)."""
    peer_ports = [free_port() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(peer_ports))
    named = {"brokerName": broker_name, "dLegerGroup": broker_name} if broker_name else {}
    procs: dict[str, str] = {}
    addrs = {}
    for i in range(3):
        procs[f"n{i}"] = f"{broker_name}-n{i}" if broker_name else f"n{i}"
        addrs[f"n{i}"] = start_broker(
            group,
            workdir,
            CONF / "dledger" / f"broker-n{i}.conf",
            procs[f"n{i}"],
            namesrv,
            wait=False,
            dLegerPeers=peers,
            **named,
            **overrides,
        )
    for i, addr in addrs.items():
        wait_http(f"http://{addr}/health", proc=group.procs[procs[i]], timeout_s=20)
    return addrs


def wait_master(addrs: dict[str, str], timeout_s: float = 15.0, exclude: set[str] = frozenset()) -> str:
    """The selfId whose broker reports MASTER (and every live member agrees on its address)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for sid, addr in addrs.items():
            if sid in exclude:
                continue
            try:
                st = httpx.get(f"http://{addr}/status", timeout=1).json()
            except httpx.HTTPError:
                continue
            if st["role"] == "MASTER":
                return sid
        time.sleep(0.05)
    raise AssertionError(f"no master among {addrs} after {timeout_s}s")
