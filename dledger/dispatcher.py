"""`EntryDispatcher`: the leader's replication loop for one follower.

States (DLedger's): COMPARE → (TRUNCATE) → APPEND. After every leader change, COMPARE walks back
from the leader's end index to the last entry the follower holds identically, TRUNCATE makes that
entry the follower's last (cutting a stale tail), and APPEND streams batches of consecutive entries
(up to `max_batch_push_count` / `max_batch_push_size` bytes) with up to `max_pending_push_batches`
batches in flight. Each batch names the entry before it (prev index/term, Raft §5.3), so a
follower never appends after a mismatch. INCONSISTENT_STATE goes back to COMPARE. With nothing
to send the dispatcher pushes COMMIT (the commit index) when it moved, and at least once a second.
A follower further behind than `peer_push_throttle_point` bytes gets at most `peer_push_quota`
bytes per second.

A batch without an answer for `max_push_time_out_ms`, or a network error, sends the dispatcher
back to COMPARE in *probe* mode (etcd raft's Progress "probe" state): instead of resending the
whole window, it asks the follower where it stands with one single-entry COMPARE, and after each
unanswered one waits twice as long (`_PROBE_BACKOFF_MIN_S` doubling to `_PROBE_BACKOFF_MAX_S`)
before the next. The first answer ends it (COMPARE finds the follower's end in a round trip or
two, then the pipeline refills); an answered heartbeat (`on_peer_alive`) cuts the wait short, so a
follower coming back — a partition healed, or a restarted process with a shorter log — is asked
within a heartbeat interval whatever the backoff. A follower cut off for 10 s therefore costs the
bytes in flight when it went away plus a few single-entry probes (it cost the whole window every
push timeout: 138 MB in one 10 s partition).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import DLedgerEntry
from dledger.member_state import MemberState
from dledger.rpc.protocol import (
    InstallSnapshotRequest,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    RpcService,
)
from dledger.snapshot import SNAPSHOT_META_FILE, SnapshotReader, SnapshotStore
from dledger.store.base import DLedgerStore
from dledger.taskset import TaskSet

log = logging.getLogger("dledger.dispatcher")

_COMMIT_INTERVAL_S = 1.0
_COMMIT_DELAY_S = 0.002
_SMALL_BATCHES_IN_FLIGHT = 2
_NETWORK_BACKOFF_S = 0.1
_PROBE_BACKOFF_MIN_S = 0.1
_PROBE_BACKOFF_MAX_S = 4.0
_INSTALL_DONE_TIMEOUT_S = 10.0
# A push refused again at the index COMPARE just agreed on never gets through by retrying at
# once (the follower holds a different entry committed there): from the second refusal each new
# COMPARE waits, doubling up to the max, and the log says it once per _REFUSAL_LOG_INTERVAL_S.
_REFUSAL_BACKOFF_MIN_S = 0.1
_REFUSAL_BACKOFF_MAX_S = 4.0
_REFUSAL_LOG_INTERVAL_S = 10.0


class DispatchState(StrEnum):
    COMPARE = "COMPARE"
    APPEND = "APPEND"


class BatchKey(NamedTuple):
    """Which stored bytes a batch push carries."""

    first_index: int
    last_index: int
    pos: int
    size: int
    term: int


class RawBatch(NamedTuple):
    """The stored bytes of the last batch pushed, shared by the dispatchers of followers that keep
    pace (they are sent the same batches)."""

    key: BatchKey
    data: bytes


class ReplicationLog(Protocol):
    """What a dispatcher needs of the leader's replication state (`DLedgerEntryPusher`)."""

    config: DLedgerConfig
    ms: MemberState
    store: DLedgerStore
    rpc: RpcService
    clock: Callable[[], float]
    term: int  # the leader term the watermarks belong to (-1: not leading)
    leader_end_pos: int  # data position after the leader's last entry
    last_raw: RawBatch | None
    snapshots: SnapshotStore | None  # what a follower behind our log's begin gets

    def get_entry(self, index: int) -> DLedgerEntry: ...
    def term_at(self, index: int) -> int: ...
    def update_peer_water_mark(self, term: int, peer: str, index: int) -> None: ...
    def notify_higher_term(self, term: int, source: str) -> None: ...
    def notify_peer_ack(self, peer: str) -> None: ...


