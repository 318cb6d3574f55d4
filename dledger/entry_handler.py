"""`EntryHandler`: the follower side of replication.

Pushes are first checked against the member state (term, leader) by the elector, which also
counts any push as a sign of life from the leader. Then:

- APPEND batches are applied strictly in index order. A batch that arrives before the one it
  follows (reordered on the network) waits in a map keyed by its first index; a second batch for
  the same index replaces the first, which is answered REPEATED_PUSH. A batch still waiting after
  `max_push_time_out_ms` is answered INCONSISTENT_STATE so the leader goes back to COMPARE.
  A batch must follow an entry with the leader's (prev index, prev term) (Raft §5.3); entries the
  follower already holds with the same term are skipped (duplicates), a conflicting one is cut
  together with everything after it — never at or below the commit index.
- COMPARE answers whether we hold the leader's entry (same index, term and pos).
- TRUNCATE makes the leader's entry our last one. A TRUNCATE that would cut an entry of the
  leader's current term is a stale duplicate (that leader appended it after truncating) and is
  answered SUCCESS without cutting.
- COMMIT, and the commit index piggy-backed on every push, move our commit index (never past
  the entries this push verified).

With SYNC_FLUSH the answer to an APPEND waits for `store.wait_flushed`, so a leader counts this
follower only for entries that are on its disk; concurrent pushes share one fsync.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.member_state import MemberState
from dledger.rpc.protocol import (
    InstallSnapshotRequest,
    InstallSnapshotResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
)
from dledger.snapshot import SnapshotMeta, SnapshotReader, SnapshotStore, SnapshotWriter
from dledger.store.base import DLedgerStore

log = logging.getLogger("dledger.entry_handler")

# A leader whose log lacks an entry we hold committed retries its pushes without end: one line
# per this many seconds says so (with the count), not one per push.
_CONFLICT_LOG_INTERVAL_S = 10.0

AcceptLeader = Callable[[int, str], DLedgerResponseCode]
"""accept(term, leader_id): may this leader push to us in this term (the elector decides)."""


class _Parked(NamedTuple):
    """An APPEND that arrived before the batch it follows."""

    request: PushEntryRequest
    future: asyncio.Future[PushEntryResponse]
    timer: asyncio.TimerHandle


class EntryHandler:
    """Applies the leader's pushes to the local store."""

    def __init__(
        self,
        config: DLedgerConfig,
        member_state: MemberState,
        store: DLedgerStore,
        accept_leader: AcceptLeader,
        commit_listener: Callable[[], None],
        snapshots: SnapshotStore | None = None,
        load_snapshot: Callable[[SnapshotReader], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.ms = member_state
        self.store = store
        self.accept_leader = accept_leader
        self.commit_listener = commit_listener
        self.snapshots = snapshots  # where an InstallSnapshot is stored (None: snapshots are off)
        self.load_snapshot = load_snapshot  # hands a stored install to the state machine
        self._install: SnapshotWriter | None = None  # the snapshot being received
        self.waiting: dict[int, _Parked] = {}
        self.gap_since: dict[int, float] = {}  # first index of a parked push -> first arrival
        self.wait_timeout_s = config.max_push_time_out_ms / 1000
        self.max_waiting = max(2 * config.max_pending_push_batches, 8)
        # Our log was cut under the leader (a corrupt entry found while running): pushes beyond
        # our end are answered INCONSISTENT_STATE at once, not parked, until the leader COMPAREs.
        self.resync_needed = False
        self._conflicts = 0  # committed-entry conflicts since the last line about them
        self._conflict_logged_at = float("-inf")

    def _resp(self, req: PushEntryRequest, code: DLedgerResponseCode, index: int = -1) -> PushEntryResponse:
        store = self.store
        return PushEntryResponse(
            group=self.ms.group,
            remote_id=req.local_id,
            local_id=self.ms.self_id,
            leader_id=self.ms.leader_id or "",
            term=self.ms.curr_term,
            code=int(code),
            index=index,
            begin_index=store.ledger_begin_index,
            end_index=store.ledger_end_index,
        )

    async def handle_push(self, req: PushEntryRequest) -> PushEntryResponse:
        code = self.accept_leader(req.term, req.leader_id)
        if code != DLedgerResponseCode.SUCCESS:
            return self._resp(req, code)
        ptype = req.type
        try:
            if ptype == PushType.APPEND:
                if not req.entries:
                    return self._resp(req, DLedgerResponseCode.UNEXPECTED_ARGUMENT)
                return await self._handle_append(req)
            if ptype == PushType.COMMIT:
                self._update_commit(req.term, req.commit_index)
                return self._resp(req, DLedgerResponseCode.SUCCESS, self.store.ledger_end_index)
            if len(req.entries) != 1:
                return self._resp(req, DLedgerResponseCode.UNEXPECTED_ARGUMENT)
            if ptype in (PushType.COMPARE, PushType.TRUNCATE):
                resp = self._handle_compare(req) if ptype == PushType.COMPARE else self._handle_truncate(req)
                if resp.code == DLedgerResponseCode.SUCCESS and self.config.sync_flush:
                    # The leader counts the matched index as our watermark: it must be on disk.
                    await self.store.wait_flushed(resp.index)
                return resp
        except DLedgerException as exc:
            log.warning(
                "push type=%s from %s term=%d failed group=%s selfId=%s: %s",
                ptype,
                req.leader_id,
                req.term,
                self.ms.group,
                self.ms.self_id,
                exc,
            )
            return self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE)
        return self._resp(req, DLedgerResponseCode.UNSUPPORTED)

    def _update_commit(self, term: int, commit_index: int) -> None:
        before = self.store.committed_index
        self.store.update_committed_index(term, commit_index)
        if self.store.committed_index != before:
            # Next loop turn: the answer to this push goes out at the end of this one, and the
            # state machine's apply (a whole batch to dispatch) must not delay the leader's quorum.
            asyncio.get_running_loop().call_soon(self.commit_listener)

    def _committed_conflict(self, req: PushEntryRequest, index: int) -> PushEntryResponse:
        """The leader's entry at `index` differs from ours, which we hold committed: refused. Raft
        cannot get here unless a majority lost entries it had acknowledged (fsynced data damaged,
        or power loss under ASYNC_FLUSH) and elected a leader without them; this member then can
        never follow. Said at most once per _CONFLICT_LOG_INTERVAL_S, with what to do."""
        self._conflicts += 1
        now = time.monotonic()
        if now - self._conflict_logged_at >= _CONFLICT_LOG_INTERVAL_S:
            log.error(
                "event=committed_entry_conflict group=%s selfId=%s leader=%s term=%d index=%d committed=%d "
                "pushes=%d: the leader's log differs at an index this member holds committed — a "
                "majority lost entries it had acknowledged (damaged disks, or power loss under "
                "ASYNC_FLUSH). This member cannot follow that leader: stop it, move its store "
                "directory aside and start it empty to take the leader's log",
                self.ms.group, self.ms.self_id, req.leader_id, req.term, index, self.store.committed_index,
                self._conflicts,
            )  # fmt: skip
            self._conflict_logged_at = now
            self._conflicts = 0
        return self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE)

    # -- COMPARE / TRUNCATE ---------------------------------------------------------------
    def _holds(self, index: int, term: int, pos: int) -> bool:
        store = self.store
        if index == store.ledger_end_index == store.ledger_begin_index - 1 >= 0:
            return store.ledger_end_term == term  # the entry our installed snapshot ends with
        if index < store.ledger_begin_index or index > store.ledger_end_index or index < 0:
            return False
        local = store.get(index)
        return local.term == term and local.pos == pos

    def _handle_compare(self, req: PushEntryRequest) -> PushEntryResponse:
        self.gap_since.clear()  # the leader resyncs: earlier gaps are moot
        self.resync_needed = False
        e = req.entries[0]
        if self._holds(e.index, e.term, e.pos):
            return self._resp(req, DLedgerResponseCode.SUCCESS, e.index)
        return self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE)

    def _clear_waiting(self) -> None:
        """Answer every parked push INCONSISTENT_STATE (they will never be applied)."""
        for parked in list(self.waiting.values()):
            parked.timer.cancel()
            if not parked.future.done():
                parked.future.set_result(self._resp(parked.request, DLedgerResponseCode.INCONSISTENT_STATE))
        self.waiting.clear()
        self.gap_since.clear()

    def _handle_truncate(self, req: PushEntryRequest) -> PushEntryResponse:
        e = req.entries[0]
        store = self.store
        self._clear_waiting()
        if not self._holds(e.index, e.term, e.pos):
            if e.index <= store.committed_index:
                return self._committed_conflict(req, e.index)
            end = store.truncate(e, req.term, req.leader_id)
        elif store.ledger_end_term == req.term:
            # Our tail was appended by this very leader after an earlier TRUNCATE: this one is a
            # delayed duplicate, and the tail matches the leader's log.
            return self._resp(req, DLedgerResponseCode.SUCCESS, e.index)
        else:
            # Cut the stale tail after the leader's entry, but never a committed entry.
            keep = max(e.index, store.committed_index)
            if keep >= store.ledger_end_index:
                return self._resp(req, DLedgerResponseCode.SUCCESS, e.index)  # nothing to cut, nothing to log
            end = store.truncate(store.get(keep), req.term, req.leader_id)
        log.info(
            "truncated group=%s selfId=%s term=%d leader=%s at %d: end %d",
            self.ms.group,
            self.ms.self_id,
            req.term,
            req.leader_id,
            e.index,
            end,
        )
        return self._resp(req, DLedgerResponseCode.SUCCESS, e.index)

    # -- APPEND ---------------------------------------------------------------------------
    async def _handle_append(self, req: PushEntryRequest) -> PushEntryResponse:
        first = req.entries[0].index
        if first > self.store.ledger_end_index + 1 and self.resync_needed:
            return self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE)
        if first > self.store.ledger_end_index + 1:
            resp = await self._park(req, first)
        else:
            resp = self._apply(req)
            self._drain_waiting()
        if resp.code == DLedgerResponseCode.SUCCESS and self.config.sync_flush:
            await self.store.wait_flushed(resp.index)
        return resp

    async def _park(self, req: PushEntryRequest, first: int) -> PushEntryResponse:
        loop = asyncio.get_running_loop()
        now = loop.time()
        # The deadline counts from the first push for this index, also across an expiry: a leader
        # resending on its own timeout (its answer raced ours) is told INCONSISTENT_STATE at once.
        since = self.gap_since.get(first, now)
        old = self.waiting.pop(first, None)
        if old is not None:
            old.timer.cancel()
            if not old.future.done():
                old.future.set_result(self._resp(old.request, DLedgerResponseCode.REPEATED_PUSH))
        elif len(self.waiting) >= self.max_waiting:
            return self._resp(req, DLedgerResponseCode.PUSH_REQUEST_IS_FULL)
        self.gap_since[first] = since
        fut: asyncio.Future[PushEntryResponse] = loop.create_future()
        handle = loop.call_later(max(since + self.wait_timeout_s - now, 0.001), self._expire, first, fut)
        self.waiting[first] = _Parked(req, fut, handle)
        return await fut

    def _expire(self, first: int, fut: asyncio.Future[PushEntryResponse]) -> None:
        item = self.waiting.get(first)
        if item is not None and item.future is fut:
            del self.waiting[first]  # gap_since[first] stays until the gap fills or a resync
            if not fut.done():
                log.info(
                    "push at %d waited for %d too long group=%s selfId=%s",
                    first,
                    self.store.ledger_end_index + 1,
                    self.ms.group,
                    self.ms.self_id,
                )
                fut.set_result(self._resp(item.request, DLedgerResponseCode.INCONSISTENT_STATE))

    def _drain_waiting(self) -> None:
        while self.waiting:
            first = min(self.waiting)
            if first > self.store.ledger_end_index + 1:
                return
            req, fut, handle = self.waiting.pop(first)
            self.gap_since.pop(first, None)
            handle.cancel()
            if fut.done():
                continue
            if req.term != self.ms.curr_term:
                fut.set_result(self._resp(req, DLedgerResponseCode.EXPIRED_TERM))
                continue
            try:
                fut.set_result(self._apply(req))
            except DLedgerException as exc:
                log.warning("parked push failed group=%s selfId=%s: %s", self.ms.group, self.ms.self_id, exc)
                fut.set_result(self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE))

    def _apply(self, req: PushEntryRequest) -> PushEntryResponse:
        """Append a batch whose first index is at most end + 1 (sync: ordering is preserved)."""
        store = self.store
        prev = req.prev_index
        if prev >= 0:
            if prev > store.ledger_end_index or prev < store.ledger_begin_index - 1:
                return self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE)
            if prev == store.ledger_begin_index - 1 and prev != store.ledger_end_index \
                    and store.ledger_before_begin_term < 0:
                return self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE)  # its term is unknown here
            if store.term_at(prev) != req.prev_term:
                return self._resp(req, DLedgerResponseCode.INCONSISTENT_STATE)
        leader_term, leader_id = req.term, req.leader_id
        entries = req.entries
        if entries[0].index == store.ledger_end_index + 1:
            # The common case: the whole push follows our end — validated and written as one run.
            store.batch_append_as_follower(entries, leader_term, leader_id, req.raw or None)
            entries = []
        for i, e in enumerate(entries):
            end = store.ledger_end_index
            if e.index == end + 1:
                store.batch_append_as_follower(entries[i:], leader_term, leader_id)
                break
            local = store.get(e.index)
            if local.term == e.term:
                continue  # a duplicate of what we hold (same index and term: same entry, Raft §5.3)
            if e.index <= store.committed_index:
                return self._committed_conflict(req, e.index)
            store.truncate(e, leader_term, leader_id)
        last = req.entries[-1].index
        self._update_commit(leader_term, min(req.commit_index, last))
        return self._resp(req, DLedgerResponseCode.SUCCESS, last)

    # -- INSTALL_SNAPSHOT -----------------------------------------------------------------
    def _snapshot_resp(self, req: InstallSnapshotRequest,
                       code: DLedgerResponseCode) -> InstallSnapshotResponse:
        ms = self.ms
        return InstallSnapshotResponse(group=ms.group, remote_id=req.local_id, local_id=ms.self_id,
                                       leader_id=ms.leader_id or "", term=ms.curr_term, code=int(code),
                                       end_index=self.store.ledger_end_index)

    async def handle_install_snapshot(self, req: InstallSnapshotRequest) -> InstallSnapshotResponse:
        """One chunk of the leader's snapshot: files in order, then the meta, which stores the
        snapshot, replaces our log by it and loads it into the state machine."""
        code = self.accept_leader(req.term, req.leader_id)
        if code != DLedgerResponseCode.SUCCESS:
            return self._snapshot_resp(req, code)
        if self.snapshots is None or self.load_snapshot is None:
            return self._snapshot_resp(req, DLedgerResponseCode.UNSUPPORTED)
        store = self.store
        if req.last_included_index <= store.committed_index:
            # Never roll committed state back (a resend after the install already went in).
            log.info("event=install_snapshot_ignored group=%s selfId=%s index=%d committed=%d",
                     self.ms.group, self.ms.self_id, req.last_included_index, store.committed_index)
            return self._snapshot_resp(req, DLedgerResponseCode.SUCCESS)
        w = self._install
        try:
            if w is None or (w.index, w.term) != (req.last_included_index, req.last_included_term):
                if req.offset or req.done:
                    raise DLedgerException(DLedgerResponseCode.INSTALL_SNAPSHOT_ERROR,
                                           f"chunk {req.name!r}@{req.offset} of snapshot "
                                           f"{req.last_included_index} without its start")
                w = self._install = SnapshotWriter(req.last_included_index, req.last_included_term, -1)
            if not req.done:
                w.append(req.name, req.offset, req.data)
                return self._snapshot_resp(req, DLedgerResponseCode.SUCCESS)
            self._install = None
            meta = SnapshotMeta.from_json(req.data)
            w.end_pos = meta.end_pos
            reader = await self.snapshots.save_async(w, meta)
        except DLedgerException as exc:
            self._install = None
            log.warning("event=install_snapshot_failed group=%s selfId=%s index=%d: %s", self.ms.group,
                        self.ms.self_id, req.last_included_index, exc)
            return self._snapshot_resp(req, DLedgerResponseCode.INSTALL_SNAPSHOT_ERROR)
        self._clear_waiting()
        store.reset_to_snapshot(reader.index, reader.term, reader.end_pos)
        await self.load_snapshot(reader)
        self.commit_listener()
        log.info("event=install_snapshot_loaded group=%s selfId=%s leader=%s index=%d term=%d",
                 self.ms.group, self.ms.self_id, req.leader_id, reader.index, reader.term)
        return self._snapshot_resp(req, DLedgerResponseCode.SUCCESS)

    def on_log_cut(self) -> None:
        """The store cut our log below what the leader believes we hold: answer parked pushes
        and, until the leader's next COMPARE, refuse pushes beyond our end instead of parking them."""
        self.on_role_change()
        self.resync_needed = True

    def on_role_change(self) -> None:
        """Leader or term changed: parked pushes of the old leader will never be applied."""
        self._clear_waiting()
