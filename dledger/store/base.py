"""The store API every DLedger component talks to (`DLedgerStore` in DLedger).

Calls are made from the event loop and are synchronous except flushing, which may wait for an
fsync in a worker thread. Role checks (am I leader, is a transfer running) are the caller's job;
the store checks what only it can: positions, index continuity, terms, disk space.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from dledger.entry import DLedgerEntry

AppendHook = Callable[[DLedgerEntry, memoryview, int], None]
"""hook(entry, writable view of the encoded entry, BODY_OFFSET): runs before the bytes are written."""


class DLedgerStore(ABC):
    """Abstract log store. Indexes start at 0; an empty log has end index -1 and begin index -1."""

    ledger_begin_index: int = -1
    ledger_end_index: int = -1
    ledger_end_term: int = -1
    committed_index: int = -1
    committed_pos: int = -1
    append_hooks: list[AppendHook]

    def add_append_hook(self, hook: AppendHook) -> None:
        """Register a hook called with each leader-appended entry before it is written."""
        self.append_hooks.append(hook)

    @abstractmethod
    def append_as_leader(self, entry: DLedgerEntry, term: int) -> DLedgerEntry:
        """Assign index = end + 1, term and pos; run hooks; write. Raises DLedgerException
        (DISK_FULL, DISK_ERROR)."""

    @abstractmethod
    def batch_append_as_leader(self, entries: Sequence[DLedgerEntry], term: int) -> list[DLedgerEntry]:
        """Append many entries in one call (same rules as `append_as_leader`)."""

    @abstractmethod
    def append_as_follower(self, entry: DLedgerEntry, leader_term: int, leader_id: str) -> DLedgerEntry:
        """Append an entry received from the leader; it must be index end + 1 and land at the
        leader's pos, else DLedgerException (INCONSISTENT_INDEX / DISK_ERROR)."""

    @abstractmethod
    def batch_append_as_follower(
        self,
        entries: Sequence[DLedgerEntry],
        leader_term: int,
        leader_id: str,
        raw: bytes | memoryview | None = None,
    ) -> None:
        """Append the leader's contiguous run (first index end + 1, each entry at the leader's pos,
        right after the one before it). The whole run is validated first — index continuity, terms,
        positions, body CRCs — and a refused run writes nothing (INCONSISTENT_INDEX /
        INCONSISTENT_TERM / DISK_ERROR / DISK_FULL). `raw`, when given, is the run's exact encoding
        as received (the leader's stored bytes) and may be written as-is."""

    @abstractmethod
    def get(self, index: int) -> DLedgerEntry:
        """The entry at `index` (body CRC checked). INDEX_OUT_OF_RANGE outside [begin, end]."""

    def get_range(self, first: int, last: int) -> list[DLedgerEntry]:
        """Entries `first`..`last` inclusive (each checked as by `get`); stores override this with
        a cheaper contiguous read."""
        return [self.get(i) for i in range(first, last + 1)]

    @abstractmethod
    def truncate(self, entry: DLedgerEntry, leader_term: int, leader_id: str) -> int:
        """Make `entry` (from the leader) the last entry: cut everything after its index (or at it,
        writing the leader's entry, when ours differs). Returns the new end index."""

    @abstractmethod
    def update_committed_index(self, term: int, committed_index: int) -> None:
        """DLedger's rules: ignore an older term, a backwards move or one below begin; clamp to end."""

    @abstractmethod
    def flush(self) -> None:
        """Write dirty data and index pages to disk now (blocking)."""

    @property
    @abstractmethod
    def flushed_index(self) -> int:
        """Highest index known to be on disk (for SYNC_FLUSH acks)."""

    @abstractmethod
    async def wait_flushed(self, index: int) -> None:
        """Return once every entry up to `index` is fsynced; concurrent callers share one fsync."""

    @abstractmethod
    async def start(self) -> None:
        """Recover from disk and start background services (flush, checkpoint, clean space)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop services, flush, write the checkpoint."""

    @property
    def is_disk_full(self) -> bool:
        return False
