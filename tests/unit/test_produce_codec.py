"""The produce body's decoder: the SDK's message shape (body, bodyEncoding, idempotencyKey,
queueId) takes a shortcut past the full field-by-field reader, and must decode to exactly what that
reader gives and refuse exactly what it refuses, naming the same field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker.errors import BrokerError
from broker.http.codec import _full_message, parse_produce_json

_MAX = 4 * 1024 * 1024


def _both(item: dict[str, Any]) -> tuple[Any, Any]:
    """(what the decoder gives for one item, what the full reader gives for it)."""
    msgs, queues, _ = parse_produce_json(orjson.dumps({"messages": [item]}), "T", _MAX, "h:1")
    full, qid = _full_message(item, "messages[0]", "T", _MAX, "h:1", msgs[0].born_timestamp)
    return (msgs[0], queues[0]), (full, qid)


@pytest.mark.parametrize(
    "item",
    [
        {"body": "hello"},
        {"body": "hello", "bodyEncoding": "utf-8"},
        {"body": "hello", "idempotencyKey": "k-1"},
        {"body": "é" * 100, "bodyEncoding": "utf-8", "idempotencyKey": "p-0001"},
        {"body": "x", "bodyEncoding": "utf-8", "idempotencyKey": "p-2", "queueId": 3},
        {"body": "x", "queueId": 0},
        {"body": "x", "queueId": 65535},
        {"body": "x", "idempotencyKey": None, "queueId": None},
    ],
)
def test_sdk_shaped_messages_decode_as_the_full_reader_does(item: dict[str, Any]) -> None:
    (msg, qid), (full, full_qid) = _both(item)
    assert qid == full_qid
    assert (msg.topic, msg.body, msg.tags, msg.keys, msg.properties, msg.idempotency_key) == (
        full.topic,
        full.body,
        full.tags,
        full.keys,
        full.properties,
        full.idempotency_key,
    )
    assert (msg.born_host, msg.flag) == (full.born_host, full.flag)


def test_a_float_queue_id_that_is_an_integer_is_that_queue() -> None:
    _, queues, _ = parse_produce_json(
        b'{"messages": [{"body": "a", "idempotencyKey": "k", "queueId": 2.0}]}', "T", _MAX, "h"
    )
    assert queues == [2] and type(queues[0]) is int


@pytest.mark.parametrize("bad", [-1, 65536, True, "3", 2.5, [1]])
def test_a_bad_queue_id_in_the_sdk_shape_names_its_message(bad: Any) -> None:
    body = orjson.dumps(
        {"messages": [{"body": "a", "queueId": 1}, {"body": "b", "idempotencyKey": "k", "queueId": bad}]}
    )
    with pytest.raises(BrokerError) as err:
        parse_produce_json(body, "T", _MAX, "h")
    assert err.value.extra["field"] == "messages[1].queueId"
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"body": "a", "idempotencyKey": "bad\x01key"}, "messages[0].idempotencyKey"),
        ({"body": "a", "idempotencyKey": 7}, "messages[0].idempotencyKey"),
        ({"body": "a", "idempotencyKey": "k" * 1000}, "messages[0].idempotencyKey"),
        ({"body": "a", "bodyEncoding": None}, "messages[0].bodyEncoding"),
        ({"body": "a", "bodyEncoding": "utf-16"}, "messages[0].bodyEncoding"),
        ({"body": "a", "queueId": 1, "tagz": "x"}, "messages[0].tagz"),
    ],
)
def test_what_the_shortcut_does_not_take_is_refused_by_the_full_reader(
    item: dict[str, Any], field: str
) -> None:
    with pytest.raises(BrokerError) as err:
        parse_produce_json(orjson.dumps({"messages": [item]}), "T", _MAX, "h")
    assert err.value.extra["field"] == field


def test_the_body_size_limit_holds_on_the_shortcut() -> None:
    with pytest.raises(BrokerError) as err:
        parse_produce_json(b'{"messages": [{"body": "abcdef", "queueId": 0}]}', "T", 5, "h")
    assert err.value.extra["field"] == "messages[0].body"


def test_a_null_first_idempotency_key_is_none():
    body = b'{"messages": [{"body": "a"}], "firstIdempotencyKey": null}'
    msgs, _, run = parse_produce_json(body, "T", _MAX, "h")
    assert run is None and msgs[0].idempotency_key is None


def test_first_idempotency_key_gives_the_request_a_key_run():
    first = "00c0ffee00c0ffee" + f"{41:016x}"
    body = orjson.dumps({"messages": [{"body": "a", "queueId": 1}, {"body": "b"}],
                         "firstIdempotencyKey": first})
    msgs, queues, run = parse_produce_json(body, "T", _MAX, "h")
    assert run is not None and (run.prefix, run.first) == ("00c0ffee00c0ffee", 41)
    assert [run.key(i) for i in range(2)] == [first, "00c0ffee00c0ffee" + f"{42:016x}"]
    assert queues == [1, None] and [m.idempotency_key for m in msgs] == [None, None]


@pytest.mark.parametrize(("doc", "field"), [
    ({"firstIdempotencyKey": "00C0FFEE00C0FFEE0000000000000001"}, "firstIdempotencyKey"),  # upper case
    ({"firstIdempotencyKey": "00c0ffee00c0ffee000000000000001"}, "firstIdempotencyKey"),  # 31 digits
    ({"firstIdempotencyKey": 7}, "firstIdempotencyKey"),
    ({"firstIdempotencyKey": "00c0ffee00c0ffee" + "f" * 16}, "firstIdempotencyKey"),  # the 2nd would wrap
    ({"firstIdempotencyKey": "00c0ffee00c0ffee" + "0" * 16, "extra": 1}, "extra"),
])
def test_a_bad_first_idempotency_key_is_refused_naming_its_field(doc, field):
    body = orjson.dumps({"messages": [{"body": "a"}, {"body": "b"}], **doc})
    with pytest.raises(BrokerError) as ei:
        parse_produce_json(body, "T", _MAX, "h")
    assert ei.value.extra.get("field") == field, ei.value


@pytest.mark.parametrize("item", [{"body": "b", "idempotencyKey": "k"},
                                  {"body": "b", "idempotencyKey": "k", "tags": "t"}])
def test_a_message_key_beside_a_key_run_is_refused(item):
    body = orjson.dumps({"messages": [{"body": "a"}, item],
                         "firstIdempotencyKey": "00c0ffee00c0ffee" + "0" * 16})
    with pytest.raises(BrokerError) as ei:
        parse_produce_json(body, "T", _MAX, "h")
    assert ei.value.extra.get("field") == "messages[1].idempotencyKey"
