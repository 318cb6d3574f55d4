"""Replicated broker state kept as records in the commit log itself.

`ConsumerOffsetManager`: committed consumer-group offsets. A commit is written as a record into the
system topic `RMQ_SYS_CONSUMER_OFFSETS` (through the message store, so in DLedger mode it is
replicated and committed on a majority before the call returns) and applied when the reput
dispatcher feeds the record back — on every member, in log order. At start the table is rebuilt by
replaying that topic's consume queue. So committed offsets survive a master failover.

`IdempotencyTable`: idempotency key → the first put's result, for `idempotencyWindowMs`. Built from
the IDEMPOTENCY_KEY property of dispatched messages (no extra record), so it is the same on every
member and is rebuilt by replay, and a retry after a failover still finds the first result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.topics import SYS_CONSUMER_OFFSETS

log = logging.getLogger(__name__)

RecordWriter = Callable[[str, dict[str, Any]], Awaitable[None]]
SNAPSHOT_EVERY_RECORDS = 1000


class PutResult(NamedTuple):
    """What a successful put returns for one message (immutable; a NamedTuple because one is made
    per stored message and a frozen dataclass's __init__ costs several times more)."""

    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int


class ConsumerOffsetManager:
    """Committed offsets per (group, topic, queueId). Callers: HTTP offset routes and consumers
    (`commit`, `commit_many`, `query`, `offsets_of`), the dispatcher (`apply_record`)."""

    def __init__(self, snapshot_every_records: int = SNAPSHOT_EVERY_RECORDS) -> None:
        self._table: dict[tuple[str, str], dict[int, int]] = {}
        self._writer: RecordWriter | None = None
        self.snapshot_every_records = snapshot_every_records
        self.records_since_snapshot = 0
        # A snapshot must hold exactly the state at its place in the log: it waits for commits in
        # flight to be applied and holds new ones back while it is written.
        self._snapshot_lock = asyncio.Lock()
        self._inflight = 0
        self._drained = asyncio.Event()

    def set_writer(self, writer: RecordWriter) -> None:
        self._writer = writer

    async def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Commit one queue's offset (master only; returns once the record is committed and applied)."""
        await self.commit_many(group, topic, {queue_id: offset})

    async def commit_many(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Commit several queues' offsets of one topic in one record."""
        if not isinstance(group, str) or not group or len(group) > 255:
            raise BrokerError(BrokerCode.INVALID_REQUEST, "consumer group must be 1-255 characters",
                              field="group")
        for qid, off in offsets.items():
            if not isinstance(qid, int) or not isinstance(off, int) or qid < 0 or off < 0:
                raise BrokerError(BrokerCode.INVALID_REQUEST,
                                  f"offset {off!r} for queue {qid!r} must be a non-negative integer",
                                  field="offsets")
        if self._writer is None:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "offset store is not started")
        while self._snapshot_lock.locked():
            async with self._snapshot_lock:
                pass
        self._inflight += 1
        try:
            await self._writer(SYS_CONSUMER_OFFSETS, {"group": group, "topic": topic,
                                                      "offsets": {str(q): o for q, o in offsets.items()}})
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()
        if self.records_since_snapshot >= self.snapshot_every_records and not self._snapshot_lock.locked():
            await self.write_snapshot()

    async def write_snapshot(self) -> None:
        """Write the whole table as one record; replay at start begins at the last snapshot, so
        start-up time stays bounded however many commits the log holds."""
        if self._writer is None:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "offset store is not started")
        async with self._snapshot_lock:
            while self._inflight:
                self._drained.clear()
                await self._drained.wait()
            table = [[g, t, {str(q): o for q, o in qs.items()}] for (g, t), qs in self._table.items()]
            self.records_since_snapshot = 0
            await self._writer(SYS_CONSUMER_OFFSETS, {"snapshot": table})

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 if the group never committed one for this queue."""
        return self._table.get((group, topic), {}).get(queue_id, -1)

    def offsets_of(self, group: str, topic: str | None = None) -> dict[str, dict[int, int]]:
        """{topic: {queueId: offset}} committed by `group` (optionally one topic)."""
        return {t: dict(q) for (g, t), q in self._table.items()
                if g == group and (topic is None or t == topic)}

    def groups(self) -> list[str]:
        return sorted({g for g, _ in self._table})

    def apply_record(self, record: dict[str, Any]) -> None:
        """Apply a replicated offset record (dispatcher, in log order); a snapshot replaces the table."""
        if "snapshot" in record:
            try:
                self._table = {(str(g), str(t)): {int(q): int(o) for q, o in qs.items()}
                               for g, t, qs in record["snapshot"]}
                self.records_since_snapshot = 0
            except (TypeError, ValueError, AttributeError):
                log.error("event=bad_offset_snapshot")
            return
        self.records_since_snapshot += 1
        try:
            key = (str(record["group"]), str(record["topic"]))
            queues = self._table.setdefault(key, {})
            for q, o in record["offsets"].items():
                queues[int(q)] = int(o)
        except (KeyError, TypeError, ValueError, AttributeError):
            log.error("event=bad_offset_record record=%r", record)

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self._table if k[1] == topic]:
            del self._table[key]


class IdempotencyTable:
    """(topic, idempotency key) → (PutResult, store timestamp ms), kept for `window_ms`."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._entries: OrderedDict[tuple[str, str], tuple[PutResult, int]] = OrderedDict()

    def get(self, topic: str, key: str, now_ms: int | None = None) -> PutResult | None:
        hit = self._entries.get((topic, key))
        if hit is None:
            return None
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if now_ms - hit[1] > self.window_ms:
            return None
        return hit[0]

    def remember(self, topic: str, key: str, result: PutResult, store_ts_ms: int) -> None:
        """Record the first result of a key (a later duplicate in the log never overwrites it)."""
        k = (topic, key)
        if k in self._entries:
            return
        self._entries[k] = (result, store_ts_ms)
        self._expire(store_ts_ms)

    def _expire(self, now_ms: int) -> None:
        limit = now_ms - self.window_ms
        entries = self._entries
        while entries:
            k, (_, ts) = next(iter(entries.items()))
            if ts >= limit:
                break
            del entries[k]

    def __len__(self) -> int:
        return len(self._entries)
