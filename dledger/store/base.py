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

RetentionFloor = Callable[[], int | None]
"""floor() -> the lowest index whose entry must stay in the log (None: no requirement)."""

CorruptCutListener = Callable[[str], None]
"""listener(reason): a corrupt log found while running is about to be cut (see `corrupt_cut_listeners`)."""


class DLedgerStore(ABC):
    """Abstract log store. Indexes start at 0; an empty log has end index -1 and begin index -1.

    Callers: the DLedger components (server, pusher, dispatchers, entry handler, member state,
    state machine caller) and the broker's DLedger commit log, which also reads message bytes
    straight from the data (`get_data`, `get_entry_pos_and_size`, `data_begin_pos`,
    `data_end_pos`) and recovers the store before the server starts (`recover`).
    """

    ledger_begin_index: int = -1
    ledger_end_index: int = -1
    ledger_end_term: int = -1
    committed_index: int = -1
    committed_pos: int = -1
    # Term of entry `ledger_begin_index - 1` when the log starts right after a snapshot of it
    # (DLedger's ledgerBeforeBeginTerm; -1: unknown, e.g. the prefix went by retention only).
    ledger_before_begin_term: int = -1
    append_hooks: list[AppendHook]
    # Recovery had to cut entries it had acknowledged (a corrupt log): the index it must reach
    # again before this member votes or campaigns (-1: none). `MemberState.check_recovering` reads it.
    catchup_watermark: int = -1
    # Older data files are still being verified after start: no campaign, no leadership transfer.
    verifying: bool = False
    # Reads through `get_data` are views of stored bytes (the dispatchers send them as they are);
    # False where `get_data` has to re-encode (the memory store).
    zero_copy_reads: bool = True
    # Where `MemberState` persists currTerm/voteLeader: None for the `currterm` file beside the
    # store, or a dict that plays the disk (the memory store, kept across a simulated crash).
    term_state: dict[str, str] | None = None
    # Called (with the reason) right before a corrupt log found while running is cut: the elector
    # steps down, the entry handler answers parked pushes (stores that never cut keep it empty).
    corrupt_cut_listeners: list[CorruptCutListener]

    retention_floor: RetentionFloor | None = None

    def add_append_hook(self, hook: AppendHook) -> None:
        """Register a hook called with each leader-appended entry before it is written."""
        self.append_hooks.append(hook)

    def set_retention_floor(self, floor: RetentionFloor) -> None:
        """Expiry (retention, disk-space cleaning) never deletes the entry `floor()` names, nor
        any after it. The server sets it from its state machines (`StateMachine.retained_from_index`)."""
        self.retention_floor = floor

    def recover(self) -> None:  # noqa: B027 - stores without files have nothing to recover
        """Load the files and rebuild the ledger state (blocking; `start` does it when not done).
        The broker calls it first so it can check its consume queues against the data."""

    def clear_catchup_watermark(self) -> None:
        """The log has reached `catchup_watermark` again: forget it (durably where it is persisted)."""
        self.catchup_watermark = -1

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
    def get_entry_pos_and_size(self, index: int) -> tuple[int, int]:
        """(pos, size) of entry `index` without reading its body. INDEX_OUT_OF_RANGE outside
        [begin, end]."""

    @abstractmethod
    def get_data(self, pos: int, size: int) -> bytes | memoryview:
        """The stored bytes at data position `pos` (never across a data file's end)."""

    @property
    @abstractmethod
    def data_begin_pos(self) -> int:
        """Data position of the first entry still stored (-1 when empty)."""

    @property
    @abstractmethod
    def data_end_pos(self) -> int:
        """Data position right after the last byte written (appended, not necessarily committed)."""

    @abstractmethod
    def get(self, index: int) -> DLedgerEntry:
        """The entry at `index` (body CRC checked). INDEX_OUT_OF_RANGE outside [begin, end]."""

    def get_range(self, first: int, last: int) -> list[DLedgerEntry]:
        """Entries `first`..`last` inclusive (each checked as by `get`); stores override this with
        a cheaper contiguous read."""
        return [self.get(i) for i in range(first, last + 1)]

    def term_at(self, index: int) -> int:
        """Term of entry `index`, including the entry a snapshot ends with right before the log's
        begin (the prev term of the first push after an install)."""
        if index == self.ledger_end_index:
            return self.ledger_end_term
        if index == self.ledger_begin_index - 1 and self.ledger_before_begin_term >= 0:
            return self.ledger_before_begin_term
        return self.get(index).term

    @abstractmethod
    def reset_to_snapshot(self, index: int, term: int, end_pos: int) -> None:
        """Replace the whole log by a snapshot of everything up to `index` (InstallSnapshot, or a
        stored snapshot ahead of a log cut back at start): every entry is dropped, end index /
        term become the snapshot's, and entry `index + 1` will be written at `end_pos` (where
        the leader holds it). Durable before it returns."""

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
