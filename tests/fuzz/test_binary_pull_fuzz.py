"""Hypothesis on the pipeline's binary pull decoder (pipeline/binpull.py): pages built here from the
layout documented in docs/INTERFACES.md round-trip; garbage, truncated, extended and bit-flipped
pages end in PullFormatError (never IndexError, struct.error, a crash or a huge allocation)."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.binpull import PullFormatError, decode_pull_page, parse_properties, split_keys

FUZZ = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
HEADER = struct.Struct(">4sB3xIqqq")
RECORD = struct.Struct(">qqqqiiBiIII")

i64 = st.integers(-(2**63), 2**63 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)))
messages_st = st.lists(
    st.fixed_dictionaries(
        {
            "queueOffset": i64,
            "commitLogOffset": i64,
            "bornTimestamp": i64,
            "storeTimestamp": i64,
            "reconsumeTimes": i32,
            "queueId": i32,
            "msgId": st.text(alphabet="0123456789ABCDEF", max_size=40),
            "tags": st.none() | text,
            "keys": st.lists(text.filter(bool), max_size=4),
            "properties": st.dictionaries(text.filter(bool), text, max_size=4),
            "body": st.binary(max_size=300),
        }
    ),
    max_size=8,
)


def encode_page(msgs: list[dict], nxt: int = 7, lo: int = 0, hi: int = 9) -> bytes:
    """The documented layout, written independently of the broker's encoder."""
    out = [HEADER.pack(b"LMQP", 1, len(msgs), nxt, lo, hi)]
    for m in msgs:
        mid = m["msgId"].encode()
        tags = None if m["tags"] is None else m["tags"].encode()
        keys = " ".join(m["keys"]).encode()
        props = "".join(f"{k}\x01{v}\x02" for k, v in m["properties"].items()).encode()
        out.append(
            RECORD.pack(
                m["queueOffset"],
                m["commitLogOffset"],
                m["bornTimestamp"],
                m["storeTimestamp"],
                m["reconsumeTimes"],
                m["queueId"],
                len(mid),
                -1 if tags is None else len(tags),
                len(keys),
                len(props),
                len(m["body"]),
            )
        )
        out += [mid, tags or b"", keys, props]
    out += [m["body"] for m in msgs]
    return b"".join(out)


def decode_or_format_error(data: bytes) -> None:
    """Either a page whose columns are consistent, or PullFormatError — nothing else."""
    try:
        page = decode_pull_page(data)
    except PullFormatError as exc:
        assert str(exc).startswith("ledgermq: bad binary pull page: ")
        return
    assert len(page.bodies) == len(page.queue_offsets) == len(page.msg_ids) == len(page.tags)
    assert sum(len(b) for b in page.bodies.to_pylist()) <= len(data)


@FUZZ
@given(messages_st, i64, i64, i64)
def test_round_trip(msgs, nxt, lo, hi):
    page = decode_pull_page(encode_page(msgs, nxt, lo, hi))
    assert (page.next_offset, page.min_offset, page.max_offset) == (nxt, lo, hi)
    assert len(page) == len(msgs)
    for name, col in (
        ("queueOffset", page.queue_offsets),
        ("commitLogOffset", page.commit_log_offsets),
        ("bornTimestamp", page.born_timestamps),
        ("storeTimestamp", page.store_timestamps),
        ("reconsumeTimes", page.reconsume_times),
        ("queueId", page.queue_ids),
        ("msgId", page.msg_ids),
        ("tags", page.tags),
    ):
        assert col == [m[name] for m in msgs], name
    assert [split_keys(k) for k in page.keys] == [m["keys"] for m in msgs]
    assert [dict(parse_properties(p)) for p in page.properties] == [m["properties"] for m in msgs]
    assert page.bodies.to_pylist() == [m["body"] for m in msgs]
    if len(msgs) >= 2:  # a slice keeps the same rows (bodies sliced without a copy)
        part = page.slice(1, len(msgs))
        assert part.bodies.to_pylist() == [m["body"] for m in msgs[1:]]
        assert part.queue_offsets == [m["queueOffset"] for m in msgs[1:]]


@FUZZ
@given(messages_st, st.data())
def test_truncated_page_is_a_format_error(msgs, data):
    raw = encode_page(msgs)
    cut = data.draw(st.integers(0, len(raw) - 1))
    try:
        decode_pull_page(raw[:cut])
    except PullFormatError:
        return
    raise AssertionError(f"a page cut at {cut}/{len(raw)} bytes decoded without error")


@FUZZ
@given(messages_st, st.binary(min_size=1, max_size=64))
def test_trailing_bytes_are_a_format_error(msgs, extra):
    try:
        decode_pull_page(encode_page(msgs) + extra)
    except PullFormatError:
        return
    raise AssertionError("trailing bytes after the body section were accepted")


@FUZZ
@given(messages_st, st.data())
def test_bit_flips_never_escape_as_other_errors(msgs, data):
    raw = bytearray(encode_page(msgs))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
    decode_or_format_error(bytes(raw))


@FUZZ
@given(st.binary(max_size=400))
def test_garbage_is_a_format_error(junk):
    decode_or_format_error(junk)
    decode_or_format_error(b"LMQP\x01\x00\x00\x00" + junk)


def test_header_fields_are_checked():
    good = encode_page([])
    assert len(decode_pull_page(good)) == 0
    for bad, why in (
        (b"XMQP" + good[4:], "magic"),
        (good[:4] + b"\x02" + good[5:], "version"),
        (HEADER.pack(b"LMQP", 1, 2**32 - 1, 0, 0, 0), "cannot fit"),  # no allocation by count
    ):
        try:
            decode_pull_page(bad)
        except PullFormatError as exc:
            assert why in str(exc)
        else:
            raise AssertionError(why)


@FUZZ
@given(st.binary(max_size=200))
def test_properties_garbage_is_a_format_error(raw):
    try:
        pairs = parse_properties(raw)
    except PullFormatError:
        return
    assert all(k for k, _ in pairs)
