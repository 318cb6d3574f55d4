"""InstallSnapshot on real processes: three `python -m dledger --state-machine digest
--enable-snapshot` members whose retention deletes every data file the newest snapshot covers. A
member whose whole store is wiped after the leader's log stopped starting at index 0 comes back,
gets the leader's snapshot (then entries), ends with the same state-machine state as the others,
and can lead. Reference: dledger/snapshot.py, Raft §7, DLedger 0.3's snapshot package."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.client import DLedgerClient
from dledger.codes import DLedgerException
from tests.ports import free_ports

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]
GROUP = "snapg"
IDS = ("n0", "n1", "n2")
EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))  # retention runs whenever it is allowed to


class Group:
    """Three members; every process started is killed by PID at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in zip(IDS, free_ports(3), strict=True))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, member: str) -> None:
        with open(self.base / f"{member}.log", "ab") as log:
            self.procs[member] = subprocess.Popen(
                [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", member,
                 "--peers", self.peers, "--store-dir", str(self.base / member),
                 "--data-file-size", str(64 * 1024),
                 "--state-machine", "digest", "--enable-snapshot", "--snapshot-threshold", "50",
                 "--file-reserved-hours", "0", "--delete-when", EVERY_HOUR],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip

    def kill(self, member: str) -> None:
        p = self.procs[member]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)

    def log(self, member: str) -> str:
        return (self.base / f"{member}.log").read_text()

    def teardown(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    try:
        yield g
    finally:
        g.teardown()


async def append(c: DLedgerClient, start: int, n: int) -> None:
    for i in range(start, start + n, 10):
        await c.append([f"value-{j:05d}-".encode() * 60 for j in range(i, i + 10)])  # ~720 B each


async def metadata(c: DLedgerClient, members: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {m: await c.metadata(m) for m in members}


async def wait_same_state(c: DLedgerClient, members: tuple[str, ...],
                          timeout_s: float = 30.0) -> dict[str, Any]:
    """Until every member committed and applied the same log end and holds the same digest."""
    deadline = time.monotonic() + timeout_s
    mds: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        try:
            mds = await metadata(c, members)
        except DLedgerException:
            await asyncio.sleep(0.1)
            continue
        ends = {(md["ledgerEndIndex"], md["committedIndex"], md["stateMachine"]["appliedIndex"],
                 md["stateMachine"]["digest"]) for md in mds.values()}
        if len(ends) == 1:
            end, committed, applied, _ = next(iter(ends))
            if end == committed == applied:
                return mds
        await asyncio.sleep(0.1)
    raise AssertionError(f"members did not converge: {mds}")


async def test_wiped_member_rejoins_through_a_snapshot_and_can_lead(group: Group) -> None:
    for m in IDS:
        group.start(m)
    async with DLedgerClient(GROUP, group.peers, timeout_s=15.0) as c:
        leader = await c.find_leader()
        await append(c, 0, 600)
        mds = await wait_same_state(c, IDS)
        for _ in range(150):  # retention runs every 100 ms
            if (await c.metadata(leader))["ledgerBeginIndex"] > 0:
                break
            await asyncio.sleep(0.1)
        assert (await c.metadata(leader))["ledgerBeginIndex"] > 0, "retention never moved the leader's begin"
        victim = next(m for m in IDS if m != leader)
        group.kill(victim)
        shutil.rmtree(group.base / victim)  # a replaced machine: empty disk
        await append(c, 600, 200)
        begin = (await c.metadata(leader))["ledgerBeginIndex"]
        assert begin > 0
        group.start(victim)
        mds = await wait_same_state(c, IDS)
        assert mds[victim]["stateMachine"]["count"] == 800
        assert mds[victim]["ledgerBeginIndex"] > 0 and mds[victim]["snapshotIndex"] >= begin - 1
        assert "event=install_snapshot_loaded" in group.log(victim)
        await c.leadership_transfer(victim)
        assert (await c.metadata(victim))["role"] == "LEADER"
        await append(c, 800, 50)
        mds = await wait_same_state(c, IDS)
        assert {md["stateMachine"]["count"] for md in mds.values()} == {850}
