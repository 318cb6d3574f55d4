"""Hypothesis on every binary/JSON codec: garbage, truncated and bit-flipped input must end in the
codec's own precise exception (DLedgerException, BrokerError, OffsetSpecError) — never another
exception type, a crash, or a hang (each example has a deadline) — and never a huge allocation
driven by a length field (lengths are checked against the bytes present first)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import BrokerError
from broker.message import (
    Message,
    check_layout,
    decode_dispatch_info,
    decode_message,
    decode_message_id,
    encode_message,
    properties_to_bytes,
)
from dledger.codes import DLedgerException
from dledger.entry import (
    BODY_OFFSET,
    HEADER,
    INDEX_UNIT_SIZE,
    DLedgerEntry,
    decode,
    decode_index_record,
    encode,
)
from dledger.rpc import protocol
from pipeline.offsets import OffsetSpecError, parse_offsets_json, parse_queue_key

FUZZ = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

entries_st = st.builds(
    DLedgerEntry,
    body=st.binary(max_size=300),
    magic=st.sampled_from([1, 2, 3]),
    index=st.integers(0, 2**62),
    term=st.integers(0, 2**62),
    pos=st.integers(0, 2**62),
)


# -- DLedger entry and index record -----------------------------------------------------------------
@FUZZ
@given(st.binary(max_size=600))
def test_entry_decode_of_garbage_raises_only_dledger_exception(data: bytes) -> None:
    try:
        entry = decode(data)
    except DLedgerException:
        return
    assert entry.size == BODY_OFFSET + len(entry.body) <= len(data)


@FUZZ
@given(entries_st, st.data())
def test_truncated_entry_is_refused(entry: DLedgerEntry, data: st.DataObject) -> None:
    raw = bytes(encode(entry))
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DLedgerException, match=r"truncated|size"):
        decode(raw[:cut])


@FUZZ
@given(entries_st, st.data())
def test_bit_flip_in_body_or_checked_header_field_is_refused(entry: DLedgerEntry,
                                                             data: st.DataObject) -> None:
    raw = bytearray(encode(entry))
    # size (4-7), body CRC (40-43), body length (44-47) and the body are all checked. The magic is
    # checked only for validity: a flip from one valid magic to another (1 <-> 3, 2 <-> 3) passes
    # decode; the store must cross-check it against the index record (see docs/RELIABILITY.md).
    checked = [*range(4, 8), *range(40, len(raw))]
    at = data.draw(st.sampled_from(checked))
    bit = data.draw(st.integers(0, 7))
    raw[at] ^= 1 << bit
    with pytest.raises(DLedgerException):
        decode(bytes(raw))


def test_entry_with_huge_declared_size_fails_fast_without_allocating() -> None:
    raw = bytearray(BODY_OFFSET)
    HEADER.pack_into(raw, 0, 1, BODY_OFFSET + 2**31 - 100, 0, 0, 0, 0, 0, 0, 2**31 - 100)
    with pytest.raises(DLedgerException, match="truncated"):
        decode(bytes(raw))


@FUZZ
@given(st.binary(max_size=64))
def test_index_record_decode(data: bytes) -> None:
    if len(data) < INDEX_UNIT_SIZE:
        with pytest.raises(DLedgerException, match="index record truncated"):
            decode_index_record(data)
    else:
        assert len(decode_index_record(data)) == 5


# -- broker commit-log message -----------------------------------------------------------------------
messages_st = st.builds(
    Message,
    topic=st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=40),
    body=st.binary(max_size=300),
    tags=st.none() | st.text(st.characters(min_codepoint=65, max_codepoint=90), max_size=8),
    keys=st.lists(st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=6),
                  max_size=3),
)


def _encoded(msg: Message) -> bytes:
    return bytes(encode_message(msg, queue_id=1, queue_offset=7, phys_offset=4096,
                                store_host="127.0.0.1:10911"))


@FUZZ
@given(st.binary(max_size=600))
def test_message_decoders_on_garbage_raise_only_broker_error(data: bytes) -> None:
    for fn in (check_layout, decode_message, decode_dispatch_info):
        try:
            fn(data)
        except BrokerError as exc:
            assert exc.code == "MESSAGE_CORRUPTED", exc


@FUZZ
@given(messages_st, st.data())
def test_truncated_message_is_refused(msg: Message, data: st.DataObject) -> None:
    raw = _encoded(msg)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(BrokerError):
        decode_message(raw[:cut])
    assert decode_message(raw).body == msg.body


@FUZZ
@given(messages_st, st.data())
def test_bit_flip_in_message_never_escapes_as_another_exception(msg: Message, data: st.DataObject) -> None:
    raw = bytearray(_encoded(msg))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= 1 << data.draw(st.integers(0, 7))
    try:
        out = decode_message(bytes(raw))
    except BrokerError:
        return
    # Undetected flips can only be in fields without a check (offsets, timestamps, hosts...):
    # the body is CRC-protected.
    assert out.body == msg.body


@FUZZ
@given(st.text(max_size=80))
def test_message_id_decode(text: str) -> None:
    try:
        host, offset = decode_message_id(text)
    except BrokerError as exc:
        assert exc.code == "INVALID_REQUEST"
        return
    assert ":" in host and offset >= -(2**63)


@FUZZ
@given(st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=5))
def test_properties_with_separators_are_refused(props: dict[str, str]) -> None:
    bad = any(c in k + v for k, v in props.items() for c in "\x01\x02")
    if bad:
        with pytest.raises(BrokerError):
            properties_to_bytes(props)
    else:
        properties_to_bytes(props)


# -- DLedger RPC frames ---------------------------------------------------------------------------------
def _sample_messages() -> list[tuple[int, protocol.RequestOrResponse]]:
    e = DLedgerEntry(body=b"payload", index=3, term=2, pos=96)
    base = {"group": "g", "remote_id": "n1", "local_id": "n0", "leader_id": "n0", "term": 2}
    out: list[tuple[int, protocol.RequestOrResponse]] = []
    for kind, table in ((protocol.KIND_REQUEST, protocol.REQUEST_TYPES),
                        (protocol.KIND_RESPONSE, protocol.RESPONSE_TYPES)):
        for cls in table.values():
            msg = cls(**base)
            if hasattr(msg, "entries"):
                msg.entries = [e]
            out.append((kind, msg))
    return out


SAMPLES = _sample_messages()
FRAME_ERRORS = (DLedgerException,)


@FUZZ
@given(st.sampled_from([protocol.KIND_REQUEST, protocol.KIND_RESPONSE]),
       st.sampled_from([int(c) for c in protocol.RequestCode] + [0, 65535]), st.binary(max_size=400))
def test_frame_body_garbage_raises_only_dledger_exception(kind: int, rtype: int, body: bytes) -> None:
    try:
        protocol.decode_frame_body(kind, rtype, memoryview(body))
    except FRAME_ERRORS:
        pass


@FUZZ
@given(st.sampled_from(SAMPLES), st.data())
def test_truncated_or_flipped_frames_raise_only_dledger_exception(sample: tuple, data: st.DataObject) -> None:
    kind, msg = sample
    frame = protocol.encode_frame(kind, 9, msg)
    body = bytearray(frame[protocol.FRAME_HEAD.size:])
    assert protocol.decode_frame_body(kind, msg.request_code, memoryview(bytes(body))) is not None
    if data.draw(st.booleans()):
        body = body[:data.draw(st.integers(0, len(body) - 1))]
    elif body:
        body[data.draw(st.integers(0, len(body) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    try:
        protocol.decode_frame_body(kind, msg.request_code, memoryview(bytes(body)))
    except FRAME_ERRORS:
        pass


def test_frame_string_that_is_not_utf8_is_refused_precisely() -> None:
    # Found by this fuzzer: UnicodeDecodeError used to escape decode_frame_body.
    kind, msg = SAMPLES[0]
    frame = bytearray(protocol.encode_frame(kind, 1, msg))
    at = protocol.FRAME_HEAD.size + 2  # first byte of the group string "g"
    frame[at] = 0xFF
    body = memoryview(bytes(frame[protocol.FRAME_HEAD.size:]))
    with pytest.raises(DLedgerException):
        protocol.decode_frame_body(kind, msg.request_code, body)


def test_entry_count_larger_than_frame_fails_fast() -> None:
    kind, msg = next((k, m) for k, m in SAMPLES if hasattr(m, "entries"))
    msg.entries = []
    frame = bytearray(protocol.encode_frame(kind, 1, msg))
    body = frame[protocol.FRAME_HEAD.size:]
    # The count is the first u32 after the common header; claim 2^32 - 1 entries in a tiny frame.
    idx = body.rfind(b"\x00\x00\x00\x00")
    body[idx:idx + 4] = b"\xff\xff\xff\xff"
    with pytest.raises(DLedgerException):
        protocol.decode_frame_body(kind, msg.request_code, memoryview(bytes(body)))


# -- offsets JSON (Spark source options) --------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children,
                                                                        max_size=4),
    max_leaves=20)


@FUZZ
@given(json_values)
def test_offsets_json_of_any_shape_raises_only_offset_spec_error(doc: object) -> None:
    try:
        out = parse_offsets_json(json.dumps(doc), "startingOffsets")
    except OffsetSpecError:
        return
    for topic, queues in out.items():
        assert isinstance(topic, str)
        for key, value in queues.items():
            parse_queue_key(key)
            assert isinstance(value, int) and value >= -2


@FUZZ
@given(st.text(max_size=200))
def test_offsets_json_of_garbage_text(text: str) -> None:
    try:
        parse_offsets_json(text, "endingOffsets")
    except OffsetSpecError:
        pass


def test_deeply_nested_offsets_json_is_refused_precisely() -> None:
    with pytest.raises(OffsetSpecError):
        parse_offsets_json("[" * 100_000 + "]" * 100_000, "startingOffsets")
