"""The producer's sender: takes ready batches off the accumulator and sends them, at most
`max_in_flight` requests per broker set and one batch per queue, each on its own connection
(Kafka's `Sender`, aiokafka's sender routine). One task on the producer's loop decides what to
send; each request runs in a task of its own and resolves its records' futures.

A failed attempt is classified as in `client.outcome`: the records of a batch that may have
reached a set remember that set (and are then never sent anywhere else: their final error is
`SendOutcomeUnknownError`); a batch that its set refused definitively moves to another set while
none of its records may be stored anywhere; otherwise it goes back to the head of its queue and
is retried after a backoff (100 ms doubling to 1 s, 20 % jitter, Kafka's defaults) until its
records' `send_timeout_s` has passed. A 4xx naming one message (`messages[i]`) fails that record
only; the rest of its batch is sent again at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

import orjson

from client.accumulator import BufferPool, ProducerBatch, Record, RecordAccumulator
from client.errors import (
    BadRequestError,
    BrokerUnreachableError,
    LedgerMQError,
    NotMasterError,
    OutcomeUnknownError,
    SendOutcomeUnknownError,
    SendTimeoutError,
    ServerError,
)
from client.fault import LatencyFaultTolerance
from client.loop import resume_at_loop_end
from client.message import KeyGenerator, SendResult
from client.outcome import Delivery, delivery_of
from client.transport import AsyncTransport, BrokerSetRoute, RouteCache, base_url, decode_answer, seg

log = logging.getLogger(__name__)

RETRY_BACKOFF_MS = 100
RETRY_BACKOFF_MAX_MS = 1000
# A produce request unanswered this long has its set's master looked up again (and as often
# after): when the set elected another master meanwhile (the old one hung, or is cut off), the
# request is given up and its batch retried there at once, instead of waiting out
# `request_timeout_s` against a master that can no longer store it.
MASTER_WATCH_S = 1.0
_JSON = {"Content-Type": "application/json"}
_MESSAGE_FIELD = re.compile(r"^messages\[(\d+)\]")


def refused_by_set(exc: LedgerMQError) -> bool:
    """The set as a whole cannot take writes now, and said so before storing anything: no
    connection to its master, no master known, a refusal such as DISK_FULL."""
    if isinstance(exc, BrokerUnreachableError):
        return True
    if isinstance(exc, NotMasterError):
        return not exc.master_addr
    return isinstance(exc, ServerError) and delivery_of(exc) is Delivery.REFUSED


def backoff_s(attempts: int) -> float:
    base = min(RETRY_BACKOFF_MS * 2 ** max(0, attempts - 1), RETRY_BACKOFF_MAX_MS) / 1000.0
    return base * random.uniform(0.8, 1.2)


class Sender:
    """Sends the accumulator's batches. Callers: the producer (`start`, `wakeup` after appends,
    `flush`, `close`); everything else runs on its own tasks."""

    def __init__(
        self,
        *,
        transport: AsyncTransport,
        routes: RouteCache,
        fault: LatencyFaultTolerance,
        accumulator: RecordAccumulator,
        pool: BufferPool,
        choose_set: Callable[[list[BrokerSetRoute], str, set[str]], tuple[BrokerSetRoute, int | None]],
        on_drain: Callable[[ProducerBatch], None],
        max_in_flight: int,
        request_timeout_s: float,
        stats: dict[str, int],
        on_loop_end: Callable[[int], None],
        keys: KeyGenerator,
    ) -> None:
        self.transport = transport
        self.routes = routes
        self.fault = fault
        self.acc = accumulator
        self.pool = pool
        self.choose_set = choose_set
        self.on_drain = on_drain
        self.max_in_flight = max_in_flight
        self.request_timeout_s = request_timeout_s
        self.stats = stats
        self.on_loop_end = on_loop_end
        self.keys = keys
        self.in_flight: dict[str, int] = {}
        self.hints: dict[str, str] = {}  # broker set -> master URL named by a NOT_MASTER answer
        self.pending = 0  # records appended and not yet resolved
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # Each request's task -> its batch and the queue it was drained from.
        self._requests: dict[asyncio.Task[None], tuple[ProducerBatch, tuple[str, str, int | None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # ---- producer side -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ledgermq-producer-sender")

    def added(self, n: int) -> None:
        """`n` records were appended."""
        self.pending += n
        self._idle.clear()
        self._wake.set()

    def wakeup(self) -> None:
        self._wake.set()

    async def flush(self) -> None:
        """Send everything now and return when every record appended so far is resolved."""
        self.acc.flushing += 1
        self._wake.set()
        try:
            await self._idle.wait()
        finally:
            self.acc.flushing -= 1

    async def close(self, timeout_s: float | None, closed_error: Callable[[], LedgerMQError]) -> None:
        """Flush within `timeout_s` (None: no limit), then fail what is left and stop."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush()
        except TimeoutError:
            pass
        self._stopping = True
        for batch in self.acc.clear():
            for r in batch.records:
                self._fail_record(r, closed_error())
        for task in list(self._requests):
            task.cancel()
        if self._requests:
            await asyncio.gather(*self._requests, return_exceptions=True)
        if self._task is not None:
            self._wake.set()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # ---- the sender task ---------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._dispatch_until(lambda: self._stopping)
        except asyncio.CancelledError:
            if self._stopping or not self.pending:
                raise
            # Not cancelled by `close`: the event loop is ending with records unsent (asyncio.run
            # cancels every task left once the program's coroutine returned, an AsyncProducer
            # never closed). Sent first, within each record's send_timeout_s, as the blocking
            # producer does at interpreter exit: the runner waits for this task.
            resume_at_loop_end()
            self.on_loop_end(self.pending)
            self.acc.flushing += 1
            await self._dispatch_until(lambda: self._stopping or not self.pending)
            await self.transport.aclose()

    async def _dispatch_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._wake.clear()
            now = time.monotonic()
            wake_at: float | None = None
            for broker_name in self.acc.sets_with_data():
                busy = self.in_flight.get(broker_name, 0)
                if busy >= self.max_in_flight:
                    continue
                ready, wake = self.acc.ready(broker_name, busy == 0, now)
                if wake is not None:
                    wake_at = wake if wake_at is None else min(wake_at, wake)
                for batch in ready[: self.max_in_flight - busy]:
                    self.acc.drain(batch)
                    self.on_drain(batch)
                    self.in_flight[broker_name] = self.in_flight.get(broker_name, 0) + 1
                    task = asyncio.get_running_loop().create_task(self._send(batch))
                    self._requests[task] = (batch, (batch.topic, broker_name, batch.queue_id))
                    task.add_done_callback(self._request_ended)
            timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _send(self, batch: ProducerBatch) -> None:
        broker_name = batch.broker_name
        started = time.monotonic()
        self._expire(batch, started)
        if not batch.records:
            return
        try:
            doc = await self._post(batch)
        except LedgerMQError as exc:
            self._failed(batch, exc, started)
            return
        self.fault.update(broker_name, (time.monotonic() - started) * 1000, failed=False)
        results = doc["results"]
        self._complete(batch.records, results, broker_name)

    def _request_ended(self, task: asyncio.Task[None]) -> None:
        batch, key = self._requests.pop(task)
        self.in_flight[key[1]] -= 1
        if task.cancelled() and batch.records:
            # Cut off (perhaps before the task even started) by `close` past its timeout, or by the
            # event loop's end (see `_run`): the request may have reached the set.
            cut = OutcomeUnknownError(
                f"the request to broker set {batch.broker_name} was cut off by the "
                + ("producer's close" if self._stopping else "event loop's end")
            )
            for r in batch.records:
                if r.maybe_reached is None:
                    r.maybe_reached, r.first_unknown = batch.broker_name, cut
            if self._stopping:
                for r in batch.records:
                    self._fail_record(r, cut)
                batch.records = []
            else:  # sent again at once with the same keys by `_run`'s last flush
                batch.retry_at = 0.0
                self.acc.reenqueue(batch)
        self.acc.done(batch, key)
        self._wake.set()

    async def _post(self, batch: ProducerBatch) -> Any:
        url = self.hints.get(batch.broker_name)
        if url is None:
            route = await self.routes.get(batch.topic, refresh=batch.attempts > 0)
            broker = route.broker(batch.broker_name)
            url = broker.master_url if broker else None
        if url is None:
            raise NotMasterError(f"broker set {batch.broker_name} has no master in the route")
        if batch.payload is None:
            batch.payload = self._payload(batch)
        self.stats["requests"] += 1
        what = f"POST {url}/topics/{seg(batch.topic)}/messages"
        answer, moved_to = await self.routes.unless_master_moves(
            batch.topic,
            batch.broker_name,
            url,
            self.transport.send(
                "POST",
                f"{url}/topics/{seg(batch.topic)}/messages",
                body=batch.payload,
                headers=_JSON,
                timeout_s=self.request_timeout_s,
            ),
            MASTER_WATCH_S,
        )
        if moved_to is not None:
            # The old master may have stored the batch before it stopped answering: an unknown
            # outcome, retried with the same keys on the same set (the new master answers a key
            # the set already stored with its first result).
            raise OutcomeUnknownError(
                f"{what}: no answer within {MASTER_WATCH_S:g} s, and broker set {batch.broker_name} "
                f"elected {moved_to} its master meanwhile; hung up to send it there"
            )
        return decode_answer(answer, what)

    def _payload(self, batch: ProducerBatch) -> bytes:
        """The produce request of `batch`, its keys fixed for every attempt: messages without one
        of the caller's get consecutive keys, sent as the run's first (`firstIdempotencyKey`) when
        none has its own. Each doc keeps its key (for a request built again, and for errors)."""
        docs = [r.doc for r in batch.records]
        if not any("idempotencyKey" in d for d in docs):
            run = self.keys.run(len(docs))
            if run is not None:
                payload = orjson.dumps({"messages": docs, "firstIdempotencyKey": run[0]})
                for doc, key in zip(docs, run, strict=True):
                    doc["idempotencyKey"] = key
                return payload
        for doc in docs:
            if "idempotencyKey" not in doc:
                doc["idempotencyKey"] = self.keys()
        return orjson.dumps({"messages": docs})

    # ---- outcomes ------------------------------------------------------------------------------
    def _complete(self, records: list[Record], results: list[dict[str, Any]], broker_name: str) -> None:
        """A batch's results, one per record in order; its buffer bytes released at once."""
        size = 0
        for r, res in zip(records, results, strict=True):
            size += r.size
            if not r.future.done():
                r.future.set_result(SendResult.from_json(res, broker_name))
        self._released(len(records), size)

    def _fail_record(self, r: Record, exc: LedgerMQError) -> None:
        if r.maybe_reached is not None and not isinstance(exc, SendOutcomeUnknownError):
            first = r.first_unknown
            exc = SendOutcomeUnknownError(
                f"send to broker set {r.maybe_reached} failed; an attempt may have stored it "
                f"({first.code if first else '?'}); last: {exc.code} ({exc.detail})",
                topic=r.topic,
                broker_name=r.maybe_reached,
                messages=[r.sent_message()],
                cause=exc,
            )
        if not r.future.done():
            r.future.set_exception(exc)
        self._resolved(r)

    def _resolved(self, r: Record) -> None:
        self._released(1, r.size)

    def _released(self, records: int, size: int) -> None:
        self.pool.release(size)
        self.pending -= records
        if self.pending == 0:
            self._idle.set()

    def _expire(self, batch: ProducerBatch, now: float) -> None:
        """Fail the records whose send_timeout_s has passed (before a new attempt)."""
        expired = [r for r in batch.records if now >= r.deadline]
        if not expired:
            return
        for r in expired:
            self._fail_record(r, _timed_out(batch, r))
        batch.records = [r for r in batch.records if now < r.deadline]
        batch.payload = None

    def _failed(self, batch: ProducerBatch, exc: LedgerMQError, started: float) -> None:
        broker_name = batch.broker_name
        batch.last_error = exc
        delivery = delivery_of(exc)
        if delivery is Delivery.MAYBE:
            for r in batch.records:
                if r.maybe_reached is None:
                    r.maybe_reached, r.first_unknown = broker_name, exc
        hint = base_url(exc.master_addr) if isinstance(exc, NotMasterError) and exc.master_addr else None
        if hint:
            self.hints[broker_name] = hint
        else:
            self.hints.pop(broker_name, None)
            if delivery is Delivery.MAYBE or refused_by_set(exc):
                self.fault.update(broker_name, (time.monotonic() - started) * 1000, failed=True)
                self._evacuate(broker_name, exc)
        index = _refused_message(exc, len(batch.records))
        if index is not None:
            # One message refused: it alone fails; its batch-mates were not stored either.
            self._fail_record(batch.records.pop(index), exc)
            batch.payload = None
            if batch.records:
                self.acc.reenqueue(batch)
            return
        if not exc.retryable:
            for r in batch.records:
                self._fail_record(r, exc)
            batch.records = []
            return
        now = time.monotonic()
        self._expire_all_past(batch, exc, now)
        if not batch.records:
            return
        log.info(
            "produce retry topic=%s broker=%s queue=%s records=%d attempt=%d reason=%s",
            batch.topic,
            broker_name,
            batch.queue_id,
            len(batch.records),
            batch.attempts + 1,
            exc.code,
        )
        self.stats["retries"] += 1
        if batch.movable and refused_by_set(exc) and self._move(batch, exc):
            return
        batch.attempts += 1
        batch.retry_at = now + (0.0 if hint else backoff_s(batch.attempts))
        self.acc.reenqueue(batch)

    def _evacuate(self, broker_name: str, why: LedgerMQError) -> None:
        """The set is failing: its waiting batches that may go elsewhere do so now, instead of
        waiting behind a batch whose outcome is unknown (a queue sends one batch at a time)."""
        for batch in self.acc.take_movable(broker_name):
            if not self._move(batch, why):
                self.acc.reenqueue(batch)

    def _expire_all_past(self, batch: ProducerBatch, last: LedgerMQError, now: float) -> None:
        keep = []
        for r in batch.records:
            if now >= r.deadline:
                self._fail_record(r, last)
            else:
                keep.append(r)
        if len(keep) != len(batch.records):
            batch.records = keep
            batch.payload = None

    def _move(self, batch: ProducerBatch, why: LedgerMQError) -> bool:
        """Send `batch` to another writable set it has not tried (the route as cached)."""
        route = self.routes.cached(batch.topic)
        if route is None:
            return False
        batch.tried.add(batch.broker_name)
        try:
            broker, queue_id = self.choose_set(route.brokers, batch.topic, batch.tried)
        except LedgerMQError:
            return False
        log.info(
            "produce moved topic=%s from=%s to=%s records=%d reason=%s",
            batch.topic,
            batch.broker_name,
            broker.broker_name,
            len(batch.records),
            why.code,
        )
        batch.broker_name, batch.queue_id = broker.broker_name, queue_id
        for r in batch.records:
            if queue_id is None:
                r.doc.pop("queueId", None)
            else:
                r.doc["queueId"] = queue_id
        batch.payload = None
        batch.retry_at = 0.0
        self.stats["moves"] += 1
        self.acc.reenqueue(batch)
        return True


def _refused_message(exc: LedgerMQError, n: int) -> int | None:
    """The index of the one message a 4xx names (`field` = `messages[i]...`), if any."""
    if not isinstance(exc, BadRequestError):
        return None
    m = _MESSAGE_FIELD.match(exc.field or "")
    if m is None or int(m.group(1)) >= n:
        return None
    return int(m.group(1))


def _timed_out(batch: ProducerBatch, r: Record) -> LedgerMQError:
    """The error of a record whose time ran out before its next attempt: the last attempt's."""
    return (
        batch.last_error
        or r.first_unknown
        or SendTimeoutError(
            f"send to topic {batch.topic!r} not attempted within send_timeout_s (broker set "
            f"{batch.broker_name} busy); nothing was sent"
        )
    )
