"""Replicated broker state kept as records in the commit log itself.

`ConsumerOffsetManager`: committed consumer-group offsets. A commit is written as a record into the
system topic `RMQ_SYS_CONSUMER_OFFSETS` (through the message store, so in DLedger mode it is
replicated and committed on a majority before the call returns) and applied when the reput
dispatcher feeds the record back — on every member, in log order. At start the table is rebuilt by
replaying that topic's consume queue. So committed offsets survive a master failover.

`IdempotencyTable`: idempotency key → the first put's result, for `idempotencyWindowMs`. Built from
the IDEMPOTENCY_KEY property of dispatched messages (no extra record), so it is the same on every
member and is rebuilt by replay, and a retry after a failover still finds the first result. A run
of sequenced keys (one prefix, consecutive counters: what the SDK gives a batch) is one entry.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from array import array
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Iterable
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.message import key_sequence, sequenced_key
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


# A held result in 30 bytes (a 63-byte object, the allocator's 64-byte class): the store timestamp
# (ms, 48 bits) with the index of the store host in the table's interned hosts above it (the msgId's
# first 16 hex digits), the commit-log offset, the queue offset, the size, the queue id.
_RESULT = struct.Struct("<QQQIH")
_TS_MASK = (1 << 48) - 1
_MAX_HOSTS = 1 << 16


class _KeyRun:
    """The first results of the keys `prefix` + `first`..`last` (one put, one queue, one instant,
    one host): message j at queue offset `first_queue_offset + j`, commit-log offset `phys[j]`,
    size `sizes[j]` — 12 bytes a key instead of a dict entry and a packed result."""

    __slots__ = ("first", "first_queue_offset", "last", "phys", "queue_id", "sizes", "stamp")

    def __init__(self, first: int, stamp: int, queue_id: int, first_queue_offset: int,
                 units: list[tuple[int, int]]) -> None:
        self.first = first
        self.last = first + len(units) - 1
        self.stamp = stamp
        self.queue_id = queue_id
        self.first_queue_offset = first_queue_offset
        self.phys = array("Q", map(itemgetter(0), units))
        self.sizes = array("I", map(itemgetter(1), units))


class _PrefixRuns:
    """One prefix's runs in a bucket, sorted by first counter and never overlapping, so the only
    run that can hold a counter is the last one starting at or before it (`firsts` is bisected)."""

    __slots__ = ("firsts", "runs")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.runs: list[_KeyRun] = []

    def add(self, run: _KeyRun) -> None:
        if not self.runs or run.first > self.runs[-1].last:  # a producer's counters grow: appended
            self.firsts.append(run.first)
            self.runs.append(run)
            return
        i = bisect_right(self.firsts, run.first)
        self.firsts.insert(i, run.first)
        self.runs.insert(i, run)

    def overlapping(self, first: int, last: int) -> list[_KeyRun]:
        """The runs holding a counter in `first`..`last`."""
        out = []
        i = bisect_right(self.firsts, last) - 1
        runs = self.runs
        while i >= 0 and runs[i].last >= first:
            out.append(runs[i])
            i -= 1
        return out


class _Bucket:
    """Keys first remembered over one stretch of time: {topic: {key: packed result}} and
    {topic: {prefix: runs of sequenced keys}}, and the newest store timestamp among them (the
    bucket is dropped whole once that is past the window)."""

    __slots__ = ("count", "keys", "newest_ms", "runs", "start_ms")

    def __init__(self, start_ms: int) -> None:
        self.start_ms = start_ms
        self.newest_ms = start_ms
        self.count = 0
        self.keys: dict[str, dict[bytes, bytes]] = {}
        self.runs: dict[str, dict[str, _PrefixRuns]] = {}


class IdempotencyTable:
    """(topic, idempotency key) → the first put's `PutResult`, kept for `window_ms` and for at most
    `max_keys` keys (the oldest go first beyond that, counted in `evicted`).

    Sized and timed for the SDK, which puts a key on every message: at 5,000 msgs/s a 5-minute
    window is 1.5 million keys on every member, each looked up by the put and remembered by every
    member's dispatcher. Keys live in buckets nested by topic (no tuple per key); a bucket covers
    1/8 of the window and at most 1/4 of `max_keys`, and is always dropped whole: once its newest
    key is older than the window, or as the oldest when the table is full (so no dict is ever left
    holding the holes of deleted keys). A key is held as its UTF-8 bytes — what the dispatcher
    reads from the log, with no conversion — and a result as one packed `_RESULT` (the store host
    interned). A lookup probes the topic's buckets, newest first, so buckets are few and large;
    the put and the dispatcher look up and remember a whole batch per call. A run of sequenced
    keys (what the SDK gives a batch: `key_sequence`) is held as one `_KeyRun` per bucket, found
    by one bisect per bucket, and costs 12 bytes a key.
    Callers: the put (`first_results`, `run_first_results`), the dispatchers and recovery
    (`remember_run`, `remember_stored`, `remember_key_run`), lookups by id (`get`)."""

    BUCKETS_PER_WINDOW = 8
    BUCKETS_PER_MAX_KEYS = 4

    def __init__(self, window_ms: int, max_keys: int = 1_000_000) -> None:
        self.window_ms = window_ms
        self.max_keys = max_keys
        self.evicted = 0
        self._bucket_ms = max(1, window_ms // self.BUCKETS_PER_WINDOW)
        self._bucket_keys = max(1, max_keys // self.BUCKETS_PER_MAX_KEYS)
        self._buckets: list[_Bucket] = []  # oldest first
        self._size = 0
        self._hosts: list[str] = []  # interned store hosts, as msgId prefixes
        self._host_ids: dict[bytes, int] = {}
        self._last_evict_log = 0.0

    def _held(self, topic: str) -> list[dict[bytes, bytes]]:
        """The topic's keys in each bucket, newest first (a retry is usually recent)."""
        return [keys for b in reversed(self._buckets) if (keys := b.keys.get(topic)) is not None]

    def _held_runs(self, topic: str) -> list[dict[str, _PrefixRuns]]:
        """The topic's runs of sequenced keys in each bucket, newest first."""
        return [runs for b in reversed(self._buckets) if (runs := b.runs.get(topic)) is not None]

    def _runs_holding(self, topic: str, prefix: str, first: int, last: int) -> list[_KeyRun]:
        """The runs of `topic` holding a key `prefix` + a counter in `first`..`last`."""
        out: list[_KeyRun] = []
        for runs in self._held_runs(topic):
            prefix_runs = runs.get(prefix)
            if prefix_runs is not None:
                out += prefix_runs.overlapping(first, last)
        return out

    def get(self, topic: str, key: str, now_ms: int | None = None) -> PutResult | None:
        """The first result of `key` on `topic`, if it was stored within the window."""
        k = key.encode("utf-8", "surrogatepass")
        for keys in self._held(topic):
            packed = keys.get(k)
            if packed is not None:
                return self._result(packed, now_ms)
        seq = key_sequence(key)
        if seq is not None:
            for run in self._runs_holding(topic, seq[0], seq[1], seq[1]):
                return self._run_result(run, seq[1] - run.first, now_ms)
        return None

    def first_results(self, topic: str, keys: list[str]) -> dict[int, PutResult] | None:
        """{i: first result} for the `keys[i]` stored within the window; None when there is none
        (a put's new keys, the common case)."""
        hits = self._key_hits(topic, keys)
        if self._held_runs(topic):  # a sequenced key may be held in a run
            for i, key in enumerate(keys):
                seq = key_sequence(key) if hits is None or i not in hits else None
                if seq is None:
                    continue
                for run in self._runs_holding(topic, seq[0], seq[1], seq[1]):
                    result = self._run_result(run, seq[1] - run.first, None)
                    if result is not None:
                        if hits is None:
                            hits = {}
                        hits[i] = result
        return hits

    def run_first_results(self, topic: str, prefix: str, first: int, n: int) -> dict[int, PutResult] | None:
        """`first_results` of the `n` sequenced keys `prefix` + `first`, `first` + 1, … (a put's
        run): one probe per bucket, and the keys are made only if the topic holds keys one by one."""
        last = first + n - 1
        hits = None
        for run in self._runs_holding(topic, prefix, first, last):
            for counter in range(max(first, run.first), min(last, run.last) + 1):
                result = self._run_result(run, counter - run.first, None)
                if result is not None:
                    if hits is None:
                        hits = {}
                    hits[counter - first] = result
        if self._held(topic):
            one_by_one = self._key_hits(topic, [sequenced_key(prefix, c) for c in range(first, last + 1)])
            if one_by_one:
                hits = one_by_one if hits is None else {**one_by_one, **hits}
        return hits

    def _key_hits(self, topic: str, keys: list[str]) -> dict[int, PutResult] | None:
        """`first_results` among the keys held one by one."""
        held = self._held(topic)
        if not held:
            return None
        try:
            encoded = list(map(str.encode, keys))
        except UnicodeEncodeError:  # a lone surrogate (JSON can carry one): kept, not refused
            encoded = [key.encode("utf-8", "surrogatepass") for key in keys]
        # New keys, the common case: each bucket probed for the whole batch in one C loop.
        if all(bucket_keys.keys().isdisjoint(encoded) for bucket_keys in held):
            return None
        hits = None
        for i, k in enumerate(encoded):
            for bucket_keys in held:
                packed = bucket_keys.get(k)
                if packed is not None:
                    result = self._result(packed, None)
                    if result is not None:
                        if hits is None:
                            hits = {}
                        hits[i] = result
                    break
        return hits

    def remember(self, topic: str, key: str, result: PutResult, store_ts_ms: int) -> None:
        """Record the first result of a key (a later duplicate in the log never overwrites it)."""
        # msgId = store host (16 hex digits) + the commit-log offset, as `create_message_id` makes
        # it: the host is interned, the offset is not stored twice.
        self.remember_stored(topic, key.encode("utf-8", "surrogatepass"), bytes.fromhex(result.msg_id[:16]),
                             result.queue_id, result.queue_offset, result.commit_log_offset,
                             result.store_size, store_ts_ms)

    def remember_stored(self, topic: str, key: bytes, host: bytes, queue_id: int, queue_offset: int,
                        phys: int, size: int, store_ts_ms: int) -> None:
        """`remember` from a stored message's fields (what the dispatcher has: no PutResult or
        msgId is built): `key` its UTF-8, `host` the store host's 8 bytes (IPv4, port)."""
        self.remember_run(topic, queue_id, store_ts_ms, host, [key], queue_offset, [(phys, size)], [0])

    def remember_run(self, topic: str, queue_id: int, store_ts_ms: int, host: bytes, keys: list[bytes],
                     first_queue_offset: int, units: list[tuple[int, int]], at: list[int]) -> None:
        """`remember_stored` for keyed messages of one dispatched run of a queue, in log order,
        stored at one instant by one host: `keys[i]` is the message stored as `units[at[i]]`
        (commit-log offset, size) at queue offset `first_queue_offset + at[i]`. The per-message
        work is the probes and an insert; the rest is done once."""
        if self.window_ms <= 0:
            return
        hid = self._host_ids.get(host)
        if hid is None:
            hid = self._host_id(host)
        bucket = self._bucket_at(store_ts_ms)
        held = self._held(topic)  # after any expiry
        into = bucket.keys.get(topic)
        if into is None:
            into = bucket.keys[topic] = {}
            held.insert(0, into)
        stamp = (store_ts_ms & _TS_MASK) | hid << 48
        room = self._bucket_keys - bucket.count
        pack = _RESULT.pack
        n = len(keys)
        if n <= room and all(bucket_keys.keys().isdisjoint(keys) for bucket_keys in held):
            # New keys that fit the bucket, the common case: probed and inserted in C loops. In
            # reverse, so a key twice in the run keeps its first result.
            if len(at) != n:
                raise ValueError(f"{n} keys for {len(at)} positions")
            if len(units) == n:  # every message of the run keyed: `at` is 0..n-1
                runs = units
                queue_offsets: Iterable[int] = range(first_queue_offset, first_queue_offset + n)
            else:
                runs = [units[j] for j in at]
                queue_offsets = [first_queue_offset + j for j in at]
            before = len(into)
            into.update(zip(reversed(keys), reversed(list(map(
                pack, repeat(stamp), map(itemgetter(0), runs), queue_offsets, map(itemgetter(1), runs),
                repeat(queue_id),
            ))), strict=True))
            added = len(into) - before
            bucket.count += added
            self._size += added
            while self._size > self.max_keys:
                self._evict_oldest()
            return
        added = 0
        for key, j in zip(keys, at, strict=True):
            for bucket_keys in held:
                if key in bucket_keys:
                    break
            else:
                if added == room:  # the bucket is full: the rest go to a new one
                    bucket.count += added
                    self._size += added
                    bucket = self._new_bucket(store_ts_ms)
                    into = bucket.keys[topic] = {}
                    held = self._held(topic)
                    room, added = self._bucket_keys, 0
                phys, size = units[j]
                into[key] = pack(stamp, phys, first_queue_offset + j, size, queue_id)
                added += 1
        bucket.count += added
        self._size += added
        while self._size > self.max_keys:
            self._evict_oldest()

    def remember_key_run(self, topic: str, queue_id: int, store_ts_ms: int, host: bytes, prefix: str,
                         first: int, first_queue_offset: int, units: list[tuple[int, int]]) -> None:
        """Record the first results of the sequenced keys `prefix` + `first`, `first` + 1, … of
        messages stored as `units` (commit-log offset, size) at queue offsets
        `first_queue_offset`, … by `host` at `store_ts_ms` (what the dispatcher reads off a run's
        head). A key held already keeps its first result; the others are one entry (a few if the
        run fills the bucket or straddles held keys)."""
        n = len(units)
        if self.window_ms <= 0 or n == 0:
            return
        hid = self._host_ids.get(host)
        if hid is None:
            hid = self._host_id(host)
        bucket = self._bucket_at(store_ts_ms)
        held = self._held_indexes(topic, prefix, first, n)  # after any expiry
        stamp = (store_ts_ms & _TS_MASK) | hid << 48
        start = 0
        while start < n:
            if held is not None:
                while start < n and start in held:
                    start += 1
                end = start
                while end < n and end not in held:
                    end += 1
            else:
                end = n
            while start < end:  # the new keys from `start` to `end`, as many entries as buckets
                room = self._bucket_keys - bucket.count
                if room <= 0:
                    bucket = self._new_bucket(store_ts_ms)
                    continue
                stop = min(end, start + room)
                runs = bucket.runs.get(topic)
                if runs is None:
                    runs = bucket.runs[topic] = {}
                prefix_runs = runs.get(prefix)
                if prefix_runs is None:
                    prefix_runs = runs[prefix] = _PrefixRuns()
                prefix_runs.add(_KeyRun(first + start, stamp, queue_id, first_queue_offset + start,
                                        units[start:stop]))
                bucket.count += stop - start
                self._size += stop - start
                start = stop
        while self._size > self.max_keys:
            self._evict_oldest()

    def _held_indexes(self, topic: str, prefix: str, first: int, n: int) -> set[int] | None:
        """Which of the keys `prefix` + `first` … `first` + n - 1 the table holds (in or past the
        window: a key's first result stays until its bucket goes); None for none."""
        last = first + n - 1
        held: set[int] = set()
        for run in self._runs_holding(topic, prefix, first, last):
            held.update(range(max(first, run.first) - first, min(last, run.last) - first + 1))
        one_by_one = self._held(topic)
        if one_by_one:
            for i in range(n):
                k = sequenced_key(prefix, first + i).encode()
                if any(k in keys for keys in one_by_one):
                    held.add(i)
        return held or None

    def _bucket_at(self, store_ts_ms: int) -> _Bucket:
        """The bucket for keys stored at `store_ts_ms`: the newest one, or a new one past its time."""
        bucket = self._buckets[-1] if self._buckets else None
        if bucket is not None and store_ts_ms < bucket.start_ms + self._bucket_ms:
            if store_ts_ms > bucket.newest_ms:
                bucket.newest_ms = store_ts_ms
            return bucket
        return self._new_bucket(store_ts_ms)

    def _host_id(self, host: bytes) -> int:
        if len(self._hosts) == _MAX_HOSTS:  # a set's store hosts are its members: never in practice
            log.warning("event=idempotency_hosts_reset hosts=%d", len(self._hosts))
            self.evicted += self._size
            self._buckets, self._size = [], 0
            self._hosts, self._host_ids = [], {}
        hid = self._host_ids[host] = len(self._hosts)
        self._hosts.append(host.hex().upper())
        return hid

    def _result(self, packed: bytes, now_ms: int | None) -> PutResult | None:
        stamp, phys, queue_offset, size, queue_id = _RESULT.unpack(packed)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if now_ms - (stamp & _TS_MASK) > self.window_ms:
            return None
        return PutResult(f"{self._hosts[stamp >> 48]}{phys:016X}", queue_id, queue_offset, phys, size)

    def _run_result(self, run: _KeyRun, j: int, now_ms: int | None) -> PutResult | None:
        stamp = run.stamp
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if now_ms - (stamp & _TS_MASK) > self.window_ms:
            return None
        phys = run.phys[j]
        return PutResult(f"{self._hosts[stamp >> 48]}{phys:016X}", run.queue_id, run.first_queue_offset + j,
                         phys, run.sizes[j])

    def _new_bucket(self, start_ms: int) -> _Bucket:
        bucket = _Bucket(start_ms)
        self._buckets.append(bucket)
        # Whole buckets whose newest key is older than the window (replay at start may insert
        # out of time order, so every bucket is checked; there are few).
        limit = start_ms - self.window_ms
        live = [b for b in self._buckets if b.newest_ms >= limit]
        if len(live) != len(self._buckets):
            self._size -= sum(b.count for b in self._buckets if b.newest_ms < limit)
            self._buckets = live
        return bucket

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
                    stamp, phys, queue_offset, size, queue_id = _RESULT.unpack(v)
                    result = PutResult(f"{self._hosts[stamp >> 48]}{phys:016X}", queue_id, queue_offset,
                                       phys, size)
                    out.append((topic, k.decode("utf-8", "surrogatepass"), result, stamp & _TS_MASK))
            for topic, runs in bucket.runs.items():
                for prefix, prefix_runs in runs.items():
                    for run in prefix_runs.runs:
                        for j in range(run.last - run.first + 1):
                            ts = run.stamp & _TS_MASK
                            result = self._run_result(run, j, ts)
                            assert result is not None
                            out.append((topic, sequenced_key(prefix, run.first + j), result, ts))
        return sorted(out)

    def __len__(self) -> int:
        return self._size
