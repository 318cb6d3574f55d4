"""A member whose log has a flipped bit inside a *committed* entry rejoins by itself.

Three real `DLedgerServer`s in this process (mmap file stores, loopback TCP): entries are
committed everywhere, the group stops, one byte of a committed entry in n2's data file is flipped.
On restart n2 cuts its log before the corrupt entry and persists a catch-up watermark; while
below it, n2 grants no vote (so n1 + n2 cannot elect a leader although they are a majority) and
never campaigns. Once n0 is back a leader is elected, n2 re-fetches the cut entries, clears the
watermark and holds the leader's bytes again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET
from dledger.member_state import Role
from dledger.rpc.protocol import VoteRequest, VoteResult
from dledger.server import DLedgerServer
from tests.ports import free_ports

GROUP = "rejoin"
IDS = ("n0", "n1", "n2")
DATA_FILE = 64 * 1024
INDEX_FILE = 32 * 1024
N_ENTRIES = 200
CORRUPT = 120  # committed on every member; not the first entry of its data file



class Group:
    """In-process members; every started server is shut down at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in zip(IDS, free_ports(3), strict=True))
        self.servers: dict[str, DLedgerServer] = {}

    def config(self, member: str) -> DLedgerConfig:
        return DLedgerConfig(group=GROUP, self_id=member, peers=self.peers,
                             store_base_dir=str(self.base / member),
                             heart_beat_time_interval_ms=100, max_heart_beat_leak=3, min_vote_interval_ms=50,
                             max_vote_interval_ms=150, check_point_interval_ms=100,
                             mapped_file_size_for_entry_data=DATA_FILE,
                             mapped_file_size_for_entry_index=INDEX_FILE)  # fmt: skip

    async def start(self, member: str) -> DLedgerServer:
        server = DLedgerServer(self.config(member))
        self.servers[member] = server
        await server.start()
        return server

    async def stop(self, member: str) -> None:
        await self.servers.pop(member).shutdown()

    async def leader(self, timeout_s: float = 5.0) -> DLedgerServer:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            for s in self.servers.values():
                if s.member_state.is_leader():
                    return s
            await asyncio.sleep(0.02)
        raise AssertionError(f"no leader within {timeout_s}s")


@pytest.fixture
async def group(tmp_path: Path):
    g = Group(tmp_path)
    yield g
    for member in list(g.servers):
        await g.stop(member)


async def wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


def flip_bit(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0x10]))


def body(i: int) -> bytes:
    return f"entry-{i:05d}-".encode() * (1 + i % 13)


def committed_bytes(server: DLedgerServer) -> bytes:
    """Every data-file byte up to the committed position."""
    store = server.store
    out = bytearray()
    for mf in store.data_file_list.files:
        end = min(mf.wrote_pos, store.committed_pos - mf.file_from_offset)
        if end > 0:
            out += mf.mm[:end]
    return bytes(out)


