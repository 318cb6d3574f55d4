"""Wire codec of the hot routes: produce bodies (JSON or raw) in, messages out, with orjson.

Validation is by hand (not pydantic) because these routes carry the throughput; every rejection
is a BrokerError naming the field (`messages[3].body`), never a 500. The pydantic models in
`schemas.py` describe the same shapes for the OpenAPI document.
"""

from __future__ import annotations

import base64
import binascii
import operator
import re
import time
from typing import Any

import orjson

from broker.errors import BrokerError, invalid
from broker.message import (
    BODY_LENGTH_POSITION,
    KEY_SEPARATOR,
    MAX_KEY_COUNTER,
    PROPERTY_IDEMPOTENCY_KEY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    KeyRun,
    Message,
    MessageExt,
    MessageHead,
    bytes_to_properties,
    create_message_id,
    key_sequence,
)
from broker.message_model import typed_properties
from broker.service.validation import (
    MAX_BATCH_MESSAGES,
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_QUEUE_ID,
    MAX_TAGS_LENGTH,
    RESERVED_PROPERTIES,
    check_body_size,
    check_keys,
    check_properties,
    check_queue_id,
    check_text,
)
from wire import pullpage

# The typed fields of a message (the message model: delay, FIFO, transactions), mapped onto
# RocketMQ's properties by `broker.message_model.typed_properties`.
_TYPED_FIELDS = frozenset(
    {"deliverAt", "delayMs", "delayTimeLevel", "messageGroup", "transactional", "producerGroup"}
)
_MESSAGE_FIELDS = frozenset(
    {"body", "bodyEncoding", "tags", "keys", "properties", "queueId", "idempotencyKey"}
) | _TYPED_FIELDS
# What the SDK sends for a message: its batches also name the queue of every message.
_SDK_FIELDS = frozenset({"body", "bodyEncoding", "idempotencyKey", "queueId"})
_BATCH_FIELDS = frozenset({"messages", "firstIdempotencyKey"})


def _messages_of(raw: bytes) -> tuple[list[Any], KeyRun | None]:
    """The message objects of a produce body — `{"messages": [...]}`, or one message object —
    and the key run its `firstIdempotencyKey` gives them."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid("body", f"not valid JSON: {exc}") from None
    if isinstance(doc, dict) and "messages" not in doc and "body" in doc:
        doc = {"messages": [doc]}
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        raise invalid("messages", 'expected {"messages": [{"body": ...}, ...]}')
    first_key = doc.get("firstIdempotencyKey")  # null: none, as when absent
    if len(doc) > (2 if "firstIdempotencyKey" in doc else 1):
        raise invalid(sorted(k for k in doc if k not in _BATCH_FIELDS)[0],
                      'unknown field; the body is {"messages": [...], "firstIdempotencyKey": ...}')
    items: list[Any] = doc["messages"]
    if not items:
        raise invalid("messages", "at least one message is required")
    if len(items) > MAX_BATCH_MESSAGES:
        raise invalid("messages", f"at most {MAX_BATCH_MESSAGES} messages per request")
    if first_key is None:
        return items, None
    seq = key_sequence(first_key) if type(first_key) is str else None
    if seq is None:
        raise invalid("firstIdempotencyKey", "expected 32 lower-case hex digits: 16 of prefix, then 16 of "
                      "the first message's counter")
    if seq[1] + len(items) - 1 > MAX_KEY_COUNTER:
        raise invalid("firstIdempotencyKey", f"the counter of message {len(items) - 1} would pass 2^64 - 1")
    return items, KeyRun(*seq)


def _body_bytes(item: dict[str, Any], where: str) -> bytes:
    body = item.get("body")
    if not isinstance(body, str):
        raise invalid(f"{where}.body", "required string (text, or base64 with bodyEncoding=base64)")
    encoding = item.get("bodyEncoding", "utf-8")
    if encoding == "utf-8":
        return body.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{where}.body", "not valid base64") from None
    raise invalid(f"{where}.bodyEncoding", f"expected 'utf-8' or 'base64', got {encoding!r}")


def _full_message(
    item: Any, where: str, topic: str, max_message_size: int, born_host: str, now: int
) -> tuple[Message, int | None]:
    """One message object of any shape the API allows, every field checked."""
    if not isinstance(item, dict):
        raise invalid(where, "expected an object")
    unknown = item.keys() - _MESSAGE_FIELDS
    if unknown:  # a typo like "bodyEncodng" must not be silently ignored
        name = sorted(unknown)[0]
        raise invalid(f"{where}.{name}", f"unknown field; known: {', '.join(sorted(_MESSAGE_FIELDS))}")
    data = _body_bytes(item, where)
    check_body_size(len(data), max_message_size, f"{where}.body")
    for nullable in ("keys", "properties", "body", "bodyEncoding"):
        if nullable in item and item[nullable] is None:
            raise invalid(f"{where}.{nullable}", "must not be null (leave it out instead)")
    properties = check_properties(item.get("properties"), f"{where}.properties")
    if not item.keys().isdisjoint(_TYPED_FIELDS):
        properties = {**properties, **_typed(item, where)}
    msg = Message(
        topic=topic,
        body=data,
        tags=check_text(item.get("tags"), f"{where}.tags", MAX_TAGS_LENGTH),
        keys=check_keys(item.get("keys"), f"{where}.keys"),
        properties=properties,
        idempotency_key=check_text(
            item.get("idempotencyKey"), f"{where}.idempotencyKey", MAX_IDEMPOTENCY_KEY_LENGTH
        ),
        born_timestamp=now,
        born_host=born_host,
    )
    return msg, check_queue_id(item.get("queueId"), f"{where}.queueId")


def _opt_int(item: dict[str, Any], key: str, where: str, hi: int) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= hi:
        raise invalid(f"{where}.{key}", f"expected an integer in 0..{hi}")
    return value


def _typed(item: dict[str, Any], where: str) -> dict[str, str]:
    """The properties of a message's typed fields (their rules: `MessageModelService`)."""
    transactional = item.get("transactional")
    if transactional is not None and type(transactional) is not bool:
        raise invalid(f"{where}.transactional", "expected true or false")
    return typed_properties(
        deliver_at_ms=_opt_int(item, "deliverAt", where, 2**62),
        delay_ms=_opt_int(item, "delayMs", where, 2**62),
        delay_level=_opt_int(item, "delayTimeLevel", where, 1000),
        message_group=check_text(item.get("messageGroup"), f"{where}.messageGroup", MAX_TAGS_LENGTH),
        transactional=bool(transactional),
        producer_group=check_text(item.get("producerGroup"), f"{where}.producerGroup", MAX_TAGS_LENGTH),
    )


