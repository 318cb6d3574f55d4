"""`Message`, `MessageExt` and the commit-log message codec in RocketMQ's v1 layout.

Commit-log message (big-endian, IPv4 hosts, MAGICCODE v1)::

    offset  size  field
    0       4     TOTALSIZE
    4       4     MAGICCODE                 0xDAA320A7
    8       4     BODYCRC                   crc32(body) & 0x7FFFFFFF, as RocketMQ
    12      4     QUEUEID
    16      4     FLAG
    20      8     QUEUEOFFSET               (QUEUE_OFFSET_POSITION)
    28      8     PHYSICALOFFSET            (PHY_POS_POSITION)
    36      4     SYSFLAG
    40      8     BORNTIMESTAMP
    48      8     BORNHOST                  IPv4 4 + port 4
    56      8     STORETIMESTAMP            (STORE_TIMESTAMP_POSITION)
    64      8     STOREHOST                 IPv4 4 + port 4
    72      4     RECONSUMETIMES
    76      8     PREPARED_TRANSACTION_OFFSET
    84      4+n   BODY
    ..      1+n   TOPIC
    ..      2+n   PROPERTIES                key\\x01value\\x02 ...

Fixed overhead: 91 bytes. The offset message id is STOREHOST (8 bytes) + PHYSICALOFFSET (8 bytes)
in upper-case hex (32 characters), RocketMQ's `MessageDecoder.createMessageId`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import struct
import time
import uuid
from dataclasses import dataclass, replace
from typing import NamedTuple

from zlib_ng.zlib_ng import crc32  # zlib's CRC-32, SIMD: ~15x faster on 100 KB entries

from broker.errors import BrokerCode, BrokerError
from wire.groups import java_string_hash
from wire.msgid import MessageIdError
from wire.msgid import create_message_id as create_message_id  # re-exported: the msgId helpers
from wire.msgid import decode_message_id as wire_decode_message_id
from wire.msgid import message_id_prefix as message_id_prefix
from wire.msgid import pack_host as pack_host
from wire.msgid import unpack_host as unpack_host

log = logging.getLogger(__name__)

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7 as a Java int (MessageVersion V1)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194: end-of-file filler in a local commit log
QUEUE_ID_POSITION = 12
QUEUE_OFFSET_POSITION = 20
PHY_POS_POSITION = 28
STORE_TIMESTAMP_POSITION = 56
BODY_LENGTH_POSITION = 84
FIXED_OVERHEAD = 91
MAX_PROPERTIES_LENGTH = 32767

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTS BORNHOST(ip,port)
# STORETS STOREHOST(ip,port) RECONSUMETIMES PREPARED_TX_OFFSET BODYLEN
HEAD = struct.Struct(">iiiiiqqiq4sIq4sIiqi")
assert HEAD.size == BODY_LENGTH_POSITION + 4


class MessageHead(NamedTuple):
    """The fixed 88 bytes of a stored message (`HEAD`, fields in layout order; hosts as IPv4
    bytes and port)."""

    total_size: int
    magic_code: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_ip: bytes
    born_port: int
    store_timestamp: int
    store_ip: bytes
    store_port: int
    reconsume_times: int
    prepared_transaction_offset: int
    body_length: int


assert len(MessageHead._fields) == len(HEAD.unpack(bytes(HEAD.size)))
_tuple_new = tuple.__new__  # MessageHead from HEAD's tuple: 1/3 of what `MessageHead._make` costs
INT = struct.Struct(">i")
LONG = struct.Struct(">q")

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_IDEMPOTENCY_KEY = "IDEMPOTENCY_KEY"
# On the first message of a put whose keys are a run of sequenced keys (`key_sequence`): how many
# messages, this one first, carry the keys from its IDEMPOTENCY_KEY on (the others carry none).
PROPERTY_IDEMPOTENCY_KEY_RUN = "IDEMPOTENCY_KEY_RUN"
KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


SEQUENCED_KEY_LENGTH = 32
_PREFIX_LENGTH = 16
_LOWER_HEX = frozenset("0123456789abcdef")
MAX_KEY_COUNTER = (1 << 64) - 1


def key_sequence(key: str) -> tuple[str, int] | None:
    """(prefix, counter) of a sequenced idempotency key — 16 lower-case hex digits of prefix, then
    16 of counter, as the SDK makes them (`client.message.KeyGenerator`) — else None."""
    if len(key) != SEQUENCED_KEY_LENGTH or not _LOWER_HEX.issuperset(key):
        return None
    return key[:_PREFIX_LENGTH], int(key[_PREFIX_LENGTH:], 16)


def sequenced_key(prefix: str, counter: int) -> str:
    """The sequenced key of `prefix` (16 lower-case hex digits) and `counter`."""
    return f"{prefix}{counter:016x}"


class KeyRun(NamedTuple):
    """The idempotency keys of a put's messages given as one run: message i's key is the
    sequenced key of `prefix` and `first` + i (one field on the wire instead of a key each, and
    one table entry: what the SDK sends)."""

    prefix: str
    first: int

    def key(self, i: int) -> str:
        return sequenced_key(self.prefix, self.first + i)

    def part(self, start: int) -> KeyRun:
        """The run of the messages from index `start` on."""
        return KeyRun(self.prefix, self.first + start)

    def keyed(self, msgs: list[Message]) -> list[Message]:
        """Copies of `msgs`, message i with the run's key i as its own (for the paths that
        handle keys one by one)."""
        return [replace(m, idempotency_key=self.key(i)) for i, m in enumerate(msgs)]


def body_crc(body: bytes | memoryview) -> int:
    """RocketMQ's body CRC: crc32 masked to a non-negative Java int."""
    return crc32(body) & 0x7FFFFFFF


