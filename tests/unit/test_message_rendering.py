"""A stored message rendered straight from its bytes (the pull page's `message_json_view`, a
receive's `RECEIVED_JSON`) must show exactly what `message_json` of its `MessageExt` shows: the
same fields, the same strings, whatever the properties and the body hold."""

from __future__ import annotations

import pytest

from broker.http import codec
from broker.http.codec import message_binary_view, message_json, message_json_view
from broker.http.consumers import RECEIVED_JSON
from broker.message import (
    PROPERTY_UNIQ_KEY,
    Message,
    encode_message,
    message_ext_from,
    new_uniq_key,
    parse_message,
)
from wire import pullpage


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
        Message("t", b"sdk", idempotency_key="0123456789abcdef0000000000000001"),  # every SDK message
        Message("t", b"sdk+tags", tags="T", keys=["k"], idempotency_key="k-2", properties={"p": "v"}),
        Message("t", b"odd key", idempotency_key="é\u00ff key"),
        Message("t", b"", properties={"IDEMPOTENCY_KEYX": "not the system key"}),
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
    rec, body = message_binary_view(view, head, topic_at, props_at)
    *_, id_len, tags_len, keys_len, props_len, body_len = pullpage.RECORD.unpack_from(rec, 0)
    at = pullpage.RECORD.size + id_len
    tags = None if tags_len < 0 else rec[at : at + tags_len].decode()
    at += max(tags_len, 0)
    keys = [k for k in rec[at : at + keys_len].decode().split(" ") if k]
    user = dict(pullpage.parse_properties(rec[at + keys_len : at + keys_len + props_len]))
    assert (tags, keys, user) == (expected["tags"], expected["keys"], expected["properties"])
    assert body_len == len(body)


@pytest.mark.parametrize("idempotency_key", [None, "0123456789abcdef0000000000000001"])
@pytest.mark.parametrize("own_uniq_key", [False, True])
def test_the_bulk_shapes_skip_the_properties_parse_and_keep_their_message_id(
    idempotency_key: str | None, own_uniq_key: bool
) -> None:
    props = {PROPERTY_UNIQ_KEY: new_uniq_key()} if own_uniq_key else {}
    view = _stored(Message("t", b"body", properties=props, idempotency_key=idempotency_key))
    head, topic_at, props_at = parse_message(view, 4096)
    stored = message_ext_from(view, head, topic_at, props_at, 4096).properties
    assert codec._BULK_PROPERTIES(bytes(view[props_at + 2 : head.total_size])) is not None
    doc = RECEIVED_JSON.from_view(view, head, topic_at, props_at)
    assert doc["messageId"] == stored[PROPERTY_UNIQ_KEY] and doc["properties"] == {} and doc["tags"] is None


def test_a_message_ext_renders_through_from_ext() -> None:
    view = _stored(Message("t", b"again", tags="T"), reconsume_times=1)
    head, topic_at, props_at = parse_message(view, 4096)
    ext = message_ext_from(view, head, topic_at, props_at, 4096)
    assert RECEIVED_JSON.from_ext(ext) == RECEIVED_JSON.from_view(view, head, topic_at, props_at)
