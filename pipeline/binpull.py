"""Decoder of the broker's binary pull page (``Accept: application/x-ledgermq-messages``), whose
layout is defined once in ``wire.pullpage`` (docs/INTERFACES.md, "Binary pull format"); the
pipeline talks to the broker only through its HTTP API and imports nothing from ``broker/``.

Decoding is columnar: one Python step per record only finds where each record starts (the
variable fields make that a chain), then numpy gathers every fixed field and every variable field
of the whole page at once, and Arrow arrays are built straight over those buffers (bodies over the
page itself, no copy). That is what lets an executor decode ~1000 messages in ~0.4 ms instead of
~1.5 ms with a per-record unpack (docs/PERFORMANCE.md, Spark).

Every malformed page (short, wrong magic/version, a length running past the end, trailing bytes,
bad UTF-8, a broken property list) raises ``PullFormatError``, never IndexError or struct.error.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from client.errors import ServerError
from wire import pullpage

PULL_BINARY_CONTENT_TYPE = pullpage.CONTENT_TYPE
_HEADER = pullpage.HEADER
_RECORD_SIZE = pullpage.RECORD.size
# The fixed part of a record as one numpy row (packed, big-endian, exactly _RECORD_SIZE bytes).
_RECORD_DTYPE = np.dtype(
    [
        ("queueOffset", ">i8"),
        ("commitLogOffset", ">i8"),
        ("bornTimestamp", ">i8"),
        ("storeTimestamp", ">i8"),
        ("reconsumeTimes", ">i4"),
        ("queueId", ">i4"),
        ("msgIdLen", "u1"),
        ("tagsLen", ">i4"),
        ("keysLen", ">u4"),
        ("propsLen", ">u4"),
        ("bodyLen", ">u4"),
    ]
)
assert _RECORD_DTYPE.itemsize == _RECORD_SIZE
_RECORD_BYTES = np.arange(_RECORD_SIZE, dtype=np.int64)
_MAX_BODY_BYTES = 2**31 - 1  # int32 offsets of an Arrow binary array


class PullFormatError(ServerError):
    """A binary pull page that does not follow the documented layout."""

    code = "BAD_PULL_PAGE"

    def __init__(self, message: str) -> None:
        super().__init__(f"ledgermq: bad binary pull page: {message}")

    def __str__(self) -> str:
        return self.detail  # without the code: what the page got wrong is the whole story


@dataclass
class PullPage:
    """One decoded page as columns: numpy int64/int32 arrays for the fixed fields, Arrow arrays
    for the text fields (``keys_array`` holds the whole KEYS property, "" when none;
    ``properties_array`` the raw ``k\\x01v\\x02...`` bytes) and the bodies.

    The list-valued properties (``queue_offsets``, ``msg_ids``, ...) are conveniences for tests and
    tools; the reader itself works on the columns.
    """

    next_offset: int
    min_offset: int
    max_offset: int
    queue_offset_array: np.ndarray
    commit_log_offset_array: np.ndarray
    born_timestamp_array: np.ndarray
    store_timestamp_array: np.ndarray
    reconsume_times_array: np.ndarray
    queue_id_array: np.ndarray
    msg_id_array: pa.StringArray
    tags_array: pa.StringArray
    keys_array: pa.StringArray
    properties_array: pa.BinaryArray
    bodies: pa.BinaryArray

    def __len__(self) -> int:
        return len(self.queue_offset_array)

    @classmethod
    def empty(cls, min_offset: int) -> PullPage:
        """A page with no messages (e.g. the answer for an offset below the queue's min)."""
        i64 = np.empty(0, np.int64)
        i32 = np.empty(0, np.int32)
        s = pa.array([], pa.string())
        return cls(
            min_offset, min_offset, min_offset, i64, i64, i64, i64, i32, i32, s, s, s,
            pa.array([], pa.binary()), pa.array([], pa.binary()),
        )  # fmt: skip

    def slice(self, start: int, stop: int) -> PullPage:
        """Rows ``[start, stop)`` (views, no copies)."""
        n = max(0, stop - start)
        return PullPage(
            self.next_offset,
            self.min_offset,
            self.max_offset,
            self.queue_offset_array[start:stop],
            self.commit_log_offset_array[start:stop],
            self.born_timestamp_array[start:stop],
            self.store_timestamp_array[start:stop],
            self.reconsume_times_array[start:stop],
            self.queue_id_array[start:stop],
            self.msg_id_array.slice(start, n),
            self.tags_array.slice(start, n),
            self.keys_array.slice(start, n),
            self.properties_array.slice(start, n),
            self.bodies.slice(start, n),
        )

    @property
    def queue_offsets(self) -> list[int]:
        return self.queue_offset_array.tolist()

    @property
    def commit_log_offsets(self) -> list[int]:
        return self.commit_log_offset_array.tolist()

    @property
    def born_timestamps(self) -> list[int]:
        return self.born_timestamp_array.tolist()

    @property
    def store_timestamps(self) -> list[int]:
        return self.store_timestamp_array.tolist()

    @property
    def reconsume_times(self) -> list[int]:
        return self.reconsume_times_array.tolist()

    @property
    def queue_ids(self) -> list[int]:
        return self.queue_id_array.tolist()

    @property
    def msg_ids(self) -> list[str]:
        return self.msg_id_array.to_pylist()

    @property
    def tags(self) -> list[str | None]:
        return self.tags_array.to_pylist()

    @property
    def keys(self) -> list[str]:
        return self.keys_array.to_pylist()

    @property
    def properties(self) -> list[bytes]:
        return self.properties_array.to_pylist()


def _record_starts(data: bytes, count: int) -> tuple[array, int]:
    """Byte position of each record and the end of the last one (the body section's start).

    The one per-record Python loop of the decoder: where record i+1 starts depends on record i's
    variable lengths, so this chain cannot be vectorised; everything else is done per column.
    """
    n = len(data)
    lengths = pullpage.LENGTHS.unpack_from
    starts = array("q")
    append = starts.append
    pos = _HEADER.size
    for i in range(count):
        if pos + _RECORD_SIZE > n:
            raise PullFormatError(f"record {i} at byte {pos} runs past the end ({n})")
        lid, ltags, lkeys, lprops = lengths(data, pos + pullpage.LENGTHS_AT)
        if ltags < -1:
            raise PullFormatError(f"record {i}: tagsLen {ltags}")
        append(pos)
        end = pos + _RECORD_SIZE + lid + (ltags if ltags > 0 else 0) + lkeys + lprops
        if end > n:
            raise PullFormatError(f"record {i}: variable fields end at byte {end}, past the end ({n})")
        pos = end
    return starts, pos


def _gather(page: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[pa.Buffer, pa.Buffer]:
    """Arrow (int32 offsets, data) buffers of the byte ranges ``[starts[i], starts[i] + lens[i])``."""
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        values = np.empty(0, np.uint8)
    elif (lens == lens[0]).all():  # all the same length (msgIds usually are): one 2-D take
        values = page[(starts[:, None] + np.arange(lens[0], dtype=np.int64)).ravel()]
    else:
        values = page[np.repeat(starts - offsets[:-1], lens) + np.arange(total, dtype=np.int64)]
    return pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)


def _text(
    field: str, count: int, buffers: tuple[pa.Buffer, pa.Buffer], valid: np.ndarray | None = None
) -> pa.StringArray:
    validity = None
    null_count = 0
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(count - valid.sum())
    arr = pa.Array.from_buffers(pa.string(), count, [validity, *buffers], null_count)
    try:
        arr.validate(full=True)  # UTF-8 of every value
    except pa.ArrowInvalid as exc:
        raise PullFormatError(f"{field} is not valid UTF-8 ({exc})") from None
    return arr


def decode_pull_page(data: bytes) -> PullPage:
    """Decode one binary pull page (layout in the module docstring) into columns."""
    if not isinstance(data, bytes):
        data = bytes(data)
    n = len(data)
    if n < _HEADER.size:
        raise PullFormatError(f"{n} bytes is shorter than the {_HEADER.size}-byte header")
    magic, version, count, next_offset, min_offset, max_offset = _HEADER.unpack_from(data, 0)
    if magic != pullpage.MAGIC:
        raise PullFormatError(f"magic {magic!r}, expected {pullpage.MAGIC!r}")
    if version != pullpage.VERSION:
        raise PullFormatError(f"version {version}, expected {pullpage.VERSION}")
    if count > (n - _HEADER.size) // _RECORD_SIZE:
        raise PullFormatError(f"count {count} records cannot fit in {n} bytes")
    if n > _MAX_BODY_BYTES:
        raise PullFormatError(f"page of {n} bytes exceeds the 2 GiB a binary column can hold")
    starts_arr, body_at = _record_starts(data, count)
    if count == 0:
        if body_at != n:
            raise PullFormatError(f"body section is {n - body_at} bytes, the records declare 0")
        page = PullPage.empty(min_offset)
        page.next_offset, page.max_offset = next_offset, max_offset
        return page
    raw = np.frombuffer(data, np.uint8)
    starts = np.frombuffer(starts_arr, np.int64)
    fixed = raw[starts[:, None] + _RECORD_BYTES].view(_RECORD_DTYPE).reshape(count)
    body_lens = fixed["bodyLen"].astype(np.int64)
    total = int(body_lens.sum())
    if body_at + total != n:
        raise PullFormatError(f"body section is {n - body_at} bytes, the records declare {total}")
    # Offsets point into the whole page buffer (they start at the body section): no body copies.
    body_offsets = np.empty(count + 1, np.int64)
    body_offsets[0] = body_at
    np.cumsum(body_lens, out=body_offsets[1:])
    body_offsets[1:] += body_at
    bodies = pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(body_offsets.astype(np.int32)), pa.py_buffer(data)]
    )
    id_lens = fixed["msgIdLen"].astype(np.int64)
    tags_lens = np.maximum(fixed["tagsLen"].astype(np.int64), 0)
    keys_lens = fixed["keysLen"].astype(np.int64)
    props_lens = fixed["propsLen"].astype(np.int64)
    id_at = starts + _RECORD_SIZE
    tags_at = id_at + id_lens
    keys_at = tags_at + tags_lens
    props_at = keys_at + keys_lens
    id_buffers = _gather(raw, id_at, id_lens)
    if (np.frombuffer(id_buffers[1], np.uint8) > 0x7F).any():
        raise PullFormatError("msgId is not ASCII")
    return PullPage(
        next_offset,
        min_offset,
        max_offset,
        fixed["queueOffset"].astype(np.int64),
        fixed["commitLogOffset"].astype(np.int64),
        fixed["bornTimestamp"].astype(np.int64),
        fixed["storeTimestamp"].astype(np.int64),
        fixed["reconsumeTimes"].astype(np.int32),
        fixed["queueId"].astype(np.int32),
        _text("msgId", count, id_buffers),
        _text("tags", count, _gather(raw, tags_at, tags_lens), fixed["tagsLen"] >= 0),
        _text("keys", count, _gather(raw, keys_at, keys_lens)),
        pa.Array.from_buffers(pa.binary(), count, [None, *_gather(raw, props_at, props_lens)]),
        bodies,
    )


def first_keys(keys: pa.StringArray) -> pa.StringArray:
    """The ``key`` column: the first of each message's keys (``split_keys(k)[0]``), null if none."""
    if not len(keys) or pc.max(pc.utf8_length(keys)).as_py() == 0:
        return pa.nulls(len(keys), pa.string())
    first = pc.list_element(pc.split_pattern(pc.utf8_ltrim(keys, characters=" "), " ", max_splits=1), 0)
    return pc.if_else(pc.equal(first, ""), pa.scalar(None, pa.string()), first)


def parse_properties(raw: bytes) -> list[tuple[str, str]]:
    """``k\\x01v\\x02...`` → [(k, v), ...]; anything else is a ``PullFormatError``."""
    try:
        return pullpage.parse_properties(raw)
    except ValueError as exc:
        raise PullFormatError(str(exc)) from None


def split_keys(raw: str) -> list[str]:
    """The KEYS property as the JSON form lists it: split on spaces, empty keys dropped."""
    return [k for k in raw.split(" ") if k]
