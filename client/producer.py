"""`Producer` / `AsyncProducer`: send messages to the master of a topic's broker set.

Queue selection is round robin over the writable (broker set, queue) pairs of the topic's route; a
message's own `queue_id` is kept. Every message of a `send`/`send_batch` call gets an
`idempotencyKey` (uuid4, unless the caller set one) before its first attempt — fresh per call and
never written into the caller's `Message`, so sending the same object again stores it again — and a
retry within the call goes to the same broker set and queue with the same keys, so the master
answers a retried key with the original result instead of storing it twice. This holds across
master failover because the key table is rebuilt from the replicated log. Retries happen on
NOT_MASTER (to the named master, or after a route refresh), connection errors, 503 and 504
(outcome unknown), until `send_timeout_s` has passed.

A send whose attempts may have reached a broker (`client.outcome`) and then failed is reported as
`SendOutcomeUnknownError` naming the set, never as unreachable or refused: only the caller can
then decide to resend it there with the same keys.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from client.errors import (
    BrokerUnreachableError,
    LedgerMQError,
    NotMasterError,
    SendOutcomeUnknownError,
    ServerError,
    TopicNotExistError,
)
from client.fault import LatencyFaultTolerance
from client.outcome import Delivery, delivery_of
from client.transport import (
    PERM_WRITE,
    AsyncTransport,
    BrokerSetRoute,
    RouteCache,
    base_url,
    seg,
    split_addrs,
)

log = logging.getLogger(__name__)


@dataclass
class Message:
    """A message to send. `body` bytes are sent base64 unless valid UTF-8 text. Set
    `idempotency_key` only to make separate sends of it count as one (the producer gives every
    send its own key otherwise)."""

    body: bytes | str
    tags: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    idempotency_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The produce API's message object (`idempotencyKey` only when set here)."""
        if isinstance(self.body, str):
            body, enc = self.body, "utf-8"
        else:
            try:
                body, enc = self.body.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                body, enc = base64.b64encode(self.body).decode("ascii"), "base64"
        doc: dict[str, Any] = {"body": body, "bodyEncoding": enc}
        if self.tags is not None:
            doc["tags"] = self.tags
        if self.keys:
            doc["keys"] = list(self.keys)
        if self.properties:
            doc["properties"] = dict(self.properties)
        if self.queue_id is not None:
            doc["queueId"] = self.queue_id
        if self.idempotency_key is not None:
            doc["idempotencyKey"] = self.idempotency_key
        return doc


@dataclass
class SendResult:
    """Where a message was stored."""

    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    broker_name: str


def _as_message(m: Message | bytes | str) -> Message:
    return m if isinstance(m, Message) else Message(body=m)