def tags_hash_code(tags: str | None) -> int:
    """Java `String.hashCode()` of the tags (what RocketMQ stores in a consume-queue unit); 0 for none."""
    return java_string_hash(tags) if tags else 0


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """(store host 'ip:port', physical offset) of an offset message id (`wire.msgid`);
    BrokerError INVALID_REQUEST naming `msgId` on bad input."""
    try:
        return wire_decode_message_id(msg_id)
    except MessageIdError as exc:
        raise BrokerError(BrokerCode.INVALID_REQUEST, str(exc), field="msgId") from None


# UNIQ_KEY = 16 random hex digits fixed per process + a 64-bit counter: unique like a uuid4 (the
# random part tells processes apart) at a fraction of its cost (uuid4 was ~5 us of every put).
_UNIQ_PREFIX = uuid.uuid4().hex[:16].upper()
_uniq_counter = itertools.count(int.from_bytes(os.urandom(4), "big") << 16)


def new_uniq_key() -> str:
    """A unique key (RocketMQ's UNIQ_KEY is 32 upper-case hex characters too)."""
    return f"{_UNIQ_PREFIX}{next(_uniq_counter) & 0xFFFFFFFFFFFFFFFF:016X}"


def _uniq_only_properties() -> bytes:
    """The stored properties of a message with nothing but a new UNIQ_KEY (bytes formatting,
    the cheapest way: this runs once per produced message)."""
    return _UNIQ_PROPS_HEAD + _UNIQ_SUFFIX % (next(_uniq_counter) & 0xFFFFFFFFFFFFFFFF)


def properties_to_bytes(props: dict[str, str]) -> bytes:
    """Encode properties as `key\\x01value\\x02` pairs; separators inside keys/values are refused."""
    parts = []
    for k, v in props.items():
        if (NAME_VALUE_SEPARATOR in k or PROPERTY_SEPARATOR in k or NAME_VALUE_SEPARATOR in v
                or PROPERTY_SEPARATOR in v):
            raise BrokerError(BrokerCode.MESSAGE_ILLEGAL,
                              f"property {k!r} contains a reserved separator (\\x01 or \\x02)",
                              field="properties")
        parts.append(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}")
    try:
        return "".join(parts).encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 for it, so nothing to store
        raise BrokerError(BrokerCode.MESSAGE_ILLEGAL, f"tags, keys or properties are not valid Unicode "
                          f"text ({exc.reason} at {exc.start})", field="properties") from None