def parse_produce_json(
    raw: bytes, topic: str, max_message_size: int, born_host: str
) -> tuple[list[Message], list[int | None], KeyRun | None]:
    """`{"messages": [...]}` (or one message object) → (messages, queueId of each, the key run
    of `firstIdempotencyKey`: message i's key is its prefix and its counter + i)."""
    items, key_run = _messages_of(raw)
    now = int(time.time() * 1000)
    msgs: list[Message] = []
    queues: list[int | None] = []
    for i, item in enumerate(items):
        # The common bulk shapes: {"body": "..."}, and the SDK's {body, bodyEncoding: utf-8,
        # idempotencyKey, queueId} (or a subset of it). A key or queue id that is not a plain
        # one goes to `check_text` / `check_queue_id`, which name the error.
        if type(item) is dict and type(body := item.get("body")) is str:
            fast = True
            if len(item) == 1:
                idem = qid = None
            elif len(item) == 2 and type(qid := item.get("queueId")) is int and 0 <= qid <= MAX_QUEUE_ID:
                idem = None  # the SDK's shape when its batch carries the keys (firstIdempotencyKey)
            elif item.keys() <= _SDK_FIELDS and item.get("bodyEncoding", "utf-8") == "utf-8":
                idem = item.get("idempotencyKey")
                if idem is not None:
                    if type(idem) is not str or len(idem) > MAX_IDEMPOTENCY_KEY_LENGTH or "\x01" in idem \
                            or "\x02" in idem:
                        idem = check_text(idem, f"messages[{i}].idempotencyKey", MAX_IDEMPOTENCY_KEY_LENGTH)
                    if key_run is not None:
                        raise _key_with_run(i)
                qid = item.get("queueId")
                if qid is not None and (type(qid) is not int or not 0 <= qid <= MAX_QUEUE_ID):
                    qid = check_queue_id(qid, f"messages[{i}].queueId")
            else:
                fast = False
            if fast:
                data = body.encode("utf-8")
                if len(data) > max_message_size:
                    check_body_size(len(data), max_message_size, f"messages[{i}].body")
                msgs.append(Message(topic, data, None, None, None, 0, idem, now, born_host))
                queues.append(qid)
                continue
        msg, qid = _full_message(item, f"messages[{i}]", topic, max_message_size, born_host, now)
        if key_run is not None and msg.idempotency_key is not None:
            raise _key_with_run(i)
        msgs.append(msg)
        queues.append(qid)
    return msgs, queues, key_run


def _key_with_run(i: int) -> BrokerError:
    return invalid(f"messages[{i}].idempotencyKey", "not with firstIdempotencyKey, which gives every "
                   "message of the request its key")


