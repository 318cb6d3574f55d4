"""Protobuf messages ⇄ the broker's `Message` / `MessageExt` (RocketMQ proxy's GrpcConverter).

Only the wire form is handled here: body encoding, timestamps, hosts, where each system property
travels. What a message may contain (sizes, tags, keys, property names) is checked by
`broker.service.validation.check_message`, the same rules as HTTP's.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.errors import BrokerCode, BrokerError, invalid
from broker.grpc.protocol import pb
from broker.message import PROPERTY_UNIQ_KEY, Message, MessageExt
from broker.message_model import MODEL_PROPERTIES, message_shape, typed_properties
from broker.message_type import TopicMessageType
from broker.service.validation import MAX_CLIENT_ID_LENGTH as MAX_MESSAGE_ID_LENGTH
from broker.service.validation import check_message


def millis(ts: Timestamp) -> int:
    """A protobuf Timestamp in milliseconds since the epoch."""
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def timestamp(ms: int) -> Timestamp:
    """Milliseconds since the epoch as a protobuf Timestamp."""
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: Duration) -> int:
    """A protobuf Duration in milliseconds (negative stays negative, for the range checks)."""
    return d.seconds * 1000 + d.nanos // 1_000_000


def duration(ms: int) -> Duration:
    """Milliseconds as a protobuf Duration."""
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _gunzip(data: bytes, limit: int, where: str) -> bytes:
    """A GZIP body inflated, refused past `limit` bytes before it is all in memory."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise invalid(f"{where}.body", f"body_encoding is GZIP but the body is not: {exc}") from None
    if len(out) > limit:
        raise BrokerError(
            BrokerCode.MESSAGE_TOO_LARGE,
            f"{where}.body inflates past maxMessageSize ({limit} bytes)",
            field=f"{where}.body",
            limit=limit,
        )
    return out


def _ipv4(host: str) -> str | None:
    # At most 15 characters ("255.255.255.255"): what is longer is no IPv4 literal, and the cache
    # below (a client names its own host on every message) holds only short strings.
    return _parsed_ipv4(host) if len(host) <= 15 else None


@functools.lru_cache(maxsize=4096)
def _parsed_ipv4(host: str) -> str | None:
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return None


def peer_host(peer: str) -> str:
    """The IPv4 address in a gRPC peer string (`ipv4:10.0.0.7:51234`), else 0.0.0.0."""
    if peer.startswith("ipv4:"):
        host = peer[5:].rpartition(":")[0]
        return _ipv4(host) or "0.0.0.0"
    return "0.0.0.0"


def to_message(m: pb.Message, where: str, max_body_bytes: int, peer: str) -> Message:
    """A sent message as the broker stores it. The client's message id is the message's
    UNIQ_KEY (what it is delivered and looked up by) and its idempotency key (a retry of the
    send is answered with the first result, never stored twice)."""
    sp = m.system_properties
    body = m.body
    if sp.body_encoding == pb.GZIP:
        body = _gunzip(body, max_body_bytes, where)
    elif sp.body_encoding not in (pb.IDENTITY, pb.ENCODING_UNSPECIFIED):
        raise invalid(f"{where}.bodyEncoding", f"unknown body encoding {sp.body_encoding}")
    message_id = sp.message_id
    if not message_id or len(message_id) > MAX_MESSAGE_ID_LENGTH or not message_id.isprintable():
        raise invalid(
            f"{where}.messageId", f"a message id is 1..{MAX_MESSAGE_ID_LENGTH} printable characters"
        )
    # BORNHOST is 4 IPv4 bytes + a port: a client's own IPv4 literal, else the connection's.
    born_ip = _ipv4(sp.born_host) or peer_host(peer)
    msg = Message(
        topic=m.topic.name,
        body=body,
        tags=sp.tag if sp.HasField("tag") else None,
        keys=list(sp.keys),
        properties=dict(m.user_properties),
        idempotency_key=message_id,
        born_timestamp=millis(sp.born_timestamp) if sp.HasField("born_timestamp") else 0,
        born_host=f"{born_ip}:0",
    )
    check_message(msg, where, max_body_bytes)  # user properties may not name UNIQ_KEY & co.
    msg.properties.update(_typed(m, where))
    msg.properties[PROPERTY_UNIQ_KEY] = message_id
    return msg