class AsyncProducer:
    """Asyncio producer. `namesrv_addr`: `host:port;host:port` or a list; `broker_addr` for a
    single broker without a name server.

    With several broker sets, a set that fails an attempt (no connection, no master, a refusal
    to write, an unknown outcome) is avoided for `fault_isolation_ms` (`client.fault`, RocketMQ's
    latency-fault tolerance; `send_latency_fault_enable` also avoids slow sets), and a send that
    the chosen set refused definitively moves to another set at once — only then: a send that may
    have reached a set stays there (see `SendOutcomeUnknownError`)."""

    def __init__(
        self,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        send_timeout_s: float = 15.0,
        request_timeout_s: float = 5.0,
        fault_isolation_ms: int = 10_000,
        send_latency_fault_enable: bool = False,
    ) -> None:
        self.transport = AsyncTransport(token=token, timeout_s=request_timeout_s)
        self.routes = RouteCache(self.transport, split_addrs(namesrv_addr), split_addrs(broker_addr))
        self.send_timeout_s = send_timeout_s
        self.fault = LatencyFaultTolerance(fault_isolation_ms, send_latency_fault_enable)
        self._counter = itertools.count()
        self.retries = 0  # attempts beyond the first, for tests and metrics
        self.moves = 0  # sends moved to another broker set after a refusal

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self.transport.aclose()

    async def send(
        self, topic: str, message: Message | bytes | str, *, broker_name: str | None = None, **kw: Any
    ) -> SendResult:
        """Send one message; keyword args (tags, keys, properties, queue_id, idempotency_key)
        override the message's fields for this send (the caller's `Message` is not changed).
        `broker_name` sends to that broker set (e.g. to resend after `SendOutcomeUnknownError`)."""
        msg = _as_message(message)
        if kw:
            msg = dataclasses.replace(msg, **kw)
        return (await self.send_batch(topic, [msg], broker_name=broker_name))[0]

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
        msgs = [_as_message(m) for m in messages]
        if not msgs:
            return []
        docs = [m.to_json() for m in msgs]
        for doc in docs:  # this call's keys: reused by its retries, never by a later call
            doc.setdefault("idempotencyKey", uuid.uuid4().hex)
        pinned = [m.queue_id for m in msgs if m.queue_id is not None]
        route = await self.routes.get(topic)
        brokers = route.brokers
        if broker_name is not None:
            brokers = [b for b in route.brokers if b.broker_name == broker_name]
            if not brokers:
                raise TopicNotExistError(f"broker set {broker_name!r} does not hold topic {topic!r}")
        broker, queue_id = self._select(brokers, max(pinned) + 1 if pinned else 0, topic)
        send = _Send(topic, msgs, docs, movable=broker_name is None and not pinned)
        send.assign(broker.broker_name, queue_id)
        return await self._send_with_retry(send)

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

    async def _send_with_retry(self, send: _Send) -> list[SendResult]:
        """POST the messages to their set's master, retrying with the same keys until
        `send_timeout_s`. A movable send that its set refused (`_refused_by_set`) before any
        attempt may have reached a set moves to another set. Once an attempt may have reached a
        set, the send stays there and its final error is a `SendOutcomeUnknownError`, whatever
        later attempts saw (a dead set refuses connections: that says nothing about the request
        already sent)."""
        topic = send.topic
        payload = {"messages": send.docs}
        deadline = time.monotonic() + self.send_timeout_s
        hint: str | None = None
        delay = 0.05
        attempt = 0
        maybe_reached: LedgerMQError | None = None
        tried: set[str] = set()
        path = f"/topics/{seg(topic)}/messages"
        while True:
            broker_name = send.broker_name
            started = time.monotonic()
            try:
                url: str | None = hint
                if url is None:
                    route = await self.routes.get(topic, refresh=attempt > 0)
                    broker = route.broker(broker_name)
                    url = broker.master_url if broker else None
                if url is None:
                    raise NotMasterError(f"broker set {broker_name} has no master in the route")
                doc = await self.transport.request("POST", url + path, json=payload)
                self.fault.update(broker_name, (time.monotonic() - started) * 1000, failed=False)
                return [
                    SendResult(r["msgId"], r["queueId"], r["queueOffset"], r["commitLogOffset"], broker_name)
                    for r in doc["results"]
                ]
            except LedgerMQError as exc:
                delivery = delivery_of(exc)
                if maybe_reached is None and delivery is Delivery.MAYBE:
                    maybe_reached = exc
                hint = (
                    base_url(exc.master_addr) if isinstance(exc, NotMasterError) and exc.master_addr else None
                )
                if hint is None and (delivery is Delivery.MAYBE or _refused_by_set(exc)):
                    self.fault.update(broker_name, (time.monotonic() - started) * 1000, failed=True)
                if send.movable and maybe_reached is None and _refused_by_set(exc):
                    tried.add(broker_name)
                    if await self._move(send, tried, exc):
                        attempt += 1
                        continue
                if not exc.retryable or time.monotonic() + delay > deadline:
                    if maybe_reached is None:
                        raise
                    raise SendOutcomeUnknownError(
                        f"send to broker set {broker_name} failed after {attempt + 1} attempts; "
                        f"attempt outcome unknown since {maybe_reached.code} ({maybe_reached.detail}); "
                        f"last: {exc.code} ({exc.detail})",
                        topic=topic,
                        broker_name=broker_name,
                        messages=_as_sent(send.msgs, send.docs),
                        cause=exc,
                    ) from exc
                log.info(
                    "produce retry topic=%s broker=%s attempt=%d reason=%s",
                    topic,
                    broker_name,
                    attempt + 1,
                    exc.code,
                )
            attempt += 1
            self.retries += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _move(self, send: _Send, tried: set[str], why: LedgerMQError) -> bool:
        """Move `send` to a writable set it has not tried; False when there is none."""
        try:
            route = await self.routes.get(send.topic)
            broker, queue_id = self._select(route.brokers, 0, send.topic, exclude=tried)
        except LedgerMQError:
            return False
        log.info(
            "produce moved topic=%s from=%s to=%s reason=%s",
            send.topic,
            send.broker_name,
            broker.broker_name,
            why.code,
        )
        send.assign(broker.broker_name, queue_id)
        self.moves += 1
        return True


