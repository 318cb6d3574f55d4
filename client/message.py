"""What a producer sends and what it gets back: `Message`, `SendResult`, and the idempotency
keys it gives every message."""

from __future__ import annotations

import base64
import os
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Message:
    """A message to send. `body` bytes are sent base64 unless valid UTF-8 text. Set
    `idempotency_key` only to make separate sends of it count as one (the producer gives every
    send its own key otherwise).

    RocketMQ's message types: `message_group` makes it a FIFO message (a group's messages are
    stored in one queue in the order they were sent and consumed in that order; at most 64
    bytes); `deliver_at_ms` (epoch ms) or `delay_ms` makes it a delayed one (its result carries
    `deliver_at_ms` and a `recall_handle` for `recall`). The topic's `message.type` must allow
    the type (`mqadmin updateTopic -a +message.type=FIFO`), else the broker refuses the send.
    `keys` is a list, or one string of keys separated by spaces (RocketMQ's `setKeys`)."""

    body: bytes | str
    tags: str | None = None
    keys: list[str] | str = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    idempotency_key: str | None = None
    message_group: str | None = None
    deliver_at_ms: int | None = None
    delay_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The produce API's message object (`idempotencyKey` only when set here)."""
        raw = self.body
        if isinstance(raw, str):
            body, enc = raw, "utf-8"
        elif isinstance(raw, bytes | bytearray | memoryview):
            try:
                body, enc = str(raw, "utf-8"), "utf-8"
            except UnicodeDecodeError:
                body, enc = base64.b64encode(raw).decode("ascii"), "base64"
        else:
            raise TypeError(f"a message body is bytes or str, got {type(raw).__name__} (serialize it first)")
        doc: dict[str, Any] = {"body": body} if enc == "utf-8" else {"body": body, "bodyEncoding": enc}
        if self.tags is not None:
            doc["tags"] = self.tags
        if self.keys:
            doc["keys"] = self.keys.split() if isinstance(self.keys, str) else list(self.keys)
        if self.properties:
            doc["properties"] = dict(self.properties)
        if self.queue_id is not None:
            doc["queueId"] = self.queue_id
        if self.idempotency_key is not None:
            doc["idempotencyKey"] = self.idempotency_key
        if self.message_group is not None:
            doc["messageGroup"] = self.message_group
        if self.deliver_at_ms is not None:
            doc["deliverAt"] = self.deliver_at_ms
        if self.delay_ms is not None:
            doc["delayMs"] = self.delay_ms
        return doc


@dataclass
class SendResult:
    """Where a message was stored. A delayed message is stored in the timer queue until it is due:
    its `queue_offset` is -1 and it carries `deliver_at_ms` and `recall_handle`. A delayed or
    transactional message's `message_id` is the id it keeps from send to delivery (its
    `msg_id` names the stored copy in the timer queue or the half topic; None for other messages,
    whose `msg_id` is the one). A half message (`send_transactional`) carries its `transaction_id`."""

    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    broker_name: str
    message_id: str | None = None
    deliver_at_ms: int | None = None
    recall_handle: str | None = None
    transaction_id: str | None = None

    @classmethod
    def from_json(cls, res: dict[str, Any], broker_name: str) -> SendResult:
        """One entry of a produce answer's `results`."""
        return cls(res["msgId"], res["queueId"], res["queueOffset"], res["commitLogOffset"], broker_name,
                   res.get("messageId"), res.get("deliverAt"), res.get("recallHandle"),
                   res.get("transactionId"))


def as_message(m: Message | bytes | str) -> Message:
    return m if isinstance(m, Message) else Message(body=m)


_MAX_COUNTER = (1 << 64) - 1


class KeyGenerator:
    """Idempotency keys: a random 64-bit prefix per producer and a 64-bit counter, as 32 lower-case
    hex digits (0.2 us a key against 2 us for uuid4; RocketMQ's client message ids are built the
    same way: a fixed prefix and a sequence). `run(n)` reserves n consecutive keys, which a
    request names by its first (`firstIdempotencyKey`): the broker stores and remembers them as one."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._next = int.from_bytes(os.urandom(4), "big")
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            counter = self._next
            self._next = (counter + 1) & _MAX_COUNTER
        return f"{self._prefix}{counter:016x}"

    def run(self, n: int) -> list[str] | None:
        """`n` consecutive keys, or None where the counter would wrap within them (then draw
        them one by one)."""
        with self._lock:
            first = self._next
            if first + n - 1 > _MAX_COUNTER:
                return None
            self._next = (first + n) & _MAX_COUNTER
        prefix = self._prefix
        return [f"{prefix}{c:016x}" for c in range(first, first + n)]
