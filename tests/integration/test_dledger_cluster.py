"""Three real `python -m dledger` processes on loopback TCP with the mmap file store.

Election within 3 s, 10,000 appends byte-identical on all members, SIGKILL of the leader under
load (new leader within 3 s, acknowledged entries kept, the killed member catches up),
COMPARE/TRUNCATE of an old leader's uncommitted tail, SIGSTOP/SIGCONT of the leader, and
leadership transfer to a named member.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.client import DLedgerClient
from dledger.codes import DLedgerException
from tests.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
GROUP = "itg"
DATA_FILE_SIZE = 8 * 1024 * 1024



class Group:
    """Three member processes; every one started is killed by PID at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ids = ["n0", "n1", "n2"]
        ports = free_ports(3)
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in zip(self.ids, ports, strict=True))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, member: str) -> Path:
        return self.base / f"{member}.log"

    def start(self, member: str) -> None:
        log = open(self.log_path(member), "ab")
        self.procs[member] = subprocess.Popen(
            [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", member, "--peers", self.peers,
             "--store-dir", str(self.base / member), "--data-file-size", str(DATA_FILE_SIZE)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

    def start_all(self) -> None:
        for m in self.ids:
            self.start(m)

    def signal(self, member: str, sig: int) -> None:
        os.kill(self.procs[member].pid, sig)

    def kill(self, member: str) -> None:
        p = self.procs[member]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)

    def stop_gracefully(self, member: str) -> None:
        p = self.procs[member]
        os.kill(p.pid, signal.SIGTERM)
        p.wait(15)

    def teardown(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)

    def client(self) -> DLedgerClient:
        return DLedgerClient(GROUP, self.peers, timeout_s=5.0)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    try:
        yield g
    finally:
        g.teardown()


async def wait_leader(
    c: DLedgerClient, members: list[str], timeout_s: float, exclude: str | None = None
) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for m in members:
            try:
                md = await c.metadata(m)
            except DLedgerException:
                continue
            if md["role"] == "LEADER" and m != exclude:
                c.leader_id = m
                return m
        await asyncio.sleep(0.02)
    raise AssertionError(f"no leader among {members} within {timeout_s}s")


async def wait_caught_up(c: DLedgerClient, members: list[str], timeout_s: float = 15.0) -> int:
    """Wait until every member's committed index equals the leader's end index; return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            mds = [await c.metadata(m) for m in members]
        except DLedgerException:
            await asyncio.sleep(0.05)
            continue
        leaders = [md for md in mds if md["role"] == "LEADER"]
        if len(leaders) == 1:
            end = leaders[0]["ledgerEndIndex"]
            if all(md["committedIndex"] == end for md in mds):
                return end
        await asyncio.sleep(0.05)
    raise AssertionError(f"members did not catch up: {mds}")


async def read_log(c: DLedgerClient, member: str, upto: int) -> list[tuple[int, int, int, bytes]]:
    out: list[tuple[int, int, int, bytes]] = []
    i = 0
    while i <= upto:
        entries = await c.get(i, 2000, member_id=member)
        assert entries, f"{member} returned nothing at {i}"
        out += [(e.index, e.term, e.pos, e.body) for e in entries]
        i = out[-1][0] + 1
    return out


class Writers:
    """Concurrent appenders that remember every acknowledged (index -> body)."""

    def __init__(self, c: DLedgerClient, n: int) -> None:
        self.c = c
        self.acked: dict[int, bytes] = {}
        self.failed = 0
        self.running = True
        self.tasks = [asyncio.get_running_loop().create_task(self._run(w)) for w in range(n)]

    async def _run(self, w: int) -> None:
        seq = 0
        while self.running:
            seq += 1
            body = f"w{w}-{seq}".encode() * 8
            try:
                resp = await self.c.append([body])
            except DLedgerException:
                self.failed += 1
                await asyncio.sleep(0.01)
                continue
            self.acked[resp.index] = body

    async def stop(self) -> None:
        self.running = False
        await asyncio.gather(*self.tasks, return_exceptions=True)


def data_bytes(store_dir: Path, member: str, upto_pos: int) -> bytes:
    files = sorted((store_dir / f"dledger-{member}" / "data").iterdir())
    out = bytearray()
    for f in files:
        if int(f.name) >= upto_pos:
            break
        with open(f, "rb") as fh:
            out += fh.read(min(DATA_FILE_SIZE, upto_pos - int(f.name)))
    return bytes(out)


async def test_leader_elected_within_3s_and_10000_appends_identical_on_all_members(group: Group) -> None:
    group.start_all()
    async with group.client() as c:
        for m in group.ids:  # every member is up and answering (Python start-up is not election time)
            await c.metadata(m)
        t_up = time.monotonic()
        await wait_leader(c, group.ids, 3.0)
        assert time.monotonic() - t_up < 3.0
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with sem:
                await c.append([f"entry-{i}".encode() * (1 + i % 20)])

        await asyncio.gather(*(one(i) for i in range(10_000)))
        end = await wait_caught_up(c, group.ids)
        assert end == 10_000  # the leader's no-op at 0, then 10,000 bodies
        logs = [await read_log(c, m, end) for m in group.ids]
        assert logs[0] == logs[1] == logs[2]
        assert sorted(b for _, _, _, b in logs[0][1:]) == sorted(
            f"entry-{i}".encode() * (1 + i % 20) for i in range(10_000)
        )
        last = logs[0][-1]
        committed_pos = last[2] + 48 + len(last[3])
    for m in group.ids:
        group.stop_gracefully(m)
    raw = [data_bytes(group.base / m, m, committed_pos) for m in group.ids]
    assert len(raw[0]) == committed_pos and raw[0] == raw[1] == raw[2]


async def test_sigkill_leader_under_load_new_leader_within_3s_and_killed_member_catches_up(
    group: Group,
) -> None:
    group.start_all()
    async with group.client() as c:
        leader = await wait_leader(c, group.ids, 5.0)
        writers = Writers(c, 16)
        await asyncio.sleep(1.5)
        acked_before = len(writers.acked)
        t_kill = time.monotonic()
        group.kill(leader)
        survivors = [m for m in group.ids if m != leader]
        new_leader = await wait_leader(c, survivors, 3.0)
        failover_s = time.monotonic() - t_kill
        await asyncio.sleep(1.0)
        await writers.stop()
        assert acked_before > 100 and len(writers.acked) > acked_before
        assert failover_s < 3.0, failover_s
        end = max(writers.acked)
        log_new = {i: b for i, _, _, b in await read_log(c, new_leader, end)}
        for index, body in writers.acked.items():
            assert log_new[index] == body, f"acked index {index} lost after failover"
        group.start(leader)
        end = await wait_caught_up(c, group.ids, 20.0)
        logs = [await read_log(c, m, end) for m in group.ids]
        assert logs[0] == logs[1] == logs[2]


async def test_old_leader_uncommitted_tail_is_truncated_when_it_rejoins(group: Group) -> None:
    group.start_all()
    async with group.client() as c:
        leader = await wait_leader(c, group.ids, 5.0)
        await c.append([b"committed"] * 10)
        followers = [m for m in group.ids if m != leader]
        for f in followers:
            group.kill(f)  # (a SIGSTOPped member would still receive pushes into its socket buffer)
        # These reach only the leader's log: they can never commit.
        lone = DLedgerClient(GROUP, {leader: dict(p.split("-", 1) for p in group.peers.split(";"))[leader]},
                             timeout_s=1.0)  # fmt: skip
        pending = [
            asyncio.get_running_loop().create_task(lone.append([b"uncommitted"] * 5)) for _ in range(4)
        ]
        await asyncio.sleep(0.5)
        md = await c.metadata(leader)
        assert md["ledgerEndIndex"] > md["committedIndex"]
        group.kill(leader)
        await asyncio.gather(*pending, return_exceptions=True)
        await lone.close()
        for f in followers:
            group.start(f)
        new_leader = await wait_leader(c, followers, 5.0)
        await c.append([b"after"] * 50)
        group.start(leader)
        end = await wait_caught_up(c, group.ids, 20.0)
        logs = [await read_log(c, m, end) for m in group.ids]
        assert logs[0] == logs[1] == logs[2]
        assert all(b != b"uncommitted" for *_, b in logs[0])
        assert new_leader != leader
    assert "truncated group=" in group.log_path(leader).read_text()


async def test_sigstop_leader_then_sigcont_it_rejoins_as_follower(group: Group) -> None:
    group.start_all()
    async with group.client() as c:
        leader = await wait_leader(c, group.ids, 5.0)
        await c.append([b"before"] * 10)
        group.signal(leader, signal.SIGSTOP)
        t0 = time.monotonic()
        others = [m for m in group.ids if m != leader]
        new_leader = await wait_leader(c, others, 3.0)
        assert time.monotonic() - t0 < 3.0
        await c.append([b"during"] * 10)
        group.signal(leader, signal.SIGCONT)
        await c.append([b"after"] * 10)
        end = await wait_caught_up(c, group.ids, 15.0)
        md = await c.metadata(leader)
        assert md["role"] == "FOLLOWER" and md["leaderId"] == new_leader
        logs = [await read_log(c, m, end) for m in group.ids]
        assert logs[0] == logs[1] == logs[2]


async def test_leadership_transfer_to_named_member_then_appends_continue(group: Group) -> None:
    group.start_all()
    async with group.client() as c:
        leader = await wait_leader(c, group.ids, 5.0)
        await c.append([b"x"] * 100)
        await wait_caught_up(c, group.ids)
        target = next(m for m in group.ids if m != leader)
        await c.leadership_transfer(target)
        md = await c.metadata(target)
        assert md["role"] == "LEADER"
        resp = await c.append([b"after-transfer"])
        assert resp.index > 100
        end = await wait_caught_up(c, group.ids, 10.0)
        logs = [await read_log(c, m, end) for m in group.ids]
        assert logs[0] == logs[1] == logs[2]


def test_node_cli_refuses_a_bad_config_naming_the_problem(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dledger", "--group", "g", "--self-id", "n5", "--peers", "n0-127.0.0.1:1",
         "--store-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert b"selfId 'n5' is not in peers" in proc.stderr
