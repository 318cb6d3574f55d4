"""Retention keeps what a state machine still needs, and a member that lost its log is brought
back from the leader's begin index.

A machine that keeps its state in the log itself (the broker's in-log snapshot records) names the
lowest index it still needs (`StateMachine.retained_from_index`); expiry never deletes that entry
or anything after it. Three real `DLedgerServer`s in this process (mmap file stores, loopback TCP)
for the group cases.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from dledger.config import DLedgerConfig
from dledger.entry import DLedgerEntry
from dledger.server import DLedgerServer
from dledger.statemachine import StateMachine
from dledger.store.mmap_store import DLedgerMmapFileStore
from tests.ports import free_ports

GROUP = "retention"
IDS = ("n0", "n1", "n2")
DATA_FILE = 64 * 1024


def body(i: int) -> bytes:
    return f"entry-{i:05d}-".encode() * (20 + i % 13)  # ~330 bytes: a 64 KB data file holds ~190


def age_data_files(store: DLedgerMmapFileStore, hours: float = 2.0) -> None:
    """What days of running leave: every data file older than the reserved time."""
    old = time.time() - hours * 3600
    for mf in store.data_file_list.files:
        os.utime(mf.path, (old, old))


def expire_all(store: DLedgerMmapFileStore) -> int:
    deleted = 0
    while (n := store.check_disk_space()) > 0:
        deleted += n
    return deleted


def test_expiry_stops_at_the_retention_floor(tmp_path: Path) -> None:
    cfg = DLedgerConfig(group=GROUP, self_id="n0", peers="n0-127.0.0.1:1", store_base_dir=str(tmp_path),
                        mapped_file_size_for_entry_data=DATA_FILE, mapped_file_size_for_entry_index=32 * 1024,
                        file_reserved_hours=1, delete_when="99")  # fmt: skip
    store = DLedgerMmapFileStore(cfg, disk_used_ratio=lambda: 0.75)  # above the check-expired ratio
    store.recover()
    for i in range(1000):
        store.append_as_leader(DLedgerEntry(body=body(i)), 1)
    store.update_committed_index(1, 999)
    floor = [500]
    store.set_retention_floor(lambda: floor[0])
    age_data_files(store)
    assert expire_all(store) > 0
    begin = store.ledger_begin_index
    assert 0 < begin <= 500, begin  # the floor's entry and everything after it stayed
    assert store.get(500).body == body(500)
    floor[0] = None  # the machine no longer needs anything: down to the commit index
    expire_all(store)
    assert store.ledger_begin_index > 500
    floor[0] = 10  # below what is left: nothing more may go
    age_data_files(store)
    kept = store.ledger_begin_index
    assert expire_all(store) == 0 and store.ledger_begin_index == kept
    store.close_without_flush()


def test_a_floor_before_anything_is_stored_keeps_everything(tmp_path: Path) -> None:
    """A machine that has applied nothing yet answers -1 (or an index retention already passed):
    nothing may go, and the disk check does not fail (it runs first thing at start)."""
    cfg = DLedgerConfig(group=GROUP, self_id="n0", peers="n0-127.0.0.1:1", store_base_dir=str(tmp_path),
                        mapped_file_size_for_entry_data=DATA_FILE, mapped_file_size_for_entry_index=32 * 1024,
                        file_reserved_hours=1, delete_when="99")  # fmt: skip
    store = DLedgerMmapFileStore(cfg, disk_used_ratio=lambda: 0.75)
    store.recover()
    store.set_retention_floor(lambda: -1)
    assert store.check_disk_space() == 0  # empty log
    for i in range(1000):
        store.append_as_leader(DLedgerEntry(body=body(i)), 1)
    store.update_committed_index(1, 999)
    age_data_files(store)
    assert expire_all(store) == 0 and store.ledger_begin_index == 0
    store.close_without_flush()


class KeepFrom(StateMachine):
    """Applies nothing; asks the log to keep every entry from `floor` on."""

    def __init__(self, floor: int | None) -> None:
        self.floor = floor
        self.applied = -1

    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        self.applied = entries[-1].index

    def last_applied_index(self) -> int:
        return self.applied

    def retained_from_index(self) -> int | None:
        return self.floor


class Group:
    """In-process members; every started server is shut down at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in zip(IDS, free_ports(3), strict=True))
        self.servers: dict[str, DLedgerServer] = {}
        self.machines: dict[str, KeepFrom] = {}

    def config(self, member: str) -> DLedgerConfig:
        return DLedgerConfig(group=GROUP, self_id=member, peers=self.peers,
                             store_base_dir=str(self.base / member),
                             heart_beat_time_interval_ms=100, min_vote_interval_ms=50,
                             max_vote_interval_ms=150,
                             mapped_file_size_for_entry_data=DATA_FILE,
                             mapped_file_size_for_entry_index=32 * 1024,
                             file_reserved_hours=1, delete_when="99")  # fmt: skip

    async def start(self, member: str, floor: int | None = None) -> DLedgerServer:
        server = DLedgerServer(self.config(member))
        self.machines[member] = KeepFrom(floor)
        server.set_state_machine(self.machines[member])
        self.servers[member] = server
        await server.start()
        return server

    async def stop(self, member: str) -> None:
        await self.servers.pop(member).shutdown()

    async def leader(self, timeout_s: float = 5.0) -> DLedgerServer:
        return await wait_for(lambda: next((s for s in self.servers.values() if s.member_state.is_leader()),
                                           None), timeout_s, "a leader")


@pytest.fixture
async def group(tmp_path: Path):
    g = Group(tmp_path)
    yield g
    for member in list(g.servers):
        await g.stop(member)


async def wait_for(cond, timeout_s: float, what: str):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := cond()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)
    return value


def data_bytes_from(server: DLedgerServer, index: int) -> bytes:
    """The data-file bytes of entries `index`..committed, as stored."""
    store = server.store
    entries = store.get_range(index, store.committed_index)
    return b"".join(bytes(store.get_data(e.pos, e.size)) for e in entries)


async def test_a_wiped_follower_is_truncated_to_the_leaders_begin_and_catches_up(group: Group) -> None:
    """No snapshots: a member that lost its whole store after the leader's retention moved the
    begin index gets TRUNCATE at the leader's first entry, then every entry from there (the
    broker's state rides in those entries); and the state machine's floor is honoured."""
    for m in IDS:
        await group.start(m, floor=500)
    leader = await group.leader()
    for i in range(0, 800, 50):
        await leader.append([body(j) for j in range(i, i + 50)])
    end = leader.store.ledger_end_index
    await wait_for(lambda: all(s.store.committed_index == end for s in group.servers.values()), 5,
                   "every member to commit the whole log")
    follower = next(m for m in IDS if group.servers[m] is not leader)
    await group.stop(follower)
    shutil.rmtree(group.base / follower)  # a replaced machine: empty disk
    age_data_files(leader.store)
    leader.store.clean_space_service.disk_used_ratio = lambda: 0.75
    assert expire_all(leader.store) > 0
    begin = leader.store.ledger_begin_index
    assert 0 < begin <= 500, begin  # the state machine's floor held
    for i in range(800, 840, 20):
        await leader.append([body(j) for j in range(i, i + 20)])
    back = await group.start(follower, floor=500)
    end = leader.store.ledger_end_index
    await wait_for(lambda: back.store.committed_index == end, 10, "the wiped member to catch up")
    assert (back.store.ledger_begin_index, back.store.ledger_end_index) == (begin, end)
    assert data_bytes_from(back, begin) == data_bytes_from(leader, begin)
    assert back.store.data_begin_pos == leader.store.data_begin_pos
