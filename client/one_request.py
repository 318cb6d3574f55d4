"""`send_batch`: the caller's messages in one request to one broker set, stored together in
order (the batching path is `client.sender`). Same rules: every retry sends the same keys to the
same set; a send that its set refused definitively before any attempt may have reached a set moves
to another set; once an attempt may have reached a set, the send stays there and ends, if it must,
as `SendOutcomeUnknownError`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from client.errors import LedgerMQError, NotMasterError, SendOutcomeUnknownError
from client.fault import LatencyFaultTolerance
from client.message import Message, SendResult
from client.outcome import Delivery, delivery_of
from client.sender import refused_by_set
from client.transport import AsyncTransport, BrokerSetRoute, RouteCache, base_url, seg


class ProducerParts(Protocol):
    """What a one-request send uses of its producer (`client.producer.AsyncProducer`)."""

    send_timeout_s: float
    routes: RouteCache
    transport: AsyncTransport
    fault: LatencyFaultTolerance
    stats: dict[str, int]

    def _select(
        self, brokers: list[BrokerSetRoute], min_queues: int, topic: str, exclude: Iterable[str] = ()
    ) -> tuple[BrokerSetRoute, int | None]: ...


log = logging.getLogger(__name__)


async def send_one_request(
    p: ProducerParts, send: OneRequest, *, first: LedgerMQError | None = None, started: float | None = None
) -> list[SendResult]:
    """POST the messages to their set's master, retrying with the same keys until
    `send_timeout_s` after `started` (default: now). A movable send that its set refused
    (`refused_by_set`) before any attempt may have reached a set moves to another set. Once an
    attempt may have reached a set, the send stays there and its final error is a
    `SendOutcomeUnknownError`, whatever later attempts saw (a dead set refuses connections: that
    says nothing about the request already sent). `first`: how an attempt the caller made itself
    failed (`Producer.send`'s own request), taken as this send's first attempt."""
    topic = send.topic
    payload = {"messages": send.docs}
    deadline = (time.monotonic() if started is None else started) + p.send_timeout_s
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
            if first is not None:
                failed, first = first, None
                raise failed
            url = hint or await p.routes.master_url(topic, broker_name, refresh=attempt > 0)
            p.stats["requests"] += 1
            doc = await p.transport.request("POST", url + path, json=payload)
            p.fault.update(broker_name, (time.monotonic() - started) * 1000, failed=False)
            return [SendResult.from_json(r, broker_name) for r in doc["results"]]
        except LedgerMQError as exc:
            delivery = delivery_of(exc)
            if maybe_reached is None and delivery is Delivery.MAYBE:
                maybe_reached = exc
            hint = base_url(exc.master_addr) if isinstance(exc, NotMasterError) and exc.master_addr else None
            if hint is None and (delivery is Delivery.MAYBE or refused_by_set(exc)):
                p.fault.update(broker_name, (time.monotonic() - started) * 1000, failed=True)
            if send.movable and maybe_reached is None and refused_by_set(exc):
                tried.add(broker_name)
                if await _move(p, send, tried, exc):
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
        p.stats["retries"] += 1
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def _move(p: ProducerParts, send: OneRequest, tried: set[str], why: LedgerMQError) -> bool:
    """Move `send` to a writable set it has not tried; False when there is none."""
    try:
        route = await p.routes.get(send.topic)
        broker, queue_id = p._select(route.brokers, 0, send.topic, exclude=tried)
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
    p.stats["moves"] += 1
    return True


class OneRequest:
    """One `send_batch` in flight: its messages, their request documents and the set they go to."""

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


def _as_sent(msgs: list[Message], docs: list[dict[str, Any]]) -> list[Message]:
    """The messages with the idempotency keys and queue ids they were sent with."""
    return [
        dataclasses.replace(m, idempotency_key=d["idempotencyKey"], queue_id=d.get("queueId"))
        for m, d in zip(msgs, docs, strict=True)
    ]
