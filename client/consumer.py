"""Consumers: `PullConsumer` (offset-based pull with long polling) and `SimpleConsumer`
(RocketMQ 5 style receive / ack with invisibility time), each sync and async."""

from __future__ import annotations

import asyncio
import base64
import itertools
from dataclasses import dataclass
from typing import Any

from client.errors import BrokerUnreachableError, LedgerMQError, NotMasterError, TopicNotExistError
from client.transport import AsyncTransport, BrokerSetRoute, RouteCache, split_addrs


@dataclass
class ReceivedMessage:
    """A message as the broker returns it; `body` is always bytes here."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    body: bytes
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    reconsume_times: int = 0
    receipt_handle: str | None = None
    broker_name: str | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @classmethod
    def from_json(cls, d: dict[str, Any], broker_name: str | None = None) -> ReceivedMessage:
        raw = d.get("body", "")
        body = base64.b64decode(raw) if d.get("bodyEncoding") == "base64" else raw.encode("utf-8")
        return cls(
            d["msgId"],
            d.get("topic", ""),
            d["queueId"],
            d["queueOffset"],
            d["commitLogOffset"],
            body,
            d.get("tags"),
            list(d.get("keys") or []),
            dict(d.get("properties") or {}),
            d.get("bornTimestamp", 0),
            d.get("storeTimestamp", 0),
            d.get("reconsumeTimes", 0),
            d.get("receiptHandle"),
            broker_name,
        )


@dataclass
class PullResult:
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass
class MessageQueue:
    """One queue of a topic in one broker set."""

    topic: str
    broker_name: str
    queue_id: int


class _RouteUser:
    def __init__(
        self,
        namesrv_addr: str | list[str] | None,
        broker_addr: str | list[str] | None,
        token: str | None,
        request_timeout_s: float,
    ) -> None:
        self.transport = AsyncTransport(token=token, timeout_s=request_timeout_s)
        self.routes = RouteCache(self.transport, split_addrs(namesrv_addr), split_addrs(broker_addr))

    async def _broker(self, topic: str, broker_name: str | None) -> BrokerSetRoute:
        route = await self.routes.get(topic)
        if broker_name is None:
            return route.brokers[0]
        broker = route.broker(broker_name)
        if broker is None:
            route = await self.routes.get(topic, refresh=True)
            broker = route.broker(broker_name)
        if broker is None:
            raise TopicNotExistError(f"broker set {broker_name!r} does not hold topic {topic!r}")
        return broker

    async def _read(self, topic: str, broker_name: str | None, method: str, path: str, **kw: Any) -> Any:
        """A read-only request: master first, then any slave (they serve committed data)."""
        broker = await self._broker(topic, broker_name)
        last: LedgerMQError | None = None
        for url in broker.urls():
            try:
                return await self.transport.request(method, url + path, **kw)
            except (BrokerUnreachableError, NotMasterError) as exc:
                last = exc
        self.routes.invalidate(topic)
        raise last or BrokerUnreachableError(f"no address for broker set {broker.broker_name}")

    async def close(self) -> None:
        await self.transport.aclose()


class AsyncPullConsumer(_RouteUser):
    """Pull by offset from any queue; the caller keeps offsets (or commits them with
    `commit_offset`)."""

    def __init__(
        self,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        request_timeout_s: float = 40.0,
    ) -> None:
        super().__init__(namesrv_addr, broker_addr, token, request_timeout_s)

    async def queues(self, topic: str) -> list[MessageQueue]:
        route = await self.routes.get(topic)
        return [
            MessageQueue(topic, b.broker_name, q) for b in route.brokers for q in range(b.read_queue_nums)
        ]

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        wait_ms: int = 0,
        broker_name: str | None = None,
    ) -> PullResult:
        params = {"offset": offset, "maxMessages": max_messages, "waitMs": wait_ms}
        broker = await self._broker(topic, broker_name)
        doc = await self._read(
            topic, broker.broker_name, "GET", f"/topics/{topic}/queues/{queue_id}/messages", params=params
        )
        return PullResult(
            [ReceivedMessage.from_json(m, broker.broker_name) for m in doc["messages"]],
            doc["nextOffset"],
            doc["minOffset"],
            doc["maxOffset"],
        )

    async def committed_offsets(
        self, group: str, topic: str, broker_name: str | None = None
    ) -> dict[int, int]:
        doc = await self._read(
            topic, broker_name, "GET", f"/consumers/{group}/offsets", params={"topic": topic}
        )
        return {o["queueId"]: o["offset"] for o in doc["offsets"] if o["topic"] == topic}

    async def commit_offset(
        self, group: str, topic: str, offsets: dict[int, int], broker_name: str | None = None
    ) -> None:
        broker = await self._broker(topic, broker_name)
        url = broker.master_url or broker.urls()[0]
        await self.transport.request(
            "PUT",
            f"{url}/consumers/{group}/offsets",
            json={"topic": topic, "offsets": {str(k): v for k, v in offsets.items()}},
        )


class AsyncSimpleConsumer(_RouteUser):
    """Group consumption: `receive` hides messages for `invisible_ms`; `ack` settles them; an
    unacked message comes back with `reconsume_times` + 1, and after the broker's
    maxReconsumeTimes it goes to `%DLQ%{group}`."""

    def __init__(
        self,
        group: str,
        topic: str,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        invisible_ms: int = 30_000,
        request_timeout_s: float = 40.0,
    ) -> None:
        super().__init__(namesrv_addr, broker_addr, token, request_timeout_s)
        self.group, self.topic, self.invisible_ms = group, topic, invisible_ms
        self._turn = itertools.count()

    async def receive(
        self, max_messages: int = 16, wait_ms: int = 0, invisible_ms: int | None = None
    ) -> list[ReceivedMessage]:
        route = await self.routes.get(self.topic)
        if not route.brokers:
            return []
        broker = route.brokers[next(self._turn) % len(route.brokers)]
        url = broker.master_url or broker.urls()[0]
        body = {
            "topic": self.topic,
            "maxMessages": max_messages,
            "waitMs": wait_ms,
            "invisibleMs": invisible_ms or self.invisible_ms,
        }
        try:
            doc = await self.transport.request("POST", f"{url}/consumers/{self.group}/receive", json=body)
        except (BrokerUnreachableError, NotMasterError):
            self.routes.invalidate(self.topic)
            raise
        return [ReceivedMessage.from_json(m, broker.broker_name) for m in doc["messages"]]

    async def _settle(self, action: str, msgs: list[ReceivedMessage], **extra: Any) -> dict[str, Any]:
        by_broker: dict[str | None, list[str]] = {}
        for m in msgs:
            if m.receipt_handle is None:
                raise ValueError(f"message {m.msg_id} has no receipt handle (was it received?)")
            by_broker.setdefault(m.broker_name, []).append(m.receipt_handle)
        result: dict[str, Any] = {}
        for name, handles in by_broker.items():
            broker = await self._broker(self.topic, name)
            url = broker.master_url or broker.urls()[0]
            result = await self.transport.request(
                "POST",
                f"{url}/consumers/{self.group}/{action}",
                json={"topic": self.topic, "receiptHandles": handles, **extra},
            )
        return result

    async def ack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        return await self._settle("ack", list(msgs))

    async def nack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        """Give messages back now (redelivered at once, counted as a reconsume)."""
        return await self._settle("nack", list(msgs))

    async def change_invisible_duration(self, msg: ReceivedMessage, invisible_ms: int) -> ReceivedMessage:
        broker = await self._broker(self.topic, msg.broker_name)
        url = broker.master_url or broker.urls()[0]
        doc = await self.transport.request(
            "POST",
            f"{url}/consumers/{self.group}/invisible",
            json={"topic": self.topic, "receiptHandle": msg.receipt_handle, "invisibleMs": invisible_ms},
        )
        msg.receipt_handle = doc.get("receiptHandle", msg.receipt_handle)
        return msg


class _SyncWrapper:
    """Runs an async client on a private event loop (not usable inside a running loop)."""

    _async_cls: type

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._runner = asyncio.Runner()
        self._c = self._runner.run(_make(self._async_cls, *args, **kw))

    def _run(self, coro: Any) -> Any:
        return self._runner.run(coro)

    def close(self) -> None:
        self._runner.run(self._c.close())
        self._runner.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(cls: type, *args: Any, **kw: Any) -> Any:
    return cls(*args, **kw)


class PullConsumer(_SyncWrapper):
    """Blocking twin of `AsyncPullConsumer` (same methods)."""

    _async_cls = AsyncPullConsumer

    def queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._c.queues(topic))

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        wait_ms: int = 0,
        broker_name: str | None = None,
    ) -> PullResult:
        return self._run(self._c.pull(topic, queue_id, offset, max_messages, wait_ms, broker_name))

    def committed_offsets(self, group: str, topic: str, broker_name: str | None = None) -> dict[int, int]:
        return self._run(self._c.committed_offsets(group, topic, broker_name))

    def commit_offset(
        self, group: str, topic: str, offsets: dict[int, int], broker_name: str | None = None
    ) -> None:
        self._run(self._c.commit_offset(group, topic, offsets, broker_name))


class SimpleConsumer(_SyncWrapper):
    """Blocking twin of `AsyncSimpleConsumer` (same methods)."""

    _async_cls = AsyncSimpleConsumer

    def receive(
        self, max_messages: int = 16, wait_ms: int = 0, invisible_ms: int | None = None
    ) -> list[ReceivedMessage]:
        return self._run(self._c.receive(max_messages, wait_ms, invisible_ms))

    def ack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        return self._run(self._c.ack(*msgs))

    def nack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        return self._run(self._c.nack(*msgs))

    def change_invisible_duration(self, msg: ReceivedMessage, invisible_ms: int) -> ReceivedMessage:
        return self._run(self._c.change_invisible_duration(msg, invisible_ms))
