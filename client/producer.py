"""`Producer` / `AsyncProducer`: send messages to the masters of a topic's broker sets.

`send`/`send_async` batch by themselves, Kafka-style: messages wait in the accumulator
(`client.accumulator`) per broker set and queue, and the sender (`client.sender`) sends a queue's
batch when it is full (`batch_max_messages`, `batch_max_bytes`), has waited `linger_ms`, or at once
when its set has no request in flight; at most `max_in_flight` requests per set, one batch per
queue, so a queue's messages are stored in the order they were sent, retries included. Each
message gets its own future and result. Messages without a `queue_id` stick to one (set, queue)
until its batch leaves, then go to the next (Kafka's sticky partitioner); a message's own
`queue_id` is kept. `buffer_max_bytes` bounds what waits: a send past it blocks up to
`max_block_ms`, then raises `ProducerBufferFullError`. `flush()` sends everything now and waits;
`close()` flushes. `send_batch` is one request of the caller's messages, stored together in order.

Every message gets an `idempotencyKey` before its first attempt (a per-producer random prefix and
a counter, unless the caller set one; a batch's keys are consecutive and sent as one
`firstIdempotencyKey`, which the broker stores and remembers as one) — fresh per send and never
written into the caller's `Message`, so sending the same object again stores it again — and
every retry sends the same keys to the same set, so the master answers a retried key with the
first result instead of storing it twice, also across a master failover (the key table is
rebuilt from the replicated log). Retries happen on NOT_MASTER (to the named master, or after a
route refresh), connection errors, 503 and 504, until `send_timeout_s` has passed.

A send whose attempts may have reached a broker (`client.outcome`) and then failed is reported as
`SendOutcomeUnknownError` naming the set, never as unreachable or refused: only the caller can
then decide to resend it there with the same keys. Several broker sets: a set that fails an
attempt is avoided for `fault_isolation_ms` (`client.fault`), and a send its set refused
definitively moves to another set — only while no attempt may have reached a set.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from client.accumulator import BufferPool, Record, RecordAccumulator
from client.errors import (
    LedgerMQError,
    NotMasterError,
    ProducerClosedError,
    QueueNotExistError,
    TopicNotExistError,
)
from client.fault import LatencyFaultTolerance
from client.loop import BackgroundLoop, LightFuture, close_at_exit, closed
from client.message import KeyGenerator, Message, SendResult, as_message
from client.one_request import OneRequest, send_one_request
from client.sender import MASTER_WATCH_S, Sender
from client.transaction import BlockingTransaction, CheckLoop, Transaction, TransactionChecker
from client.transport import (
    PERM_WRITE,
    AsyncTransport,
    BrokerSetRoute,
    RouteCache,
    TopicRoute,
    base_url,
    new_client_id,
    seg,
    split_addrs,
)
from wire.groups import consistent_hash, java_string_hash, queue_of_group

__all__ = ["AsyncProducer", "Message", "Producer", "SendResult"]

log = logging.getLogger(__name__)

# What a message costs the buffer beyond its body: the JSON around it and its key.
RECORD_OVERHEAD_BYTES = 96

SendCallback = Callable[[SendResult | None, BaseException | None], None]


def _record_size(doc: dict[str, Any]) -> int:
    return len(doc["body"]) + RECORD_OVERHEAD_BYTES


def _with_callback(fut: Any, callback: SendCallback) -> None:
    """Call `callback(result, None)` or `callback(None, error)` when `fut` resolves (on the
    producer's loop: keep it short)."""

    def done(f: Any) -> None:
        if f.cancelled():
            callback(None, ProducerClosedError("send cancelled"))
            return
        exc = f.exception()
        callback(None, exc) if exc is not None else callback(f.result(), None)

    fut.add_done_callback(done)


class AsyncProducer:
    """Asyncio producer. `namesrv_addr`: `host:port;host:port` or a list; `broker_addr` for a
    single broker without a name server. See the module docstring for batching, retries and
    the errors; defaults follow Kafka's producer (linger 5 ms, 5 requests in flight per set,
    32 MiB buffer); a batch is up to 1 MiB (four of the broker's 256 KiB DLedger entries): a request
    costs the set a fixed ~1 ms of CPU besides its messages, so fewer, larger requests go faster.
    `client_id` names this producer in the brokers' client lists (default `host@pid@random`)."""

    def __init__(
        self,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        send_timeout_s: float = 15.0,
        request_timeout_s: float = 5.0,
        linger_ms: float = 5.0,
        batch_max_messages: int = 1000,
        batch_max_bytes: int = 1024 * 1024,
        max_in_flight: int = 5,
        buffer_max_bytes: int = 32 * 1024 * 1024,
        max_block_ms: float = 60_000,
        fault_isolation_ms: int = 10_000,
        send_latency_fault_enable: bool = False,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
        client_id: str | None = None,
        producer_group: str | None = None,
        transaction_checker: TransactionChecker | None = None,
    ) -> None:
        if transaction_checker is not None and not producer_group:
            raise ValueError("a transaction_checker answers for a producer_group: give both")
        if batch_max_messages < 1 or batch_max_bytes < 1 or max_in_flight < 1 or buffer_max_bytes < 1:
            raise ValueError(
                "batch_max_messages, batch_max_bytes, max_in_flight, buffer_max_bytes must be >= 1"
            )
        self.client_id = client_id or new_client_id()
        self.transport = AsyncTransport(
            token=token,
            timeout_s=request_timeout_s,
            max_connections=max(64, max_in_flight),
            ca_file=ca_file,
            client_cert=client_cert,
            headers={"X-Client-Id": self.client_id, "X-Client-Type": "PRODUCER"},
        )
        self.routes = RouteCache(self.transport, split_addrs(namesrv_addr), split_addrs(broker_addr))
        self.send_timeout_s = send_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_in_flight = max_in_flight
        self.fault = LatencyFaultTolerance(fault_isolation_ms, send_latency_fault_enable)
        self.accumulator = RecordAccumulator(batch_max_messages, batch_max_bytes, linger_ms)
        self.pool = BufferPool(buffer_max_bytes, max_block_ms)
        self.stats = {"requests": 0, "retries": 0, "moves": 0}
        self._keys = KeyGenerator()
        self._counter = itertools.count()
        self._sticky: dict[str, tuple[TopicRoute, str, int | None]] = {}  # topic -> (route, set, queue)
        self._sender: Sender | None = None
        self._closed = False
        self.producer_group = producer_group
        self.checks = CheckLoop(self, producer_group, transaction_checker) if transaction_checker else None
        self._checks_started = False
        self._start_checks()

    def _start_checks(self) -> None:
        """Start answering check-backs once a loop runs (at once when created on one, else at the
        first send or `async with`)."""
        if self.checks is None or self._checks_started:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._checks_started = True
        self.checks.start()

    @property
    def retries(self) -> int:
        """Attempts beyond the first, for tests and metrics."""
        return self.stats["retries"]

    @property
    def moves(self) -> int:
        """Sends moved to another broker set after a refusal."""
        return self.stats["moves"]

    async def __aenter__(self) -> AsyncProducer:
        self._start_checks()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop taking messages, send what waits (within `timeout_s`, None: no limit), fail what
        is left (`ProducerClosedError`, or `SendOutcomeUnknownError` where an attempt may have
        reached a broker), and close the connections. A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        if self.checks is not None:
            await self.checks.stop()
        if self._sender is not None:
            await self._sender.close(timeout_s, lambda: ProducerClosedError("the producer was closed"))
        await self.transport.aclose()

    async def flush(self) -> None:
        """Send every message sent so far now, and return when each has its result."""
        if self._sender is not None:
            await self._sender.flush()

    # ---- batched sends -------------------------------------------------------------------------
    async def send(
        self, topic: str, message: Message | bytes | str, *, broker_name: str | None = None, **kw: Any
    ) -> SendResult:
        """Send one message and wait for its result; batched with concurrent sends. Keyword args
        (tags, keys, properties, queue_id, idempotency_key) override the message's fields for this
        send (the caller's `Message` is not changed). `broker_name` sends to that broker set (e.g.
        to resend after `SendOutcomeUnknownError`). Errors: see `send_batch`, plus
        `ProducerBufferFullError` and `SendTimeoutError` (nothing sent)."""
        fut = None if kw or broker_name is not None else self._enqueue_sticky(topic, message)
        if fut is None:
            fut = await self.send_async(topic, message, broker_name=broker_name, **kw)
        return await fut

    async def send_async(
        self,
        topic: str,
        message: Message | bytes | str,
        *,
        broker_name: str | None = None,
        callback: SendCallback | None = None,
        **kw: Any,
    ) -> asyncio.Future[SendResult]:
        """Queue one message and return its future at once (waiting only for room in the buffer,
        up to `max_block_ms`). `callback(result, error)` runs when it resolves."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        msg, doc, size = self._prepare(message, kw)
        return await self._send_prepared(topic, msg, doc, size, broker_name, callback)

    async def send_transactional(
        self, topic: str, message: Message | bytes | str, *, broker_name: str | None = None, **kw: Any
    ) -> Transaction:
        """Send a half message (batched like any send) and return its `Transaction`: consumers
        see the message once it is committed, never after a rollback. Its producer group is
        `producer_group` (default: the topic, as the broker does), whose `transaction_checker`
        the master asks if neither comes. The topic's `message.type` must be TRANSACTION (or
        MIXED)."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        self._start_checks()
        msg, doc, size = self._prepare(message, kw)
        doc["transactional"] = True
        if self.producer_group:
            doc["producerGroup"] = self.producer_group
        fut = await self._send_prepared(topic, msg, doc, size, broker_name, None)
        return Transaction(self, topic, await fut)

    async def _send_prepared(
        self,
        topic: str,
        msg: Message | None,
        doc: dict[str, Any],
        size: int,
        broker_name: str | None,
        callback: SendCallback | None,
    ) -> asyncio.Future[SendResult]:
        if not self.pool.try_reserve(size):  # no coroutine for the common case: room at once
            await self.pool.reserve(size)
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        if callback is not None:
            _with_callback(fut, callback)
        try:
            if not self._try_enqueue(topic, msg, doc, size, fut, broker_name):
                await self._enqueue(topic, msg, doc, size, fut, broker_name)
        except BaseException:
            self.pool.release(size)
            raise
        return fut

    def _prepare(
        self, message: Message | bytes | str, kw: dict[str, Any]
    ) -> tuple[Message | None, dict[str, Any], int]:
        """The message with `kw` applied (None for a bare text body: the common case, built only
        if an error needs it), its request document, and its size. A message without the
        caller's key gets one when its batch is first sent (`Sender`: the batch's keys are a run)."""
        if isinstance(message, str) and not kw:
            doc: dict[str, Any] = {"body": message}  # utf-8, the API's default encoding
            return None, doc, len(message) + RECORD_OVERHEAD_BYTES
        msg = as_message(message)
        if kw:
            msg = dataclasses.replace(msg, **kw)
        doc = msg.to_json()
        return msg, doc, _record_size(doc)

    def _try_enqueue(
        self,
        topic: str,
        msg: Message | None,
        doc: dict[str, Any],
        size: int,
        fut: Any,
        broker_name: str | None,
    ) -> bool:
        """Append a prepared message without a coroutine if the topic's route is cached (the path
        of nearly every message); False if the route must be fetched first (`_enqueue`)."""
        route = self.routes.fresh(topic)
        if route is None:
            return False
        self._enqueue_on(route, topic, msg, doc, size, fut, broker_name)
        return True

    async def _enqueue(
        self,
        topic: str,
        msg: Message | None,
        doc: dict[str, Any],
        size: int,
        fut: Any,
        broker_name: str | None,
    ) -> None:
        """Append a prepared message to its queue's batch (on the loop), fetching the topic's route
        first when it is not cached."""
        route = self.routes.fresh(topic) or await self.routes.get(topic)
        self._enqueue_on(route, topic, msg, doc, size, fut, broker_name)

    def _enqueue_on(
        self,
        route: TopicRoute,
        topic: str,
        msg: Message | None,
        doc: dict[str, Any],
        size: int,
        fut: Any,
        broker_name: str | None,
    ) -> None:
        """`_enqueue` with the topic's route in hand."""
        pinned_queue = msg.queue_id if msg is not None else None
        group = msg.message_group if msg is not None else None
        sticky = None
        if group is not None:
            # A FIFO group: always its set and the queue the broker will store it in, and never
            # moved — one queue sends one batch at a time, so the group's order survives retries.
            target = self._set_for_group(route.brokers, group, topic, broker_name)
            nums = target.write_queue_nums
            queue = pinned_queue = queue_of_group(group, nums) if nums else None
            if queue is None:
                doc.pop("queueId", None)
            else:
                doc["queueId"] = queue
            broker_name = target.broker_name
        elif broker_name is not None or pinned_queue is not None:
            target, queue = self._target(route, topic, pinned_queue, broker_name)
        else:
            sticky = self._kept_sticky(topic, route)
            if sticky is None:
                b, q = self._select(route.brokers, 0, topic)
                sticky = self._sticky[topic] = (route, b.broker_name, q)
            target, queue = None, sticky[2]
        set_name = sticky[1] if sticky is not None else target.broker_name  # type: ignore[union-attr]
        if pinned_queue is not None:
            queue = pinned_queue
        elif queue is not None:
            doc["queueId"] = queue
        record = Record(
            topic,
            msg,
            doc,
            size,
            fut,
            time.monotonic() + self.send_timeout_s,
            pinned_queue=pinned_queue is not None,
            pinned_set=broker_name is not None,
        )
        self._append(topic, set_name, queue, record, sticky is not None)

    def _enqueue_sticky(
        self, topic: str, message: Message | bytes | str
    ) -> asyncio.Future[SendResult] | None:
        """`send`'s path for nearly every message, without a coroutine of its own: a bare text
        body to the topic's kept sticky (set, queue), its route cached, room in the buffer at once.
        The general path's checks (room without waiting, which a send waiting for room never gets
        past; a cached route, which a send waiting for one lacks), so it never overtakes a send
        waiting there. None: take the general path (which raises the errors)."""
        if type(message) is not str or self._closed or self._sender is None:
            return None
        route = self.routes.fresh(topic)
        sticky = self._kept_sticky(topic, route) if route is not None else None
        if sticky is None:
            return None
        _, doc, size = self._prepare(message, {})
        if not self.pool.try_reserve(size):
            return None
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        queue = sticky[2]
        if queue is not None:
            doc["queueId"] = queue
        record = Record(topic, None, doc, size, fut, time.monotonic() + self.send_timeout_s, False, False)
        self._append(topic, sticky[1], queue, record, True)
        return fut

    def _kept_sticky(self, topic: str, route: TopicRoute) -> tuple[TopicRoute, str, int | None] | None:
        """The topic's sticky (route, set, queue), kept while `route` is the one it was chosen
        from and its set is not avoided; None when a new one must be chosen."""
        sticky = self._sticky.get(topic)
        if sticky is None or sticky[0] is not route or not self.fault.is_available(sticky[1]):
            return None
        return sticky

    def _append(self, topic: str, set_name: str, queue: int | None, record: Record, sticky: bool) -> None:
        """Add `record` to its queue's batch (a full batch moves the topic's sticky queue on) and
        tell the sender, starting it with the first record."""
        if self.accumulator.append(topic, set_name, queue, record) and sticky:
            self._sticky.pop(topic, None)
        if self._sender is None:
            self._sender = Sender(
                transport=self.transport,
                routes=self.routes,
                fault=self.fault,
                accumulator=self.accumulator,
                pool=self.pool,
                choose_set=lambda brokers, t, exclude: self._select(brokers, 0, t, exclude),
                on_drain=self._on_drain,
                max_in_flight=self.max_in_flight,
                request_timeout_s=self.request_timeout_s,
                stats=self.stats,
                on_loop_end=self._closed_by_loop_end,
                keys=self._keys,
            )
            self._sender.start()
        self._sender.added(1)

    def _closed_by_loop_end(self, pending: int) -> None:
        self._closed = True
        log.warning(
            "event=producer_closed_at_loop_end pending=%d hint=close the AsyncProducer (or use async "
            "with) before its event loop ends to choose when its messages are sent",
            pending,
        )

    def _target(
        self, route: TopicRoute, topic: str, pinned_queue: int | None, broker_name: str | None
    ) -> tuple[BrokerSetRoute, int | None]:
        """The (set, queue) of a message outside any message group: in `broker_name`'s set if
        given, else in the set holding its `pinned_queue`, else the next (set, queue) in turn."""
        if broker_name is not None:
            brokers = [b for b in route.brokers if b.broker_name == broker_name]
            if not brokers:
                raise TopicNotExistError(f"broker set {broker_name!r} does not hold topic {topic!r}")
            min_queues = 0 if pinned_queue is None else pinned_queue + 1
            return self._select(brokers, min_queues, topic)
        if pinned_queue is not None:
            return self._set_for_queue(route.brokers, pinned_queue, topic)
        return self._select(route.brokers, 0, topic)

    def _set_for_group(
        self, brokers: list[BrokerSetRoute], group: str, topic: str, broker_name: str | None = None
    ) -> BrokerSetRoute:
        """The broker set of a FIFO message group: the same for every message of the group (a
        hash over the topic's writable sets by name, or `broker_name`'s), whatever the sets'
        health — moving a group to another set would reorder it."""
        if not isinstance(group, str) or not group:
            raise ValueError(f"message_group must be a non-empty string, got {group!r}")
        writable = sorted(
            (b for b in brokers if b.perm & PERM_WRITE and broker_name in (None, b.broker_name)),
            key=lambda b: b.broker_name,
        )
        if not writable:
            where = f"broker set {broker_name!r}" if broker_name else "no writable broker set"
            raise TopicNotExistError(f"{where} of topic {topic!r} takes message group {group!r}")
        return writable[consistent_hash(java_string_hash(group), len(writable))]

    async def recall(self, topic: str, recall_handle: str, broker_name: str | None = None) -> str:
        """Cancel a delayed message before it is due (RocketMQ 5's `recallMessage`): its send's
        `recall_handle`, on the set that stored it (`SendResult.broker_name`; without it, each set
        of the topic is asked). Returns its message id. Errors: a `LedgerMQError` with code
        `RECALL_FAILED` (409: delivered, recalled or due), `NotFoundError` (no such timer)."""
        route = await self.routes.get(topic)
        sets = [b for b in route.brokers if broker_name in (None, b.broker_name)]
        if not sets:
            raise TopicNotExistError(f"broker set {broker_name!r} does not hold topic {topic!r}")
        last: LedgerMQError | None = None
        for b in sets:
            if b.master_url is None:
                last = NotMasterError(f"broker set {b.broker_name} has no master in the route")
                continue
            try:
                doc = await self.transport.request("POST", f"{b.master_url}/topics/{seg(topic)}/recall",
                                                   json={"recallHandle": recall_handle})
            except LedgerMQError as exc:
                if exc.status != 404 or len(sets) == 1:
                    raise
                last = exc  # another set may hold it
                continue
            return str(doc["messageId"])
        assert last is not None
        raise last

    def _on_drain(self, batch: Any) -> None:
        """A batch left: the topic's next unpinned messages go to the next (set, queue)."""
        sticky = self._sticky.get(batch.topic)
        if sticky is not None and sticky[1:] == (batch.broker_name, batch.queue_id):
            del self._sticky[batch.topic]

    def _set_for_queue(
        self, brokers: list[BrokerSetRoute], queue_id: int, topic: str
    ) -> tuple[BrokerSetRoute, int | None]:
        """The set for a message whose caller chose only the queue: the first writable set (in
        route order, not being avoided) that has it, so the queue's messages stay in one place."""
        writable = [
            b for b in brokers if b.perm & PERM_WRITE and queue_id < (b.write_queue_nums or queue_id + 1)
        ]
        if not writable:
            most = max((b.write_queue_nums or 0 for b in brokers if b.perm & PERM_WRITE), default=None)
            if most is None:
                raise TopicNotExistError(f"topic {topic!r} has no writable broker set")
            raise QueueNotExistError(
                f"queue {queue_id} does not exist: topic {topic!r} has {most} write queues"
            )
        ok = [b for b in writable if self.fault.is_available(b.broker_name)] or writable
        return ok[0], queue_id

    def _select(
        self, brokers: list[BrokerSetRoute], min_queues: int, topic: str, exclude: Iterable[str] = ()
    ) -> tuple[BrokerSetRoute, int | None]:
        """The next (broker set, queue) in turn among writable sets with at least `min_queues`
        write queues (a set whose queue numbers the route does not give counts as having them),
        not in `exclude`, preferring sets not being avoided; queue None when no route gives
        queue numbers (the broker picks)."""
        skip = set(exclude)
        writable = [
            b
            for b in brokers
            if b.perm & PERM_WRITE and (b.master_addr or 0 in b.addrs) and b.broker_name not in skip
        ]
        if not writable:
            writable = [b for b in brokers if b.perm & PERM_WRITE and b.broker_name not in skip]
        if not writable:
            if brokers and not any(b.perm & PERM_WRITE for b in brokers):
                raise TopicNotExistError(
                    f"no writable broker set for topic {topic!r}: every set holding it is read-only (the "
                    "topic's perm, or the broker's brokerPermission: `mqadmin updateBrokerConfig -k "
                    "brokerPermission -v 6` gives a drained set its writes back)"
                )
            raise TopicNotExistError(f"no writable broker set for topic {topic!r}")
        if min_queues:
            # The caller picked queues: only sets that have them (else let the broker say so).
            writable = [
                b for b in writable if min_queues <= b.write_queue_nums or b.write_queue_nums == 0
            ] or writable
        ok = set(self.fault.available(b.broker_name for b in writable))
        if ok and len(ok) < len(writable):
            writable = [b for b in writable if b.broker_name in ok]
        elif not ok and len(writable) > 1:
            soonest = self.fault.least_recent_failure([b.broker_name for b in writable])
            writable = [b for b in writable if b.broker_name == soonest]
        pairs = [(b, q) for b in writable for q in range(b.write_queue_nums)] or [(b, None) for b in writable]
        return pairs[next(self._counter) % len(pairs)]

    # ---- one request of the caller's messages --------------------------------------------------
    async def send_batch(
        self,
        topic: str,
        messages: Iterable[Message | bytes | str],
        *,
        broker_name: str | None = None,
    ) -> list[SendResult]:
        """Send messages in one request to one broker set, stored in order. A message with a
        `queue_id` goes to that queue; the others go together to the queue picked for the batch
        (so a batch without queue ids is stored contiguously in one queue). `broker_name` picks
        the set (default: the next writable set in turn, skipping sets being avoided); a send
        with neither a broker name nor queue ids moves to another set when its set refuses.

        Raises, when every retry until `send_timeout_s` failed: `SendOutcomeUnknownError` if any
        attempt may have reached a set (it names the set and keeps the keys: resend them
        there); otherwise the last refusal (`NotMasterError`, `BrokerUnreachableError`, a 4xx
        error, `DiskFullError`), which means nothing of this send was stored."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        msgs = [as_message(m) for m in messages]
        if not msgs:
            return []
        docs = [m.to_json() for m in msgs]
        for doc in docs:  # this call's keys: reused by its retries, never by a later call
            if "idempotencyKey" not in doc:
                doc["idempotencyKey"] = self._keys()
        pinned = [m.queue_id for m in msgs if m.queue_id is not None]
        route = await self.routes.get(topic)
        brokers = route.brokers
        if broker_name is not None:
            brokers = [b for b in route.brokers if b.broker_name == broker_name]
            if not brokers:
                raise TopicNotExistError(f"broker set {broker_name!r} does not hold topic {topic!r}")
        groups = {m.message_group for m in msgs if m.message_group is not None}
        if groups:  # the broker puts each in its group's queue; the set must be every group's
            homes = {self._set_for_group(brokers, g, topic).broker_name for g in groups}
            if len(homes) > 1:
                raise ValueError(f"the message groups of one send_batch live on different broker sets "
                                 f"({', '.join(sorted(homes))}): send them with send(), or a batch per set")
            brokers = [b for b in brokers if b.broker_name in homes]
        broker, queue_id = self._select(brokers, max(pinned) + 1 if pinned else 0, topic)
        send = OneRequest(topic, msgs, docs, movable=broker_name is None and not pinned and not groups)
        send.assign(broker.broker_name, queue_id)
        return await send_one_request(self, send)


class Producer:
    """Blocking producer: an `AsyncProducer` on a background thread with its own event loop (the
    I/O thread of Kafka's producer). `send` blocks for the result; `send_async` returns a
    `concurrent.futures.Future` at once (blocking only while the buffer is full, up to
    `max_block_ms`), with an optional `callback(result, error)` run on the I/O thread. Safe to
    use from several threads. Same keyword arguments as `AsyncProducer`. A producer the program
    never closes is closed at interpreter exit: what it was given is sent first (`client.loop`)."""

    def __init__(self, namesrv_addr: str | list[str] | None = None, **kw: Any) -> None:
        self._bg = BackgroundLoop("ledgermq-producer")
        self._loop = self._bg.loop
        try:
            self._p: AsyncProducer = self._call(_make(AsyncProducer, namesrv_addr, **kw))
        except BaseException:  # a bad argument: no I/O thread left behind
            self._bg.close()
            raise
        self._intake: collections.deque[tuple[Any, ...]] = collections.deque()
        self._intake_lock = threading.Lock()
        self._intake_woken = False
        self._intake_event = asyncio.Event()
        self._intake_idle = asyncio.Event()
        self._intake_task = self._call(_start_task(self._take_intake()))
        self._hints: dict[str, str] = {}  # broker set -> its master's URL, as a NOT_MASTER answer named it
        self._closed = False
        close_at_exit(self, self.close)

    def _call(self, coro: Any, timeout_s: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def send(
        self, topic: str, message: Message | bytes | str, *, broker_name: str | None = None, **kw: Any
    ) -> SendResult:
        """Send one message and wait for its result. See `AsyncProducer.send`.

        While nothing else this producer was given is unresolved (the common case: one thread
        sending in a loop), the request goes out on the calling thread, over a blocking socket,
        and its answer comes back there: no hand-off to the I/O thread and back. Otherwise the
        message is batched with the rest, so it never overtakes an earlier one; so are messages
        of a message group, and the first message of a topic whose route is not cached yet. A
        failed request is retried on the I/O thread with the same key, by `send_batch`'s rules."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        msg, doc, size = self._p._prepare(message, kw)
        if (msg is None or msg.message_group is None) and self._p.pool.hold_if_idle():
            try:
                result = self._send_direct(topic, message, msg, doc, broker_name)
            finally:
                self._p.pool.end_direct()
            if result is not None:
                return result
        return self._queue(topic, msg, doc, size, broker_name, None).result()

    def _send_direct(
        self,
        topic: str,
        message: Message | bytes | str,
        msg: Message | None,
        doc: dict[str, Any],
        broker_name: str | None,
    ) -> SendResult | None:
        """`send` on the calling thread; None, before sending anything, when the topic's route is
        not cached or names no master."""
        p = self._p
        route = p.routes.fresh(topic)
        if route is None:
            return None
        pinned_queue = msg.queue_id if msg is not None else None
        target, queue = p._target(route, topic, pinned_queue, broker_name)
        url = self._hints.get(target.broker_name) or target.master_url
        if url is None:
            return None
        if pinned_queue is None and queue is not None:
            doc["queueId"] = queue
        if "idempotencyKey" not in doc:  # this send's key, for its retries too
            doc["idempotencyKey"] = p._keys()
        started = time.monotonic()
        p.stats["requests"] += 1
        try:
            answer = p.transport.request_blocking(
                "POST", f"{url}/topics/{seg(topic)}/messages", json={"messages": [doc]},
                watch=(MASTER_WATCH_S, lambda: self._master_moved(topic, target.broker_name, url)),
            )
        except LedgerMQError as exc:
            if isinstance(exc, NotMasterError) and exc.master_addr:
                self._hints[target.broker_name] = base_url(exc.master_addr)
            else:
                self._hints.pop(target.broker_name, None)
            if self._closed:
                raise ProducerClosedError("the producer was closed during the send") from exc
            movable = broker_name is None and pinned_queue is None
            send = OneRequest(topic, [msg or as_message(message)], [doc], movable=movable)
            send.assign(target.broker_name, queue)
            return self._call(send_one_request(p, send, first=exc, started=started))[0]
        p.fault.update(target.broker_name, (time.monotonic() - started) * 1000, failed=False)
        return SendResult.from_json(answer["results"][0], target.broker_name)

    def _master_moved(self, topic: str, broker_name: str, url: str) -> str | None:
        """For a send on the caller's thread still unanswered: why to give it up (the set elected
        another master than `url`), or None. The I/O thread retries it there with the same key."""
        try:
            master = self._call(self._p.routes.master_now(topic, broker_name, MASTER_WATCH_S))
        except (RuntimeError, concurrent.futures.CancelledError):  # closed meanwhile: its loop is gone
            return None
        if master is None or master == url:
            return None
        return f"broker set {broker_name} elected {master} its master meanwhile"

    def send_async(
        self,
        topic: str,
        message: Message | bytes | str,
        *,
        broker_name: str | None = None,
        callback: SendCallback | None = None,
        **kw: Any,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue one message; its future resolves with the SendResult or the error."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        msg, doc, size = self._p._prepare(message, kw)
        return self._queue(topic, msg, doc, size, broker_name, callback)

    def _queue(
        self,
        topic: str,
        msg: Message | None,
        doc: dict[str, Any],
        size: int,
        broker_name: str | None,
        callback: SendCallback | None,
    ) -> concurrent.futures.Future[SendResult]:
        """Hand a prepared message to the I/O thread's accumulator; its future."""
        self._p.pool.reserve_blocking(size)
        fut: concurrent.futures.Future[SendResult] = LightFuture()
        if callback is not None:
            _with_callback(fut, callback)
        self._intake.append((topic, msg, doc, size, fut, broker_name))
        with self._intake_lock:
            if not self._intake_woken:
                self._intake_woken = True
                self._loop.call_soon_threadsafe(self._intake_event.set)
        return fut

    async def _take_intake(self) -> None:
        """On the loop: move what `send_async` queued into the accumulator, in order."""
        while True:
            await self._intake_event.wait()
            self._intake_event.clear()
            with self._intake_lock:
                self._intake_woken = False
            while self._intake:
                topic, msg, doc, size, fut, broker_name = self._intake.popleft()
                try:
                    if not self._p._try_enqueue(topic, msg, doc, size, fut, broker_name):
                        await self._p._enqueue(topic, msg, doc, size, fut, broker_name)
                except Exception as exc:  # e.g. no route for the topic: this message fails alone
                    self._p.pool.release(size)
                    fut.set_exception(exc)
            self._intake_idle.set()

    async def _drain_intake(self) -> None:
        """Return once everything `send_async` queued so far is in the accumulator."""
        while self._intake:
            self._intake_idle.clear()
            self._intake_event.set()
            await self._intake_idle.wait()

    async def _flush(self) -> None:
        await self._drain_intake()
        await self._p.flush()

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every message sent so far now, and return when each has its result."""
        self._call(self._flush(), timeout_s)

    def send_batch(
        self, topic: str, messages: Iterable[Message | bytes | str], *, broker_name: str | None = None
    ) -> list[SendResult]:
        """See `AsyncProducer.send_batch`."""
        return self._call(self._p.send_batch(topic, list(messages), broker_name=broker_name))

    def send_transactional(
        self, topic: str, message: Message | bytes | str, *, broker_name: str | None = None, **kw: Any
    ) -> BlockingTransaction:
        """See `AsyncProducer.send_transactional`; `commit()`/`rollback()` block."""
        tx = self._call(self._p.send_transactional(topic, message, broker_name=broker_name, **kw))
        return BlockingTransaction(tx, self._call)

    @property
    def checks(self) -> CheckLoop | None:
        """The check-back loop (with a `transaction_checker`): its `stats`."""
        return self._p.checks

    def recall(self, topic: str, recall_handle: str, broker_name: str | None = None) -> str:
        """See `AsyncProducer.recall`."""
        return self._call(self._p.recall(topic, recall_handle, broker_name))

    @property
    def retries(self) -> int:
        return self._p.retries

    @property
    def moves(self) -> int:
        return self._p.moves

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (within `timeout_s`), fail what is left, stop the I/O thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        closed(self)
        try:
            self._call(self._flush_and_close(timeout_s))
        finally:
            self._bg.close()

    async def _flush_and_close(self, timeout_s: float | None) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await self._drain_intake()
        except TimeoutError:
            pass
        self._intake_task.cancel()
        await asyncio.gather(self._intake_task, return_exceptions=True)
        while self._intake:  # what the intake never took
            _, _, _, size, fut, _ = self._intake.popleft()
            self._p.pool.release(size)
            fut.set_exception(ProducerClosedError("the producer was closed"))
        await self._p.close(timeout_s)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(cls: type, *args: Any, **kw: Any) -> Any:
    # The transport's connections belong to the loop they are created on.
    return cls(*args, **kw)


async def _start_task(coro: Any) -> asyncio.Task[Any]:
    return asyncio.get_running_loop().create_task(coro)
