"""`Producer` / `AsyncProducer`: send messages to the master of a topic's broker set.

Queue selection is round robin over the writable (broker set, queue) pairs of the topic's route.
Every message gets an `idempotencyKey` (uuid4) before its first attempt, and a retry goes to the
same broker set and queue, so the master answers a retried key with the original result instead
of storing it twice — this holds across master failover because the key table is rebuilt from the
replicated log. Retries happen on NOT_MASTER (to the named master, or after a route refresh),
connection errors, 503 and 504 (outcome unknown), until `send_timeout_s` has passed.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from client.errors import LedgerMQError, NotMasterError, TopicNotExistError
from client.transport import PERM_WRITE, AsyncTransport, BrokerSetRoute, RouteCache, base_url, split_addrs

log = logging.getLogger(__name__)


@dataclass
class Message:
    """A message to send. `body` bytes are sent base64 unless valid UTF-8 text."""

    body: bytes | str
    tags: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    idempotency_key: str | None = None

    def to_json(self) -> dict[str, Any]:
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
    single broker without a name server."""

    def __init__(
        self,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        send_timeout_s: float = 15.0,
        request_timeout_s: float = 5.0,
    ) -> None:
        self.transport = AsyncTransport(token=token, timeout_s=request_timeout_s)
        self.routes = RouteCache(self.transport, split_addrs(namesrv_addr), split_addrs(broker_addr))
        self.send_timeout_s = send_timeout_s
        self._counter = itertools.count()
        self.retries = 0  # attempts beyond the first, for tests and metrics

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.transport.aclose()

    async def send(self, topic: str, message: Message | bytes | str, **kw: Any) -> SendResult:
        """Send one message; keyword args (tags, keys, properties, queue_id) build a Message."""
        msg = _as_message(message)
        for k, v in kw.items():
            setattr(msg, k, v)
        return (await self.send_batch(topic, [msg]))[0]

    async def send_batch(self, topic: str, messages: Iterable[Message | bytes | str]) -> list[SendResult]:
        """Send messages as one batch to one queue (stored contiguously, in order)."""
        msgs = [_as_message(m) for m in messages]
        if not msgs:
            return []
        for m in msgs:
            if m.idempotency_key is None:
                m.idempotency_key = uuid.uuid4().hex
        route = await self.routes.get(topic)
        broker, queue_id = self._select(route.brokers, msgs[0].queue_id, topic)
        payload = {"messages": [m.to_json() for m in msgs]}
        if queue_id is not None:
            for doc in payload["messages"]:
                doc["queueId"] = queue_id
        return await self._send_with_retry(topic, broker.broker_name, payload)

    def _select(
        self, brokers: list[BrokerSetRoute], queue_id: int | None, topic: str
    ) -> tuple[BrokerSetRoute, int | None]:
        writable = [b for b in brokers if b.perm & PERM_WRITE and (b.master_addr or 0 in b.addrs)]
        if not writable:
            writable = [b for b in brokers if b.perm & PERM_WRITE]
        if not writable:
            raise TopicNotExistError(f"no writable broker set for topic {topic!r}")
        pairs = [(b, q) for b in writable for q in range(b.write_queue_nums)] or [(b, None) for b in writable]
        n = next(self._counter)
        if queue_id is not None:
            # The caller picked the queue: take the broker set in turn that has it.
            cands = [b for b in writable if queue_id < b.write_queue_nums or b.write_queue_nums == 0]
            return (cands or writable)[n % len(cands or writable)], queue_id
        return pairs[n % len(pairs)]

    async def _send_with_retry(
        self, topic: str, broker_name: str, payload: dict[str, Any]
    ) -> list[SendResult]:
        deadline = time.monotonic() + self.send_timeout_s
        hint: str | None = None
        delay = 0.05
        attempt = 0
        while True:
            url: str | None = hint
            if url is None:
                route = await self.routes.get(topic, refresh=attempt > 0)
                broker = route.broker(broker_name)
                url = broker.master_url if broker else None
            try:
                if url is None:
                    raise NotMasterError(f"broker set {broker_name} has no master in the route")
                doc = await self.transport.request("POST", f"{url}/topics/{topic}/messages", json=payload)
                return [
                    SendResult(r["msgId"], r["queueId"], r["queueOffset"], r["commitLogOffset"], broker_name)
                    for r in doc["results"]
                ]
            except LedgerMQError as exc:
                if not exc.retryable or time.monotonic() + delay > deadline:
                    raise
                hint = (
                    base_url(exc.master_addr) if isinstance(exc, NotMasterError) and exc.master_addr else None
                )
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


class Producer:
    """Blocking producer: the same as `AsyncProducer`, run on a private event loop. Do not use it
    from inside a running event loop (use AsyncProducer there)."""

    def __init__(self, namesrv_addr: str | list[str] | None = None, **kw: Any) -> None:
        self._runner = asyncio.Runner()
        self._p: AsyncProducer = self._runner.run(_make(AsyncProducer, namesrv_addr, **kw))

    def send(self, topic: str, message: Message | bytes | str, **kw: Any) -> SendResult:
        return self._runner.run(self._p.send(topic, message, **kw))

    def send_batch(self, topic: str, messages: Iterable[Message | bytes | str]) -> list[SendResult]:
        return self._runner.run(self._p.send_batch(topic, list(messages)))

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
