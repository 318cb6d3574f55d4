"""`ReputMessageService`: committed messages → consume queues, in log order (RocketMQ's reput).

It owns the reput offset (everything below it is dispatched), the callers waiting for it to pass
a position (`wait_dispatched`: a put answers once its own messages are indexed), and the dispatch
itself: one consume-queue unit per message, the record of a system topic applied to its state
(`SystemRecords`), an idempotency key remembered, long-polling waiters of the queue woken.

Fed by the commit log (`broker.store.base.Dispatcher`): the local log after each write, the
DLedger log through its state machine on every member. Nothing here knows which.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import re
import struct
from collections.abc import Callable
from typing import Any

from broker.errors import BrokerCode, BrokerError
from broker.message import (
    BODY_LENGTH_POSITION,
    FIXED_OVERHEAD,
    IDEMPOTENCY_MARK,
    MAX_KEY_COUNTER,
    MESSAGE_MAGIC_CODE,
    STORE_TIMESTAMP_POSITION,
    TAGS_MARK,
    DispatchInfo,
    key_sequence,
    keyed_plain_key,
    keyed_tail,
    message_id_prefix,
    parse_message,
    plain_tail_signature,
    topic_name,
    unpack_host,
)
from broker.store.base import DispatchHook, TopicQueueTable
from broker.store.consume_queue import ConsumeQueue
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.long_polling import LongPollingService
from broker.store.offsets import IdempotencyTable
from broker.store.system_state import SystemRecords
from broker.topics import TopicConfigManager

log = logging.getLogger("broker.store.message_store")

# The header fields dispatch_packed checks: total size, magic, queue id, queue offset, physical
# offset, body length (offsets 0, 4, 12, 20, 28, 84 of broker.message.HEAD).
_RUN_HEAD = struct.Struct(">ii4xi4xqq48xi")
_STORE_STAMP = struct.Struct(">q8s")  # store timestamp, store host (IPv4, port: a msgId's first 8 bytes)
_STORE_STAMP_SIZE = _STORE_STAMP.size
_MAX_STALE_WAITERS = 4096


def _expire_waiter(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(BrokerError(BrokerCode.TIMEOUT, "committed record was not dispatched in time",
                                      outcome="committed"))


class _KeyRunInProgress:
    """A key run being dispatched: its head (the message carrying IDEMPOTENCY_KEY_RUN) is in, and
    the next `remaining` messages of its queue — at the next queue offsets, stored at the same
    instant (one put stamps one store timestamp) and dispatched in the same entry or feed (the
    put cut its runs at its entries) — carry the next keys. Remembered as one entry once complete,
    or as far as it got when a message, or the end of the entry or feed, breaks it."""

    __slots__ = ("first", "first_queue_offset", "host", "next_queue_offset", "prefix", "queue_id",
                 "remaining", "topic", "ts", "units")

    def __init__(self, info: DispatchInfo, prefix: str, first: int) -> None:
        self.topic = info.topic
        self.queue_id = info.queue_id
        self.prefix = prefix
        self.first = first
        self.ts = info.store_timestamp
        self.host = bytes.fromhex(message_id_prefix(info.store_host))
        self.first_queue_offset = info.queue_offset
        self.units = [(info.phys_offset, info.size)]
        self.next_queue_offset = info.queue_offset + 1
        self.remaining = info.key_run - 1

    def take(self, topic: str, queue_id: int, queue_offset: int, store_ts: int,
             units: list[tuple[int, int]]) -> int:
        """How many of `units` (messages of `topic`/`queue_id` from `queue_offset` on, in log
        order, stored at `store_ts`) continue the run; they are added."""
        if queue_offset != self.next_queue_offset or store_ts != self.ts or queue_id != self.queue_id \
                or topic != self.topic:
            return 0
        n = min(len(units), self.remaining)
        self.units += units if n == len(units) else units[:n]
        self.remaining -= n
        self.next_queue_offset += n
        return n


class ReputMessageService:
    """The dispatcher (a `broker.store.base.Dispatcher`). Callers: the commit log (`dispatch*`),
    the put path (`wait_dispatched`), the store's start and flush (`reput_offset`)."""

    def __init__(self, queues: ConsumeQueueStore, topics: TopicConfigManager, system: SystemRecords,
                 idempotency: IdempotencyTable, long_polling: LongPollingService,
                 topic_queue_table: TopicQueueTable) -> None:
        self.queues = queues
        self.topics = topics
        self.system = system
        self.idempotency = idempotency
        self.long_polling = long_polling
        self.topic_queue_table = topic_queue_table
        # Read once per message: the structures themselves (no method call on the hot path).
        self._queue_map = queues.queues
        self._system_topics = system.topics
        self._poll_waiting = long_polling.waiting
        # topic -> the broker service that indexes its messages (timer queue, half topic)
        self.hooks: dict[str, DispatchHook] = {}
        self.reput_offset = 0  # everything below this commit-log offset is dispatched
        self.recovered_end = 0  # end of the furthest consume queue at start (all of it committed)
        # Puts/records waiting for the dispatcher to pass their end: a min-heap on the commit-log
        # end position, popped as reput_offset advances (no per-put polling, no list scans).
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_seq = itertools.count()
        # The same for plain callbacks (`when_dispatched`): no future, no timer.
        self._callbacks: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._key_run: _KeyRunInProgress | None = None

    @property
    def readable_end(self) -> int:
        return max(self.reput_offset, self.recovered_end)

    def skip_to(self, pos: int) -> None:
        self.reput_offset = max(self.reput_offset, pos)

    # ---- waiting for dispatch -------------------------------------------------------------------

    async def wait_dispatched(self, phys_end: int, timeout_s: float = 10.0) -> None:
        """Return once the dispatcher has passed commit-log position `phys_end`; TIMEOUT
        (outcome committed) after `timeout_s`. One future and one timer handle per call."""
        if self.reput_offset >= phys_end:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiters, (phys_end, next(self._waiter_seq), fut))
        timer = loop.call_later(timeout_s, _expire_waiter, fut)
        try:
            await fut
        finally:
            timer.cancel()

    @property
    def callbacks_waiting(self) -> int:
        """`when_dispatched` callbacks not called yet."""
        return len(self._callbacks)

    def when_dispatched(self, phys_end: int, callback: Callable[[Any], None], arg: Any) -> None:
        """Call `callback(arg)` once the dispatcher has passed `phys_end` (at once if it has), or
        when the store stops."""
        if self.reput_offset >= phys_end:
            callback(arg)
            return
        heapq.heappush(self._callbacks, (phys_end, next(self._waiter_seq), callback, arg))

    def dispatch_done(self) -> None:
        """After a batch of dispatches (a feed): release `wait_dispatched` callers that are
        covered. A key run never continues into the next feed."""
        if self._key_run is not None:
            self.end_key_run()
        reput = self.reput_offset
        callbacks = self._callbacks
        while callbacks and callbacks[0][0] <= reput:
            _, _, callback, arg = heapq.heappop(callbacks)
            callback(arg)
        heap = self._waiters
        while heap and heap[0][0] <= reput:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        if len(heap) > _MAX_STALE_WAITERS:  # waiters that timed out while dispatch was stuck: drop them
            self._waiters = [w for w in heap if not w[2].done()]
            heapq.heapify(self._waiters)

    def fail_waiters(self, error: BrokerError) -> None:
        """The store is stopping: every waiter gets `error`, every `when_dispatched` callback runs."""
        for _, _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(error)
        self._waiters.clear()
        callbacks, self._callbacks = self._callbacks, []
        for _, _, callback, arg in callbacks:
            callback(arg)

    # ---- dispatching ----------------------------------------------------------------------------

    def dispatch(self, data: memoryview | bytes, phys: int) -> bool:
        """Dispatch one committed message (in log order) whose bytes start at `phys`. False if it
        was skipped: already dispatched, unreadable, or of a deleted incarnation of its topic."""
        if phys < self.reput_offset:
            return False  # already dispatched (replay after restart)
        try:
            head, topic_at, props_at = parse_message(data, phys, check_crc=False)
        except BrokerError as exc:
            log.error("event=dispatch_skipped phys=%d reason=%s", phys, exc.detail)
            self.reput_offset = phys + max(len(data), 1)
            return False
        size = head.total_size
        queue_id = head.queue_id
        queue_offset = head.queue_offset
        topic = topic_name(bytes(data[topic_at + 1:props_at]))
        if phys < self.topics.deleted_at.get(topic, -1):
            self.reput_offset = phys + size  # stored before the topic was deleted: not re-indexed
            return False
        if head.physical_offset != phys:
            log.error("event=phys_offset_mismatch stored=%d actual=%d topic=%s", head.physical_offset, phys,
                      topic)
        props_raw = bytes(data[props_at + 2:size])
        info = None
        tags_code = 0
        hook = self.hooks.get(topic)
        if hook is not None or TAGS_MARK in props_raw or IDEMPOTENCY_MARK in props_raw:  # else: none there
            info = DispatchInfo(topic, queue_id, queue_offset, head.physical_offset, size,
                                head.store_timestamp, unpack_host(head.store_ip, head.store_port), props_raw)
            if hook is not None:
                info.tags_code = hook.tags_code(info)  # the hook's on_unit reads it back
            tags_code = info.tags_code
        self.topics.ensure_from_data(topic, queue_id)
        key = (topic, queue_id)
        cq = self._queue_map.get(key)
        if cq is None:
            cq = self.queues.create(topic, queue_id)
        written = cq.put_unit(queue_offset, phys, size, tags_code)
        table = self.topic_queue_table
        if table.get(key, 0) <= queue_offset:  # see _advance_table
            table[key] = queue_offset + 1
        if written and topic in self._system_topics:  # a unit already present was applied at start
            self.system.apply(topic, phys, data)
        if written and hook is not None:
            assert info is not None
            hook.on_unit(info)
        if info is not None:
            if info.idempotency_key or self._key_run is not None:
                self.remember_idempotency(info)
        elif self._key_run is not None:
            self._continue_key_run(topic, queue_id, queue_offset, head.store_timestamp, [(phys, size)])
        self.reput_offset = phys + size
        if self._poll_waiting:
            self.long_polling.notify(key)
        return True

    def _advance_table(self, key: tuple[str, int], next_qoff: int) -> None:
        # A slave's table follows what it dispatches (a master's is already ahead: it assigns
        # offsets as it writes), so the table is right whenever this member becomes master —
        # and after a restart that re-dispatched a tail the consume queues had lost.
        table = self.topic_queue_table
        if table.get(key, 0) < next_qoff:
            table[key] = next_qoff

    def dispatch_packed(self, data: memoryview | bytes, base: int) -> None:
        """Dispatch, in order, the messages stored back to back in `data` (one committed DLedger
        entry body), the first at commit-log position `base`.

        The bulk of a produced batch takes a short path: a message of the same topic and queue as
        the one before it, with the next queue offset and no property but its UNIQ_KEY, gets its
        layout checked by one comparison and one consume-queue unit (a fifth of what `dispatch`
        costs). One whose only other property is an IDEMPOTENCY_KEY (what the SDK sends) gets its
        layout checked by one comparison too once the run has seen a key of that length, its key
        read, and its key remembered with those of its run stored at the same instant by the same
        host (`IdempotencyTable.remember_run`). The first message of each run, and every other
        message, goes through `dispatch`."""
        end = len(data)
        off = 0
        unpack_head = _RUN_HEAD.unpack_from
        run_sig = b""  # plain_tail_signature of the current run's topic; b"": no run
        run_topic_f = b""  # the run's topic field as stored
        run_tail = run_qid = first_qoff = next_qoff = sig_len = -1
        run_cq: ConsumeQueue | None = None
        units: list[tuple[int, int]] = []
        # The run's keyed shape (keyed_tail: its `fullmatch`, None until the run has a key); and
        # the run's keys so far that share a store stamp (timestamp and host: `key_stamp`), with
        # their unit indexes.
        key_match: Callable[[Any, int, int], re.Match[bytes] | None] | None = None
        key_stamp = b""
        keys: list[bytes] = []
        key_units: list[int] = []
        while end - off >= FIXED_OVERHEAD:
            phys = base + off
            total, magic, queue_id, queue_offset, stored_phys, body_len = unpack_head(data, off)
            msg_end = off + total
            if magic != MESSAGE_MAGIC_CODE or total < FIXED_OVERHEAD or msg_end > end:
                self._end_run(run_cq, first_qoff, units, key_stamp, keys, key_units)
                log.error("event=dispatch_skipped phys=%d reason=no message at this position of the entry "
                          "at %d (magic %#010x, size %d)", phys, base, magic & 0xFFFFFFFF, total)
                self.reput_offset = max(self.reput_offset, base + end)
                return
            if phys < self.reput_offset:
                off = msg_end  # already dispatched (replay after restart)
                continue
            topic_at = off + BODY_LENGTH_POSITION + 4 + body_len
            if queue_offset == next_qoff and queue_id == run_qid and stored_phys == phys and body_len >= 0:
                if msg_end - topic_at == run_tail and data[topic_at:topic_at + sig_len] == run_sig:
                    units.append((phys, total))
                    next_qoff += 1
                    off = msg_end
                    continue
                if key_match is not None and (found := key_match(data, topic_at, msg_end)) is not None:
                    key = found[1]
                else:
                    key = keyed_plain_key(data, topic_at, msg_end, run_topic_f)
                    if key is not None:
                        key_match = keyed_tail(run_topic_f, len(key)).fullmatch
                if key is not None:  # the SDK's shape: the same, plus an idempotency key
                    at = off + STORE_TIMESTAMP_POSITION
                    if data[at:at + _STORE_STAMP_SIZE] != key_stamp:
                        self._remember_keys(run_cq, first_qoff, units, key_stamp, keys, key_units)
                        key_stamp, keys, key_units = bytes(data[at:at + _STORE_STAMP_SIZE]), [], []
                    keys.append(key)
                    key_units.append(len(units))
                    units.append((phys, total))
                    next_qoff += 1
                    off = msg_end
                    continue
            self._end_run(run_cq, first_qoff, units, key_stamp, keys, key_units)
            run_sig, run_cq, units, next_qoff, key_match = b"", None, [], -1, None
            key_stamp, keys, key_units = b"", [], []
            if self.dispatch(data[off:msg_end], phys) and body_len >= 0:
                raw = bytes(data[topic_at + 1:topic_at + 1 + data[topic_at]])
                topic = topic_name(raw)
                run_cq = self._queue_map.get((topic, queue_id))
                if run_cq is not None and topic not in self._system_topics and topic not in self.hooks:
                    run_sig, run_tail = plain_tail_signature(raw)
                    sig_len = len(run_sig)
                    run_topic_f = run_sig[:1 + len(raw)]
                    run_qid = queue_id
                    first_qoff = next_qoff = queue_offset + 1
            off = msg_end
        self._end_run(run_cq, first_qoff, units, key_stamp, keys, key_units)
        if self._key_run is not None:  # a key run never spans entries
            self.end_key_run()
        # Long polls: `dispatch` woke a run's waiters at its first message; they run after this
        # synchronous loop and read the whole run.

    def _end_run(self, cq: ConsumeQueue | None, first_qoff: int, units: list[tuple[int, int]],
                 key_stamp: bytes, keys: list[bytes], key_units: list[int]) -> None:
        if cq is None or not units:
            return
        cq.put_units(first_qoff, units)
        self._advance_table((cq.topic, cq.queue_id), first_qoff + len(units))
        self._remember_keys(cq, first_qoff, units, key_stamp, keys, key_units)
        if self._key_run is not None:  # started in this entry: the same put, the same store timestamp
            self._continue_key_run(cq.topic, cq.queue_id, first_qoff, self._key_run.ts, units)
        phys, size = units[-1]
        self.reput_offset = phys + size

    def _remember_keys(self, cq: ConsumeQueue | None, first_qoff: int, units: list[tuple[int, int]],
                       key_stamp: bytes, keys: list[bytes], key_units: list[int]) -> None:
        if keys and cq is not None:
            ts, host = _STORE_STAMP.unpack(key_stamp)
            self.idempotency.remember_run(cq.topic, cq.queue_id, ts, host, keys, first_qoff, units, key_units)

    def remember_idempotency(self, info: DispatchInfo) -> None:
        """Remember the idempotency key of a dispatched message (in log order): its own, the
        first of the key run it heads, or the next one of the run it continues."""
        key = info.idempotency_key
        if self._key_run is not None:
            if not key and self._continue_key_run(info.topic, info.queue_id, info.queue_offset,
                                                  info.store_timestamp, [(info.phys_offset, info.size)]):
                return
            self.end_key_run()
        if not key:
            return
        if info.key_run > 0 and (seq := key_sequence(key)) is not None \
                and seq[1] + info.key_run - 1 <= MAX_KEY_COUNTER:
            self._key_run = _KeyRunInProgress(info, *seq)
            if self._key_run.remaining == 0:
                self.end_key_run()
            return
        self.idempotency.remember_stored(info.topic, key.encode("utf-8", "surrogatepass"),
                                         bytes.fromhex(message_id_prefix(info.store_host)), info.queue_id,
                                         info.queue_offset, info.phys_offset, info.size, info.store_timestamp)

    def _continue_key_run(self, topic: str, queue_id: int, queue_offset: int, store_ts: int,
                          units: list[tuple[int, int]]) -> bool:
        """Add what continues the key run in progress; end it if complete or broken. True if
        all of `units` belonged to it."""
        run = self._key_run
        assert run is not None
        taken = run.take(topic, queue_id, queue_offset, store_ts, units)
        if run.remaining == 0 or taken < len(units):
            self.end_key_run()
        return taken == len(units)

    def end_key_run(self) -> None:
        """Remember the key run in progress as far as it got (a short one is logged: its put
        wrote every message of it into one entry, so only a cut log ends one early)."""
        run, self._key_run = self._key_run, None
        if run is None:
            return
        if run.remaining:
            log.warning("event=key_run_cut topic=%s queueId=%d queueOffset=%d missing=%d", run.topic,
                        run.queue_id, run.first_queue_offset, run.remaining)
        self.idempotency.remember_key_run(run.topic, run.queue_id, run.ts, run.host, run.prefix, run.first,
                                          run.first_queue_offset, run.units)