async def test_member_with_a_corrupt_committed_entry_refuses_votes_then_catches_up(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for m in IDS:
        await group.start(m)
    leader = await group.leader()
    for i in range(0, N_ENTRIES, 20):
        await leader.append([body(j) for j in range(i, i + 20)])
    end = leader.store.ledger_end_index
    await wait_for(lambda: all(s.store.committed_index == end for s in group.servers.values()), 5,
                   "every member to commit the whole log")
    n2 = group.servers["n2"]
    target = CORRUPT
    entry = n2.store.get(target)
    assert entry.body in {body(i) for i in range(N_ENTRIES)}  # a message, not the no-op
    mf = n2.store.data_file_list.find_file(entry.pos)
    path, local = mf.path, entry.pos - mf.file_from_offset
    assert local > 0, "the corrupt entry must not be the first of its file"
    for m in IDS:
        await group.stop(m)

    flip_bit(path, local + BODY_OFFSET + 7)  # one bit of the body of a committed entry
    caplog.clear()

    # n2 and n1 are a majority, but n2 lost committed entries: it must not help elect anyone.
    n2 = await group.start("n2")
    n1 = await group.start("n1")
    assert n2.store.ledger_end_index == target - 1
    assert any("event=committed_entries_cut" in r.getMessage() and f"lastGoodIndex={target - 1}"
               in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert n2.store.catchup_watermark >= end
    catchup = Path(n2.config.default_path()) / "catchup"
    assert catchup.read_text() == f"catchUpIndex={n2.store.catchup_watermark}\n"
    assert n2.metadata()["recovering"] is True
    with pytest.raises(DLedgerException) as ex:
        n2.store.get(target)  # the corrupt entry is never served
    assert ex.value.code is DLedgerResponseCode.INDEX_OUT_OF_RANGE
    roles: list[Role] = []
    n2.register_role_change_handler(lambda _term, role: roles.append(role))
    terms = (n1.member_state.curr_term, n2.member_state.curr_term)
    await asyncio.sleep(1.5)  # 5 election timeouts
    assert not n1.member_state.is_leader() and not n2.member_state.is_leader()
    assert (n1.member_state.curr_term, n2.member_state.curr_term) == terms  # no pre-vote passed
    assert any("event=vote_refused_recovering" in r.getMessage() for r in caplog.records)
    assert any("event=campaign_held_recovering" in r.getMessage() for r in caplog.records)
    assert not any(f"campaign group={GROUP} selfId=n2" in r.getMessage() for r in caplog.records)
    # A real vote request from an up-to-date candidate in a higher term: term adopted, no vote.
    ms = n2.member_state
    resp = await n2.elector.handle_vote(VoteRequest(
        group=GROUP, remote_id="n2", local_id="n1", term=ms.curr_term + 1, ledger_end_index=end + 10,
        ledger_end_term=n1.store.ledger_end_term + 1))  # fmt: skip
    assert resp.vote_result == VoteResult.REJECT_TERM_NOT_READY
    assert ms.curr_term == terms[1] + 1 and ms.vote_for is None
    assert catchup.exists(), "the watermark survives until the member caught up"

    # With n0 back a leader is elected without n2, which re-fetches what it cut.
    await group.start("n0")
    leader = await group.leader()
    assert leader is not n2
    await leader.append([b"after the rejoin"])
    new_end = leader.store.ledger_end_index
    await wait_for(lambda: n2.store.committed_index == new_end and not n2.metadata()["recovering"], 10,
                   "n2 to catch up past its watermark")
    assert Role.LEADER not in roles
    assert not catchup.exists()
    assert any("event=catch_up_complete" in r.getMessage() and "selfId=n2" in r.getMessage()
               for r in caplog.records)
    assert n2.store.get(target).body == leader.store.get(target).body == entry.body
    await wait_for(lambda: all(s.store.committed_pos == leader.store.committed_pos
                               for s in group.servers.values()), 5, "equal committed positions")
    assert committed_bytes(n2) == committed_bytes(leader) == committed_bytes(group.servers["n1"])
    # Caught up, n2 votes again.
    ms = n2.member_state
    resp = await n2.elector.handle_vote(VoteRequest(
        group=GROUP, remote_id="n2", local_id="n1", term=ms.curr_term, ledger_end_index=new_end + 10,
        ledger_end_term=leader.store.ledger_end_term, pre_vote=True, take_leadership=True))  # fmt: skip
    assert resp.vote_result != VoteResult.REJECT_TERM_NOT_READY


async def test_a_follower_restarted_with_a_cut_log_is_resynced_by_the_running_leader(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader keeps running and believes the follower is at its old end; the follower comes
    back far below it. The leader must find the follower's real end (COMPARE) and re-fetch it
    without waiting for a leader change (it used to take 3-6 s in a third of the runs: the
    follower's answer to a parked push raced the leader's push timeout, and every resend was
    parked afresh)."""
    for m in IDS:
        await group.start(m)
    leader = await group.leader()
    for i in range(0, N_ENTRIES, 20):
        await leader.append([body(j) for j in range(i, i + 20)])
    victim = next(m for m in IDS if group.servers[m] is not leader)
    end = leader.store.ledger_end_index
    v = group.servers[victim]
    await wait_for(lambda: v.store.committed_index == end, 5, "the victim to commit everything")
    entry = v.store.get(CORRUPT)
    mf = v.store.data_file_list.find_file(entry.pos)
    path, local = mf.path, entry.pos - mf.file_from_offset
    await group.stop(victim)
    flip_bit(path, local + BODY_OFFSET + 3)
    v = await group.start(victim)
    assert v.store.ledger_end_index == CORRUPT - 1 and v.metadata()["recovering"]
    t0 = asyncio.get_running_loop().time()
    stop = asyncio.Event()

    async def keep_writing() -> None:
        i = 0
        while not stop.is_set():
            await leader.append([f"more-{i}".encode()])
            i += 1
            await asyncio.sleep(0.02)

    writer = asyncio.create_task(keep_writing())
    try:
        await wait_for(lambda: not v.metadata()["recovering"], 8, "the victim to catch up")
    finally:
        stop.set()
        await writer
    took = asyncio.get_running_loop().time() - t0
    assert leader.member_state.is_leader() and leader.member_state.curr_term == v.member_state.curr_term
    assert v.store.get(CORRUPT).body == entry.body
    # One push timeout (1 s) at most: the follower answers a resent push for a gap it already
    # reported at once, so the leader's resend cannot race the follower's answer forever.
    assert took < 4.0, f"caught up only after {took:.2f}s"


# ---- damage in an older data file (before recovery's scan): found by the background verification

def big_body(i: int) -> bytes:
    return body(i) * 8  # ~90 entries per 64 KB data file


async def write_files(group: Group, leader: DLedgerServer, min_files: int) -> int:
    """Append through `leader` until it has `min_files` data files; wait until all commit."""
    i = 0
    while len(leader.store.data_file_list.files) < min_files:
        await leader.append([big_body(j) for j in range(i, i + 50)])
        i += 50
    end = leader.store.ledger_end_index
    await wait_for(lambda: all(s.store.committed_index == end for s in group.servers.values()), 5,
                   "every member to commit the whole log")
    return end


def old_entry(server: DLedgerServer, index: int) -> tuple[str, int, bytes]:
    """(path, local offset, body) of committed entry `index`, which must sit in the first data file
    (outside recovery's scan) and not be its first entry."""
    entry = server.store.get(index)
    files = server.store.data_file_list.files
    mf = server.store.data_file_list.find_file(entry.pos)
    assert mf is files[0] and len(files) >= 5 and entry.pos > mf.file_from_offset
    return mf.path, entry.pos - mf.file_from_offset + BODY_OFFSET + 9, entry.body


class Writer:
    """Keeps appending through `leader` (one entry per 20 ms) until stopped."""

    def __init__(self, leader: DLedgerServer) -> None:
        self.leader = leader
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            await self.leader.append([f"more-{i}".encode()])
            i += 1
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        self.stop.set()
        await self.task


async def assert_identical(group: Group, leader: DLedgerServer) -> None:
    await leader.append([b"last"])
    end = leader.store.ledger_end_index
    await wait_for(lambda: all(s.store.committed_index == end for s in group.servers.values()), 5,
                   "every member to commit the last entry")
    ref = committed_bytes(leader)
    for s in group.servers.values():
        assert committed_bytes(s) == ref, f"{s.config.self_id} differs from the leader"


async def test_a_follower_restarted_with_a_flip_in_an_old_data_file_is_cut_and_refetched(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for m in IDS:
        await group.start(m)
    leader = await group.leader()
    end = await write_files(group, leader, 6)
    victim = next(m for m in IDS if group.servers[m] is not leader)
    target = 20
    path, offset, original = old_entry(group.servers[victim], target)
    await group.stop(victim)
    flip_bit(path, offset)
    caplog.clear()
    writer = Writer(leader)
    try:
        v = await group.start(victim)
        roles: list[Role] = []
        v.register_role_change_handler(lambda _term, role: roles.append(role))
        assert await v.store.wait_verified() is False
        cuts = [r.getMessage() for r in caplog.records if "event=committed_entries_cut" in r.getMessage()]
        assert len(cuts) == 1 and f"selfId={victim}" in cuts[0] and f"lastGoodIndex={target - 1}" in cuts[0]
        assert v.store.catchup_watermark >= end
        await wait_for(lambda: not v.metadata()["recovering"] and not v.metadata()["verifying"], 8,
                       f"{victim} to re-fetch past its watermark")
    finally:
        await writer.close()
    assert Role.LEADER not in roles and not v.member_state.is_leader()
    assert leader.member_state.is_leader()
    assert v.store.get(target).body == original
    await assert_identical(group, leader)


async def test_a_running_follower_whose_log_is_cut_under_it_is_resynced(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """A later disk fault: the verification of a running follower's older files (an operator's
    check) finds a flipped bit and cuts the log while the leader keeps pushing; the follower's end
    moves back under the leader's pipeline, and COMPARE/TRUNCATE brings it back."""
    from dledger.store.verify import verify_old_files

    caplog.set_level(logging.INFO)
    for m in IDS:
        await group.start(m)
    leader = await group.leader()
    end = await write_files(group, leader, 6)
    victim = next(m for m in IDS if group.servers[m] is not leader)
    v = group.servers[victim]
    roles: list[Role] = []
    v.register_role_change_handler(lambda _term, role: roles.append(role))
    target = 20
    path, offset, original = old_entry(v, target)
    term = leader.member_state.curr_term
    writer = Writer(leader)
    try:
        await asyncio.sleep(0.2)  # the leader's pipeline to the victim is busy
        flip_bit(path, offset)  # through the file: the shared mapping sees it
        assert await verify_old_files(v.store, v.store.data_file_list.files[-3].file_from_offset) is False
        assert v.store.ledger_end_index == target - 1 and v.metadata()["recovering"]
        assert v.store.catchup_watermark >= end
        with pytest.raises(DLedgerException):
            v.store.get(target)
        t0 = asyncio.get_running_loop().time()
        await wait_for(lambda: not v.metadata()["recovering"], 8, f"{victim} to re-fetch past its watermark")
        took = asyncio.get_running_loop().time() - t0
    finally:
        await writer.close()
    # Pushes beyond the cut are refused at once (not parked for a push timeout): the leader COMPAREs.
    assert took < v.entry_handler.wait_timeout_s, f"caught up only after {took:.2f}s"
    assert Role.LEADER not in roles
    assert leader.member_state.is_leader() and leader.member_state.curr_term == term  # undisturbed
    assert v.store.get(target).body == original
    await assert_identical(group, leader)


async def test_a_leader_that_finds_a_corrupt_old_entry_steps_down_before_cutting(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    from dledger.store.verify import verify_old_files

    caplog.set_level(logging.INFO)
    for m in IDS:
        await group.start(m)
    old = await group.leader()
    end = await write_files(group, old, 6)
    target = 20
    path, offset, original = old_entry(old, target)
    flip_bit(path, offset)
    roles: list[tuple[Role, int]] = []
    old.register_role_change_handler(lambda _term, role: roles.append((role, old.store.ledger_end_index)))
    assert await verify_old_files(old.store, old.store.data_file_list.files[-3].file_from_offset) is False
    # It stepped down while its log still reached the old end, then cut.
    assert roles and roles[0] == (Role.CANDIDATE, end)
    assert not old.member_state.is_leader() and old.store.ledger_end_index == target - 1
    new = None
    deadline = asyncio.get_running_loop().time() + 5
    while new is None:
        assert asyncio.get_running_loop().time() < deadline, "no new leader within 5 s"
        new = next((s for s in group.servers.values() if s.member_state.is_leader()), None)
        await asyncio.sleep(0.02)
    assert new is not old
    await new.append([b"under the new leader"])
    await wait_for(lambda: not old.metadata()["recovering"], 8, "the old leader to re-fetch")
    assert (Role.LEADER, target - 1) not in roles and all(r is not Role.LEADER for r, _ in roles)
    assert old.store.get(target).body == original
    await assert_identical(group, new)
