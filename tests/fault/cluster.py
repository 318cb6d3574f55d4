"""Fault harness: a real name server plus a 3-member DLedger broker set, started from conf files
in a temporary directory (free ports, temporary store dirs), with nemeses.

Every DLedger peer link goes through `tests/fault/netproxy.py` (one proxy process for the six
directed links): member `a` reaches member `b` at the proxy port of link `a->b`, so the harness can
partition, isolate and cut links one way without root. Process faults are signals to PIDs the
harness started (SIGKILL + restart, SIGSTOP/SIGCONT). Disk faults (`diskfaults.py`) are applied
to a killed member's files before it restarts. Every nemesis action is recorded in the shared
history (process "nemesis"); a fault that hits the current leader carries `leader_fault=True` and
the leader's term, which `checkers.new_master_times` uses.

A background monitor polls `/status` of every member (~10 Hz) into the history; the Raft checkers
read those samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.fault import diskfaults
from tests.fault.checkers import MemberLog
from tests.fault.history import History
from tests.ports import free_ports

log = logging.getLogger("fault.cluster")
REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
PY = sys.executable


def read_properties(path: Path) -> list[tuple[str, str]]:
    """Ordered (key, value) pairs of a .properties file, comments dropped."""
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and line[0] not in "#!" and "=" in line:
            k, _, v = line.partition("=")
            out.append((k.strip(), v.strip()))
    return out


def write_properties(base: list[tuple[str, str]], overrides: dict[str, Any], dst: Path) -> Path:
    """Write `base` with `overrides` applied (None drops a key; new keys appended)."""
    seen, lines = set(), []
    for k, v in base:
        seen.add(k)
        if k in overrides:
            if overrides[k] is None:
                continue
            v = str(overrides[k])
        lines.append(f"{k}={v}")
    lines += [f"{k}={v}" for k, v in overrides.items() if k not in seen and v is not None]
    dst.write_text("\n".join(lines) + "\n")
    return dst


def broker_template() -> list[tuple[str, str]]:
    """The first member's conf of the repo's 3-member DLedger example, or a built-in equivalent
    while conf/dledger/ has none."""
    candidates = sorted(CONF.glob("dledger/*.conf")) + sorted(CONF.glob("dledger/*.properties"))
    if candidates:
        return read_properties(candidates[0])
    return [("brokerClusterName", "DefaultCluster"), ("brokerName", "broker-a"), ("brokerId", "0"),
            ("enableDLegerCommitLog", "true"), ("dLegerGroup", "broker-a"),
            ("flushDiskType", "SYNC_FLUSH"), ("autoCreateTopicEnable", "true")]


@dataclass
class Member:
    """One broker-set member process and where its files are."""

    name: str
    index: int
    http_port: int
    peer_port: int
    workdir: Path
    proc: subprocess.Popen | None = None
    incarnation: int = -1
    paused: bool = False
    start_extents: dict[str, int] = field(default_factory=dict)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    @property
    def conf_path(self) -> Path:
        return self.workdir / f"broker-{self.name}.conf"

    @property
    def store_root(self) -> Path:
        return self.workdir / f"store-{self.name}"

    @property
    def fsync_record(self) -> Path:
        return self.workdir / f"fsync-{self.name}.json"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def dledger_dir(self) -> Path:
        return self.store_root / f"dledger-{self.name}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class FaultCluster:
    """Name server + DLedger broker set + link proxy, all killed by PID in `stop()`."""

    def __init__(self, workdir: Path, history: History, *, size: int = 3, flush_disk_type: str = "SYNC_FLUSH",
                 unsafe_ack: bool = False, record_fsync: bool = False,
                 conf_overrides: dict[str, Any] | None = None,
                 member_overrides: dict[str, dict[str, Any]] | None = None,
                 dledger_overrides: dict[str, Any] | None = None,
                 launch_args: dict[str, list[str]] | None = None, seed: int = 0,
                 broker_name: str = "broker-a", namesrv_port: int | None = None,
                 hosted: set[str] | None = None) -> None:
        self.workdir = workdir
        self.history = history
        self.flush_disk_type = flush_disk_type
        self.unsafe_ack = unsafe_ack
        self.record_fsync = record_fsync
        self.conf_overrides = dict(conf_overrides or {})
        self.member_overrides = dict(member_overrides or {})
        self.dledger_overrides = dict(dledger_overrides or {})
        self.launch_args = dict(launch_args or {})  # per member: extra tests.fault.launch options
        self.rng = random.Random(seed)
        n_links = size * (size - 1)
        ports = free_ports(2 + 2 * size + n_links)
        self.namesrv_port, self.control_port = namesrv_port or ports[0], ports[1]
        self.own_namesrv = namesrv_port is None  # else another harness runs the name server
        self.broker_name = broker_name
        self.hosted = set(hosted or ())  # members run inside a broker container the test starts
        self.members = [Member(f"n{i}", i, ports[2 + 2 * i], ports[3 + 2 * i], workdir) for i in range(size)]
        link_ports = iter(ports[2 + 2 * size:])
        self.links = {(a.name, b.name): next(link_ports) for a in self.members for b in self.members
                      if a is not b}
        self.namesrv: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None
        self.last_status: dict[str, dict[str, Any]] = {}
        self.term_high = -1  # highest term the monitor has seen (survives kills)
        self._monitor: asyncio.Task | None = None
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(2.0, connect=0.5),
                                      limits=httpx.Limits(max_connections=64))

    # -- lifecycle -----------------------------------------------------------------------------
    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def _spawn(self, args: list[str], log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as logf:
            return subprocess.Popen([PY, *args], cwd=REPO, stdout=logf, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)

    def _write_confs(self) -> None:
        template = broker_template()
        ns = CONF / "namesrv.conf"
        base_ns = read_properties(ns) if ns.exists() else []
        if self.own_namesrv:
            write_properties(base_ns, {"listenPort": self.namesrv_port}, self.workdir / "namesrv.conf")
        for m in self.members:
            peers = ";".join(
                f"{o.name}-127.0.0.1:{o.peer_port if o is m else self.links[(m.name, o.name)]}"
                for o in self.members)
            overrides: dict[str, Any] = {
                "brokerName": self.broker_name, "brokerId": m.index, "listenPort": m.http_port,
                "namesrvAddr": f"127.0.0.1:{self.namesrv_port}", "storePathRootDir": m.store_root,
                "enableDLegerCommitLog": "true", "dLegerGroup": self.broker_name, "dLegerPeers": peers,
                "dLegerSelfId": m.name, "flushDiskType": self.flush_disk_type,
                "mappedFileSizeCommitLog": 4 * 1024 * 1024, "slaveReadEnable": "true",
                "autoCreateTopicEnable": "true", "defaultTopicQueueNums": 4, "grpcServerPort": 0,
            }
            overrides.update(self.conf_overrides)
            overrides.update(self.member_overrides.get(m.name, {}))
            write_properties(template, overrides, m.conf_path)

    async def start(self, leader_timeout_s: float = 30.0) -> None:
        """Start proxy, name server and members; wait until every member answers and one leads."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_confs()
        links = [f"--link={a}->{b}={port}:{self.member(b).peer_port}" for (a, b), port in self.links.items()]
        self.proxy = self._spawn(
            ["-m", "tests.fault.netproxy", f"--control-port={self.control_port}", *links],
            self.workdir / "netproxy.log")
        if self.own_namesrv:
            self.namesrv = self._spawn(["-m", "namesrv", "-c", str(self.workdir / "namesrv.conf")],
                                       self.workdir / "namesrv.log")
        await self._wait_port(self.control_port, self.proxy, "netproxy")
        for m in self.members:
            if m.name not in self.hosted:
                self.start_member(m)
        for m in self.members:
            if m.name not in self.hosted:
                await self.wait_member_up(m)
        self._monitor = asyncio.create_task(self._monitor_loop())
        await self.wait_leader(leader_timeout_s)

    async def _wait_port(self, port: int, proc: subprocess.Popen, what: str, timeout_s: float = 15) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}; see {self.workdir}")
            with contextlib.suppress(OSError):
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{what} not listening on {port} after {timeout_s}s")

    def attach(self, name: str, proc: subprocess.Popen) -> None:
        """Adopt a process the test started (a broker container) as the process of a hosted member."""
        m = self.member(name)
        m.proc, m.paused = proc, False
        m.incarnation += 1
        self.history.nemesis("start", m.name, incarnation=m.incarnation, hosted=True)

    def start_member(self, m: Member) -> None:
        """Spawn a member (through the test-only launcher when instrumentation is on)."""
        if m.name in self.hosted:
            raise RuntimeError(f"{m.name} runs in a broker container: restart the container")
        if m.alive():
            raise RuntimeError(f"{m.name} is already running (pid {m.proc.pid})")
        if self.record_fsync:
            m.start_extents = diskfaults.snapshot_extents(m.store_root) if m.store_root.exists() else {}
            with contextlib.suppress(FileNotFoundError):
                m.fsync_record.unlink()
        opts = []
        if self.record_fsync:
            opts.append(f"--fsync-record={m.fsync_record}")
        if self.unsafe_ack:
            opts.append("--unsafe-ack")
        opts += [f"--dledger={k}={v}" for k, v in self.dledger_overrides.items()]
        opts += self.launch_args.get(m.name, [])
        m.proc = self._spawn(["-m", "tests.fault.launch", *opts, "--", "broker", "-c", str(m.conf_path)],
                             m.log_path)
        m.incarnation += 1
        m.paused = False
        log.info("event=member_started member=%s pid=%d incarnation=%d", m.name, m.proc.pid, m.incarnation)

    async def wait_member_up(self, m: Member, timeout_s: float = 30.0) -> None:
        """Until `GET /health` answers 200 (fails early if the process died)."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            if not m.alive():
                raise RuntimeError(f"{m.name} exited with {m.proc.returncode if m.proc else None}: "
                                   f"{self.log_tail(m)}")
            try:
                r = await self.http.get(f"{m.url}/health", timeout=1.0)
                if r.status_code == 200:
                    return
                last = r.status_code
            except httpx.HTTPError as exc:
                last = exc
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{m.name} not healthy after {timeout_s}s: {last}")

    def log_tail(self, m: Member, lines: int = 15) -> str:
        try:
            return "\n".join(m.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "<no log>"

    async def stop(self) -> None:
        """Kill every process this harness started, by PID; SIGCONT first so SIGTERM is seen."""
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        procs = [m.proc for m in self.members] + [self.namesrv, self.proxy]
        for p in procs:
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            if p is None:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        await self.http.aclose()

    # -- observation ---------------------------------------------------------------------------
    async def status(self, m: Member, timeout_s: float = 0.5) -> dict[str, Any] | None:
        """`/status` of one member, or None if it does not answer in time."""
        try:
            r = await self.http.get(f"{m.url}/status", timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    async def _monitor_loop(self, interval_s: float = 0.1) -> None:
        while True:
            await asyncio.gather(*(self._sample(m) for m in self.members if m.alive() and not m.paused))
            await asyncio.sleep(interval_s)

    async def _sample(self, m: Member) -> None:
        incarnation = m.incarnation  # the process asked; a restart may happen while we wait
        inv = self.history.invoke("status", "monitor", None, node=m.name)
        st = await self.status(m)
        if st is None or not isinstance(st.get("dledger"), dict):
            self.history.fail(inv, "no status")
            return
        md = dict(st["dledger"])
        md["role"] = str(md.get("role", "")).upper().rsplit(".", 1)[-1]
        md.setdefault("selfId", m.name)
        md["brokerRole"] = st.get("role")
        if incarnation == m.incarnation and m.alive():
            self.last_status[m.name] = md
        self.term_high = max(self.term_high, int(md.get("term", -1) or -1))
        self.history.ok(inv, md, incarnation=incarnation)

    def current_leader(self) -> tuple[Member | None, int]:
        """The live member that last reported LEADER with the highest term (from the monitor)."""
        best, term = None, -1
        for m in self.members:
            md = self.last_status.get(m.name)
            if m.alive() and not m.paused and md and md.get("role") == "LEADER" and md.get("term", -1) > term:
                best, term = m, md["term"]
        return best, term

    async def wait_leader(self, timeout_s: float = 10.0, exclude: str | None = None) -> Member:
        """Until some live member (not `exclude`) reports LEADER."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for m in self.members:
                if m.name == exclude or not m.alive() or m.paused:
                    continue
                st = await self.status(m)
                if st and str(st.get("dledger", {}).get("role", "")).upper().endswith("LEADER"):
                    return m
            await asyncio.sleep(0.1)
        raise AssertionError(f"no leader within {timeout_s}s: {self.last_status}")

    async def wait_converged(self, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
        """Until every live member reports the same committedIndex == ledgerEndIndex, with a leader.
        Returns the final metadata per member (raises with the last view on timeout)."""
        deadline = time.monotonic() + timeout_s
        view: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            view = {}
            for m in self.members:
                if m.alive() and not m.paused:
                    st = await self.status(m, 1.0)
                    if st:
                        view[m.name] = st["dledger"]
            live = [m for m in self.members if m.alive() and not m.paused]
            ends = {(md.get("committedIndex"), md.get("ledgerEndIndex")) for md in view.values()}
            leader = any(str(md.get("role", "")).upper().endswith("LEADER") for md in view.values())
            if len(view) == len(live) and len(ends) == 1 and leader:
                ci, end = next(iter(ends))
                if ci == end:
                    return view
            await asyncio.sleep(0.2)
        ends_view = {n: (md.get("committedIndex"), md.get("ledgerEndIndex")) for n, md in view.items()}
        raise AssertionError(f"members did not converge in {timeout_s}s: (committed, end) = {ends_view}")

    def member_logs(self, view: dict[str, dict[str, Any]]) -> list[MemberLog]:
        """MemberLog of every member in `view` (for `checkers.committed_prefixes`)."""
        return [MemberLog(name, str(self.member(name).dledger_dir / "data"),
                          str(self.member(name).dledger_dir / "index"), int(md.get("committedIndex", -1)))
                for name, md in view.items()]

    # -- process nemeses -----------------------------------------------------------------------
    def _leader_fields(self, m: Member) -> dict[str, Any]:
        md = self.last_status.get(m.name) or {}
        if md.get("role") == "LEADER":
            return {"leader_fault": True, "term": md.get("term", -1)}
        return {}

    def kill(self, m: Member, power_loss: bool = False, count_as_leader_fault: bool = True) -> dict[str, Any]:
        """SIGKILL a member; with power_loss, cut its files back to what it fsynced (needs
        record_fsync=True). `count_as_leader_fault=False` when every member goes down at once (the
        time to a new master is then measured from the restart, see `mark_leader_fault`)."""
        fields = self._leader_fields(m) if count_as_leader_fault else {}
        if m.alive():
            os.kill(m.proc.pid, signal.SIGKILL)
            m.proc.wait(10)
        m.paused = False
        self.last_status.pop(m.name, None)
        cut: dict[str, Any] = {}
        if power_loss:
            if not self.record_fsync:
                raise RuntimeError("power loss needs FaultCluster(record_fsync=True)")
            cut = diskfaults.power_loss_cut(m.store_root, m.fsync_record, m.start_extents)
        self.history.nemesis("kill", m.name, power_loss=power_loss, **cut, **fields)
        return cut

    def mark_leader_fault(self, what: str, term: int) -> None:
        """Record a point from which a new master (term > `term`) is expected."""
        self.history.nemesis(what, None, leader_fault=True, term=term)

    def max_term(self) -> int:
        """Highest term any member reported to the monitor."""
        return self.term_high

    async def restart(self, m: Member, wait: bool = True) -> None:
        """Start a killed member again; waits for its /health unless wait=False."""
        self.start_member(m)
        self.history.nemesis("start", m.name, incarnation=m.incarnation)
        if wait:
            await self.wait_member_up(m)

    def pause(self, m: Member) -> None:
        """SIGSTOP: the process freezes with its sockets open (a long GC pause / VM stall)."""
        fields = self._leader_fields(m)
        os.kill(m.proc.pid, signal.SIGSTOP)
        m.paused = True
        self.history.nemesis("pause", m.name, **fields)

    def resume(self, m: Member) -> None:
        """SIGCONT a paused member."""
        os.kill(m.proc.pid, signal.SIGCONT)
        m.paused = False
        self.history.nemesis("resume", m.name)

    # -- network nemeses -----------------------------------------------------------------------
    async def _proxy(self, msg: dict[str, Any]) -> dict[str, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.control_port)
        try:
            writer.write(json.dumps(msg).encode() + b"\n")
            await writer.drain()
            reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
        finally:
            writer.close()
        if not reply.get("ok"):
            raise RuntimeError(f"netproxy refused {msg}: {reply}")
        return reply

    async def _set_flow(self, src: str, dst: str, state: str) -> None:
        # Bytes src→dst travel forward on link src->dst and backward on link dst->src.
        await self._proxy({"cmd": "set", "link": f"{src}->{dst}", "forward": state})
        await self._proxy({"cmd": "set", "link": f"{dst}->{src}", "backward": state})

    async def block(self, src: str, dst: str) -> None:
        """Drop everything `src` sends to `dst` (one-way)."""
        await self._set_flow(src, dst, "block")
        self.history.nemesis("block", [src, dst])

    async def partition(self, *groups: set[str]) -> None:
        """Cut every link between members of different groups (both directions)."""
        fields: dict[str, Any] = {}
        leader, term = self.current_leader()
        side = {name: i for i, g in enumerate(groups) for name in g}
        for a in self.members:
            for b in self.members:
                if a is not b and side.get(a.name) != side.get(b.name):
                    await self._set_flow(a.name, b.name, "block")
        if leader is not None:
            own = next((g for g in groups if leader.name in g), set())
            if len(own) * 2 <= len(self.members):
                fields = {"leader_fault": True, "term": term}
        self.history.nemesis("partition", [sorted(g) for g in groups], **fields)

    async def isolate(self, name: str) -> None:
        """Partition one member from all others."""
        await self.partition({name}, {m.name for m in self.members if m.name != name})

    async def heal(self) -> None:
        """Every link back to pass (poisoned connections are closed by the proxy)."""
        await self._proxy({"cmd": "heal"})
        self.history.nemesis("heal")

    async def proxy_stats(self) -> dict[str, Any]:
        return (await self._proxy({"cmd": "stats"}))["links"]

    # -- disk nemeses (member must be stopped) ---------------------------------------------------
    def torn_tail(self, m: Member) -> dict[str, int]:
        """Tear the write of `m`'s last entry, as far as it was not durable (needs record_fsync)."""
        assert not m.alive(), "tear files of a stopped member only"
        if not self.record_fsync:
            raise RuntimeError("a torn tail needs FaultCluster(record_fsync=True): only what was not "
                               "fsynced can tear")
        durable = diskfaults.durable_extents(m.fsync_record, m.start_extents)
        res = diskfaults.torn_tail(m.dledger_dir / "data", m.dledger_dir / "index", durable)
        self.history.nemesis("torn_tail", m.name, **res)
        return res

    def bit_flip(self, m: Member, index: int | None = None, in_body: bool = True) -> dict[str, int]:
        assert not m.alive(), "corrupt files of a stopped member only"
        res = diskfaults.bit_flip(m.dledger_dir / "data", m.dledger_dir / "index", self.rng, index, in_body)
        self.history.nemesis("bit_flip", m.name, **res)
        return res

    # -- name server -----------------------------------------------------------------------------
    def kill_namesrv(self) -> None:
        if self.namesrv is not None and self.namesrv.poll() is None:
            os.kill(self.namesrv.pid, signal.SIGKILL)
            self.namesrv.wait(5)
        self.history.nemesis("kill_namesrv")

    async def restart_namesrv(self) -> None:
        self.namesrv = self._spawn(["-m", "namesrv", "-c", str(self.workdir / "namesrv.conf")],
                                   self.workdir / "namesrv.log")
        await self._wait_port(self.namesrv_port, self.namesrv, "namesrv")
        self.history.nemesis("start_namesrv")
