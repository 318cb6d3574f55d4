"""`DLedgerServer`: one member of a DLedger group, and the API the broker and clients call.

Start order (DLedger's): store (load + recover) → RPC service → entry pusher → leader elector.
`append(bodies)` is the leader's write path: check role / transfer / pending limit (entries not yet
committed, `max_pending_requests_num`) / disk, append as leader in the current term, register one
future for the batch's last index, and return once the quorum checker has committed it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.elector import DLedgerLeaderElector, RoleChangeHandler
from dledger.entry import MAGIC_NOOP, DLedgerEntry
from dledger.entry_handler import EntryHandler
from dledger.member_state import MemberState, Role
from dledger.pusher import DLedgerEntryPusher
from dledger.rpc.protocol import (
    AppendEntryRequest,
    AppendEntryResponse,
    GetEntriesRequest,
    GetEntriesResponse,
    HeartBeatRequest,
    HeartBeatResponse,
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    MetadataRequest,
    MetadataResponse,
    PushEntryRequest,
    PushEntryResponse,
    RequestOrResponse,
    RpcService,
    VoteRequest,
    VoteResponse,
    error_response,
)
from dledger.snapshot import FileSnapshotStore, MemorySnapshotStore, SnapshotReader, SnapshotStore
from dledger.statemachine import StateMachine, StateMachineCaller
from dledger.store.base import DLedgerStore

log = logging.getLogger("dledger.server")

_SHUTDOWN_DRAIN_S = 1.0
# A new leader whose no-op append fails (disk full) retries with this backoff until it goes in.
_NOOP_RETRY_MIN_S = 0.05
_NOOP_RETRY_MAX_S = 1.0
_MAX_GET_COUNT = 10_000


@dataclass(slots=True)
class AppendResult:
    """Where a committed body landed."""

    index: int
    term: int
    pos: int


def not_leader(ms: MemberState, detail: str = "") -> DLedgerException:
    """NOT_LEADER naming the leader when known (`exc.leader_id`, `exc.leader_addr`)."""
    exc = DLedgerException(
        DLedgerResponseCode.NOT_LEADER, detail or f"{ms.self_id} is {ms.role.value}; leader is {ms.leader_id}"
    )
    exc.leader_id = ms.leader_id  # type: ignore[attr-defined]
    exc.leader_addr = ms.leader_addr  # type: ignore[attr-defined]
    return exc


def create_store(config: DLedgerConfig) -> DLedgerStore:
    """The store `config.store_type` names (the mmap store is imported only when used)."""
    if config.store_type == "MEMORY":
        from dledger.store.memory_store import DLedgerMemoryStore

        return DLedgerMemoryStore(config)
    from dledger.store.mmap_store import DLedgerMmapFileStore

    return DLedgerMmapFileStore(config)


class DLedgerServer:
    """A DLedger member: wires store, member state, RPC, pusher, entry handler and elector."""

    def __init__(
        self,
        config: DLedgerConfig,
        *,
        rpc: RpcService | None = None,
        store: DLedgerStore | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        snapshots: SnapshotStore | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.store = store if store is not None else create_store(config)
        self.member_state = MemberState(config, self.store)
        # Snapshot storage (with enable_snapshot): given (the simulator keeps it across a member's
        # crash, like its store), or DLedger's file layout beside the log.
        self.snapshots: SnapshotStore | None = None
        if config.enable_snapshot:
            self.snapshots = snapshots or (
                FileSnapshotStore(config.snapshot_store_path(), config.max_snapshot_reserved_num)
                if config.store_type == "FILE" else MemorySnapshotStore(config.max_snapshot_reserved_num))
        if rpc is None:
            from dledger.rpc.tcp import TcpRpcService

            rpc = TcpRpcService(config.group, config.self_id, config.peer_map, auth=config.peer_auth(),
                                handshake_timeout_s=config.peer_handshake_timeout_ms / 1000,
                                tls=config.peer_tls())
        self.rpc = rpc
        self._clock = clock
        self.rng = rng or random.Random()
        self.pusher = DLedgerEntryPusher(config, self.member_state, self.store, rpc, self._now,
                                         self.snapshots)
        self.elector = DLedgerLeaderElector(config, self.member_state, rpc, self.pusher, self.rng, self._now)
        self.entry_handler = EntryHandler(
            config, self.member_state, self.store, self.elector.accept_leader_message, self._on_commit,
            self.snapshots, self._install_snapshot,
        )
        # Events between the parts (none of them knows the others' classes):
        self.pusher.higher_term_listeners.append(self.elector.on_higher_term)
        self.pusher.peer_ack_listeners.append(self.elector.on_peer_ack)
        self.elector.heartbeat_ack_listeners.append(self.pusher.on_peer_alive)
        self.pusher.commit_listeners.append(self._on_commit)
        # A corrupt log cut while running: a leader steps down first, then parked pushes are
        # answered so the leader re-COMPAREs at once.
        self.store.corrupt_cut_listeners.append(self.elector.on_corrupt_cut)
        self.store.corrupt_cut_listeners.append(lambda _reason: self.entry_handler.on_log_cut())
        self.elector.internal_handlers.append(self.pusher.on_role_change)
        self.elector.internal_handlers.append(self._on_role_change)
        self._callers: list[StateMachineCaller] = []
        self.store.set_retention_floor(self._retention_floor)
        self.started = False
        self._stopping = False
        self._noop_term = -1  # the leader term whose no-op is in our log
        self._noop_error: DLedgerResponseCode | None = None  # why the current term's no-op failed
        self._noop_task: asyncio.Task[None] | None = None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    # -- wiring API -----------------------------------------------------------------------
    def register_role_change_handler(self, handler: RoleChangeHandler) -> None:
        """`handler(term, role)` on every role change (sync; schedule tasks yourself)."""
        self.elector.register_role_change_handler(handler)

    def set_state_machine(self, sm: StateMachine) -> None:
        """Feed `sm` committed entries in order from its `last_applied_index() + 1` (snapshots:
        the member's one machine is snapshotted, see `dledger.statemachine`)."""
        if self.snapshots is not None and self._callers:
            raise ValueError("enable_snapshot takes exactly one state machine per member")
        caller = StateMachineCaller(self.store, sm, f"{self.config.group}/{self.config.self_id}",
                                    self.snapshots, self.config.snapshot_threshold)
        self._callers.append(caller)
        if self.started:
            caller.start()

    async def _install_snapshot(self, reader: SnapshotReader) -> None:
        """A snapshot the leader sent is stored; the log was replaced by it: load it."""
        for c in self._callers:
            await c.install(reader)

    async def _align_log_with_snapshot(self) -> None:
        """At start: a stored snapshot beyond the recovered log end (an install whose first
        entries never arrived, or a log cut back below it) replaces the log; one right before the
        log's begin names the term the first entry follows."""
        assert self.snapshots is not None
        latest = await self.snapshots.latest_async()
        store = self.store
        if latest is None:
            return
        if latest.index > store.ledger_end_index:
            store.reset_to_snapshot(latest.index, latest.term, latest.end_pos)
        elif latest.index == store.ledger_begin_index - 1:
            store.ledger_before_begin_term = latest.term

    def _retention_floor(self) -> int | None:
        """The lowest entry any state machine still needs in the log (None: none asks)."""
        floors = [f for c in self._callers if (f := c.retained_from_index()) is not None]
        return min(floors, default=None)

    def _on_commit(self) -> None:
        for c in self._callers:
            c.on_commit()

    def _on_role_change(self, term: int, role: Role) -> None:
        self.entry_handler.on_role_change()
        if self._noop_task is not None:
            self._noop_task.cancel()
            self._noop_task = None
        self._noop_error = None
        if role == Role.LEADER:
            # Raft §8: a no-op in our own term, before any client append, commits earlier terms' entries.
            exc = self._append_noop(term)
            if exc is not None:
                # Typically DISK_FULL on every member: stay leader, refuse appends (DISK_FULL /
                # LEADER_NOT_READY) and retry until the space is freed.
                self._noop_error = exc.code
                log.warning(
                    "event=leader_noop_failed group=%s selfId=%s term=%d code=%s: appends refused until "
                    "it goes in (retrying): %s",
                    self.config.group, self.config.self_id, term, exc.code.name, exc,
                )  # fmt: skip
                self._noop_task = asyncio.get_running_loop().create_task(self._retry_noop(term))

    def _append_noop(self, term: int) -> DLedgerException | None:
        try:
            noop = self.store.append_as_leader(DLedgerEntry(body=b"", magic=MAGIC_NOOP), term)
        except DLedgerException as exc:
            return exc
        self._noop_term = term
        self._noop_error = None
        self.pusher.on_leader_append([noop])
        return None

    async def _retry_noop(self, term: int) -> None:
        """Retry the leader's no-op with backoff while we lead `term`; log only when the reason
        changes and once it succeeds."""
        ms = self.member_state
        delay = _NOOP_RETRY_MIN_S
        while True:
            await asyncio.sleep(delay)
            if self._stopping or not ms.is_leader() or ms.curr_term != term:
                return
            exc = self._append_noop(term)
            if exc is None:
                log.info(
                    "event=leader_noop_appended group=%s selfId=%s term=%d after retrying: appends accepted",
                    self.config.group, self.config.self_id, term,
                )  # fmt: skip
                return
            if exc.code != self._noop_error:
                log.warning(
                    "event=leader_noop_failed group=%s selfId=%s term=%d code=%s (retrying): %s",
                    self.config.group, self.config.self_id, term, exc.code.name, exc,
                )  # fmt: skip
                self._noop_error = exc.code
            delay = min(delay * 2, _NOOP_RETRY_MAX_S)

    def write_refusal(self) -> DLedgerResponseCode | None:
        """Why this member, being leader, cannot take appends right now: DISK_FULL (its store is
        full, or its no-op failed for that reason) or LEADER_NOT_READY (no-op not in yet); None
        when it is not leader or ready. The broker uses it to answer 507 instead of NOT_MASTER."""
        ms = self.member_state
        if ms.role != Role.LEADER:
            return None
        if self.store.is_disk_full:
            return DLedgerResponseCode.DISK_FULL
        if self._noop_term != ms.curr_term:
            if self._noop_error == DLedgerResponseCode.DISK_FULL:
                return DLedgerResponseCode.DISK_FULL
            return DLedgerResponseCode.LEADER_NOT_READY
        return None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """store → rpc → pusher → elector (→ state machine callers)."""
        self.rpc.register_handler(self)
        await self.store.start()
        if self.snapshots is not None:
            await self._align_log_with_snapshot()
        await self.rpc.start()
        self.pusher.start()
        self.elector.start()
        for c in self._callers:
            c.start()
        self.started = True
        log.info(
            "started group=%s selfId=%s term=%d end=%d committed=%d",
            self.config.group,
            self.config.self_id,
            self.member_state.curr_term,
            self.store.ledger_end_index,
            self.store.committed_index,
        )

    async def shutdown(self, *, graceful: bool = True) -> None:
        """Stop. Graceful: let pending appends finish (bounded), answer the rest, flush the store.
        Not graceful (the simulator's crash): just stop every task; the store is left as is."""
        if self._stopping:
            return
        self._stopping = True
        if graceful and self.pusher.pending:
            futures = [p.future for p in self.pusher.pending]
            await asyncio.wait(futures, timeout=_SHUTDOWN_DRAIN_S)
        if self._noop_task is not None:
            self._noop_task.cancel()
            self._noop_task = None
        await self.elector.shutdown()
        await self.pusher.shutdown()  # also cancels the dispatchers' in-flight pushes
        await self.rpc.shutdown()
        if graceful:
            for c in self._callers:
                await c.shutdown()
            await self.store.shutdown()
        else:
            for c in self._callers:
                c.abort()
        self.started = False
        log.info("stopped group=%s selfId=%s graceful=%s", self.config.group, self.config.self_id, graceful)

    # -- client API -----------------------------------------------------------------------
    async def append(self, bodies: list[bytes]) -> list[AppendResult]:
        """Append `bodies` as leader; return once committed (see docs/INTERFACES.md for errors)."""
        ms = self.member_state
        if not bodies:
            raise DLedgerException(DLedgerResponseCode.REQUEST_WITH_EMPTY_BODYS, "no bodies")
        if ms.role != Role.LEADER or self._stopping:
            raise not_leader(ms)
        if ms.transferee is not None:
            raise DLedgerException(
                DLedgerResponseCode.LEADER_TRANSFERRING, f"transferring to {ms.transferee}"
            )
        pending, limit = self.pusher.pending_entries, self.config.max_pending_requests_num
        if pending and pending + len(bodies) > limit:
            # Counted in entries (a batch of 1,000 is 1,000 entries); a batch larger than the whole
            # limit still goes in when nothing is pending, so it is never refused for ever.
            raise DLedgerException(
                DLedgerResponseCode.LEADER_PENDING_FULL,
                f"{pending} entries wait for a quorum; {len(bodies)} more would pass maxPendingRequestsNum "
                f"{limit}",
            )
        refusal = self.write_refusal()
        if refusal is not None:
            why = "store disk is full" if refusal == DLedgerResponseCode.DISK_FULL else "no-op not appended"
            raise DLedgerException(refusal, f"leader of term {ms.curr_term} cannot append: {why}")
        term = ms.curr_term
        entries = self.store.batch_append_as_leader([DLedgerEntry(body=b) for b in bodies], term)
        self.pusher.on_leader_append(entries)
        if not self.config.unsafe_ack_before_quorum:
            await self.pusher.wait_ack(entries[-1].index, term)
        return [AppendResult(e.index, e.term, e.pos) for e in entries]

    def get_entries(self, begin_index: int, max_count: int = 1) -> list[DLedgerEntry]:
        """Committed entries from `begin_index` (at most `max_count`); [] past the commit index."""
        store = self.store
        if begin_index < store.ledger_begin_index and store.ledger_begin_index >= 0:
            raise DLedgerException(
                DLedgerResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                f"{begin_index} < begin {store.ledger_begin_index}",
            )
        if begin_index < 0:
            raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, f"index {begin_index} < 0")
        stop = min(store.committed_index, begin_index + min(max_count, _MAX_GET_COUNT) - 1)
        return [store.get(i) for i in range(begin_index, stop + 1)]

    def metadata(self) -> dict[str, Any]:
        ms, store = self.member_state, self.store
        applied = min((c.applied_index for c in self._callers), default=store.committed_index)
        return {
            "role": ms.role.value,
            "term": ms.curr_term,
            "leaderId": ms.leader_id,
            "leaderAddr": ms.leader_addr,
            "selfId": ms.self_id,
            "group": ms.group,
            "peers": dict(ms.peer_map),
            "ledgerBeginIndex": store.ledger_begin_index,
            "ledgerEndIndex": store.ledger_end_index,
            "ledgerEndTerm": store.ledger_end_term,
            "committedIndex": store.committed_index,
            "appliedIndex": applied,
            "transferee": ms.transferee,
            "recovering": ms.check_recovering(),  # cut committed entries, not caught up yet: no votes
            "verifying": ms.check_verifying(),  # older data files not verified yet: no campaign
            "peerWaterMarks": dict(self.pusher.peer_water_marks) if ms.is_leader() else {},
            "snapshotIndex": max((c.last_snapshot_index for c in self._callers), default=-1),
            "stateMachine": next((st for c in self._callers if (st := c.machine.status()) is not None), None),
        }

    async def leadership_transfer(self, transferee_id: str) -> None:
        """Hand leadership to `transferee_id` (leader only); returns once it has taken over."""
        if not self.member_state.is_leader():
            raise not_leader(self.member_state)
        await self.elector.handle_leadership_transfer(transferee_id)

    # -- RPC handlers (called by the transport) -------------------------------------------
    def _refuse(self, req: RequestOrResponse) -> Any:
        if req.group != self.config.group:
            log.warning(
                "refusing %s for group %r at group=%s selfId=%s",
                type(req).__name__,
                req.group,
                self.config.group,
                self.config.self_id,
            )
            return error_response(req, DLedgerResponseCode.UNKNOWN_GROUP, self.config.self_id)
        if req.remote_id != self.config.self_id:
            log.warning(
                "refusing %s for member %r at group=%s selfId=%s",
                type(req).__name__,
                req.remote_id,
                self.config.group,
                self.config.self_id,
            )
            return error_response(req, DLedgerResponseCode.UNKNOWN_MEMBER, self.config.self_id)
        return None

    async def handle_vote(self, req: VoteRequest) -> VoteResponse:
        return self._refuse(req) or await self.elector.handle_vote(req)

    async def handle_heartbeat(self, req: HeartBeatRequest) -> HeartBeatResponse:
        return self._refuse(req) or await self.elector.handle_heartbeat(req)

    async def handle_push(self, req: PushEntryRequest) -> PushEntryResponse:
        return self._refuse(req) or await self.entry_handler.handle_push(req)

    async def handle_install_snapshot(self, req: InstallSnapshotRequest) -> InstallSnapshotResponse:
        return self._refuse(req) or await self.entry_handler.handle_install_snapshot(req)

    def _resp_header(self, req: RequestOrResponse, resp: RequestOrResponse) -> Any:
        ms = self.member_state
        resp.group, resp.remote_id, resp.local_id = ms.group, req.local_id, ms.self_id
        resp.leader_id, resp.term = ms.leader_id or "", ms.curr_term
        return resp

    async def handle_append(self, req: AppendEntryRequest) -> AppendEntryResponse:
        refused = self._refuse(req)
        if refused is not None:
            return refused
        resp = AppendEntryResponse()
        try:
            results = await self.append(req.bodies)
            resp.index, resp.pos, resp.positions = results[0].index, results[0].pos, [r.pos for r in results]
        except DLedgerException as exc:
            resp.code = int(exc.code)
        return self._resp_header(req, resp)

    async def handle_get(self, req: GetEntriesRequest) -> GetEntriesResponse:
        refused = self._refuse(req)
        if refused is not None:
            return refused
        resp = GetEntriesResponse()
        try:
            resp.entries = self.get_entries(req.begin_index, req.max_count)
        except DLedgerException as exc:
            resp.code = int(exc.code)
        return self._resp_header(req, resp)

    async def handle_metadata(self, req: MetadataRequest) -> MetadataResponse:
        refused = self._refuse(req)
        if refused is not None:
            return refused
        return self._resp_header(req, MetadataResponse(json=orjson.dumps(self.metadata())))

    async def handle_leadership_transfer(self, req: LeadershipTransferRequest) -> LeadershipTransferResponse:
        refused = self._refuse(req)
        if refused is not None:
            return refused
        resp = LeadershipTransferResponse()
        if req.take_leadership_term >= 0:
            resp.code = int(self.elector.handle_take_leadership(req))
        else:
            try:
                await self.leadership_transfer(req.transferee_id)
            except DLedgerException as exc:
                log.warning(
                    "leadership transfer to %s failed group=%s selfId=%s term=%d: %s", req.transferee_id,
                    self.config.group, self.config.self_id, self.member_state.curr_term, exc,
                )  # fmt: skip
                resp.code = int(exc.code)
        return self._resp_header(req, resp)
