"""DLedger entry codec against hand-built byte vectors (not the codec itself)."""

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    DLedgerEntry,
    decode,
    decode_index_record,
    encode,
    encode_index_record,
)


def test_encode_matches_hand_built_bytes() -> None:
    body = b"hello"
    entry = DLedgerEntry(body=body, index=7, term=3, pos=4096)
    crc = zlib.crc32(body)
    crc_signed = crc - (1 << 32) if crc >= 1 << 31 else crc
    expected = (
        (1).to_bytes(4, "big")
        + (48 + 5).to_bytes(4, "big")
        + (7).to_bytes(8, "big")
        + (3).to_bytes(8, "big")
        + (4096).to_bytes(8, "big")
        + b"\x00" * 8
        + crc_signed.to_bytes(4, "big", signed=True)
        + (5).to_bytes(4, "big")
        + body
    )
    assert bytes(encode(entry)) == expected
    assert entry.size == 53


def test_fixed_vector_decodes() -> None:
    raw = bytes.fromhex(
        "00000002" "00000030" "0000000000000001" "0000000000000002" "0000000000000000"
        "00000000" "00000000" "00000000" "00000000"
    )
    entry = decode(raw)
    assert (entry.magic, entry.size, entry.index, entry.term, entry.pos, entry.body) == (2, 48, 1, 2, 0, b"")


def test_index_record_layout() -> None:
    rec = encode_index_record(1, 123, 60, 9, 4)
    assert rec == struct.pack(">iqiqq", 1, 123, 60, 9, 4)
    assert len(rec) == INDEX_UNIT_SIZE
    assert decode_index_record(rec) == (1, 123, 60, 9, 4)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda b: b[:20], "truncated"),
        (lambda b: b"\x00\x00\x00\x09" + b[4:], "magic"),
        (lambda b: b[:4] + (999).to_bytes(4, "big") + b[8:], "size"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]), "CRC"),
        (lambda b: b[:35] + b"\x01" + b[36:], "reserved"),
        (lambda b: b[:39] + b"\x01" + b[40:], "reserved"),
    ],
)
def test_corrupt_entries_raise_disk_error(mutate, fragment: str) -> None:
    raw = bytes(encode(DLedgerEntry(body=b"payload", index=1, term=1, pos=0)))
    with pytest.raises(DLedgerException) as err:
        decode(mutate(raw))
    assert err.value.code is DLedgerResponseCode.DISK_ERROR
    assert fragment in str(err.value)


@settings(max_examples=60, deadline=None)
@given(
    body=st.one_of(st.binary(max_size=2048), st.integers(0, 4 * 1024 * 1024).map(lambda n: b"\xab" * n)),
    index=st.integers(0, 2**62),
    term=st.integers(0, 2**62),
    pos=st.integers(0, 2**62),
    magic=st.sampled_from([1, 2, 3]),
)
def test_round_trip(body: bytes, index: int, term: int, pos: int, magic: int) -> None:
    entry = DLedgerEntry(body=body, magic=magic, index=index, term=term, pos=pos)
    raw = encode(entry)
    assert len(raw) == BODY_OFFSET + len(body)
    back = decode(raw)
    assert (back.body, back.magic, back.index, back.term, back.pos) == (body, magic, index, term, pos)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_crashes(data: bytes) -> None:
    try:
        decode(data)
    except DLedgerException as err:
        assert err.code is DLedgerResponseCode.DISK_ERROR