# The protocol's message types as the message model's (LITE and PRIORITY are not served).
_TYPES = {
    pb.MESSAGE_TYPE_UNSPECIFIED: None,
    pb.NORMAL: TopicMessageType.NORMAL,
    pb.FIFO: TopicMessageType.FIFO,
    pb.DELAY: TopicMessageType.DELAY,
    pb.TRANSACTION: TopicMessageType.TRANSACTION,
}
_PB_TYPES = {t: p for p, t in _TYPES.items() if t is not None}


def _typed(m: pb.Message, where: str) -> dict[str, str]:
    """The message-model properties of a sent message (`broker.message_model.typed_properties`):
    its `message_group`, `delivery_timestamp` and TRANSACTION type. The fields must agree with
    `message_type` (the clients set both): a FIFO message has a group, a DELAY one a time. Which
    types a topic takes is the message model's rule (MESSAGE_TYPE_MISMATCH), not checked here.
    The producer group of a gRPC transaction is its topic (RocketMQ's proxy)."""
    sp = m.system_properties
    if sp.message_type not in _TYPES:
        name = pb.MessageType.Name(sp.message_type) if sp.message_type in pb.MessageType.values() else None
        if name is None:
            raise invalid(f"{where}.messageType", f"unknown message type {sp.message_type}")
        raise BrokerError(
            BrokerCode.MESSAGE_ILLEGAL,
            f"{where}: {name} messages are not supported",
            field=f"{where}.messageType",
        )
    kind = _TYPES[sp.message_type]
    group = sp.message_group if sp.HasField("message_group") else None
    due = millis(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
    if kind is TopicMessageType.FIFO and not group:
        raise BrokerError(
            BrokerCode.ILLEGAL_MESSAGE_GROUP,
            f"{where}: a FIFO message needs a message_group",
            field=f"{where}.messageGroup",
        )
    if kind is TopicMessageType.DELAY and due is None:
        raise BrokerError(
            BrokerCode.ILLEGAL_DELIVERY_TIME,
            f"{where}: a DELAY message needs a delivery_timestamp",
            field=f"{where}.deliveryTimestamp",
        )
    plain = kind in (TopicMessageType.NORMAL, TopicMessageType.TRANSACTION)
    if plain and (group is not None or due is not None):
        raise BrokerError(
            BrokerCode.MESSAGE_TYPE_MISMATCH,
            f"{where}: a {kind.value} message has no message_group or delivery_timestamp",
            field=f"{where}.messageType",
        )
    transactional = kind is TopicMessageType.TRANSACTION
    return typed_properties(
        deliver_at_ms=due,
        message_group=group or None,
        transactional=transactional,
        producer_group=m.topic.name if transactional else None,
    )


def message_id_of(msg: MessageExt) -> str:
    """The id a client knows a stored message by: its UNIQ_KEY (the sender's id), else the
    broker's offset id."""
    return msg.properties.get(PROPERTY_UNIQ_KEY) or msg.msg_id


def from_message(
    msg: MessageExt,
    *,
    namespace: str,
    receipt_handle: str,
    delivery_attempt: int,
    invisible_ms: int,
    topic: str | None = None,
) -> pb.Message:
    """A stored message as delivered by ReceiveMessage (body digest MD5 upper-case hex, as the
    proxy sends: the Node client throws without a digest, the Python one checks it); its type,
    message group and delivery time in their fields. `topic` names it otherwise than where it is
    stored (a transaction's half, shown to its producer's checker under its real topic)."""
    body = bytes(msg.body)
    shape = message_shape(msg.properties)
    sp = pb.SystemProperties(
        keys=msg.keys,
        message_id=message_id_of(msg),
        body_digest=pb.Digest(type=pb.MD5, checksum=hashlib.md5(body).hexdigest().upper()),
        body_encoding=pb.IDENTITY,
        message_type=_PB_TYPES.get(shape.message_type, pb.NORMAL),
        born_timestamp=timestamp(msg.born_timestamp),
        born_host=msg.born_host.rpartition(":")[0],
        store_timestamp=timestamp(msg.store_timestamp),
        store_host=msg.store_host,
        receipt_handle=receipt_handle,
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        invisible_duration=duration(invisible_ms),
        delivery_attempt=delivery_attempt,
    )
    if msg.tags is not None:
        sp.tag = msg.tags
    if shape.message_group is not None:
        sp.message_group = shape.message_group
    if shape.deliver_at_ms is not None:
        sp.delivery_timestamp.CopyFrom(timestamp(shape.deliver_at_ms))
    return pb.Message(
        topic=pb.Resource(resource_namespace=namespace, name=topic or msg.topic),
        user_properties={k: v for k, v in msg.user_properties.items() if k not in MODEL_PROPERTIES},
        system_properties=sp,
        body=body,
    )
