"""A stored message rendered straight from its bytes (the pull page's `message_json_view`, a
receive's `RECEIVED_JSON`) must show exactly what `message_json` of its `MessageExt` shows: the
same fields, the same strings, whatever the properties and the body hold."""

from __future__ import annotations

import pytest

from broker.http.codec import message_json, message_json_view
from broker.http.consumers import RECEIVED_JSON
from broker.message import (
    PROPERTY_UNIQ_KEY,
    Message,
    encode_message,
    message_ext_from,
    new_uniq_key,
    parse_message,
)


def _stored(msg: Message, reconsume_times: int = 0) -> memoryview:
    raw = encode_message(msg, queue_id=3, queue_offset=42, phys_offset=4096, store_host="127.0.0.1:10911",
                         store_timestamp=1_700_000_000_123, reconsume_times=reconsume_times)
    return memoryview(bytes(raw))


@pytest.mark.parametrize(
    "msg",
    [
        Message("t", b"x" * 1024),  # the bulk case: UNIQ_KEY its only property
        Message("t", b"x", properties={PROPERTY_UNIQ_KEY: "my-own-id"}),
        Message("t", "é ünïcode".encode(), tags="TagA", keys=["k1", "k2"], properties={"a": "1", "b": "x y"}),
        Message("t", b"\xff\xfe binary", tags="bin"),  # not UTF-8: base64
        Message("t", b"", properties={"only": "user"}),
        Message("t", b"tagged only", tags="T"),
    ],
)
def test_views_show_what_message_json_shows(msg: Message) -> None:
    view = _stored(msg, reconsume_times=2)
    head, topic_at, props_at = parse_message(view, 4096)
    expected = message_json(message_ext_from(view, head, topic_at, props_at, 4096))
    assert RECEIVED_JSON.from_view(view, head, topic_at, props_at) == expected
    assert list(RECEIVED_JSON.from_view(view, head, topic_at, props_at)) == list(expected)  # field order
    pulled = message_json_view(view, head, topic_at, props_at)
    assert pulled == {k: v for k, v in expected.items() if k != "messageId"}  # pull pages leave it out


def test_the_bulk_case_keeps_its_generated_message_id() -> None:
    uniq = new_uniq_key()
    view = _stored(Message("t", b"body", properties={PROPERTY_UNIQ_KEY: uniq}))
    head, topic_at, props_at = parse_message(view, 4096)
    doc = RECEIVED_JSON.from_view(view, head, topic_at, props_at)
    assert doc["messageId"] == uniq and doc["properties"] == {} and doc["tags"] is None


def test_a_message_ext_renders_through_from_ext() -> None:
    view = _stored(Message("t", b"again", tags="T"), reconsume_times=1)
    head, topic_at, props_at = parse_message(view, 4096)
    ext = message_ext_from(view, head, topic_at, props_at, 4096)
    assert RECEIVED_JSON.from_ext(ext) == RECEIVED_JSON.from_view(view, head, topic_at, props_at)
