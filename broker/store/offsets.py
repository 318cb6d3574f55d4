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
import re
import time
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
            self.records_since_snapshot = 0
            await self._writer(SYS_CONSUMER_OFFSETS, {"snapshot": self.snapshot()})

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
                self.restore(record["snapshot"])
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

    def snapshot(self) -> list[list[Any]]:
        """The whole table for a state snapshot: [[group, topic, {queueId: offset}], ...]."""
        return [[g, t, {str(q): o for q, o in qs.items()}] for (g, t), qs in self._table.items()]

    def restore(self, snapshot: Any) -> None:
        """Replace the table by a `snapshot()`'s."""
        self._table = {(str(g), str(t)): {int(q): int(o) for q, o in qs.items()}
                       for g, t, qs in snapshot or ()}


_TS_BITS = 48  # store timestamps in ms: good until the year 10889
_TS_MASK = (1 << _TS_BITS) - 1
_U16 = 0xFFFF
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1


_HEX32 = re.compile(r"[0-9a-f]{32}").fullmatch


def _compact_key(key: str) -> str | int:
    """A 32-digit lower-case hex key (the SDK's uuid4) as its 128-bit int (44 bytes instead of 81).
    Only that exact shape converts, so two different strings never map to one int."""
    if len(key) == 32 and _HEX32(key):
        return int(key, 16)
    return key


class _Bucket:
    """Keys remembered over one stretch of time: {topic: {key: packed result}}, and the newest
    store timestamp among them (the bucket is dropped once that is older than the window)."""

    __slots__ = ("count", "keys", "newest_ms", "start_ms")

    def __init__(self, start_ms: int) -> None:
        self.start_ms = start_ms
        self.newest_ms = start_ms
        self.count = 0
        self.keys: dict[str, dict[str | int, int]] = {}


