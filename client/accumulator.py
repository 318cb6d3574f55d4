"""The producer's record accumulator: messages waiting to be sent, grouped into batches per broker
set and queue (Kafka's `RecordAccumulator`), and the buffer budget that bounds them. State only:
the sender (`client.sender`) does the I/O.

A batch's life: OPEN (records appended) → in flight (`drain`: at most one batch per queue in
flight, so a queue's batches are stored in the order they were filled, retries included) →
either done (every record resolved) or back at the head of its queue (`reenqueue`, a retry after
a backoff, or at the head of another set's queue when it moved there).

When is a queue's head batch sent (`ready`)? When it is full, when a flush or close asks, when it
has lingered `linger_ms`, or at once when its set has no request in flight (Nagle's rule: waiting
only pays while a request is on the wire to collect the next batch behind it).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from client.errors import LedgerMQError, ProducerBufferFullError
from client.message import Message


@dataclass(slots=True, eq=False)
class Record:
    """One message waiting for its result. `future` is an `asyncio.Future` (async callers) or a
    `concurrent.futures.Future` (the blocking producer's `send_async`); both resolve on the
    producer's loop."""

    topic: str
    message: Message | None  # None: a bare text body (the document says it all)
    doc: dict[str, Any]  # the produce API object; idempotencyKey once first sent, queueId when chosen
    size: int  # bytes charged to the buffer
    future: Any
    deadline: float  # time.monotonic() after which it fails
    pinned_queue: bool  # the caller chose the queue: it never moves
    pinned_set: bool  # the caller chose the broker set: it never moves
    maybe_reached: str | None = None  # the broker set an attempt may have reached
    first_unknown: LedgerMQError | None = None  # that attempt's error

    def sent_message(self) -> Message:
        """The message with the idempotency key and queue it was sent with."""
        base = self.message if self.message is not None else Message(self.doc["body"])
        return dataclasses.replace(
            base, idempotency_key=self.doc.get("idempotencyKey"), queue_id=self.doc.get("queueId")
        )


@dataclass(eq=False)
class ProducerBatch:
    """Records for one (topic, broker set, queue), sent as one request."""

    topic: str
    broker_name: str
    queue_id: int | None
    records: list[Record] = field(default_factory=list)
    size: int = 0
    created: float = field(default_factory=time.monotonic)
    attempts: int = 0
    retry_at: float = 0.0  # not sent before (backoff after a failed attempt)
    payload: bytes | None = None  # the encoded request, kept for retries
    tried: set[str] = field(default_factory=set)  # broker sets that refused it
    last_error: LedgerMQError | None = None

    @property
    def movable(self) -> bool:
        """May go to another broker set: no record pinned, none possibly stored anywhere."""
        return all(not (r.pinned_set or r.pinned_queue or r.maybe_reached) for r in self.records)


QueueKey = tuple[str, str, "int | None"]  # (topic, broker set, queue)


class RecordAccumulator:
    """Batches per (topic, broker set, queue). Callers: `append` from the producer's API (on the
    loop), `ready`/`drain`/`reenqueue`/`done` from the sender."""

    def __init__(self, batch_max_messages: int, batch_max_bytes: int, linger_ms: float) -> None:
        self.batch_max_messages = batch_max_messages
        self.batch_max_bytes = batch_max_bytes
        self.linger_s = linger_ms / 1000.0
        self.queues: dict[QueueKey, collections.deque[ProducerBatch]] = {}
        self.in_flight_queues: set[QueueKey] = set()
        self.flushing = 0  # > 0 while a flush or close waits: every batch is ready

    def append(self, topic: str, broker_name: str, queue_id: int | None, record: Record) -> bool:
        """Add `record` to the open batch of its queue (a new one when that is full). True when
        the open batch is full now (the producer then moves its sticky queue on)."""
        key = (topic, broker_name, queue_id)
        dq = self.queues.get(key)
        if dq is None:
            dq = self.queues[key] = collections.deque()
        batch = dq[-1] if dq else None
        if batch is None or batch.payload is not None or self._full(batch, record.size):
            batch = ProducerBatch(topic, broker_name, queue_id)
            dq.append(batch)
        batch.records.append(record)
        batch.size += record.size
        return self._full(batch, 0)

    def _full(self, batch: ProducerBatch, extra: int) -> bool:
        if not batch.records:
            return False
        return len(batch.records) >= self.batch_max_messages or batch.size + extra > self.batch_max_bytes

    def sets_with_data(self) -> set[str]:
        return {key[1] for key, dq in self.queues.items() if dq}

    def ready(self, broker_name: str, set_idle: bool, now: float) -> tuple[list[ProducerBatch], float | None]:
        """The head batches of `broker_name`'s queues that may be sent now (none of a queue that
        has a batch in flight), oldest first, and the earliest time another becomes ready."""
        out: list[ProducerBatch] = []
        wake: float | None = None
        for key, dq in self.queues.items():
            if key[1] != broker_name or not dq or key in self.in_flight_queues:
                continue
            batch = dq[0]
            if batch.retry_at > now:
                wake = batch.retry_at if wake is None else min(wake, batch.retry_at)
                continue
            full = len(dq) > 1 or self._full(batch, 0) or batch.size >= self.batch_max_bytes
            if full or self.flushing or set_idle or batch.attempts or now - batch.created >= self.linger_s:
                out.append(batch)
            else:
                due = batch.created + self.linger_s
                wake = due if wake is None else min(wake, due)
        out.sort(key=lambda b: b.created)
        return out, wake

    def drain(self, batch: ProducerBatch) -> None:
        """Take the head batch of its queue off for sending; its queue is muted until `done`."""
        key = (batch.topic, batch.broker_name, batch.queue_id)
        dq = self.queues[key]
        assert dq[0] is batch
        dq.popleft()
        if not dq:
            del self.queues[key]
        self.in_flight_queues.add(key)

    def done(self, batch: ProducerBatch, key: QueueKey) -> None:
        """The request of `batch`, sent from queue `key`, has ended (success or not)."""
        self.in_flight_queues.discard(key)

    def reenqueue(self, batch: ProducerBatch) -> None:
        """Put `batch` back at the head of its (possibly new) queue: it goes before the batches
        filled after it."""
        key = (batch.topic, batch.broker_name, batch.queue_id)
        dq = self.queues.get(key)
        if dq is None:
            dq = self.queues[key] = collections.deque()
        dq.appendleft(batch)

    def take_movable(self, broker_name: str) -> list[ProducerBatch]:
        """Remove and return the waiting batches of `broker_name` that may go to another set
        (oldest first): its set is failing, they need not wait behind its stuck queue."""
        out: list[ProducerBatch] = []
        for key in [k for k in self.queues if k[1] == broker_name]:
            dq = self.queues[key]
            keep = collections.deque(b for b in dq if not b.movable)
            out += [b for b in dq if b.movable]
            if keep:
                self.queues[key] = keep
            else:
                del self.queues[key]
        out.sort(key=lambda b: b.created)
        return out

    def batches(self) -> Iterator[ProducerBatch]:
        for dq in self.queues.values():
            yield from dq

    def clear(self) -> list[ProducerBatch]:
        """Every waiting batch, removed (a close that gives up)."""
        out = list(self.batches())
        self.queues.clear()
        return out


class BufferPool:
    """The bytes of records not yet resolved, at most `max_bytes`. `reserve` (async callers, on
    the loop) and `reserve_blocking` (other threads) wait for room up to `max_block_ms`, then
    raise ProducerBufferFullError; `release` runs on the loop."""

    def __init__(self, max_bytes: int, max_block_ms: float) -> None:
        self.max_bytes = max_bytes
        self.max_block_s = max_block_ms / 1000.0
        self.used = 0
        self._cond = threading.Condition(threading.Lock())
        self._async_waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._thread_waiters = 0
        self._direct = False

    def _fits(self, n: int) -> bool:
        # A record larger than the whole buffer waits for an empty buffer, then goes alone.
        return self.used + n <= self.max_bytes or self.used == 0

    def hold_if_idle(self) -> bool:
        """Whether no record is unresolved and no direct send (`Producer.send` on its caller's
        thread) is under way; if so, mark one under way until `end_direct`. A send that passes
        cannot overtake any earlier message of its producer."""
        with self._cond:
            if self.used or self._direct:
                return False
            self._direct = True
            return True

    def end_direct(self) -> None:
        with self._cond:
            self._direct = False

    def try_reserve(self, n: int) -> bool:
        with self._cond:
            if self._fits(n) and not self._async_waiters:
                self.used += n
                return True
            return False

    async def reserve(self, n: int) -> None:
        if self.try_reserve(n):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._async_waiters.append((n, fut))
        try:
            async with asyncio.timeout(self.max_block_s):
                await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return  # granted as the time ran out: keep it
            self._remove_waiter(fut)
            raise self._full_error(n) from None
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted, but the caller is gone: give it back
            else:
                self._remove_waiter(fut)
            raise

    def _remove_waiter(self, fut: asyncio.Future[None]) -> None:
        for i, (_, f) in enumerate(self._async_waiters):
            if f is fut:
                del self._async_waiters[i]
                return

    def reserve_blocking(self, n: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        with self._cond:
            self._thread_waiters += 1
            try:
                while not self._fits(n):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._full_error(n)
                    self._cond.wait(left)
                self.used += n
            finally:
                self._thread_waiters -= 1

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            while self._async_waiters:
                need, fut = self._async_waiters[0]
                if fut.done():
                    self._async_waiters.popleft()
                    continue
                if not self._fits(need):
                    break
                self._async_waiters.popleft()
                self.used += need
                fut.set_result(None)
            if self._thread_waiters:
                self._cond.notify_all()

    def _full_error(self, n: int) -> ProducerBufferFullError:
        return ProducerBufferFullError(
            f"no room for a {n}-byte message in the producer's buffer within {self.max_block_s * 1000:g} ms "
            f"({self.used} of buffer_max_bytes={self.max_bytes} bytes wait to be sent): the broker does not "
            "keep up, or is unreachable; nothing of this message was sent"
        )