class _Send:
    """One send in flight: its messages, their request documents and the set they go to."""

    def __init__(self, topic: str, msgs: list[Message], docs: list[dict[str, Any]], movable: bool) -> None:
        self.topic = topic
        self.msgs = msgs
        self.docs = docs
        self.movable = movable
        self.broker_name = ""

    def assign(self, broker_name: str, queue_id: int | None) -> None:
        """Aim at `broker_name`; the messages the caller gave no queue go to `queue_id`."""
        self.broker_name = broker_name
        for m, doc in zip(self.msgs, self.docs, strict=True):
            if m.queue_id is None:
                if queue_id is None:
                    doc.pop("queueId", None)
                else:
                    doc["queueId"] = queue_id


def _refused_by_set(exc: LedgerMQError) -> bool:
    """The set as a whole cannot take writes now, and said so before storing anything: no
    connection to its master, no master known, a refusal such as DISK_FULL."""
    if isinstance(exc, BrokerUnreachableError):
        return True
    if isinstance(exc, NotMasterError):
        return not exc.master_addr
    return isinstance(exc, ServerError) and delivery_of(exc) is Delivery.REFUSED


def _as_sent(msgs: list[Message], docs: list[dict[str, Any]]) -> list[Message]:
    """The messages with the idempotency keys and queue ids they were sent with."""
    return [
        dataclasses.replace(m, idempotency_key=d["idempotencyKey"], queue_id=d.get("queueId"))
        for m, d in zip(msgs, docs, strict=True)
    ]


class Producer:
    """Blocking producer: the same as `AsyncProducer`, run on a private event loop. Do not use it
    from inside a running event loop (use AsyncProducer there)."""

    def __init__(self, namesrv_addr: str | list[str] | None = None, **kw: Any) -> None:
        self._runner = asyncio.Runner()
        self._p: AsyncProducer = self._runner.run(_make(AsyncProducer, namesrv_addr, **kw))

    def send(
        self, topic: str, message: Message | bytes | str, *, broker_name: str | None = None, **kw: Any
    ) -> SendResult:
        """See `AsyncProducer.send`."""
        return self._runner.run(self._p.send(topic, message, broker_name=broker_name, **kw))

    def send_batch(
        self, topic: str, messages: Iterable[Message | bytes | str], *, broker_name: str | None = None
    ) -> list[SendResult]:
        """See `AsyncProducer.send_batch`."""
        return self._runner.run(self._p.send_batch(topic, list(messages), broker_name=broker_name))

    @property
    def retries(self) -> int:
        return self._p.retries

    def close(self) -> None:
        self._runner.run(self._p.close())
        self._runner.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(cls: type, *args: Any, **kw: Any) -> Any:
    # httpx.AsyncClient must be created on the loop that will use it.
    return cls(*args, **kw)
