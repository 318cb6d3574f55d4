"""Decoder of the broker's binary pull page (``Accept: application/x-ledgermq-messages``).

The layout is the one documented in docs/INTERFACES.md ("Binary pull format"); it is restated
here on purpose: the pipeline talks to the broker only through its HTTP API and imports nothing
from ``broker/``. All integers big-endian::

    header  36 bytes: magic "LMQP" | version u8 (=1) | 3 reserved | count u32 |
                      nextOffset i64 | minOffset i64 | maxOffset i64
    count records, each 57 fixed bytes:
                      queueOffset i64 | commitLogOffset i64 | bornTimestamp i64 (ms) |
                      storeTimestamp i64 (ms) | reconsumeTimes i32 | queueId i32 |
                      msgIdLen u8 | tagsLen i32 (-1 = none) | keysLen u32 | propsLen u32 | bodyLen u32
                    then msgId (ASCII) | tags (UTF-8) | keys (UTF-8, " "-separated) |
                    user properties (UTF-8 ``k\\x01v\\x02...``)
    body section: the count bodies concatenated in record order, exactly filling the rest.

Every malformed page (short, wrong magic/version, a length running past the end, trailing bytes,
bad UTF-8, a broken property list) raises ``PullFormatError``, never IndexError or struct.error.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from itertools import accumulate

import pyarrow as pa

from pipeline.routes import LedgerMQError

PULL_BINARY_CONTENT_TYPE = "application/x-ledgermq-messages"
MAGIC = b"LMQP"
VERSION = 1
_HEADER = struct.Struct(">4sB3xIqqq")
_RECORD = struct.Struct(">qqqqiiBiIII")
_MAX_BODY_BYTES = 2**31 - 1  # int32 offsets of an Arrow binary array


class PullFormatError(LedgerMQError):
    """A binary pull page that does not follow the documented layout."""

    def __init__(self, message: str) -> None:
        super().__init__(f"ledgermq: bad binary pull page: {message}", code="BAD_PULL_PAGE")


@dataclass
class PullPage:
    """One decoded page; per-message columns are parallel lists, bodies one Arrow array."""

    next_offset: int
    min_offset: int
    max_offset: int
    queue_offsets: list[int]
    commit_log_offsets: list[int]
    born_timestamps: list[int]
    store_timestamps: list[int]
    reconsume_times: list[int]
    queue_ids: list[int]
    msg_ids: list[str]
    tags: list[str | None]
    keys: list[str]
    properties: list[bytes]
    bodies: pa.BinaryArray

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def slice(self, start: int, stop: int) -> PullPage:
        """Rows ``[start, stop)`` (the body array is sliced without a copy)."""
        return PullPage(
            self.next_offset,
            self.min_offset,
            self.max_offset,
            self.queue_offsets[start:stop],
            self.commit_log_offsets[start:stop],
            self.born_timestamps[start:stop],
            self.store_timestamps[start:stop],
            self.reconsume_times[start:stop],
            self.queue_ids[start:stop],
            self.msg_ids[start:stop],
            self.tags[start:stop],
            self.keys[start:stop],
            self.properties[start:stop],
            self.bodies.slice(start, max(0, stop - start)),
        )


def decode_pull_page(data: bytes) -> PullPage:
    """Decode one binary pull page (layout in the module docstring)."""
    if not isinstance(data, bytes):
        data = bytes(data)
    n = len(data)
    if n < _HEADER.size:
        raise PullFormatError(f"{n} bytes is shorter than the {_HEADER.size}-byte header")
    magic, version, count, next_offset, min_offset, max_offset = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise PullFormatError(f"magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise PullFormatError(f"version {version}, expected {VERSION}")
    rsize = _RECORD.size
    if count > (n - _HEADER.size) // rsize:
        raise PullFormatError(f"count {count} records cannot fit in {n} bytes")
    unpack = _RECORD.unpack_from
    fixed: list[tuple] = []
    msg_ids: list[str] = []
    tags: list[str | None] = []
    keys: list[str] = []
    props: list[bytes] = []
    pos = _HEADER.size
    try:
        for i in range(count):
            if pos + rsize > n:
                raise PullFormatError(f"record {i} at byte {pos} runs past the end ({n})")
            rec = unpack(data, pos)
            pos += rsize
            lid, ltags, lkeys, lprops = rec[6], rec[7], rec[8], rec[9]
            if ltags < -1:
                raise PullFormatError(f"record {i}: tagsLen {ltags}")
            end = pos + lid + max(ltags, 0) + lkeys + lprops
            if end > n:
                raise PullFormatError(f"record {i}: variable fields end at byte {end}, past the end ({n})")
            msg_ids.append(data[pos : pos + lid].decode("ascii"))
            pos += lid
            if ltags < 0:
                tags.append(None)
            else:
                tags.append(data[pos : pos + ltags].decode("utf-8"))
                pos += ltags
            keys.append(data[pos : pos + lkeys].decode("utf-8") if lkeys else "")
            pos += lkeys
            props.append(data[pos : pos + lprops])
            pos += lprops
            fixed.append(rec)
    except UnicodeDecodeError as exc:
        raise PullFormatError(
            f"record {len(fixed)}: text field is not valid UTF-8/ASCII ({exc.reason})"
        ) from None
    body_lens = [r[10] for r in fixed]
    total = sum(body_lens)
    if pos + total != n:
        raise PullFormatError(f"body section is {n - pos} bytes, the records declare {total}")
    if n > _MAX_BODY_BYTES:
        raise PullFormatError(f"page of {n} bytes exceeds the 2 GiB a binary column can hold")
    # Offsets point into the whole page buffer (they start at the body section): no body copies.
    offsets = array("i", accumulate(body_lens, initial=pos))
    bodies = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    cols = list(zip(*fixed, strict=True)) if fixed else [()] * 6
    return PullPage(
        next_offset,
        min_offset,
        max_offset,
        list(cols[0]),
        list(cols[1]),
        list(cols[2]),
        list(cols[3]),
        list(cols[4]),
        list(cols[5]),
        msg_ids,
        tags,
        keys,
        props,
        bodies,
    )


def parse_properties(raw: bytes) -> list[tuple[str, str]]:
    """``k\\x01v\\x02...`` → [(k, v), ...]; anything else is a ``PullFormatError``."""
    if not raw:
        return []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PullFormatError(f"properties are not valid UTF-8 ({exc.reason})") from None
    if not text.endswith("\x02"):
        raise PullFormatError("properties do not end with \\x02")
    out = []
    for item in text[:-1].split("\x02"):
        k, sep, v = item.partition("\x01")
        if not sep or not k:
            raise PullFormatError(f"property entry {item[:40]!r} is not key\\x01value")
        out.append((k, v))
    return out


def split_keys(raw: str) -> list[str]:
    """The KEYS property as the JSON form lists it: split on spaces, empty keys dropped."""
    return [k for k in raw.split(" ") if k]
