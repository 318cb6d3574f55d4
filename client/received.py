"""Messages as consumers receive them: `ReceivedMessage`, from the JSON answers and from the
broker's binary pull page (`wire.pullpage`: the format, shared with the broker and the Spark
source; docs/INTERFACES.md, "Binary pull format").

Bodies come as raw bytes (no base64 and no JSON string to decode): a pull page of 1 KB messages
decodes in ~1.5 us a message here against ~3 us for the JSON form (measured, bench/sdk_bench.py).
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

from client.errors import ServerError
from wire import pullpage

PULL_BINARY_CONTENT_TYPE = pullpage.CONTENT_TYPE


@dataclass(slots=True)
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
    # The id its producer was answered with (RocketMQ's message id, its UNIQ_KEY) from send to
    # delivery; in received and queried messages, not in binary pull pages.
    message_id: str | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @property
    def message_group(self) -> str | None:
        """A FIFO message's group (RocketMQ's `__SHARDINGKEY` property), else None."""
        return self.properties.get("__SHARDINGKEY")

    @property
    def attempt(self) -> int:
        """1 for the first delivery, 2 for the first redelivery, ..."""
        return self.reconsume_times + 1

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
            d.get("messageId"),
        )


@dataclass(slots=True)
class PullResult:
    """One pull answer: its messages and the queue's offsets."""

    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int


def decode_binary_page(data: bytes, topic: str, broker_name: str | None) -> PullResult:
    """Decode a binary pull page; ServerError for anything that does not follow the layout."""
    try:
        magic, version, count, next_offset, min_offset, max_offset = pullpage.HEADER.unpack_from(data, 0)
        if magic != pullpage.MAGIC or version != pullpage.VERSION:
            raise ValueError(f"magic {magic!r} version {version}")
        records = []
        pos = pullpage.HEADER.size
        unpack = pullpage.RECORD.unpack_from
        record_size = pullpage.RECORD.size
        for _ in range(count):
            (q_off, cl_off, born, stored, reconsume, qid, id_len, tags_len, keys_len, props_len, body_len) = (
                unpack(data, pos)
            )
            pos += record_size
            msg_id = data[pos : pos + id_len].decode("ascii")
            pos += id_len
            tags = None
            if tags_len >= 0:
                tags = data[pos : pos + tags_len].decode("utf-8")
                pos += tags_len
            keys = data[pos : pos + keys_len].decode("utf-8").split(" ") if keys_len else []
            pos += keys_len
            props = dict(pullpage.parse_properties(data[pos : pos + props_len])) if props_len else {}
            pos += props_len
            records.append((msg_id, qid, q_off, cl_off, tags, keys, props, born, stored, reconsume, body_len))
        messages = []
        for msg_id, qid, q_off, cl_off, tags, keys, props, born, stored, reconsume, body_len in records:
            body = data[pos : pos + body_len]
            if len(body) != body_len:
                raise ValueError("a body runs past the end")
            pos += body_len
            messages.append(
                ReceivedMessage(
                    msg_id, topic, qid, q_off, cl_off, body, tags, keys, props, born, stored, reconsume,
                    None, broker_name,
                )
            )  # fmt: skip
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} bytes after the last body")
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ServerError(f"bad binary pull page from {broker_name}: {exc}") from None
    return PullResult(messages, next_offset, min_offset, max_offset)
