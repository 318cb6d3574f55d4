"""`DLedgerEntryPusher` (leader side of replication) and its `QuorumAckChecker` logic.

The pusher keeps, for the current leader term, every member's watermark (highest index it is known
to store; with SYNC_FLUSH: to have fsynced) and the pending client appends. Whenever a watermark
moves, the quorum checker recomputes the commit index — the highest index a majority has reached,
counted only once it is in the leader's own term (Raft §5.4.2; the no-op a new leader appends makes
older entries committed with it) — and completes the pending appends up to it. There is no polling
loop on this path: watermark updates arrive with push responses and run the check inline.

One `EntryDispatcher` (dledger/dispatcher.py) per follower does the pushing; `EntryHandler`
(dledger/entry_handler.py) is the follower side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.dispatcher import EntryDispatcher, RawBatch
from dledger.entry import DLedgerEntry
from dledger.member_state import MemberState, Role
from dledger.rpc.protocol import RpcService
from dledger.snapshot import SnapshotStore
from dledger.store.base import DLedgerStore

log = logging.getLogger("dledger.pusher")

# Recently appended entries kept in memory so dispatchers do not re-read (and re-check) them. Entries
# every follower already holds are dropped as watermarks move (see _trim_cache); the caps only bound
# the cache while a follower lags or is down (it then reads from the store), so resident memory does
# not grow with the number of stored entries.
_CACHE_MAX_ENTRIES = 32_768
_CACHE_MAX_BYTES = 32 * 1024 * 1024
_SWEEP_INTERVAL_S = 0.1


@dataclass(slots=True)
class _Pending:
    index: int
    future: asyncio.Future[int]
    deadline: float


class _CatchUpWaiter(NamedTuple):
    peer: str
    index: int
    future: asyncio.Future[None]


class DLedgerEntryPusher:
    """Leader-side replication state: watermarks, pending appends, dispatchers, entry cache.

    Events for the elector (registered by the server): `higher_term_listeners(term, source)` when a
    follower answers with a higher term, `peer_ack_listeners(peer)` on every successful answer.
    """

    def __init__(
        self,
        config: DLedgerConfig,
        member_state: MemberState,
        store: DLedgerStore,
        rpc: RpcService,
        clock: Callable[[], float],
        snapshots: SnapshotStore | None = None,
    ) -> None:
        self.config = config
        self.snapshots = snapshots  # what a follower behind our log's begin is sent (InstallSnapshot)
        self.ms = member_state
        self.store = store
        self.rpc = rpc
        self.clock = clock
        self.higher_term_listeners: list[Callable[[int, str], None]] = []
        self.peer_ack_listeners: list[Callable[[str], None]] = []
        self.term = -1
        self.first_index_of_term = 1 << 62
        self.peer_water_marks: dict[str, int] = {}
        self.pending: deque[_Pending] = deque()
        self.commit_listeners: list[Callable[[], None]] = []
        self.dispatchers: dict[str, EntryDispatcher] = {}
        self.leader_end_pos = 0
        self._cache: deque[DLedgerEntry] = deque()
        self._cache_base = 0
        self._cache_bytes = 0
        self.last_raw: RawBatch | None = None  # the stored bytes of the last batch pushed
        self._catch_up_waiters: list[_CatchUpWaiter] = []
        self._own_flush_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for peer in self.ms.peers_without_self():
            d = EntryDispatcher(self, peer)
            self.dispatchers[peer] = d
            self._tasks.append(loop.create_task(d.run()))
        self._tasks.append(loop.create_task(self._sweep_timeouts()))
        if self.config.sync_flush:
            self._tasks.append(loop.create_task(self._own_flush_loop()))

    async def shutdown(self, code: DLedgerResponseCode = DLedgerResponseCode.NOT_LEADER) -> None:
        for d in self.dispatchers.values():
            d.cancel_sends()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        self._fail_pending(code, "server shutting down")

    # -- role changes ---------------------------------------------------------------------
    def on_role_change(self, term: int, role: Role) -> None:
        """Internal role handler: a new leader term resets watermarks; losing leadership fails
        every pending append (its outcome is unknown to us: TERM_CHANGED)."""
        if role == Role.LEADER:
            self._fail_pending(DLedgerResponseCode.TERM_CHANGED, f"new leader term {term}")
            self.term = term
            self.peer_water_marks = {p: -1 for p in self.ms.peer_map}
            self.first_index_of_term = 1 << 62
            self._reset_cache()
        else:
            if self.pending:
                self._fail_pending(DLedgerResponseCode.TERM_CHANGED, f"no longer leader (term {term})")
            self.term = -1
            self._reset_cache()
        for d in self.dispatchers.values():
            d.wake.set()

    def _fail_pending(self, code: DLedgerResponseCode, why: str) -> None:
        while self.pending:
            p = self.pending.popleft()
            if not p.future.done():
                exc = DLedgerException(code, why)
                exc.leader_id = self.ms.leader_id  # type: ignore[attr-defined]
                p.future.set_exception(exc)
        for w in self._catch_up_waiters:
            if not w.future.done():
                w.future.set_result(None)
        self._catch_up_waiters = []

    # -- leader appends -------------------------------------------------------------------
    def _reset_cache(self) -> None:
        self._cache.clear()
        self.last_raw = None
        self._cache_base = self.store.ledger_end_index + 1
        self._cache_bytes = 0

    def on_leader_append(self, entries: list[DLedgerEntry]) -> None:
        """The server appended `entries` as leader: cache them, move our own watermark (ASYNC_FLUSH)
        and wake the dispatchers."""
        cache = self._cache
        if entries[0].index != self._cache_base + len(cache):
            self._reset_cache()
            self._cache_base = entries[0].index
        for e in entries:
            cache.append(e)
            self._cache_bytes += e.size
        while len(cache) > _CACHE_MAX_ENTRIES or self._cache_bytes > _CACHE_MAX_BYTES:
            self._cache_bytes -= cache.popleft().size
            self._cache_base += 1
        last = entries[-1]
        self.leader_end_pos = last.pos + last.size
        if self.first_index_of_term > entries[0].index:
            self.first_index_of_term = entries[0].index
        if self.config.sync_flush:
            self._own_flush_wake.set()
        else:
            self.update_peer_water_mark(self.term, self.ms.self_id, last.index)
        for d in self.dispatchers.values():
            d.wake.set()

    def _trim_cache(self) -> None:
        """Drop cached entries at or below the lowest follower watermark: no dispatcher pushes them
        again (a resend starts after the follower's watermark; COMPARE reads the store)."""
        self_id = self.ms.self_id
        low = min((w for p, w in self.peer_water_marks.items() if p != self_id), default=-1)
        cache = self._cache
        drop = min(low - self._cache_base + 1, len(cache))
        if drop <= 0:
            return
        for _ in range(drop):
            self._cache_bytes -= cache.popleft().size
        self._cache_base += drop

    @property
    def cache_usage(self) -> tuple[int, int]:
        """(entries, bytes) held in the leader entry cache (observability; bounded, see _trim_cache)."""
        return len(self._cache), self._cache_bytes

    def get_entry(self, index: int) -> DLedgerEntry:
        """An entry of the leader's log, from the cache when recent."""
        off = index - self._cache_base
        if 0 <= off < len(self._cache):
            return self._cache[off]
        return self.store.get(index)

    def term_at(self, index: int) -> int:
        """Term of entry `index` (also the one a snapshot ends with right before our log's begin)."""
        off = index - self._cache_base
        if 0 <= off < len(self._cache):
            return self._cache[off].term
        return self.store.term_at(index)

    async def _own_flush_loop(self) -> None:
        """SYNC_FLUSH: the leader's own watermark only counts what it has fsynced (batched: one
        wait covers everything appended so far)."""
        while True:
            await self._own_flush_wake.wait()
            self._own_flush_wake.clear()
            term, end = self.term, self.store.ledger_end_index
            if term < 0 or end < 0:
                continue
            try:
                await self.store.wait_flushed(end)
            except DLedgerException:
                log.exception("leader flush failed group=%s selfId=%s", self.ms.group, self.ms.self_id)
                await asyncio.sleep(0.1)
                self._own_flush_wake.set()
                continue
            self.update_peer_water_mark(term, self.ms.self_id, end)

    def wait_ack(self, index: int, term: int) -> asyncio.Future[int]:
        """A future resolved with `index` once it is committed (or failed with a DLedgerException)."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if term != self.term:
            fut.set_exception(
                DLedgerException(DLedgerResponseCode.TERM_CHANGED, f"term {term} != {self.term}")
            )
            return fut
        if index <= self.store.committed_index:
            fut.set_result(index)
            return fut
        self.pending.append(_Pending(index, fut, self.clock() + self.config.max_wait_ack_time_ms / 1000))
        return fut

    @property
    def pending_entries(self) -> int:
        """Entries appended as leader and not committed yet (what `maxPendingRequestsNum` bounds)."""
        store = self.store
        return max(store.ledger_end_index - max(store.committed_index, store.ledger_begin_index - 1), 0)

    def on_peer_alive(self, peer: str) -> None:
        """`peer` answered a heartbeat: a dispatcher backing off from it probes now."""
        d = self.dispatchers.get(peer)
        if d is not None:
            d.on_peer_alive()

    # -- events from the dispatchers -------------------------------------------------------
    def notify_higher_term(self, term: int, source: str) -> None:
        """A follower answered with a higher term: we are no longer its leader."""
        for listener in self.higher_term_listeners:
            listener(term, source)

    def notify_peer_ack(self, peer: str) -> None:
        """A follower answered a push successfully: it is alive and follows us."""
        for listener in self.peer_ack_listeners:
            listener(peer)

    # -- QuorumAckChecker -----------------------------------------------------------------
    def peer_water_mark(self, peer: str) -> int:
        return self.peer_water_marks.get(peer, -1)

    def update_peer_water_mark(self, term: int, peer: str, index: int) -> None:
        """A member (or we) now holds everything up to `index` in leader term `term`."""
        if term != self.term or index <= self.peer_water_marks.get(peer, -1):
            return
        self.peer_water_marks[peer] = index
        if peer != self.ms.self_id:
            self._trim_cache()
        if self._catch_up_waiters:
            keep = []
            for w in self._catch_up_waiters:
                if w.peer == peer and index >= w.index:
                    if not w.future.done():
                        w.future.set_result(None)
                else:
                    keep.append(w)
            self._catch_up_waiters = keep
        self._check_quorum()

    def _check_quorum(self) -> None:
        marks = sorted(self.peer_water_marks.values(), reverse=True)
        quorum_index = marks[self.ms.quorum - 1]
        store = self.store
        if quorum_index > store.committed_index and quorum_index >= self.first_index_of_term:
            store.update_committed_index(self.term, quorum_index)
            # The appenders first, then the listeners (the state machine callers): both wake-ups
            # run in the loop's next pass, in this order, so an appender's answer leaves before
            # the apply of what it appended, and that apply still runs before the loop reads
            # anything sent after the answer.
            self._answer_committed()
            for listener in self.commit_listeners:
                listener()
            for d in self.dispatchers.values():
                d.wake.set()
        else:
            self._answer_committed()

    def _answer_committed(self) -> None:
        committed = self.store.committed_index
        pending = self.pending
        while pending and pending[0].index <= committed:
            p = pending.popleft()
            if not p.future.done():
                p.future.set_result(p.index)

    async def _sweep_timeouts(self) -> None:
        """Answer appends that waited longer than max_wait_ack_time_ms with WAIT_QUORUM_ACK_TIMEOUT."""
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL_S)
            now = self.clock()
            pending = self.pending
            while pending and pending[0].deadline <= now:
                p = pending.popleft()
                if not p.future.done():
                    p.future.set_exception(
                        DLedgerException(
                            DLedgerResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
                            f"index {p.index} not acked by a quorum in {self.config.max_wait_ack_time_ms} ms",
                        )
                    )

    async def wait_peer_caught_up(self, peer: str, index: int, timeout_s: float) -> None:
        """Return when `peer`'s watermark reaches `index` or after `timeout_s`."""
        if self.peer_water_mark(peer) >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._catch_up_waiters.append(_CatchUpWaiter(peer, index, fut))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fut, timeout_s)