def bytes_to_properties(raw: bytes | memoryview) -> dict[str, str]:
    """`key\\x01value\\x02 ...` -> dict (undecodable bytes replaced, never an error)."""
    props: dict[str, str] = {}
    for item in str(raw, "utf-8", "replace").split(PROPERTY_SEPARATOR):
        if item:
            k, _, v = item.partition(NAME_VALUE_SEPARATOR)
            props[k] = v
    return props


@dataclass(slots=True, init=False)
class Message:
    """What a producer sends: topic, body, optional tags/keys/properties, flag, and an optional
    idempotency key (a repeat within `idempotencyWindowMs` returns the first put's result)."""

    topic: str
    body: bytes
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    flag: int
    idempotency_key: str | None
    born_timestamp: int
    born_host: str

    def __init__(self, topic: str, body: bytes, tags: str | None = None, keys: list[str] | None = None,
                 properties: dict[str, str] | None = None, flag: int = 0, idempotency_key: str | None = None,
                 born_timestamp: int = 0, born_host: str = "0.0.0.0:0") -> None:
        # Hand-written: the generated __init__ with default factories cost ~2 us per message.
        self.topic = topic
        self.body = body
        self.tags = tags
        self.keys = [] if keys is None else keys
        self.properties = {} if properties is None else properties
        self.flag = flag
        self.idempotency_key = idempotency_key
        self.born_timestamp = born_timestamp
        self.born_host = born_host

    def all_properties(self) -> dict[str, str]:
        """User properties plus TAGS, KEYS, UNIQ_KEY (generated when absent) and IDEMPOTENCY_KEY."""
        props = dict(self.properties)
        props.pop(PROPERTY_IDEMPOTENCY_KEY, None)  # only the idempotency_key field sets it
        props.pop(PROPERTY_IDEMPOTENCY_KEY_RUN, None)  # only the put of a key run sets it
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(self.keys)
        if self.idempotency_key:
            props[PROPERTY_IDEMPOTENCY_KEY] = self.idempotency_key
        props.setdefault(PROPERTY_UNIQ_KEY, new_uniq_key())
        return props


