"""The content rules of a produced message, written once: sizes, tags, keys, properties,
idempotency key, queue id. Each check takes the raw value (any type: a JSON decoder hands it
over as it came) and the name of the field to blame, and raises BrokerError INVALID_REQUEST
(MESSAGE_TOO_LARGE for the body) naming that field.

The HTTP codec calls them field by field while it decodes (one pass over the JSON);
a front-end that builds `Message`s another way calls `check_message` on each."""

from __future__ import annotations

from typing import Any

from broker.errors import BrokerCode, BrokerError, invalid
from broker.message import (
    PROPERTY_IDEMPOTENCY_KEY,
    PROPERTY_IDEMPOTENCY_KEY_RUN,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
)

MAX_BATCH_MESSAGES = 10_000
MAX_TAGS_LENGTH = 255
MAX_KEY_LENGTH = 255
MAX_IDEMPOTENCY_KEY_LENGTH = 255
MAX_QUEUE_ID = 65535
# A client's own id for a message (RocketMQ 5's clients: 34 hex digits, sent as UNIQ_KEY), kept
# within a bound that keeps it usable as an idempotency key and a lookup key.
MAX_CLIENT_ID_LENGTH = 128
# Properties the broker sets from the message's own fields; never user properties.
RESERVED_PROPERTIES = frozenset(
    {PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_IDEMPOTENCY_KEY, PROPERTY_IDEMPOTENCY_KEY_RUN}
)


def check_body_size(size: int, max_message_size: int, field: str) -> None:
    """MESSAGE_TOO_LARGE when a body of `size` bytes exceeds `maxMessageSize`."""
    if size > max_message_size:
        raise BrokerError(
            BrokerCode.MESSAGE_TOO_LARGE,
            f"{field} is {size} bytes, maxMessageSize is {max_message_size}",
            field=field,
            limit=max_message_size,
        )


def check_text(value: Any, field: str, max_len: int) -> str | None:
    """An optional string of at most `max_len` characters without the property separators
    (tags, idempotency key)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(field, f"expected a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise invalid(field, f"at most {max_len} characters")
    if "\x01" in value or "\x02" in value:
        raise invalid(field, "contains a reserved control character (\\x01 or \\x02)")
    return value


def check_keys(value: Any, field: str) -> list[str]:
    """Message keys: non-empty strings without spaces or separators, at most MAX_KEY_LENGTH."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(field, "expected a list of strings")
    for i, k in enumerate(value):
        if (
            not isinstance(k, str)
            or not k
            or len(k) > MAX_KEY_LENGTH
            or " " in k
            or "\x01" in k
            or "\x02" in k
        ):
            raise invalid(
                f"{field}[{i}]", f"a key is a non-empty string without spaces, at most {MAX_KEY_LENGTH}"
            )
    return value


def check_properties(value: Any, field: str) -> dict[str, str]:
    """User properties: string values, names not reserved, no separators in either."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(field, "expected an object of string values")
    for k, v in value.items():
        if not isinstance(v, str):
            raise invalid(f"{field}.{k}", f"expected a string value, got {type(v).__name__}")
        if (
            not isinstance(k, str)
            or not k
            or len(k) > MAX_KEY_LENGTH
            or k in RESERVED_PROPERTIES
            or any(c in k for c in "\x01\x02")
            or any(c in v for c in "\x01\x02")
        ):
            raise invalid(f"{field}.{k}", "reserved or illegal property name/value")
    return value


def check_queue_id(value: Any, field: str) -> int | None:
    """An optional queue id in 0..MAX_QUEUE_ID (3.0 is 3, as a JSON-schema integer; true is not)."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_QUEUE_ID:
        raise invalid(field, f"expected an integer in 0..{MAX_QUEUE_ID}, got {value!r}")
    return value


def check_message(msg: Message, where: str, max_message_size: int) -> None:
    """Every content rule on a `Message` built by a front-end; `where` prefixes the field names
    (`messages[3]` → `messages[3].tags`)."""
    if not isinstance(msg.body, bytes | bytearray):
        raise invalid(f"{where}.body", "expected bytes")
    check_body_size(len(msg.body), max_message_size, f"{where}.body")
    check_text(msg.tags, f"{where}.tags", MAX_TAGS_LENGTH)
    check_keys(msg.keys, f"{where}.keys")
    check_properties(msg.properties, f"{where}.properties")
    check_text(msg.idempotency_key, f"{where}.idempotencyKey", MAX_IDEMPOTENCY_KEY_LENGTH)
