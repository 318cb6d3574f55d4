"""A simulated DLedger group: N `DLedgerServer`s on a `MemoryNetwork` under a `VirtualTimeLoop`,
with crash/restart (optionally losing unflushed entries), partitions and the safety invariants.

Everything random comes from one seed, and the loop's clock is virtual, so a run replays exactly.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dledger.codes import DLedgerException
from dledger.config import DLedgerConfig
from dledger.member_state import Role
from dledger.rpc.memory import MemoryNetwork, MemoryRpcService
from dledger.server import DLedgerServer
from dledger.snapshot import MemorySnapshotStore
from dledger.statemachine import StateMachine
from dledger.store.memory_store import DLedgerMemoryStore


class InvariantViolation(AssertionError):
    """A Raft safety property failed."""


@dataclass
class SimMember:
    member_id: str
    config: DLedgerConfig
    store: DLedgerMemoryStore
    server: DLedgerServer | None = None
    last_commit: int = -1  # commit index seen in this incarnation (must not go backwards)
    checked_upto: int = -1  # committed entries compared with the reference log
    incarnation: int = 0
    snapshots: MemorySnapshotStore = field(default_factory=MemorySnapshotStore)  # kept like the store
    machine: StateMachine | None = None  # this incarnation's (with a machine factory)


@dataclass
class SimCluster:
    """A group of `n` members, driven by the seeded `rng`."""

    n: int
    seed: int
    sync_flush: bool = False
    unsafe_ack: bool = False  # test-only: ack before quorum, to prove the checkers catch losses
    dledger_overrides: dict[str, Any] = field(default_factory=dict)  # DLedgerConfig fields
    machine_factory: Callable[[], StateMachine] | None = None  # a state machine per incarnation
    members: dict[str, SimMember] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.network = MemoryNetwork(random.Random(self.rng.random()))
        ids = [f"n{i}" for i in range(self.n)]
        peers = ";".join(f"{m}-127.0.0.1:{20000 + i}" for i, m in enumerate(ids))
        for m in ids:
            cfg = DLedgerConfig(
                group="sim",
                self_id=m,
                peers=peers,
                store_type="MEMORY",
                flush_disk_type="SYNC_FLUSH" if self.sync_flush else "ASYNC_FLUSH",
                flush_file_interval_ms=50,
                max_batch_push_count=16,
                max_pending_push_batches=4,
                max_wait_ack_time_ms=2500,
                unsafe_ack_before_quorum=self.unsafe_ack,
            )
            for name, value in self.dledger_overrides.items():
                setattr(cfg, name, value)
            self.members[m] = SimMember(m, cfg, DLedgerMemoryStore(cfg))
        self.leaders_by_term: dict[int, str] = {}
        self.committed_ref: dict[int, tuple[int, int, bytes]] = {}  # index -> (term, magic, body)
        self.acked: dict[int, tuple[int, bytes]] = {}  # index -> (term, body) answered SUCCESS
        self.leader_verified: dict[tuple[str, int], int] = {}  # (leader, term) -> acked indexes verified
        self.max_acked = -1
        self.acked_order: list[int] = []
        self.violations: list[str] = []
        self.client_tasks: set[asyncio.Task[None]] = set()
        self.append_ok = 0
        self.append_failed = 0
        self.body_seq = 0

    # -- lifecycle ------------------------------------------------------------------------
    async def start_member(self, m: SimMember) -> None:
        rpc = MemoryRpcService(self.network, m.member_id)
        m.server = DLedgerServer(m.config, rpc=rpc, store=m.store, rng=random.Random(self.rng.random()),
                                 snapshots=m.snapshots)
        if self.machine_factory is not None:
            m.machine = self.machine_factory()
            m.server.set_state_machine(m.machine)
        self.network.down.discard(m.member_id)
        m.incarnation += 1
        m.last_commit = -1
        m.checked_upto = min(m.checked_upto, m.store.committed_index)
        await m.server.start()

    async def start(self) -> None:
        for m in self.members.values():
            await self.start_member(m)

    async def crash(self, m: SimMember, lose_unflushed: bool) -> None:
        """Kill a member abruptly; its store keeps what was flushed (or everything)."""
        assert m.server is not None
        self.network.down.add(m.member_id)
        server, m.server = m.server, None
        await server.shutdown(graceful=False)
        m.store.crash(lose_unflushed=lose_unflushed)
        m.checked_upto = min(m.checked_upto, m.store.committed_index)

    def wipe(self, m: SimMember) -> None:
        """A replaced machine: a stopped member's log and snapshots are gone (its term and vote
        are kept: a member forgetting its vote could vote twice in a term, which the invariants
        would rightly flag)."""
        assert m.server is None, "wipe a crashed member"
        fresh = DLedgerMemoryStore(m.config)
        fresh.term_state = m.store.term_state
        m.store, m.snapshots = fresh, MemorySnapshotStore(m.config.max_snapshot_reserved_num)
        m.checked_upto = -1

    async def stop(self) -> None:
        for t in list(self.client_tasks):
            t.cancel()
        for t in list(self.client_tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        for m in self.members.values():
            if m.server is not None:
                await m.server.shutdown(graceful=False)
                m.store.crash(lose_unflushed=False)
                m.server = None

    def live(self) -> list[SimMember]:
        return [m for m in self.members.values() if m.server is not None]

    def leaders(self) -> list[SimMember]:
        return [m for m in self.live() if m.server is not None and m.server.member_state.role == Role.LEADER]

    # -- client ---------------------------------------------------------------------------
    def client_append(self, count: int) -> None:
        """Append `count` bodies at a (random) leader in the background; record SUCCESS answers."""
        leaders = self.leaders()
        if not leaders:
            return
        target = self.rng.choice(leaders)
        bodies = []
        for _ in range(count):
            self.body_seq += 1
            bodies.append(f"s{self.seed}-b{self.body_seq}".encode() * self.rng.randint(1, 4))
        task = asyncio.get_running_loop().create_task(self._append(target, bodies))
        self.client_tasks.add(task)
        task.add_done_callback(self.client_tasks.discard)

    async def _append(self, target: SimMember, bodies: list[bytes]) -> None:
        server = target.server
        if server is None:
            return
        try:
            results = await server.append(bodies)
        except DLedgerException:
            self.append_failed += 1
            return
        self.append_ok += 1
        quorum = self.n // 2 + 1
        for r, body in zip(results, bodies, strict=True):
            # At the moment of the answer the entry must be on a majority (with SYNC_FLUSH: on disk).
            holders = sum(
                1
                for m in self.members.values()
                if self._holds(m, r.index, r.term, body)
                and (not self.sync_flush or m.store.flushed_index >= r.index)
            )
            if holders < quorum:
                self.violations.append(f"index {r.index} acked while held by {holders} < {quorum} members")
            prev = self.acked.get(r.index)
            if prev is not None and prev != (r.term, body):
                raise InvariantViolation(f"index {r.index} acked twice: {prev} and {(r.term, body)}")
            if prev is None:
                self.acked_order.append(r.index)
            self.acked[r.index] = (r.term, body)
            self.max_acked = max(self.max_acked, r.index)

    # -- invariants -----------------------------------------------------------------------
    def check(self) -> None:
        """Raft safety, after every step (Raft §5.2 election safety, §5.3 log matching on the
        committed prefix, §5.4 leader completeness for acknowledged appends)."""
        if self.violations:
            raise InvariantViolation("; ".join(self.violations[:5]))
        for m in self.members.values():
            if m.store.violations:
                raise InvariantViolation(f"{m.member_id}: {m.store.violations}")
        for m in self.leaders():
            term = m.server.member_state.curr_term  # type: ignore[union-attr]
            other = self.leaders_by_term.setdefault(term, m.member_id)
            if other != m.member_id:
                raise InvariantViolation(f"two leaders in term {term}: {other} and {m.member_id}")
        lows = {}
        for m in self.members.values():
            low = m.store.low_water_modified
            m.store.low_water_modified = None
            if low is not None:
                lows[m.member_id] = low
                m.checked_upto = min(m.checked_upto, low - 1)
        for m in self.live():
            self._check_commit(m)
        if lows:
            self._check_acked_majority(min(lows.values()))
        for m in self.leaders():
            self._check_leader_has_acked(m)

    def _check_commit(self, m: SimMember) -> None:
        store = m.store
        c = store.committed_index
        if c < m.last_commit:
            raise InvariantViolation(f"{m.member_id} commit index went back {m.last_commit} -> {c}")
        m.last_commit = c
        # Entries before the log's begin went by retention or were replaced by a snapshot.
        for i in range(max(m.checked_upto + 1, store.ledger_begin_index), c + 1):
            e = store.get(i)
            mine = (e.term, e.magic, e.body)
            ref = self.committed_ref.setdefault(i, mine)
            if ref != mine:
                raise InvariantViolation(
                    f"committed index {i} differs: {m.member_id} has term {e.term}, reference term {ref[0]}"
                )
        m.checked_upto = max(m.checked_upto, c)

    def _holds(self, m: SimMember, index: int, term: int, body: bytes) -> bool:
        store = m.store
        if index > store.ledger_end_index:
            return False
        if index < store.ledger_begin_index:
            return index <= store.committed_index  # compacted: committed, so part of the snapshot
        e = store.get(index)
        return e.term == term and e.body == body

    def _check_acked_majority(self, start: int) -> None:
        """Every acknowledged entry from `start` on is held by a majority. Called with the lowest
        index any store cut since the last step: a store only loses entries by being cut."""
        quorum = self.n // 2 + 1
        for index, (term, body) in self.acked.items():
            if index < start:
                continue
            holders = sum(1 for m in self.members.values() if self._holds(m, index, term, body))
            if holders < quorum:
                raise InvariantViolation(
                    f"acked index {index} (term {term}) held by {holders} < {quorum} members"
                )

    def _check_leader_has_acked(self, m: SimMember) -> None:
        leader_term = m.server.member_state.curr_term  # type: ignore[union-attr]
        key = (m.member_id, leader_term)
        done = self.leader_verified.get(key, 0)
        order = self.acked_order
        for index in order[done:]:
            term, body = self.acked[index]
            # A leader of a later term must hold it; a deposed leader that has not heard yet need not.
            if term <= leader_term and not self._holds(m, index, term, body):
                raise InvariantViolation(f"leader {key} lacks acked index {index} (term {term})")
        self.leader_verified[key] = len(order)

    def final_check(self) -> None:
        self.check()
        self._check_acked_majority(0)