def parse_produce_raw(
    data: bytes, params: Any, topic: str, max_message_size: int, born_host: str
) -> tuple[Message, int | None]:
    """An `application/octet-stream` body with tags/keys/queueId/idempotencyKey as query parameters."""
    check_body_size(len(data), max_message_size, "body")
    q = dict(params)
    keys = [k for k in (q.get("keys") or "").split(",") if k]
    qid_raw = q.get("queueId")
    queue_id = None
    if qid_raw not in (None, ""):
        if not (qid_raw.isascii() and qid_raw.isdigit()) or len(qid_raw) > 5:
            raise invalid("queueId", f"expected an integer in 0..65535, got {qid_raw[:40]!r}")
        queue_id = check_queue_id(int(qid_raw), "queueId")
    msg = Message(
        topic=topic,
        body=data,
        tags=check_text(q.get("tags"), "query.tags", MAX_TAGS_LENGTH),
        keys=check_keys(keys, "keys"),
        idempotency_key=check_text(
            q.get("idempotencyKey"), "query.idempotencyKey", MAX_IDEMPOTENCY_KEY_LENGTH
        ),
        born_timestamp=int(time.time() * 1000),
        born_host=born_host,
    )
    return msg, queue_id


_HOST_HEX: dict[str, str] = {}  # store host → the 16 hex digits it contributes to a msgId
# What the API shows as `tags`/`keys` or not at all; the rest are the user's properties.
_SYSTEM_PROPERTIES = RESERVED_PROPERTIES


def message_json(m: MessageExt, force_base64: bool = False) -> dict[str, Any]:
    """A stored message as the API shows it: text body when valid UTF-8, base64 otherwise.
    (Hot on pull: one pass over the properties instead of the MessageExt accessors.)"""
    body = m.body
    if force_base64:
        text, enc = base64.b64encode(body).decode("ascii"), "base64"
    else:
        try:
            text, enc = body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, enc = base64.b64encode(body).decode("ascii"), "base64"
    props = m.properties
    keys_raw = props.get(PROPERTY_KEYS)
    prefix = _HOST_HEX.get(m.store_host)
    if prefix is None:
        prefix = _HOST_HEX[m.store_host] = create_message_id(m.store_host, 0)[:16]
    return {
        # = create_message_id(store_host, offset): host+port hex, then the offset as 16 hex digits.
        "msgId": f"{prefix}{m.commit_log_offset:016X}",
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "commitLogOffset": m.commit_log_offset,
        "body": text,
        "bodyEncoding": enc,
        "tags": props.get(PROPERTY_TAGS),
        "keys": [k for k in keys_raw.split(KEY_SEPARATOR) if k] if keys_raw else [],
        "properties": {k: v for k, v in props.items() if k not in _SYSTEM_PROPERTIES},
        "bornTimestamp": m.born_timestamp,
        "storeTimestamp": m.store_timestamp,
        "reconsumeTimes": m.reconsume_times,
        # The UNIQ_KEY: the id its producer knows it by, from send to delivery.
        "messageId": props.get(PROPERTY_UNIQ_KEY),
    }


_HOST_PREFIX: dict[tuple[bytes, int], str] = {}  # (store ip, port) → the 16 hex digits of a msgId
# The stored properties of the bulk shapes, which show no tags, keys or user properties: UNIQ_KEY
# alone (a bare produce), or with IDEMPOTENCY_KEY (before it: every SDK message; after it: a
# producer that set its own UNIQ_KEY); group 1 is UNIQ_KEY's value. Anything else (another key,
# an empty item, UNIQ_KEY twice) goes through `bytes_to_properties`.
_IDEMPOTENCY_ITEM = b"(?:%s\x01[^\x01\x02]*\x02)?" % PROPERTY_IDEMPOTENCY_KEY.encode()
_BULK_PROPERTIES = re.compile(
    _IDEMPOTENCY_ITEM + b"%s\x01([^\x01\x02]*)\x02" % PROPERTY_UNIQ_KEY.encode() + _IDEMPOTENCY_ITEM
).fullmatch
_BODY_AT = BODY_LENGTH_POSITION + 4


# The fields of a stored message's head (`broker.message.MessageHead`) that a pull answer carries,
# fetched by one itemgetter (positions looked up by name once: a quarter cheaper than attrgetter).
_head_fields = operator.itemgetter(*(MessageHead._fields.index(name) for name in (
    "total_size", "queue_id", "queue_offset", "physical_offset", "born_timestamp", "store_timestamp",
    "store_ip", "store_port", "reconsume_times")))