@dataclass(slots=True)
class MessageExt:
    """A stored message as read back from the commit log."""

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    properties: dict[str, str]
    flag: int = 0
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0

    @property
    def msg_id(self) -> str:
        return create_message_id(self.store_host, self.commit_log_offset)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS, "")
        return [k for k in raw.split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def user_properties(self) -> dict[str, str]:
        """Properties without the system keys the broker sets (TAGS, KEYS, UNIQ_KEY, IDEMPOTENCY_KEY,
        IDEMPOTENCY_KEY_RUN)."""
        return {k: v for k, v in self.properties.items()
                if k not in (PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_IDEMPOTENCY_KEY,
                             PROPERTY_IDEMPOTENCY_KEY_RUN)}


_SHORT = struct.Struct(">h")
_UNIQ_ONLY_HEAD = f"{PROPERTY_UNIQ_KEY}{NAME_VALUE_SEPARATOR}".encode()
_UNIQ_ONLY_TAIL = PROPERTY_SEPARATOR.encode()
_UNIQ_PROPS_HEAD = _UNIQ_ONLY_HEAD + _UNIQ_PREFIX.encode()
_UNIQ_SUFFIX = b"%016X" + _UNIQ_ONLY_TAIL  # the per-message counter half of a UNIQ_KEY, then \x02
_UNIQ_ONLY_LEN = len(_UNIQ_ONLY_HEAD) + 32 + len(_UNIQ_ONLY_TAIL)  # properties of a plain message


def plain_tail_signature(topic_raw: bytes) -> tuple[bytes, int]:
    """What follows the body of a message of topic `topic_raw` whose only property is a generated
    UNIQ_KEY (no tags, keys or idempotency key: the bulk of produced batches): the bytes from the
    topic length up to the UNIQ_KEY value, and the length of the whole tail. The dispatcher tells
    such messages by one comparison."""
    sig = bytes([len(topic_raw)]) + topic_raw + _SHORT.pack(_UNIQ_ONLY_LEN) + _UNIQ_ONLY_HEAD
    return sig, 1 + len(topic_raw) + 2 + _UNIQ_ONLY_LEN


_KEYED_HEAD = f"{PROPERTY_IDEMPOTENCY_KEY}{NAME_VALUE_SEPARATOR}".encode()
_KEYED_UNIQ = (PROPERTY_SEPARATOR + PROPERTY_UNIQ_KEY + NAME_VALUE_SEPARATOR).encode()
_KEYED_TAIL_LEN = len(_KEYED_UNIQ) + 32 + 1  # \x02UNIQ_KEY\x01, 32 hex digits, \x02
# The properties of a message with just an idempotency key, as `properties_to_bytes` writes them
# (`all_properties` puts the key before the generated UNIQ_KEY): the key, then the UNIQ_KEY counter.
_KEYED_PROPERTIES = _KEYED_HEAD + b"%s" + _KEYED_UNIQ + _UNIQ_PREFIX.encode() + b"%016X" + _UNIQ_ONLY_TAIL
# `encode_batch` writes a message with a key itself when the key is ASCII (its UTF-8 is its
# characters), at most this long, and has no property separator (`encode_message` refuses those).
_KEYED_MAX_LENGTH = 1024


def keyed_plain_key(
    data: bytes | memoryview, topic_at: int, msg_end: int, topic_field: bytes
) -> bytes | None:
    """The idempotency key (its UTF-8 bytes) of the message ending at `msg_end` whose topic field
    (length byte and name) is at `topic_at`, if that field is `topic_field` and the message's only
    properties are IDEMPOTENCY_KEY then UNIQ_KEY, as `encode_message` writes them for a message
    with just a key (the SDK's shape); else None. Exactly two of each separator, so
    `bytes_to_properties` would read the same key."""
    tf_end = topic_at + len(topic_field)
    props_at = tf_end + 2
    if data[topic_at:tf_end] != topic_field or _SHORT.unpack_from(data, tf_end)[0] != msg_end - props_at:
        return None
    props = bytes(data[props_at:msg_end])
    key_end = len(props) - _KEYED_TAIL_LEN
    if (
        key_end <= len(_KEYED_HEAD)
        or not props.startswith(_KEYED_HEAD)
        or props[key_end:key_end + len(_KEYED_UNIQ)] != _KEYED_UNIQ
        or props.count(b"\x01") != 2
        or props.count(b"\x02") != 2
        or props[-1] != 2
    ):
        return None
    return props[len(_KEYED_HEAD):key_end]


@functools.lru_cache(maxsize=256)
def keyed_tail(topic_field: bytes, key_len: int) -> re.Pattern[bytes]:
    """What follows the body of a message of the topic stored as `topic_field` (length byte and
    name) whose only properties are an idempotency key of `key_len` UTF-8 bytes then a generated
    UNIQ_KEY (the SDK's shape), as a pattern to `fullmatch` from the topic field to the message's
    end, the key its group 1: what `keyed_plain_key` reads (no separator in the key or the
    UNIQ_KEY), in one C call. The dispatcher reads a run's keys with it."""
    head = topic_field + _SHORT.pack(len(_KEYED_HEAD) + key_len + _KEYED_TAIL_LEN) + _KEYED_HEAD
    return re.compile(
        re.escape(head) + rb"([^\x01\x02]{%d})" % key_len + re.escape(_KEYED_UNIQ)
        + rb"[^\x01\x02]{%d}\x02" % (_KEYED_TAIL_LEN - len(_KEYED_UNIQ) - 1)
    )


@functools.lru_cache(maxsize=10_000)
def topic_name(raw: bytes) -> str:
    """The topic whose stored UTF-8 bytes are `raw` (cached: a store sees few topics; the
    dispatcher and the append hook look one up per run of messages)."""
    return str(raw, "utf-8", "replace")


@functools.lru_cache(maxsize=4096)
def _topic_field(topic: str) -> bytes:
    """TOPIC as stored (length byte + UTF-8), cached per topic; INVALID_TOPIC outside 1-127 bytes."""
    topic_b = topic.encode()
    if not 0 < len(topic_b) <= 127:
        raise BrokerError(BrokerCode.INVALID_TOPIC, f"topic must be 1-127 bytes, got {len(topic_b)}")
    return bytes((len(topic_b),)) + topic_b


def _too_large(nb: int, max_message_size: int) -> BrokerError:
    return BrokerError(BrokerCode.MESSAGE_TOO_LARGE,
                       f"body is {nb} bytes, maxMessageSize is {max_message_size}",
                       maxMessageSize=max_message_size)


def encode_message(msg: Message, *, queue_id: int, queue_offset: int, phys_offset: int,
                   store_host: str, store_timestamp: int | None = None,
                   props: dict[str, str] | None = None, reconsume_times: int = 0,
                   max_message_size: int = 4 * 1024 * 1024) -> bytearray:
    """Encode `msg` in the v1 layout. QUEUEOFFSET/PHYSICALOFFSET may be patched later
    (`QUEUE_OFFSET_POSITION`, `PHY_POS_POSITION`). Raises BrokerError for oversize or bad fields.

    Hot on produce: one preallocated buffer, one `pack_into` for the 88-byte head, and a message
    with no tags/keys/properties (the bulk case) skips the properties dict altogether."""
    topic_f = _topic_field(msg.topic)
    body = msg.body
    nb = len(body)
    if nb > max_message_size:
        raise _too_large(nb, max_message_size)
    if props is None and not (msg.tags or msg.keys or msg.properties or msg.idempotency_key):
        # = properties_to_bytes({UNIQ_KEY: key}); the key is hex, so no separator check needed.
        props_b = _uniq_only_properties()
    else:
        props_b = properties_to_bytes(props if props is not None else msg.all_properties())
        if len(props_b) > MAX_PROPERTIES_LENGTH:
            raise BrokerError(BrokerCode.MESSAGE_ILLEGAL,
                              f"properties are {len(props_b)} bytes, limit {MAX_PROPERTIES_LENGTH}",
                              field="properties")
    np_ = len(props_b)
    total = FIXED_OVERHEAD + nb + len(topic_f) - 1 + np_
    buf = bytearray(total)
    born_ip, born_port = pack_host(msg.born_host)
    store_ip, store_port = pack_host(store_host)
    # One instant for the store and (unset) born timestamps, as `encode_batch` stamps them.
    now = int(time.time() * 1000) if store_timestamp is None else store_timestamp
    HEAD.pack_into(buf, 0, total, MESSAGE_MAGIC_CODE, crc32(body) & 0x7FFFFFFF, queue_id, msg.flag,
                   queue_offset, phys_offset, 0, msg.born_timestamp or now, born_ip, born_port, now,
                   store_ip, store_port,
                   reconsume_times, 0, nb)
    pos = BODY_LENGTH_POSITION + 4 + nb
    buf[BODY_LENGTH_POSITION + 4:pos] = body
    end = pos + len(topic_f)
    buf[pos:end] = topic_f
    _SHORT.pack_into(buf, end, np_)
    buf[end + 2:] = props_b
    return buf


def encode_batch(msgs: list[Message], *, queue_id: int, store_host: str,
                 max_message_size: int = 4 * 1024 * 1024,
                 store_timestamp: int | None = None) -> list[bytearray]:
    """`encode_message` for each of `msgs` (queue offset and physical offset 0, to be stamped),
    in one tight loop for the bulk shapes (no tags/keys/properties; an idempotency key or not);
    any other message goes through `encode_message`. Same bytes, same errors. One store
    timestamp for all (`store_timestamp`, or now)."""
    out: list[bytearray] = []
    store_ip, store_port = pack_host(store_host)
    now = int(time.time() * 1000) if store_timestamp is None else store_timestamp
    pack_into = HEAD.pack_into
    body_at = BODY_LENGTH_POSITION + 4
    uniq_len = _UNIQ_ONLY_LEN
    counter = _uniq_counter
    last_topic: str | None = None
    tail = b""  # per topic: topic field, properties length, UNIQ_KEY up to its per-message counter
    tail_len = fixed = 0
    topic_f = b""
    # per topic and key length: topic field, properties length, the key's name, a slot for the
    # key, UNIQ_KEY up to a slot for its per-message counter
    keyed_tail = b""
    keyed_len = -1
    last_born: str | None = None
    born_ip, born_port = b"\0\0\0\0", 0
    for msg in msgs:
        key = msg.idempotency_key
        if msg.tags or msg.keys or msg.properties or (key and not (
            len(key) <= _KEYED_MAX_LENGTH and key.isascii() and "\x01" not in key and "\x02" not in key
        )):
            out.append(encode_message(msg, queue_id=queue_id, queue_offset=0, phys_offset=0,
                                      store_host=store_host, store_timestamp=now,
                                      max_message_size=max_message_size))
            continue
        if msg.topic != last_topic:
            topic_f = _topic_field(msg.topic)
            tail = topic_f + _SHORT.pack(uniq_len) + _UNIQ_PROPS_HEAD
            tail_len = len(tail)
            fixed = FIXED_OVERHEAD - 1 + len(topic_f)
            last_topic = msg.topic
            keyed_len = -1
        if msg.born_host != last_born:
            born_ip, born_port = pack_host(msg.born_host)
            last_born = msg.born_host
        body = msg.body
        nb = len(body)
        if nb > max_message_size:
            raise _too_large(nb, max_message_size)
        if key:  # the SDK's shape: = properties_to_bytes({IDEMPOTENCY_KEY: key, UNIQ_KEY: new one})
            if len(key) != keyed_len:
                keyed_len = len(key)
                props_len = len(_KEYED_HEAD) + keyed_len + _KEYED_TAIL_LEN
                # (a '%' in the topic is a literal, not a conversion)
                keyed_tail = (topic_f + _SHORT.pack(props_len)).replace(b"%", b"%%") + _KEYED_PROPERTIES
            tail_bytes = keyed_tail % (key.encode(), next(counter) & 0xFFFFFFFFFFFFFFFF)
            total = FIXED_OVERHEAD - 3 + nb + len(tail_bytes)  # less the topic's and properties' lengths
        else:
            total = fixed + nb + uniq_len
        buf = bytearray(total)
        pack_into(buf, 0, total, MESSAGE_MAGIC_CODE, crc32(body) & 0x7FFFFFFF, queue_id, msg.flag, 0, 0, 0,
                  msg.born_timestamp or now, born_ip, born_port, now, store_ip, store_port, 0, 0, nb)
        pos = body_at + nb
        buf[body_at:pos] = body
        if key:
            buf[pos:] = tail_bytes
        else:  # = _uniq_only_properties()
            buf[pos:pos + tail_len] = tail
            buf[pos + tail_len:] = _UNIQ_SUFFIX % (next(counter) & 0xFFFFFFFFFFFFFFFF)
        out.append(buf)
    return out


def _corrupt(detail: str, phys: int | None) -> BrokerError:
    where = f" at commit-log offset {phys}" if phys is not None else ""
    return BrokerError(BrokerCode.MESSAGE_CORRUPTED, detail + where, commitLogOffset=phys)


def check_layout(data: bytes | bytearray | memoryview, phys: int | None = None) -> tuple[int, int, int, int]:
    """Validate sizes/magic of the message at `data[0:]` without copying the body.

    Returns (total size, body length, topic start, properties start). Raises MESSAGE_CORRUPTED."""
    n = len(data)
    if n < FIXED_OVERHEAD:
        raise _corrupt(f"message truncated: {n} bytes < {FIXED_OVERHEAD}", phys)
    total, magic = struct.unpack_from(">ii", data, 0)
    if magic != MESSAGE_MAGIC_CODE:
        raise _corrupt(f"bad magic code {magic & 0xFFFFFFFF:#010x}", phys)
    if total < FIXED_OVERHEAD or total > n:
        raise _corrupt(f"bad total size {total} (have {n} bytes)", phys)
    body_len = INT.unpack_from(data, BODY_LENGTH_POSITION)[0]
    topic_at = BODY_LENGTH_POSITION + 4 + body_len
    if body_len < 0 or topic_at + 3 > total:
        raise _corrupt(f"bad body length {body_len} for total size {total}", phys)
    topic_len = data[topic_at]
    props_at = topic_at + 1 + topic_len
    if props_at + 2 > total:
        raise _corrupt(f"bad topic length {topic_len}", phys)
    props_len = struct.unpack_from(">h", data, props_at)[0]
    if props_len < 0 or props_at + 2 + props_len != total:
        raise _corrupt(f"bad properties length {props_len}: fields do not add up to {total}", phys)
    return total, body_len, topic_at, props_at


def parse_message(data: bytes | bytearray | memoryview, phys: int | None = None,
                  check_crc: bool = True) -> tuple[MessageHead, int, int]:
    """Validate the message at `data[0:]` (the checks of `check_layout`, then the body CRC unless
    `check_crc` is False) with a single header unpack. Returns (head, topic start, properties
    start). Raises MESSAGE_CORRUPTED. The body is not copied."""
    n = len(data)
    if n < FIXED_OVERHEAD:
        raise _corrupt(f"message truncated: {n} bytes < {FIXED_OVERHEAD}", phys)
    head: MessageHead = _tuple_new(MessageHead, HEAD.unpack_from(data, 0))
    total = head.total_size
    if head.magic_code != MESSAGE_MAGIC_CODE:
        raise _corrupt(f"bad magic code {head.magic_code & 0xFFFFFFFF:#010x}", phys)
    if total < FIXED_OVERHEAD or total > n:
        raise _corrupt(f"bad total size {total} (have {n} bytes)", phys)
    body_len = head.body_length
    topic_at = BODY_LENGTH_POSITION + 4 + body_len
    if body_len < 0 or topic_at + 3 > total:
        raise _corrupt(f"bad body length {body_len} for total size {total}", phys)
    props_at = topic_at + 1 + data[topic_at]
    if props_at + 2 > total:
        raise _corrupt(f"bad topic length {data[topic_at]}", phys)
    props_len = _SHORT.unpack_from(data, props_at)[0]
    if props_len < 0 or props_at + 2 + props_len != total:
        raise _corrupt(f"bad properties length {props_len}: fields do not add up to {total}", phys)
    if check_crc:
        crc = crc32(data[BODY_LENGTH_POSITION + 4:topic_at]) & 0x7FFFFFFF
        if crc != head.body_crc:
            raise _corrupt(f"body CRC mismatch (stored {head.body_crc}, computed {crc})", phys)
    return head, topic_at, props_at


def decode_message(data: bytes | bytearray | memoryview, phys: int | None = None,
                   check_crc: bool = True) -> MessageExt:
    """Decode the message at `data[0:]`; the body CRC is checked. Raises BrokerError(MESSAGE_CORRUPTED)."""
    head, topic_at, props_at = parse_message(data, phys, check_crc)
    return message_ext_from(data, head, topic_at, props_at, phys)


def message_ext_from(data: bytes | bytearray | memoryview, head: MessageHead, topic_at: int, props_at: int,
                     phys: int | None = None) -> MessageExt:
    """A `MessageExt` from a message `parse_message` has validated (its results passed in)."""
    (total, _, crc, queue_id, flag, queue_offset, phys_offset, sys_flag, born_ts, born_ip, born_port,
     store_ts, store_ip, store_port, reconsume, prepared, _) = head
    body = bytes(data[BODY_LENGTH_POSITION + 4:topic_at])
    try:
        topic = str(data[topic_at + 1:props_at], "utf-8")
    except UnicodeDecodeError as exc:
        raise _corrupt("topic is not UTF-8", phys) from exc
    props = bytes_to_properties(data[props_at + 2:total])
    return MessageExt(topic=topic, body=body, queue_id=queue_id, queue_offset=queue_offset,
                      commit_log_offset=phys_offset, store_size=total, born_timestamp=born_ts,
                      born_host=unpack_host(born_ip, born_port), store_timestamp=store_ts,
                      store_host=unpack_host(store_ip, store_port), properties=props, flag=flag,
                      sys_flag=sys_flag, reconsume_times=reconsume, prepared_transaction_offset=prepared,
                      body_crc=crc)


# Substring gates: a message whose raw properties contain neither has no tags and no idempotency key.
TAGS_MARK = f"{PROPERTY_TAGS}{NAME_VALUE_SEPARATOR}".encode()
IDEMPOTENCY_MARK = f"{PROPERTY_IDEMPOTENCY_KEY}{NAME_VALUE_SEPARATOR}".encode()


class DispatchInfo:
    """The fields the reput dispatcher needs, read without copying the body. `properties` is
    parsed on first use: the dispatcher needs only TAGS, IDEMPOTENCY_KEY and IDEMPOTENCY_KEY_RUN
    (`key_run`: 0 when absent or not a count), and most messages carry none (a substring test on
    the raw properties decides)."""

    __slots__ = ("_properties", "idempotency_key", "key_run", "phys_offset", "props_raw", "queue_id",
                 "queue_offset", "size", "store_host", "store_timestamp", "tags_code", "topic")

    def __init__(self, topic: str, queue_id: int, queue_offset: int, phys_offset: int, size: int,
                 store_timestamp: int, store_host: str, props_raw: bytes) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.phys_offset = phys_offset
        self.size = size
        self.store_timestamp = store_timestamp
        self.store_host = store_host
        self.props_raw = props_raw
        self._properties: dict[str, str] | None = None
        self.tags_code = 0
        self.idempotency_key: str | None = None
        self.key_run = 0
        if TAGS_MARK in props_raw or IDEMPOTENCY_MARK in props_raw:
            props = self.properties
            self.tags_code = tags_hash_code(props.get(PROPERTY_TAGS))
            self.idempotency_key = props.get(PROPERTY_IDEMPOTENCY_KEY) or None
            run = props.get(PROPERTY_IDEMPOTENCY_KEY_RUN)
            if run is not None and self.idempotency_key is not None and run.isdigit() and run.isascii():
                self.key_run = int(run)

    @property
    def properties(self) -> dict[str, str]:
        if self._properties is None:
            self._properties = bytes_to_properties(self.props_raw)
        return self._properties


def decode_dispatch_info(data: bytes | bytearray | memoryview, phys: int | None = None) -> DispatchInfo:
    """Header, topic and properties of the message at `data[0:]` (sizes validated, CRC not checked)."""
    head, topic_at, props_at = parse_message(data, phys, check_crc=False)
    total = head.total_size
    topic = str(data[topic_at + 1:props_at], "utf-8", "replace")
    return DispatchInfo(topic, head.queue_id, head.queue_offset, head.physical_offset, total,
                        head.store_timestamp, unpack_host(head.store_ip, head.store_port),
                        bytes(data[props_at + 2:total]))