class EntryDispatcher:
    """Pushes the leader's log to one follower (runs as one task; responses arrive as tasks)."""

    def __init__(self, pusher: ReplicationLog, peer_id: str) -> None:
        self.pusher = pusher
        self.ms = pusher.ms
        self.config = pusher.config
        self.peer_id = peer_id
        self.term = -1
        self.state = DispatchState.COMPARE
        self.write_index = 0
        self.match_index = -1
        self.prev_index = -1
        self.prev_term = -1
        self.inflight: dict[int, float] = {}  # first index of batch -> send time
        self.generation = 0
        self.last_commit_sent = -1
        self.last_push_time = 0.0
        # Probe mode (see the module docstring): failures since the last answer, when the next
        # probe may go, and when probing began (for the log line that ends it).
        self.probe_failures = 0
        self.probing_since = 0.0
        self._installed: tuple[int, int] | None = None  # (index, term) of the snapshot last installed
        # Refusals (INCONSISTENT_STATE) of APPENDs starting at the same index, in a row.
        self.refused_at = -1
        self.refusals = 0
        self._refusal_logged_at = float("-inf")
        self.quota_window = 0.0
        self.quota_bytes = 0
        self.wake = asyncio.Event()
        self.alive = asyncio.Event()  # set by an answered heartbeat: cuts a probe backoff short
        self.timeout_s = self.config.max_push_time_out_ms / 1000
        self._tasks = TaskSet()
        # Raw reads only where they are cheap (the mmap store; the memory store re-encodes).
        store = pusher.store
        self.raw_reader = store.get_data if store.zero_copy_reads else None

    def _request(self, ptype: PushType, entries: list[DLedgerEntry]) -> PushEntryRequest:
        ms = self.ms
        return PushEntryRequest(
            group=ms.group,
            remote_id=self.peer_id,
            local_id=ms.self_id,
            leader_id=ms.self_id,
            term=self.term,
            type=int(ptype),
            commit_index=self.pusher.store.committed_index,
            prev_index=self.prev_index,
            prev_term=self.prev_term,
            entries=entries,
        )

    async def _wait(self, timeout_s: float | None) -> None:
        if timeout_s is None or timeout_s > 0:
            handle = None
            if timeout_s is not None:
                # Never below 1 ms: a sub-resolution timer can fire early and spin this loop.
                handle = asyncio.get_running_loop().call_later(max(timeout_s, 0.001), self.wake.set)
            await self.wake.wait()
            if handle is not None:
                handle.cancel()
        self.wake.clear()

    async def run(self) -> None:
        while True:
            try:
                if not self.ms.is_leader() or not self.config.enable_push_to_follower:
                    await self._wait(None)
                    continue
                if self.term != self.ms.curr_term or self.pusher.term != self.ms.curr_term:
                    self._reset(self.ms.curr_term)
                if self.state == DispatchState.COMPARE:
                    if self.refusals > 1:
                        await asyncio.sleep(self._refusal_backoff_s())
                        if not self.ms.is_leader() or self.term != self.ms.curr_term:
                            continue  # no COMPARE in a term this member no longer leads
                    await self._compare_and_truncate()
                    continue
                now = self.pusher.clock()
                self._check_timeout(now)
                if self.state != DispatchState.APPEND:
                    continue  # the oldest push went unanswered: probe with COMPARE, not the window
                wait_s = self._fill_pipeline(now)
                await self._wait(wait_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "dispatcher error group=%s selfId=%s peer=%s",
                    self.ms.group,
                    self.ms.self_id,
                    self.peer_id,
                )
                self.state = DispatchState.COMPARE
                await asyncio.sleep(_NETWORK_BACKOFF_S)

    def _reset(self, term: int) -> None:
        self.term = term
        self.state = DispatchState.COMPARE
        self.generation += 1
        self.inflight.clear()
        self.match_index = -1
        self.last_commit_sent = -1
        self.probe_failures = 0
        self.refused_at, self.refusals = -1, 0

    def _refusal_backoff_s(self) -> float:
        return min(_REFUSAL_BACKOFF_MIN_S * (1 << min(self.refusals - 2, 16)), _REFUSAL_BACKOFF_MAX_S)

    # -- probe mode -----------------------------------------------------------------------
    def _probe_backoff_s(self) -> float:
        return min(_PROBE_BACKOFF_MIN_S * (1 << min(self.probe_failures - 1, 16)), _PROBE_BACKOFF_MAX_S)

    def _push_failed(self, now: float, why: str) -> None:
        """A push got no answer: drop the window and ask where the follower stands (COMPARE, in
        probe mode: backing off while it does not answer)."""
        if not self.probe_failures:
            self.probing_since = now
            log.info("event=push_probe_start group=%s selfId=%s peer=%s term=%d from=%d reason=%s",
                     self.ms.group, self.ms.self_id, self.peer_id, self.term, self.match_index + 1, why)
        self.probe_failures += 1
        self.state = DispatchState.COMPARE
        self.generation += 1
        self.inflight.clear()
        self.wake.set()

    def _answered(self) -> None:
        """The follower answered: leave probe mode."""
        if self.probe_failures:
            log.info("event=push_probe_end group=%s selfId=%s peer=%s term=%d probes=%d seconds=%.3f",
                     self.ms.group, self.ms.self_id, self.peer_id, self.term, self.probe_failures,
                     self.pusher.clock() - self.probing_since)
            self.probe_failures = 0
            self.wake.set()

    def on_peer_alive(self) -> None:
        """The follower answered a heartbeat: probe now rather than after the backoff."""
        if self.probe_failures:
            self.alive.set()

    # -- COMPARE / TRUNCATE / INSTALL_SNAPSHOT ----------------------------------------------
    async def _ask(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        """One request to the follower: its answer, or None after no answer (then waiting the
        probe backoff, cut short by an answered heartbeat) or an answer from a higher term."""
        try:
            resp = await send()
        except DLedgerException as exc:
            if not self.probe_failures:
                self.probing_since = self.pusher.clock()
                log.info("event=push_probe_start group=%s selfId=%s peer=%s term=%d state=%s reason=%s",
                         self.ms.group, self.ms.self_id, self.peer_id, self.term, what, exc.code.name)
            self.probe_failures += 1
            self.alive.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.alive.wait(), self._probe_backoff_s())
            return None
        if resp.term > self.term:
            self.pusher.notify_higher_term(resp.term, f"{what} answer of {self.peer_id}")
            return None
        self._answered()
        return resp

    async def _push_one(self, ptype: PushType, entry: DLedgerEntry) -> PushEntryResponse | None:
        req = self._request(ptype, [entry])
        return await self._ask(ptype.name, lambda: self.pusher.rpc.push(self.peer_id, req, self.timeout_s))

    async def _compare_and_truncate(self) -> None:
        """Find the last index where the follower agrees with us, then make it the follower's end;
        a follower that needs entries our log no longer has gets our snapshot first."""
        term = self.term
        found = await self._compare(term)
        if found is None:
            return
        match, truncate_needed, behind = found
        if behind:
            snap = await self._snapshot_to_install()
            if snap is not None:
                if await self._install_snapshot(snap, term):
                    self._installed = (snap.index, snap.term)
                    self._enter_append(term, snap.index)
                return
        if truncate_needed:
            truncated = await self._truncate(match, term)
            if truncated is None:
                return
            match = truncated
        self._enter_append(term, match)

    async def _compare(self, term: int) -> tuple[int, bool, bool] | None:
        """(match, truncate needed, follower ends before our begin) once known; None when the
        term changed or a request went unanswered (the loop comes back)."""
        store = self.pusher.store
        compare_index = store.ledger_end_index
        while True:
            if not self.ms.is_leader() or self.ms.curr_term != term:
                return None
            if compare_index < store.ledger_begin_index or compare_index < 0:
                # Nothing in common (or the follower's log is empty): start at our begin index.
                return store.ledger_begin_index - 1, True, False
            resp = await self._push_one(PushType.COMPARE, self.pusher.get_entry(compare_index))
            if resp is None or self.term != term:
                return None
            if resp.code == DLedgerResponseCode.SUCCESS:
                return compare_index, resp.end_index != compare_index, False
            if resp.code != DLedgerResponseCode.INCONSISTENT_STATE:
                log.warning(
                    "compare at %d answered %s by %s",
                    compare_index,
                    DLedgerResponseCode.value_of(resp.code).name,
                    self.peer_id,
                )
                await asyncio.sleep(_NETWORK_BACKOFF_S)
                continue
            behind = resp.end_index < store.ledger_begin_index - 1  # it lacks entries we no longer have
            if resp.end_index < 0:
                # An empty follower: stream from our first entry; past retention (our log no longer
                # starts at 0) it is first made to start where we do, with TRUNCATE.
                return max(store.ledger_begin_index, 0) - 1, store.ledger_begin_index > 0, behind
            if behind:
                return store.ledger_begin_index - 1, True, True
            if resp.end_index < store.ledger_begin_index or resp.begin_index > store.ledger_end_index:
                compare_index = -1
            elif compare_index > resp.end_index:
                compare_index = resp.end_index
            else:
                compare_index -= 1

    async def _truncate(self, match: int, term: int) -> int | None:
        """Make our entry after `match` (or our first) the follower's last; the new match."""
        store = self.pusher.store
        truncate_index = max(match, store.ledger_begin_index, 0)
        if truncate_index > store.ledger_end_index:
            # Our log is empty: a leader whose no-op has not gone in yet (disk full). Wait for
            # an append (it wakes us) instead of spinning through COMPARE.
            await self._wait(_NETWORK_BACKOFF_S)
            return None
        resp = await self._push_one(PushType.TRUNCATE, self.pusher.get_entry(truncate_index))
        if resp is None or resp.code != DLedgerResponseCode.SUCCESS or self.term != term:
            return None
        log.info(
            "truncated follower group=%s selfId=%s peer=%s term=%d at %d",
            self.ms.group,
            self.ms.self_id,
            self.peer_id,
            term,
            truncate_index,
        )
        return truncate_index

    def _enter_append(self, term: int, match: int) -> None:
        self.match_index = match
        self.pusher.update_peer_water_mark(term, self.peer_id, match)
        self._restart_from(match)
        self.state = DispatchState.APPEND
        log.info(
            "dispatcher APPEND group=%s selfId=%s peer=%s term=%d from %d",
            self.ms.group,
            self.ms.self_id,
            self.peer_id,
            term,
            match + 1,
        )

    async def _snapshot_to_install(self) -> SnapshotReader | None:
        """Our newest snapshot, when it covers everything before our log's begin (retention never
        deletes past it); None: no snapshots here, and the follower starts at our begin index."""
        snapshots = self.pusher.snapshots
        if snapshots is None:
            return None
        snap = await snapshots.latest_async()
        begin = self.pusher.store.ledger_begin_index
        if snap is None or snap.index < begin - 1:
            log.warning("event=install_snapshot_unavailable group=%s selfId=%s peer=%s begin=%d snapshot=%d: "
                        "the follower starts at our begin index without the state before it",
                        self.ms.group, self.ms.self_id, self.peer_id, begin, snap.index if snap else -1)
            return None
        return snap

    async def _install_snapshot(self, snap: SnapshotReader, term: int) -> bool:
        """Send `snap` chunk by chunk (files in name order, the meta last); True once the follower
        has stored and loaded it. Any failure starts over (from COMPARE)."""
        chunk = max(self.config.max_batch_push_size, 1)
        sent = 0
        log.info("event=install_snapshot_start group=%s selfId=%s peer=%s term=%d index=%d",
                 self.ms.group, self.ms.self_id, self.peer_id, term, snap.index)
        for name in snap.files():
            data = snap.read_file(name)
            for off in range(0, max(len(data), 1), chunk):
                if not await self._send_chunk(snap, term, name, off, data[off:off + chunk], False):
                    return False
                sent += min(chunk, len(data) - off)
        if not await self._send_chunk(snap, term, SNAPSHOT_META_FILE, 0, snap.meta.to_json(), True):
            return False
        log.info("event=install_snapshot_done group=%s selfId=%s peer=%s term=%d index=%d bytes=%d",
                 self.ms.group, self.ms.self_id, self.peer_id, term, snap.index, sent)
        return True

    async def _send_chunk(self, snap: SnapshotReader, term: int, name: str, offset: int, data: bytes,
                          done: bool) -> bool:
        ms = self.ms
        req = InstallSnapshotRequest(group=ms.group, remote_id=self.peer_id, local_id=ms.self_id,
                                     leader_id=ms.self_id, term=term, last_included_index=snap.index,
                                     last_included_term=snap.term, name=name, offset=offset, done=done,
                                     data=data)
        # The last chunk makes the follower store (fsync) and load the snapshot: give it longer.
        timeout_s = max(self.timeout_s * 10, _INSTALL_DONE_TIMEOUT_S) if done else self.timeout_s
        resp = await self._ask("INSTALL_SNAPSHOT",
                               lambda: self.pusher.rpc.install_snapshot(self.peer_id, req, timeout_s))
        if resp is None or self.term != term or not ms.is_leader():
            return False
        if resp.code != DLedgerResponseCode.SUCCESS:
            log.warning("event=install_snapshot_refused group=%s selfId=%s peer=%s index=%d file=%s code=%s",
                        ms.group, ms.self_id, self.peer_id, snap.index, name,
                        DLedgerResponseCode.value_of(resp.code).name)
            await self._wait(_NETWORK_BACKOFF_S)
            return False
        return True

    def _restart_from(self, match: int) -> None:
        self.generation += 1
        self.inflight.clear()
        self.write_index = match + 1
        self.prev_index = match
        if match < 0:
            self.prev_term = -1
        elif self._installed is not None and self._installed[0] == match:
            self.prev_term = self._installed[1]  # the snapshot the follower installed ends here
        else:
            try:
                self.prev_term = self.pusher.term_at(match)
            except DLedgerException:
                # Retention removed the entry the follower stopped at: find out anew where it
                # stands (it may need our begin index or our snapshot).
                self.state = DispatchState.COMPARE

    # -- APPEND ---------------------------------------------------------------------------
    def _check_timeout(self, now: float) -> None:
        if self.inflight and next(iter(self.inflight.values())) + self.timeout_s <= now:
            self._push_failed(now, "timeout")

    def _throttled(self, now: float, entry: DLedgerEntry) -> float | None:
        """Seconds to wait if this far-behind follower used up its quota for the current second."""
        if self.pusher.leader_end_pos - entry.pos <= self.config.peer_push_throttle_point:
            return None
        if now - self.quota_window >= 1.0:
            self.quota_window, self.quota_bytes = now, 0
        if self.quota_bytes >= self.config.peer_push_quota:
            return self.quota_window + 1.0 - now
        return None

    def _fill_pipeline(self, now: float) -> float | None:
        """Send what fits in the pipeline; return how long to wait before looking again."""
        pusher = self.pusher
        end = pusher.store.ledger_end_index
        max_count = self.config.max_batch_push_count if self.config.enable_batch_push else 1
        max_bytes = self.config.max_batch_push_size
        while self.write_index <= end and len(self.inflight) < self.config.max_pending_push_batches:
            first_entry = pusher.get_entry(self.write_index)
            wait_s = self._throttled(now, first_entry)
            if wait_s is not None:
                return wait_s
            entries = [first_entry]
            size = first_entry.size
            i = self.write_index + 1
            while i <= end and len(entries) < max_count and size < max_bytes:
                e = pusher.get_entry(i)
                entries.append(e)
                size += e.size
                i += 1
            if (
                len(self.inflight) >= _SMALL_BATCHES_IN_FLIGHT
                and len(entries) < max_count
                and size < max_bytes
            ):
                # Like Nagle: with pushes already in flight, let a partial batch grow until an
                # answer arrives (full batches still pipeline). Many small appends then share pushes.
                break
            self.quota_bytes += size
            req = self._request(PushType.APPEND, entries)
            if self.raw_reader is not None:
                self._attach_raw(req, size)
            self.prev_index, self.prev_term = entries[-1].index, entries[-1].term
            self.last_commit_sent = max(self.last_commit_sent, req.commit_index)
            self.inflight[self.write_index] = now
            self.write_index = i
            self._send(req)
        committed = pusher.store.committed_index
        deadlines = [_COMMIT_INTERVAL_S]
        if not self.inflight:
            # A moved commit index rides on the next APPEND under load; a COMMIT-only push goes out
            # once the pipeline has been idle for _COMMIT_DELAY_S (and at least once a second).
            idle_s = now - self.last_push_time
            if (
                committed > self.last_commit_sent and idle_s >= _COMMIT_DELAY_S
            ) or idle_s >= _COMMIT_INTERVAL_S:
                self._send(self._request(PushType.COMMIT, []))
                self.last_commit_sent = committed
            elif committed > self.last_commit_sent:
                deadlines.append(_COMMIT_DELAY_S - idle_s)
        else:
            deadlines.append(next(iter(self.inflight.values())) + self.timeout_s - now)
        return max(min(deadlines), 0.001)

    def _refused(self, req: PushEntryRequest, first: int, code: int) -> None:
        """A push was refused: back to COMPARE (the caller), counting refusals at one index in a row."""
        if req.type == PushType.APPEND and code == DLedgerResponseCode.INCONSISTENT_STATE:
            if first == self.refused_at:
                self.refusals += 1
            else:
                self.refused_at, self.refusals = first, 1
        name = DLedgerResponseCode.value_of(code).name
        if self.refusals <= 1:
            log.info("push %s..%d answered %s by %s group=%s selfId=%s term=%d: back to COMPARE", first,
                     req.entries[-1].index if req.entries else -1, name, self.peer_id, self.ms.group,
                     self.ms.self_id, self.term)
            return
        now = self.pusher.clock()
        if now - self._refusal_logged_at >= _REFUSAL_LOG_INTERVAL_S:
            self._refusal_logged_at = now
            log.warning("event=push_refused_again group=%s selfId=%s peer=%s term=%d index=%d refusals=%d "
                        "code=%s next_compare_in_s=%.1f: the follower keeps refusing the entry its COMPARE "
                        "agreed to follow (see its log: committed_entry_conflict)", self.ms.group,
                        self.ms.self_id, self.peer_id, self.term, first, self.refusals, name,
                        self._refusal_backoff_s())

    def _attach_raw(self, req: PushEntryRequest, size: int) -> None:
        """Send the batch as the bytes the store already holds (one copy instead of one encode per
        entry per follower), when they are contiguous in one data file. Followers that keep pace
        are sent the same batches, so the last copy is shared through the pusher."""
        first, last = req.entries[0], req.entries[-1]
        if last.pos + last.size - first.pos != size:
            return
        key = BatchKey(first.index, last.index, first.pos, size, self.term)
        shared = self.pusher.last_raw
        if shared is not None and shared.key == key:
            req.raw = shared.data
            return
        try:
            view = self.raw_reader(first.pos, size)  # type: ignore[misc]
        except DLedgerException:
            return  # crosses a file end (blank padding): encode entry by entry
        req.raw = bytes(view)
        if isinstance(view, memoryview):
            view.release()
        self.pusher.last_raw = RawBatch(key, req.raw)

    def cancel_sends(self) -> None:
        """Shutdown: drop every push still waiting for its answer."""
        for t in list(self._tasks):
            t.cancel()

    def _send(self, req: PushEntryRequest) -> None:
        self.last_push_time = self.pusher.clock()
        task = asyncio.get_running_loop().create_task(self._send_and_handle(req, self.generation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_and_handle(self, req: PushEntryRequest, generation: int) -> None:
        first = req.entries[0].index if req.entries else -1
        try:
            resp = await self.pusher.rpc.push(self.peer_id, req, self.timeout_s)
        except DLedgerException as exc:
            if req.term != self.ms.curr_term or not self.ms.is_leader():
                return
            if generation == self.generation and req.type == PushType.APPEND:
                self._push_failed(self.pusher.clock(), exc.code.name)
            return
        if resp.term > self.term:
            self.pusher.notify_higher_term(resp.term, f"push answer of {self.peer_id}")
            return
        if req.term != self.term:
            return
        code = resp.code
        self._answered()
        if code == DLedgerResponseCode.SUCCESS:
            self.pusher.notify_peer_ack(self.peer_id)
            if req.type == PushType.APPEND:
                self.refusals = 0
                if resp.index > self.match_index:
                    self.match_index = resp.index
                if generation == self.generation:
                    self.inflight.pop(first, None)
                self.pusher.update_peer_water_mark(self.term, self.peer_id, resp.index)
                self.wake.set()
            elif (req.type == PushType.COMMIT and resp.end_index < self.match_index
                  and generation == self.generation and self.state == DispatchState.APPEND):
                # The follower holds less than it acknowledged (its store was wiped or cut while we
                # had nothing to push, DLedger #61): find out anew where it stands.
                log.info("event=follower_behind_its_watermark group=%s selfId=%s peer=%s term=%d end=%d "
                         "watermark=%d: back to COMPARE", self.ms.group, self.ms.self_id, self.peer_id,
                         self.term, resp.end_index, self.match_index)
                self.state = DispatchState.COMPARE
                self.generation += 1
                self.inflight.clear()
                self.wake.set()
            return
        if code == DLedgerResponseCode.REPEATED_PUSH or generation != self.generation:
            return
        self._refused(req, first, code)
        self.state = DispatchState.COMPARE
        self.generation += 1
        self.inflight.clear()
        self.wake.set()
