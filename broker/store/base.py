"""The seams of the broker store: what a commit log offers (`CommitLog`) and what it feeds (`Dispatcher`).

Two commit logs implement `CommitLog`: the local `LocalCommitLog` (`commitlog.py`, single node,
everything written is committed) and `DLedgerCommitLog` (`dledger_commitlog.py`, a Raft log whose
committed entries reach the dispatcher through DLedger's state machine). The store above them —
`DefaultMessageStore` and its services — never asks which one it has.

A commit log owns the topic-queue table (RocketMQ's `CommitLog.topicQueueTable`): the next queue
offset of every (topic, queueId), assigned as messages are written so queue offsets follow log order.

Lifecycle, called by `DefaultMessageStore`: `prepare(dispatcher, keep_from)` recovers the files
(consume queues are then checked against `data_end`), `start()` begins feeding committed messages
to the dispatcher, `shutdown()` stops. Retention (the local log's `delete_expired`, DLedger's own
clean-up service) never deletes what `keep_from()` says is still needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from broker.errors import BrokerError
from broker.message import DispatchInfo

TopicQueueTable = dict[tuple[str, int], int]
"""(topic, queueId) → the next queue offset to assign."""

KeepFrom = Callable[[], int]
"""keep_from(): retention deletes no file holding log data at or after this position."""


class Placed(NamedTuple):
    """Where one message of a put landed."""

    phys: int
    size: int
    queue_id: int
    queue_offset: int


class Dispatcher(Protocol):
    """What a commit log feeds committed messages into, in log order (`ReputMessageService`)."""

    @property
    def reput_offset(self) -> int:
        """Everything below this commit-log offset is dispatched."""
        ...

    @property
    def readable_end(self) -> int:
        """Messages below this offset were committed (dispatched now or before a restart)."""
        ...

    def dispatch(self, data: memoryview | bytes, phys: int) -> bool:
        """One committed message whose bytes start at `phys`."""
        ...

    def dispatch_packed(self, data: memoryview | bytes, base: int) -> None:
        """Messages stored back to back in `data`, the first at `base`."""
        ...

    def skip_to(self, pos: int) -> None:
        """Nothing left to dispatch below `pos` (blank records at a file's end)."""
        ...

    def dispatch_done(self) -> None:
        """After a batch of dispatches: wake whoever waits for it."""
        ...


class DispatchHook(Protocol):
    """A broker service that indexes the messages of one topic as they are dispatched, on every
    member in log order (the timer queue, the transactions' half topic)."""

    def tags_code(self, info: DispatchInfo) -> int:
        """The consume-queue unit's tags code for this message (e.g. a timer's due time)."""
        ...

    def on_unit(self, info: DispatchInfo) -> None:
        """A unit was written for this message (not for one the start-up rebuild already saw);
        `info.tags_code` is what `tags_code` chose."""
        ...


class CommitLog(Protocol):
    """The commit log as the store uses it, whatever replicates it."""

    topic_queue_table: TopicQueueTable

    @property
    def min_offset(self) -> int:
        """First readable byte (retention moves it up)."""
        ...

    @property
    def max_offset(self) -> int:
        """The committed position: the dispatcher never goes past it."""
        ...

    @property
    def data_end(self) -> int:
        """End of the data actually in the files (recovery cuts consume queues beyond it)."""
        ...

    @property
    def leader_id(self) -> str | None:
        """The replication leader's member id (None: unknown, or no replication)."""
        ...

    async def prepare(self, dispatcher: Dispatcher, keep_from: KeepFrom) -> None:
        """Load and recover the files; `dispatcher` is what `start` will feed, `keep_from` where
        retention must stop (undispatched data, live broker state)."""
        ...

    async def start(self) -> None:
        """Begin feeding committed messages after the dispatcher's `reput_offset`."""
        ...

    async def shutdown(self) -> None:
        ...

    @property
    def pack_bytes(self) -> int:
        """At most this many bytes of messages go into one log entry (a put of more is split into
        several entries; a message larger than it is an entry of its own). No limit: one entry a put."""
        ...

    async def put(self, topic: str, queue_id: int, bufs: list[bytearray],
                  entry_starts: list[int] | None = None) -> list[Placed]:
        """Append encoded messages of one queue; return once they are committed. BrokerError
        (NOT_MASTER naming the replication code, DISK_FULL, TIMEOUT with an unknown outcome …).
        `entry_starts`: the indexes where the caller's entries begin (each within `pack_bytes`),
        instead of the log's own split."""
        ...

    async def put_many(self, bufs: list[bytearray]) -> list[Placed]:
        """Append encoded messages of any topics and queues (each names its own) as ONE unit —
        one DLedger entry: committed together or not at all — and return once committed."""
        ...

    def get_data(self, phys: int, size: int) -> memoryview:
        """Bytes of a committed message; MESSAGE_NOT_FOUND outside the readable range."""
        ...

    def dispatch_caught_up(self) -> bool:
        """Everything committed is dispatched and nothing uncommitted is in the local log."""
        ...

    def write_refusal(self) -> BrokerError | None:
        """Why this member cannot take writes whatever its role (DISK_FULL), else None."""
        ...

    def delete_expired(self) -> int:
        """One retention pass: delete expired files (never one holding data at or after
        `keep_from()`); returns the number deleted. A log that cleans itself returns 0."""
        ...