def message_json_view(
    view: memoryview,
    head: MessageHead,
    topic_at: int,
    props_at: int,
    force_base64: bool = False,
    message_id: bool = False,
) -> dict[str, Any]:
    """`message_json` built straight from a stored message's bytes (validated by the store's
    `read_messages`): no `MessageExt`, no body copy before the text decode, and a message whose
    properties are the bulk shapes' (`_BULK_PROPERTIES`) skips the properties parse. `messageId`
    only when `message_id` (pull pages leave it out)."""
    total, queue_id, queue_offset, phys, born_ts, store_ts, store_ip, store_port, reconsume = _head_fields(
        head
    )
    body = view[_BODY_AT:topic_at]
    if force_base64:
        text, enc = base64.b64encode(body).decode("ascii"), "base64"
    else:
        try:
            text, enc = str(body, "utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, enc = base64.b64encode(body).decode("ascii"), "base64"
    raw = bytes(view[props_at + 2 : total])
    bulk = _BULK_PROPERTIES(raw)
    if bulk is not None:
        tags, keys, user = None, [], {}
        # Decoded as leniently as `bytes_to_properties` would: the same string either way.
        uniq = str(bulk[1], "utf-8", "replace") if message_id else None
    else:
        props = bytes_to_properties(raw)
        keys_raw = props.get(PROPERTY_KEYS)
        tags = props.get(PROPERTY_TAGS)
        keys = [k for k in keys_raw.split(KEY_SEPARATOR) if k] if keys_raw else []
        user = {k: v for k, v in props.items() if k not in _SYSTEM_PROPERTIES}
        uniq = props.get(PROPERTY_UNIQ_KEY)
    host = (store_ip, store_port)
    prefix = _HOST_PREFIX.get(host)
    if prefix is None:
        prefix = _HOST_PREFIX[host] = (store_ip + store_port.to_bytes(4, "big")).hex().upper()
    doc = {
        "msgId": f"{prefix}{phys:016X}",  # = create_message_id(store_host, phys)
        "topic": str(view[topic_at + 1 : props_at], "utf-8", "replace"),
        "queueId": queue_id,
        "queueOffset": queue_offset,
        "commitLogOffset": phys,
        "body": text,
        "bodyEncoding": enc,
        "tags": tags,
        "keys": keys,
        "properties": user,
        "bornTimestamp": born_ts,
        "storeTimestamp": store_ts,
        "reconsumeTimes": reconsume,
    }
    if message_id:
        doc["messageId"] = uniq
    return doc


# ---- binary pull format: wire/pullpage.py (the layout, for the broker and both readers) ----
PULL_BINARY_CONTENT_TYPE = pullpage.CONTENT_TYPE
_pack_record = pullpage.RECORD.pack
_HOST_PREFIX_B: dict[tuple[bytes, int], bytes] = {}


def message_binary_view(
    view: memoryview, head: MessageHead, topic_at: int, props_at: int
) -> tuple[bytes, bytes]:
    """One stored message as (record + variable fields, body) of the binary pull format, built
    from the store's validated bytes like `message_json_view` (the same fields, no text decode)."""
    total, queue_id, queue_offset, phys, born_ts, store_ts, store_ip, store_port, reconsume = _head_fields(
        head
    )
    body = bytes(view[_BODY_AT:topic_at])
    raw = bytes(view[props_at + 2 : total])
    if _BULK_PROPERTIES(raw) is not None:
        tags, keys, user = None, b"", b""
    else:
        # Through the same lenient parse as JSON, so both forms show the very same strings.
        props = bytes_to_properties(raw)
        t = props.get(PROPERTY_TAGS)
        tags = None if t is None else t.encode()
        keys = (props.get(PROPERTY_KEYS) or "").encode()
        user = "".join(f"{k}\x01{v}\x02" for k, v in props.items() if k not in _SYSTEM_PROPERTIES).encode()
    host = (store_ip, store_port)
    prefix = _HOST_PREFIX_B.get(host)
    if prefix is None:
        prefix = _HOST_PREFIX_B[host] = (store_ip + store_port.to_bytes(4, "big")).hex().upper().encode()
    msg_id = b"%s%016X" % (prefix, phys)
    rec = _pack_record(
        queue_offset,
        phys,
        born_ts,
        store_ts,
        reconsume,
        queue_id,
        len(msg_id),
        -1 if tags is None else len(tags),
        len(keys),
        len(user),
        len(body),
    )
    return b"".join((rec, msg_id, tags or b"", keys, user)), body


def pull_binary_bytes(
    items: list[tuple[bytes, bytes]], next_offset: int, min_offset: int, max_offset: int
) -> bytes:
    """A whole binary pull page from `message_binary_view` results (layout: wire/pullpage.py)."""
    parts = [pullpage.HEADER.pack(pullpage.MAGIC, pullpage.VERSION, len(items), next_offset, min_offset,
                                  max_offset)]
    parts.extend([rec for rec, _ in items])
    parts.extend([body for _, body in items])
    return b"".join(parts)
