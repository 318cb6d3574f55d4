"""Consumers: `PullConsumer` (offset-based pull with long polling) and `SimpleConsumer`
(RocketMQ 5 style receive / ack with invisibility time), each sync and async."""

from __future__ import annotations

import asyncio
import base64
import itertools
from dataclasses import dataclass
from typing import Any

from client.errors import (
    BrokerUnreachableError,
    LedgerMQError,
    NotMasterError,
    ServerError,
    TopicNotExistError,
)
from client.fault import LatencyFaultTolerance
from client.transport import AsyncTransport, BrokerSetRoute, RouteCache, seg, split_addrs


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

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _broker(self, topic: str, broker_name: str | None) -> BrokerSetRoute:
        route = await self.routes.get(topic)
        if broker_name is None:
            if not route.brokers:
                raise TopicNotExistError(f"no broker set holds topic {topic!r}")
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

    async def _write(self, topic: str, broker: BrokerSetRoute, path: str, body: dict[str, Any]) -> Any:
        """POST `body` to the set's master; the cached route is dropped when it is unreachable
        or no longer the master."""
        try:
            return await self.transport.request("POST", broker.write_url() + path, json=body)
        except (BrokerUnreachableError, NotMasterError):
            self.routes.invalidate(topic)
            raise

    async def close(self) -> None:
        """Close the HTTP connections."""
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
        """Every readable queue of `topic`, per broker set. A route that does not carry queue
        numbers (broker_addr mode, or a topic the name servers do not route yet) is completed
        from the broker's own topic config; TopicNotExistError when no set holds the topic."""
        route = await self.routes.get(topic)
        out: list[MessageQueue] = []
        missing = 0
        for b in route.brokers:
            nums = b.read_queue_nums
            if nums == 0:
                try:
                    doc = await self._read(topic, b.broker_name, "GET", f"/topics/{seg(topic)}")
                except TopicNotExistError:
                    missing += 1
                    continue
                nums = int(doc.get("readQueueNums", 0))
            out += [MessageQueue(topic, b.broker_name, q) for q in range(nums)]
        if missing and missing == len(route.brokers):
            raise TopicNotExistError(f"no broker set holds topic {topic!r}")
        return out

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
        path = f"/topics/{seg(topic)}/queues/{seg(queue_id)}/messages"
        doc = await self._read(topic, broker.broker_name, "GET", path, params=params)
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
            topic, broker_name, "GET", f"/consumers/{seg(group)}/offsets", params={"topic": topic}
        )
        return {o["queueId"]: o["offset"] for o in doc["offsets"] if o["topic"] == topic}

    async def commit_offset(
        self, group: str, topic: str, offsets: dict[int, int], broker_name: str | None = None
    ) -> None:
        broker = await self._broker(topic, broker_name)
        try:
            await self.transport.request(
                "PUT",
                f"{broker.write_url()}/consumers/{seg(group)}/offsets",
                json={"topic": topic, "offsets": {str(k): v for k, v in offsets.items()}},
            )
        except (BrokerUnreachableError, NotMasterError):
            self.routes.invalidate(topic)
            raise


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
        fault_isolation_ms: int = 10_000,
    ) -> None:
        super().__init__(namesrv_addr, broker_addr, token, request_timeout_s)
        self.group, self.topic, self.invisible_ms = group, topic, invisible_ms
        self.fault = LatencyFaultTolerance(fault_isolation_ms)
        self._turn = itertools.count()

    async def receive(
        self, max_messages: int = 16, wait_ms: int = 0, invisible_ms: int | None = None
    ) -> list[ReceivedMessage]:
        """Receive from the topic's broker sets in turn (one set per call). A set that cannot
        serve (no connection, no master) is skipped for `fault_isolation_ms` and the next set
        asked in the same call; the error is raised only when no set could serve."""
        route = await self.routes.get(self.topic)
        if not route.brokers:
            return []
        body = {
            "topic": self.topic,
            "maxMessages": max_messages,
            "waitMs": wait_ms,
            # 0 is the caller's value (the broker refuses it), not "use the default"
            "invisibleMs": self.invisible_ms if invisible_ms is None else invisible_ms,
        }
        turn = next(self._turn)
        ordered = [route.brokers[(turn + i) % len(route.brokers)] for i in range(len(route.brokers))]
        ok = set(self.fault.available(b.broker_name for b in ordered))
        ordered.sort(key=lambda b: b.broker_name not in ok)  # stable: avoided sets last
        last: LedgerMQError | None = None
        for broker in ordered:
            try:
                doc = await self._write(self.topic, broker, f"/consumers/{seg(self.group)}/receive", body)
            except (BrokerUnreachableError, NotMasterError) as exc:
                self.fault.update(broker.broker_name, 0, failed=True)
                last = exc
                continue
            return [ReceivedMessage.from_json(m, broker.broker_name) for m in doc["messages"]]
        assert last is not None
        raise last

    async def _settle(self, action: str, msgs: list[ReceivedMessage]) -> dict[str, Any]:
        """One request per broker set; `{"results": [...]}` with one entry per message, in the
        caller's order. A failure of one set's request is raised (sets answered before it have
        applied theirs; settling again is harmless: an acked handle answers OK)."""
        by_broker: dict[str | None, list[int]] = {}
        for i, m in enumerate(msgs):
            if m.receipt_handle is None:
                raise ValueError(f"message {m.msg_id} has no receipt handle (was it received?)")
            by_broker.setdefault(m.broker_name, []).append(i)
        results: list[dict[str, Any] | None] = [None] * len(msgs)
        for name, idx in by_broker.items():
            broker = await self._broker(self.topic, name)
            handles = [msgs[i].receipt_handle for i in idx]
            doc = await self._write(
                self.topic,
                broker,
                f"/consumers/{seg(self.group)}/{action}",
                {"topic": self.topic, "receiptHandles": handles},
            )
            answered = doc.get("results") or []
            if len(answered) != len(idx):
                raise ServerError(
                    f"{action} on {broker.broker_name}: {len(answered)} results for {len(idx)} handles"
                )
            for i, r in zip(idx, answered, strict=True):
                results[i] = r
        return {"results": results}

    async def ack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        """Settle messages: `{"results": [{"receiptHandle", "status"}]}` in the order given;
        status EXPIRED when the handle is no longer current (the message was redelivered)."""
        return await self._settle("ack", list(msgs))

    async def nack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        """Give messages back now (redelivered at once, counted as a reconsume); results as `ack`."""
        return await self._settle("nack", list(msgs))

    async def change_invisible_duration(self, msg: ReceivedMessage, invisible_ms: int) -> ReceivedMessage:
        """Hide `msg` for `invisible_ms` from now; updates and returns it with its new handle."""
        if msg.receipt_handle is None:
            raise ValueError(f"message {msg.msg_id} has no receipt handle (was it received?)")
        broker = await self._broker(self.topic, msg.broker_name)
        doc = await self._write(
            self.topic,
            broker,
            f"/consumers/{seg(self.group)}/invisible",
            {"topic": self.topic, "receiptHandle": msg.receipt_handle, "invisibleMs": invisible_ms},
        )
        msg.receipt_handle = doc.get("receiptHandle", msg.receipt_handle)
        return msg


class _SyncWrapper:
    """Runs an async client on a private event loop (not usable inside a running loop)."""

    _async_cls: type

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._runner: asyncio.Runner | None = asyncio.Runner()
        self._c = self._runner.run(_make(self._async_cls, *args, **kw))

    def _run(self, coro: Any) -> Any:
        if self._runner is None:
            coro.close()
            raise RuntimeError("the client is closed")
        return self._runner.run(coro)

    def close(self) -> None:
        """Close the connections and the private event loop (a second call does nothing)."""
        if self._runner is None:
            return
        self._runner.run(self._c.close())
        self._runner.close()
        self._runner = None

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
