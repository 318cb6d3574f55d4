"""`DLedgerMemoryStore`: the log in memory, with a model of what has reached "disk".

Used by the deterministic simulator. Entries live in a list; `flushed_index` models fsync: a
periodic flush (every `flush_file_interval_ms`) and `wait_flushed` (a short simulated fsync shared
by concurrent callers) move it. `lose_unflushed()` models power loss: everything after the last
flush disappears. The object itself plays the role of the disk, so the simulator keeps it across a
member's crash and restart; `term_state` is where `MemberState` persists currTerm/voteLeader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET, DLedgerEntry, body_crc32, encode
from dledger.store.base import DLedgerStore

# Simulated fsync latency: long enough that concurrent waiters share one "fsync".
_FSYNC_DELAY_S = 0.002


class DLedgerMemoryStore(DLedgerStore):
    """In-memory `DLedgerStore`. Its log begins at 0 unless a prefix was deleted
    (`delete_prefix`, the simulator's retention) or the log was replaced by a snapshot
    (`reset_to_snapshot`): `_base` is the index of `_entries[0]`, `_base_pos` where it starts."""

    zero_copy_reads = False  # get_data re-encodes: dispatchers must not use it on the hot path

    def __init__(self, config: DLedgerConfig) -> None:
        self.config = config
        self.append_hooks = []
        self.corrupt_cut_listeners = []
        self._entries: list[DLedgerEntry] = []
        self._base = 0
        self._base_pos = 0
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.committed_pos = -1
        self._flushed_index = -1
        self._end_pos = 0
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._fsync_scheduled = False
        self._flush_task: asyncio.Task[None] | None = None
        # The simulated disk for currTerm/voteLeader; a memory store under a FILE config (unit tests of
        # the member state) leaves them to the `currterm` file.
        self.term_state = {} if config.store_type == "MEMORY" else None
        # For the simulator's invariant checks: lowest index changed in place since it last looked,
        # and any attempt to cut below the committed index.
        self.low_water_modified: int | None = None
        self.violations: list[str] = []
        self.disk_full = False

    # -- appends --------------------------------------------------------------------------
    def _append(self, entry: DLedgerEntry) -> DLedgerEntry:
        entry.compute_size_in_bytes()
        entry.body_crc = body_crc32(entry.body)
        if not self._entries:
            self._base, self._base_pos = entry.index, entry.pos
            self.ledger_begin_index = entry.index
        self._entries.append(entry)
        self._end_pos += entry.size
        self.ledger_end_index = entry.index
        self.ledger_end_term = entry.term
        return entry

    def append_as_leader(self, entry: DLedgerEntry, term: int) -> DLedgerEntry:
        if self.disk_full:
            raise DLedgerException(DLedgerResponseCode.DISK_FULL, "memory store marked full")
        entry.index = self.ledger_end_index + 1
        entry.term = term
        entry.pos = self._end_pos
        if self.append_hooks:
            buf = encode(entry)
            for hook in self.append_hooks:
                hook(entry, memoryview(buf), BODY_OFFSET)
            entry.body = bytes(buf[BODY_OFFSET:])
        return self._append(entry)

    def batch_append_as_leader(self, entries: Sequence[DLedgerEntry], term: int) -> list[DLedgerEntry]:
        return [self.append_as_leader(e, term) for e in entries]

    def append_as_follower(self, entry: DLedgerEntry, leader_term: int, leader_id: str) -> DLedgerEntry:
        if entry.index != self.ledger_end_index + 1:
            raise DLedgerException(
                DLedgerResponseCode.INCONSISTENT_INDEX,
                f"follower append index {entry.index} != end {self.ledger_end_index} + 1",
            )
        if entry.pos != self._end_pos:
            raise DLedgerException(
                DLedgerResponseCode.DISK_ERROR,
                f"entry {entry.index} pos {entry.pos} != local end pos {self._end_pos}",
            )
        return self._append(
            DLedgerEntry(
                body=entry.body,
                magic=entry.magic,
                index=entry.index,
                term=entry.term,
                pos=entry.pos,
                channel=entry.channel,
            )
        )

    def batch_append_as_follower(
        self,
        entries: Sequence[DLedgerEntry],
        leader_term: int,
        leader_id: str,
        raw: bytes | memoryview | None = None,
    ) -> None:
        """Validate the whole contiguous run (index, term, pos, body CRC), then append it; a refused
        run appends nothing. `raw` (the received encoding) is not needed here."""
        index, term, pos = self.ledger_end_index + 1, self.ledger_end_term, self._end_pos
        for e in entries:
            if e.index != index:
                raise DLedgerException(
                    DLedgerResponseCode.INCONSISTENT_INDEX,
                    f"follower append index {e.index} != expected {index} (leader {leader_id})",
                )
            if e.term < term:
                raise DLedgerException(
                    DLedgerResponseCode.INCONSISTENT_TERM, f"entry {e.index} term {e.term} < {term}"
                )
            if e.pos != pos:
                raise DLedgerException(
                    DLedgerResponseCode.DISK_ERROR, f"entry {e.index} pos {e.pos} != local end pos {pos}"
                )
            if e.body_crc and e.body_crc != body_crc32(e.body):
                raise DLedgerException(DLedgerResponseCode.DISK_ERROR, f"entry {e.index}: body CRC mismatch")
            index, term, pos = index + 1, e.term, pos + BODY_OFFSET + len(e.body)
        for e in entries:
            self._append(
                DLedgerEntry(
                    body=e.body, magic=e.magic, index=e.index, term=e.term, pos=e.pos, channel=e.channel
                )
            )

    # -- reads ----------------------------------------------------------------------------
    def get(self, index: int) -> DLedgerEntry:
        if index < 0 or index < self.ledger_begin_index or index > self.ledger_end_index:
            raise DLedgerException(
                DLedgerResponseCode.INDEX_OUT_OF_RANGE,
                f"index {index} outside [{self.ledger_begin_index}, {self.ledger_end_index}]",
            )
        return self._entries[index - self._base]

    def get_data(self, pos: int, size: int) -> bytes:
        """Raw bytes at a global position (re-encodes the entries overlapping the range)."""
        out = bytearray()
        for e in self._entries:
            if e.pos + e.size > pos and e.pos < pos + size:
                out += encode(e)[max(0, pos - e.pos) :]
        if len(out) < size:
            raise DLedgerException(DLedgerResponseCode.INDEX_OUT_OF_RANGE, f"[{pos}, +{size}) not written")
        return bytes(out[:size])

    def get_entry_pos_and_size(self, index: int) -> tuple[int, int]:
        e = self.get(index)
        return e.pos, e.size

    @property
    def data_begin_pos(self) -> int:
        return self._base_pos if self._entries else -1

    @property
    def data_end_pos(self) -> int:
        return self._end_pos

    # -- truncation and commit ------------------------------------------------------------
    def _cut_after(self, index: int) -> None:
        """Keep entries up to `index`; record where the log changed."""
        if index < self.ledger_end_index:
            if index < self.committed_index:
                self.violations.append(f"cut after {index} below committed {self.committed_index}")
            cut = index + 1
            self.low_water_modified = (
                cut if self.low_water_modified is None else min(self.low_water_modified, cut)
            )
            del self._entries[max(cut - self._base, 0):]
        self.ledger_end_index = index
        if self._entries:
            last = self._entries[-1]
            self.ledger_end_term = last.term
            self._end_pos = last.pos + last.size
        elif self._base > 0 and index == self._base - 1:
            self.ledger_end_term = self.ledger_before_begin_term  # back to where a snapshot left it
            self._end_pos = self._base_pos
        else:
            self.ledger_end_term = -1
            self._end_pos = 0
            self._base = self._base_pos = 0
            self.ledger_begin_index = -1
        self._flushed_index = min(self._flushed_index, index)

    def delete_prefix(self, upto: int) -> int:
        """Drop the entries before `upto` (the simulator's retention), never one that is not
        committed or that the retention floor keeps; returns how many went."""
        limit = min(upto, self.committed_index + 1, self.ledger_end_index)
        floor = self.retention_floor() if self.retention_floor is not None else None
        if floor is not None:
            limit = min(limit, floor)
        n = limit - self._base
        if n <= 0 or not self._entries:
            return 0
        self.ledger_before_begin_term = self._entries[n - 1].term
        del self._entries[:n]
        self._base = self.ledger_begin_index = limit
        self._base_pos = self._entries[0].pos
        return n

    def reset_to_snapshot(self, index: int, term: int, end_pos: int) -> None:
        self._entries = []
        self._base, self._base_pos, self._end_pos = index + 1, end_pos, end_pos
        self.ledger_begin_index, self.ledger_end_index, self.ledger_end_term = index + 1, index, term
        self.ledger_before_begin_term = term
        self.committed_index, self.committed_pos = index, end_pos
        self._flushed_index = index

    def truncate(self, entry: DLedgerEntry, leader_term: int, leader_id: str) -> int:
        idx = entry.index
        if idx > self.ledger_end_index + 1 or idx < 0:
            raise DLedgerException(
                DLedgerResponseCode.INCONSISTENT_INDEX,
                f"truncate at {idx} beyond end {self.ledger_end_index} + 1",
            )
        if self.ledger_begin_index <= idx <= self.ledger_end_index:
            mine = self._entries[idx - self._base]
            if mine.term == entry.term and mine.pos == entry.pos and mine.body == entry.body:
                self._cut_after(idx)
                return self.ledger_end_index
        self._cut_after(idx - 1)
        self.append_as_follower(entry, leader_term, leader_id)
        return self.ledger_end_index

    def update_committed_index(self, term: int, committed_index: int) -> None:
        if committed_index <= self.committed_index or committed_index < self.ledger_begin_index:
            return
        committed_index = min(committed_index, self.ledger_end_index)
        if committed_index <= self.committed_index:
            return
        self.committed_index = committed_index
        e = self._entries[committed_index - self._base]
        self.committed_pos = e.pos + e.size

    # -- flushing -------------------------------------------------------------------------
    def flush(self) -> None:
        self._flushed_index = self.ledger_end_index
        self._wake_flush_waiters()

    @property
    def flushed_index(self) -> int:
        return self._flushed_index

    def _wake_flush_waiters(self) -> None:
        keep = []
        for index, fut in self._flush_waiters:
            if index <= self._flushed_index or index > self.ledger_end_index:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((index, fut))
        self._flush_waiters = keep

    def _do_fsync(self) -> None:
        self._fsync_scheduled = False
        self.flush()

    async def wait_flushed(self, index: int) -> None:
        if index <= self._flushed_index:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._flush_waiters.append((index, fut))
        if not self._fsync_scheduled:
            self._fsync_scheduled = True
            loop.call_later(_FSYNC_DELAY_S, self._do_fsync)
        await fut

    async def _flush_loop(self) -> None:
        interval = max(self.config.flush_file_interval_ms, 1) / 1000
        while True:
            await asyncio.sleep(interval)
            self.flush()

    async def start(self) -> None:
        self.committed_index = min(self.committed_index, self.ledger_end_index)
        if self.committed_index >= self.ledger_begin_index >= 0 and self._entries:
            e = self._entries[self.committed_index - self._base]
            self.committed_pos = e.pos + e.size
        elif self.committed_index >= 0:
            self.committed_pos = self._base_pos
        else:
            self.committed_pos = -1
        self._fsync_scheduled = False
        self._flush_task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def shutdown(self) -> None:
        if self._flush_task is not None:
            self._flush_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flush_task
            self._flush_task = None
        self.flush()

    # -- simulator helpers ----------------------------------------------------------------
    def crash(self, lose_unflushed: bool = True) -> None:
        """Model a crash: stop the flusher, fail waiters, optionally drop unflushed entries."""
        if self._flush_task is not None:
            self._flush_task.cancel()
            self._flush_task = None
        for _, fut in self._flush_waiters:
            if not fut.done():
                fut.cancel()
        self._flush_waiters = []
        if lose_unflushed:
            self.lose_unflushed()

    def lose_unflushed(self) -> None:
        """Drop every entry after the flushed index (power loss)."""
        committed = self.committed_index
        self.committed_index = -1  # the cut below the old commit is legitimate here: recorded by caller
        self._cut_after(self._flushed_index)
        self.committed_index = min(committed, self.ledger_end_index)

    @property
    def is_disk_full(self) -> bool:
        return self.disk_full