class IdempotencyTable:
    """(topic, idempotency key) → the first put's `PutResult`, kept for `window_ms` and for at most
    `max_keys` keys (the oldest go first beyond that, counted in `evicted`).

    Sized for the SDK, which puts a key on every message: at 5,000 msgs/s a 5-minute window is
    1.5 million keys on every member. Keys live in buckets nested by topic (no tuple per key); a
    bucket covers 1/8 of the window and at most 1/16 of `max_keys`, and is always dropped whole:
    once its newest key is older than the window, or as the oldest when the table is full (so no
    dict is ever left holding the holes of deleted keys). A result is one packed int (the msgId's
    host prefix is interned), a 32-digit hex key its int: ~133 bytes per key (tracemalloc) where a
    tuple of objects took ~570; ~150 of resident memory in steady state (149 MB at 1,000,000 keys)."""

    BUCKETS_PER_WINDOW = 8
    BUCKETS_PER_MAX_KEYS = 16

    def __init__(self, window_ms: int, max_keys: int = 1_000_000) -> None:
        self.window_ms = window_ms
        self.max_keys = max_keys
        self.evicted = 0
        self._bucket_ms = max(1, window_ms // self.BUCKETS_PER_WINDOW)
        self._bucket_keys = max(1, max_keys // self.BUCKETS_PER_MAX_KEYS)
        self._buckets: list[_Bucket] = []  # oldest first
        self._size = 0
        self._prefixes: list[str] = []
        self._prefix_ids: dict[str, int] = {}
        self._last_evict_log = 0.0

    def _find(self, topic: str, key: str | int) -> int | None:
        for bucket in reversed(self._buckets):  # newest first: a retry is usually recent
            keys = bucket.keys.get(topic)
            if keys is not None:
                packed = keys.get(key)
                if packed is not None:
                    return packed
        return None

    def get(self, topic: str, key: str, now_ms: int | None = None) -> PutResult | None:
        packed = self._find(topic, _compact_key(key))
        if packed is None:
            return None
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if now_ms - (packed & _TS_MASK) > self.window_ms:
            return None
        return self._unpack(packed)

    def remember(self, topic: str, key: str, result: PutResult, store_ts_ms: int) -> None:
        """Record the first result of a key (a later duplicate in the log never overwrites it)."""
        # msgId = store host (16 hex digits: few distinct values) + the commit-log offset, as
        # `create_message_id` makes it, so the offset part is not stored twice.
        self.remember_parts(topic, key, result.msg_id[:16], result.queue_id, result.queue_offset,
                            result.commit_log_offset, result.store_size, store_ts_ms)

    def remember_parts(self, topic: str, key: str, id_prefix: str, queue_id: int, queue_offset: int,
                       phys: int, size: int, store_ts_ms: int) -> None:
        """`remember` from the parts of a result (the dispatcher has them; no PutResult or msgId
        string is built for a key already held). `id_prefix`: `message_id_prefix(store host)`."""
        if self.window_ms <= 0:
            return
        k = _compact_key(key)
        if self._find(topic, k) is not None:
            return
        buckets = self._buckets
        bucket = buckets[-1] if buckets else None
        if (
            bucket is None
            or bucket.count >= self._bucket_keys
            or store_ts_ms >= bucket.start_ms + self._bucket_ms
        ):
            bucket = _Bucket(store_ts_ms)
            buckets.append(bucket)
            self._expire(store_ts_ms)
        elif store_ts_ms > bucket.newest_ms:
            bucket.newest_ms = store_ts_ms
        keys = bucket.keys.get(topic)
        if keys is None:
            keys = bucket.keys[topic] = {}
        pid = self._prefix_ids.get(id_prefix)
        if pid is None:
            pid = self._prefix_ids[id_prefix] = len(self._prefixes)
            self._prefixes.append(id_prefix)
        keys[k] = (
            (store_ts_ms & _TS_MASK)
            | (queue_id & _U16) << 48
            | (pid & _U16) << 64
            | (size & _U32) << 80
            | (queue_offset & _U64) << 112
            | (phys & _U64) << 176
        )
        bucket.count += 1
        self._size += 1
        if self._size > self.max_keys:
            self._evict_oldest()

    def _unpack(self, v: int) -> PutResult:
        phys = v >> 176
        return PutResult(
            f"{self._prefixes[(v >> 64) & _U16]}{phys:016X}",
            (v >> 48) & _U16,
            (v >> 112) & _U64,
            phys,
            (v >> 80) & _U32,
        )

    def _expire(self, now_ms: int) -> None:
        # Whole buckets whose newest key is older than the window (replay at start may insert
        # out of time order, so every bucket is checked; there are few).
        limit = now_ms - self.window_ms
        live = [b for b in self._buckets if b.newest_ms >= limit]
        if len(live) != len(self._buckets):
            self._size -= sum(b.count for b in self._buckets if b.newest_ms < limit)
            self._buckets = live

    def _evict_oldest(self) -> None:
        # Full: the oldest bucket goes whole (at most 1/16 of max_keys), before its window ends.
        oldest = self._buckets.pop(0)
        self._size -= oldest.count
        self.evicted += oldest.count
        now = time.monotonic()
        if now - self._last_evict_log > 60:
            self._last_evict_log = now
            log.warning(
                "event=idempotency_keys_evicted evicted_total=%d maxKeys=%d windowMs=%d "
                "hint=keys are held for less than the window: raise idempotencyMaxKeys or shorten "
                "idempotencyWindowMs",
                self.evicted,
                self.max_keys,
                self.window_ms,
            )

    def entries(self) -> list[tuple[str, str, PutResult, int]]:
        """Every (topic, key, result, store timestamp) held, sorted (for tests and diagnostics)."""
        out = []
        for bucket in self._buckets:
            for topic, keys in bucket.keys.items():
                for k, v in keys.items():
                    key = f"{k:032x}" if isinstance(k, int) else k
                    out.append((topic, key, self._unpack(v), v & _TS_MASK))
        return sorted(out)

    def __len__(self) -> int:
        return self._size
