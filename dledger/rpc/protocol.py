"""DLedger RPC request/response types, their binary codec, and the `RpcService` interface.

Frame layout (big-endian), shared by the TCP transport and the in-memory network::

    offset  size  field
    0       4     frame length (bytes after this field)
    4       1     kind         0 request, 1 response
    5       2     request type (DLedger's codes: METADATA 50000 ... INSTALL_SNAPSHOT 51006)
    7       8     request id   (responses echo it; lets many requests share one connection)
    15      ...   common header: group, remote_id, local_id, leader_id (u16 length + UTF-8 each),
                  term i64, code i32
    ...     ...   type-specific fields; entries as u32 count + DLedger-encoded entries (raw bytes)

`remote_id` is the member the frame is addressed to, `local_id` the sender (DLedger's naming).
"""

from __future__ import annotations

import functools
import struct
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, Protocol

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import BODY_OFFSET, HEADER, VALID_MAGICS, DLedgerEntry, encode_into

FRAME_HEAD = struct.Struct(">IBHQ")  # length, kind, type, request id
KIND_REQUEST = 0
KIND_RESPONSE = 1
MAX_FRAME_SIZE = 256 * 1024 * 1024
_COMMON_TAIL = struct.Struct(">qi")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")


class RequestCode(IntEnum):
    """DLedger's `DLedgerRequestCode` numbers."""

    METADATA = 50000
    APPEND = 50001
    GET = 50002
    VOTE = 51001
    HEART_BEAT = 51002
    PULL = 51003
    PUSH = 51004
    LEADERSHIP_TRANSFER = 51005
    INSTALL_SNAPSHOT = 51006


class PushType(IntEnum):
    """`PushEntryRequest.Type`: what an EntryDispatcher asks a follower to do."""

    APPEND = 0
    COMMIT = 1
    COMPARE = 2
    TRUNCATE = 3


class VoteResult(IntEnum):
    """`VoteResponse.RESULT`, DLedger's names."""

    UNKNOWN = 0
    ACCEPT = 1
    REJECT_UNKNOWN_LEADER = 2
    REJECT_UNEXPECTED_LEADER = 3
    REJECT_EXPIRED_VOTE_TERM = 4
    REJECT_ALREADY_VOTED = 5
    REJECT_ALREADY_HAS_LEADER = 6
    REJECT_TERM_NOT_READY = 7
    REJECT_TERM_SMALL_THAN_LEDGER = 8
    REJECT_EXPIRED_LEDGER_TERM = 9
    REJECT_SMALL_LEDGER_END_INDEX = 10
    REJECT_TAKING_LEADERSHIP = 11


@dataclass(slots=True)
class RequestOrResponse:
    """Fields every DLedger request and response carries."""

    group: str = ""
    remote_id: str = ""
    local_id: str = ""
    leader_id: str = ""
    term: int = -1
    code: int = DLedgerResponseCode.SUCCESS

    request_code: ClassVar[RequestCode]

    def _enc(self, out: list[bytes]) -> None:
        """Append type-specific fields (subclasses)."""

    def _dec(self, buf: memoryview, off: int) -> int:
        """Read type-specific fields from `buf[off:]`; return the new offset (subclasses)."""
        return off


@functools.lru_cache(maxsize=1024)
def _str_field(s: str) -> bytes:
    """u16 length + UTF-8 of a header string (group and member ids repeat on every frame)."""
    raw = s.encode()
    return _U16.pack(len(raw)) + raw


def _put_str(out: list[bytes], s: str | None) -> None:
    out.append(_str_field(s or ""))


def _get_str(buf: memoryview, off: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(buf, off)
    off += 2
    if off + n > len(buf):
        raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, "frame string overruns frame")
    return str(buf[off : off + n], "utf-8"), off + n


def _put_entries(out: list[bytes], entries: list[DLedgerEntry]) -> None:
    out.append(_U32.pack(len(entries)))
    for e in entries:
        buf = bytearray(48 + len(e.body))
        encode_into(buf, 0, e)
        out.append(buf)


def _get_entries(buf: memoryview, off: int) -> tuple[list[DLedgerEntry], int]:
    """Decode `count + entries`. The body CRC is not checked here: the store checks it against
    the entry's bodyCrc when it writes (follower) and readers check on `get`."""
    (n,) = _U32.unpack_from(buf, off)
    off += 4
    entries = []
    end = len(buf)
    unpack = HEADER.unpack_from
    for _ in range(n):
        if off + BODY_OFFSET > end:
            raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, "entry overruns frame")
        magic, size, index, term, pos, channel, chain_crc, crc, body_len = unpack(buf, off)
        if magic not in VALID_MAGICS or body_len < 0 or size != BODY_OFFSET + body_len or off + size > end:
            raise DLedgerException(
                DLedgerResponseCode.UNEXPECTED_ARGUMENT, f"bad entry header (magic {magic}, size {size})"
            )
        body = bytes(buf[off + BODY_OFFSET : off + size])
        entries.append(DLedgerEntry(body, magic, index, term, pos, channel, chain_crc, crc, size))
        off += size
    return entries, off


_VOTE = struct.Struct(">qqBB")  # ledgerEndIndex, ledgerEndTerm, preVote, takeLeadership


@dataclass(slots=True)
class VoteRequest(RequestOrResponse):
    """Candidate → peer. `pre_vote` asks "would you?" without anyone changing term (Raft §9.6)."""

    ledger_end_index: int = -1
    ledger_end_term: int = -1
    pre_vote: bool = False
    take_leadership: bool = False
    request_code: ClassVar[RequestCode] = RequestCode.VOTE

    def _enc(self, out: list[bytes]) -> None:
        out.append(
            _VOTE.pack(self.ledger_end_index, self.ledger_end_term, self.pre_vote, self.take_leadership)
        )

    def _dec(self, buf: memoryview, off: int) -> int:
        a, b, c, d = _VOTE.unpack_from(buf, off)
        self.ledger_end_index, self.ledger_end_term, self.pre_vote, self.take_leadership = (
            a,
            b,
            bool(c),
            bool(d),
        )
        return off + _VOTE.size


@dataclass(slots=True)
class VoteResponse(RequestOrResponse):
    vote_result: int = VoteResult.UNKNOWN
    request_code: ClassVar[RequestCode] = RequestCode.VOTE

    def _enc(self, out: list[bytes]) -> None:
        out.append(_I.pack(self.vote_result))

    def _dec(self, buf: memoryview, off: int) -> int:
        (self.vote_result,) = _I.unpack_from(buf, off)
        return off + 4


@dataclass(slots=True)
class HeartBeatRequest(RequestOrResponse):
    request_code: ClassVar[RequestCode] = RequestCode.HEART_BEAT


@dataclass(slots=True)
class HeartBeatResponse(RequestOrResponse):
    request_code: ClassVar[RequestCode] = RequestCode.HEART_BEAT


_PUSH = struct.Struct(">Bqqq")  # type, commitIndex, prevIndex, prevTerm


@dataclass(slots=True)
class PushEntryRequest(RequestOrResponse):
    """EntryDispatcher → follower. APPEND carries a batch of consecutive entries after
    (prev_index, prev_term); COMPARE/TRUNCATE carry exactly one entry; COMMIT none."""

    type: int = PushType.APPEND
    commit_index: int = -1
    prev_index: int = -1
    prev_term: int = -1
    entries: list[DLedgerEntry] = field(default_factory=list)
    # The entries' exact encoding. Sender: the leader's stored bytes (contiguous in its data file),
    # sent instead of re-encoding each entry. Receiver: a view of the frame's bytes for a batch, which
    # a follower store may write as-is; `entries` is always decoded. Not part of equality.
    raw: bytes | memoryview = field(default=b"", compare=False, repr=False)
    request_code: ClassVar[RequestCode] = RequestCode.PUSH

    def _enc(self, out: list[bytes]) -> None:
        out.append(_PUSH.pack(self.type, self.commit_index, self.prev_index, self.prev_term))
        if self.raw:
            out.append(_U32.pack(len(self.entries)))
            out.append(self.raw)
        else:
            _put_entries(out, self.entries)

    def _dec(self, buf: memoryview, off: int) -> int:
        self.type, self.commit_index, self.prev_index, self.prev_term = _PUSH.unpack_from(buf, off)
        start = off + _PUSH.size + 4
        self.entries, off = _get_entries(buf, off + _PUSH.size)
        if len(self.entries) > 1:
            # The entries' exact encoding, for a follower store that writes a run as-is (a view of
            # the received frame, whose buffer nothing else reuses).
            self.raw = buf[start:off]
        return off


_PUSH_RESP = struct.Struct(">qqq")


@dataclass(slots=True)
class PushEntryResponse(RequestOrResponse):
    """`index` is the last index the push covered; begin/end describe the follower's log."""

    index: int = -1
    begin_index: int = -1
    end_index: int = -1
    request_code: ClassVar[RequestCode] = RequestCode.PUSH

    def _enc(self, out: list[bytes]) -> None:
        out.append(_PUSH_RESP.pack(self.index, self.begin_index, self.end_index))

    def _dec(self, buf: memoryview, off: int) -> int:
        self.index, self.begin_index, self.end_index = _PUSH_RESP.unpack_from(buf, off)
        return off + _PUSH_RESP.size


@dataclass(slots=True)
class AppendEntryRequest(RequestOrResponse):
    """Client → leader: one or many bodies (DLedger's AppendEntryRequest and BatchAppendEntryRequest)."""

    bodies: list[bytes] = field(default_factory=list)
    request_code: ClassVar[RequestCode] = RequestCode.APPEND

    def _enc(self, out: list[bytes]) -> None:
        out.append(_U32.pack(len(self.bodies)))
        for b in self.bodies:
            out.append(_U32.pack(len(b)))
            out.append(b)

    def _dec(self, buf: memoryview, off: int) -> int:
        (n,) = _U32.unpack_from(buf, off)
        off += 4
        bodies = []
        for _ in range(n):
            (size,) = _U32.unpack_from(buf, off)
            off += 4
            if off + size > len(buf):
                raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, "body overruns frame")
            bodies.append(bytes(buf[off : off + size]))
            off += size
        self.bodies = bodies
        return off


_APPEND_RESP = struct.Struct(">qqI")


@dataclass(slots=True)
class AppendEntryResponse(RequestOrResponse):
    """`index`/`pos` of the first appended entry; entries of a batch are consecutive; `positions`
    lists every entry's pos."""

    index: int = -1
    pos: int = -1
    positions: list[int] = field(default_factory=list)
    request_code: ClassVar[RequestCode] = RequestCode.APPEND

    def _enc(self, out: list[bytes]) -> None:
        out.append(_APPEND_RESP.pack(self.index, self.pos, len(self.positions)))
        out.append(struct.pack(f">{len(self.positions)}q", *self.positions))

    def _dec(self, buf: memoryview, off: int) -> int:
        self.index, self.pos, n = _APPEND_RESP.unpack_from(buf, off)
        off += _APPEND_RESP.size
        self.positions = list(struct.unpack_from(f">{n}q", buf, off))
        return off + 8 * n


_GET = struct.Struct(">qI")


@dataclass(slots=True)
class GetEntriesRequest(RequestOrResponse):
    """Read committed entries from `begin_index` (at most `max_count`)."""

    begin_index: int = 0
    max_count: int = 1
    request_code: ClassVar[RequestCode] = RequestCode.GET

    def _enc(self, out: list[bytes]) -> None:
        out.append(_GET.pack(self.begin_index, self.max_count))

    def _dec(self, buf: memoryview, off: int) -> int:
        self.begin_index, self.max_count = _GET.unpack_from(buf, off)
        return off + _GET.size


@dataclass(slots=True)
class GetEntriesResponse(RequestOrResponse):
    entries: list[DLedgerEntry] = field(default_factory=list)
    request_code: ClassVar[RequestCode] = RequestCode.GET

    def _enc(self, out: list[bytes]) -> None:
        _put_entries(out, self.entries)

    def _dec(self, buf: memoryview, off: int) -> int:
        self.entries, off = _get_entries(buf, off)
        return off


@dataclass(slots=True)
class MetadataRequest(RequestOrResponse):
    request_code: ClassVar[RequestCode] = RequestCode.METADATA


@dataclass(slots=True)
class MetadataResponse(RequestOrResponse):
    """`json` is the member's `metadata()` dict, orjson-encoded (admin path, not hot)."""

    json: bytes = b"{}"
    request_code: ClassVar[RequestCode] = RequestCode.METADATA

    def _enc(self, out: list[bytes]) -> None:
        out.append(_U32.pack(len(self.json)))
        out.append(self.json)

    def _dec(self, buf: memoryview, off: int) -> int:
        (n,) = _U32.unpack_from(buf, off)
        self.json = bytes(buf[off + 4 : off + 4 + n])
        return off + 4 + n


_LT = struct.Struct(">q")


@dataclass(slots=True)
class LeadershipTransferRequest(RequestOrResponse):
    """Client → leader (`take_leadership_term` = -1), or leader → transferee (the term to campaign in)."""

    transfer_id: str = ""
    transferee_id: str = ""
    take_leadership_term: int = -1
    request_code: ClassVar[RequestCode] = RequestCode.LEADERSHIP_TRANSFER

    def _enc(self, out: list[bytes]) -> None:
        _put_str(out, self.transfer_id)
        _put_str(out, self.transferee_id)
        out.append(_LT.pack(self.take_leadership_term))

    def _dec(self, buf: memoryview, off: int) -> int:
        self.transfer_id, off = _get_str(buf, off)
        self.transferee_id, off = _get_str(buf, off)
        (self.take_leadership_term,) = _LT.unpack_from(buf, off)
        return off + 8


@dataclass(slots=True)
class LeadershipTransferResponse(RequestOrResponse):
    request_code: ClassVar[RequestCode] = RequestCode.LEADERSHIP_TRANSFER


_INSTALL = struct.Struct(">qqqB")  # lastIncludedIndex, lastIncludedTerm, offset, done


@dataclass(slots=True)
class InstallSnapshotRequest(RequestOrResponse):
    """Leader → follower that needs entries the leader's log no longer has: one chunk of the
    snapshot of `last_included_index`. Files go in name order, each in chunks at increasing
    `offset`; the last chunk is the snapshot's meta (`name` = "snapshot_meta", `done` set)."""

    last_included_index: int = -1
    last_included_term: int = -1
    name: str = ""
    offset: int = 0
    done: bool = False
    data: bytes = b""
    request_code: ClassVar[RequestCode] = RequestCode.INSTALL_SNAPSHOT

    def _enc(self, out: list[bytes]) -> None:
        _put_str(out, self.name)
        out.append(_INSTALL.pack(self.last_included_index, self.last_included_term, self.offset, self.done))
        out.append(_U32.pack(len(self.data)))
        out.append(self.data)

    def _dec(self, buf: memoryview, off: int) -> int:
        self.name, off = _get_str(buf, off)
        self.last_included_index, self.last_included_term, self.offset, done = _INSTALL.unpack_from(buf, off)
        self.done = bool(done)
        off += _INSTALL.size
        (n,) = _U32.unpack_from(buf, off)
        off += 4
        if off + n > len(buf):
            raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, "snapshot chunk overruns frame")
        self.data = bytes(buf[off:off + n])
        return off + n


@dataclass(slots=True)
class InstallSnapshotResponse(RequestOrResponse):
    """`end_index`: the follower's log end after the chunk (the snapshot's index once installed)."""

    end_index: int = -1
    request_code: ClassVar[RequestCode] = RequestCode.INSTALL_SNAPSHOT

    def _enc(self, out: list[bytes]) -> None:
        out.append(_Q.pack(self.end_index))

    def _dec(self, buf: memoryview, off: int) -> int:
        (self.end_index,) = _Q.unpack_from(buf, off)
        return off + 8


REQUEST_TYPES: dict[int, type[RequestOrResponse]] = {
    c.request_code: c
    for c in (
        VoteRequest,
        HeartBeatRequest,
        PushEntryRequest,
        AppendEntryRequest,
        GetEntriesRequest,
        MetadataRequest,
        LeadershipTransferRequest,
        InstallSnapshotRequest,
    )
}
RESPONSE_TYPES: dict[int, type[RequestOrResponse]] = {
    c.request_code: c
    for c in (
        VoteResponse,
        HeartBeatResponse,
        PushEntryResponse,
        AppendEntryResponse,
        GetEntriesResponse,
        MetadataResponse,
        LeadershipTransferResponse,
        InstallSnapshotResponse,
    )
}


@functools.lru_cache(maxsize=4096)
def _header_strs(group: str, remote_id: str, local_id: str, leader_id: str) -> bytes:
    """The four header strings, encoded (the same few combinations repeat on every frame)."""
    return b"".join(_str_field(x) for x in (group, remote_id, local_id, leader_id))


_HEADER_DECODE_CACHE: dict[bytes, tuple[str, str, str, str]] = {}


def _read_header_strs(body: memoryview) -> tuple[tuple[str, str, str, str], int]:
    """Decode the four header strings; the decoded tuple is cached by its raw bytes."""
    off = 0
    for _ in range(4):
        (n,) = _U16.unpack_from(body, off)
        off += 2 + n
    if off > len(body):
        raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, "frame string overruns frame")
    raw = bytes(body[:off])
    strs = _HEADER_DECODE_CACHE.get(raw)
    if strs is None:
        group, o = _get_str(body, 0)
        remote_id, o = _get_str(body, o)
        local_id, o = _get_str(body, o)
        leader_id, o = _get_str(body, o)
        strs = (group, remote_id, local_id, leader_id)
        if len(_HEADER_DECODE_CACHE) >= 4096:  # bounded: a peer sending random ids cannot grow it
            _HEADER_DECODE_CACHE.clear()
        _HEADER_DECODE_CACHE[raw] = strs
    return strs, off


_SEPARATE_PART_SIZE = 64 * 1024  # pieces this large are written as they are; smaller ones are joined


def encode_frame(kind: int, request_id: int, msg: RequestOrResponse) -> bytes:
    """One complete frame (length prefix included) for `msg`."""
    return b"".join(encode_frame_parts(kind, request_id, msg))


def encode_frame_parts(kind: int, request_id: int, msg: RequestOrResponse) -> list[bytes]:
    """The frame for `msg` as pieces to write in order (a batch push's stored bytes stay one piece,
    never copied into a joined frame)."""
    out: list[bytes] = [b"", _header_strs(msg.group, msg.remote_id, msg.local_id, msg.leader_id or "")]
    out.append(_COMMON_TAIL.pack(msg.term, msg.code))
    msg._enc(out)
    body_len = sum(map(len, out))
    out[0] = FRAME_HEAD.pack(body_len + FRAME_HEAD.size - 4, kind, msg.request_code, request_id)
    if body_len < _SEPARATE_PART_SIZE:
        return [b"".join(out)]
    parts: list[bytes] = []
    small: list[bytes] = []
    for p in out:
        if len(p) >= _SEPARATE_PART_SIZE:
            if small:
                parts.append(b"".join(small))
                small = []
            parts.append(p)
        else:
            small.append(p)
    if small:
        parts.append(b"".join(small))
    return parts


def decode_frame_body(kind: int, rtype: int, body: memoryview) -> RequestOrResponse:
    """Decode the part of a frame after FRAME_HEAD. Raises DLedgerException(UNEXPECTED_ARGUMENT)
    for an unknown type or a malformed body."""
    table = REQUEST_TYPES if kind == KIND_REQUEST else RESPONSE_TYPES
    cls = table.get(rtype)
    if cls is None:
        raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, f"unknown request type {rtype}")
    msg = cls()
    try:
        (msg.group, msg.remote_id, msg.local_id, msg.leader_id), off = _read_header_strs(body)
        msg.term, msg.code = _COMMON_TAIL.unpack_from(body, off)
        off = msg._dec(body, off + _COMMON_TAIL.size)
    except (struct.error, UnicodeDecodeError) as exc:  # a frame string that is not UTF-8
        raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, f"malformed {cls.__name__}") from exc
    if off != len(body):
        raise DLedgerException(
            DLedgerResponseCode.UNEXPECTED_ARGUMENT, f"{cls.__name__}: {len(body) - off} trailing bytes"
        )
    return msg


def roundtrip(msg: RequestOrResponse, kind: int) -> RequestOrResponse:
    """Encode and decode `msg` (the in-memory network uses it so no object is shared between nodes)."""
    frame = encode_frame(kind, 0, msg)
    return decode_frame_body(kind, msg.request_code, memoryview(frame)[FRAME_HEAD.size :])


class RpcHandler(Protocol):
    """What a transport calls for each incoming request (implemented by `DLedgerServer`)."""

    async def handle_vote(self, req: VoteRequest) -> VoteResponse: ...
    async def handle_heartbeat(self, req: HeartBeatRequest) -> HeartBeatResponse: ...
    async def handle_push(self, req: PushEntryRequest) -> PushEntryResponse: ...
    async def handle_append(self, req: AppendEntryRequest) -> AppendEntryResponse: ...
    async def handle_get(self, req: GetEntriesRequest) -> GetEntriesResponse: ...
    async def handle_metadata(self, req: MetadataRequest) -> MetadataResponse: ...
    async def handle_leadership_transfer(
        self, req: LeadershipTransferRequest
    ) -> LeadershipTransferResponse: ...
    async def handle_install_snapshot(self, req: InstallSnapshotRequest) -> InstallSnapshotResponse: ...


_HANDLERS: dict[int, Callable[[RpcHandler, Any], Awaitable[RequestOrResponse]]] = {
    RequestCode.VOTE: lambda h, req: h.handle_vote(req),
    RequestCode.HEART_BEAT: lambda h, req: h.handle_heartbeat(req),
    RequestCode.PUSH: lambda h, req: h.handle_push(req),
    RequestCode.APPEND: lambda h, req: h.handle_append(req),
    RequestCode.GET: lambda h, req: h.handle_get(req),
    RequestCode.METADATA: lambda h, req: h.handle_metadata(req),
    RequestCode.LEADERSHIP_TRANSFER: lambda h, req: h.handle_leadership_transfer(req),
    RequestCode.INSTALL_SNAPSHOT: lambda h, req: h.handle_install_snapshot(req),
}


async def dispatch(handler: RpcHandler, req: RequestOrResponse) -> RequestOrResponse:
    """Run the `handler` method that answers `req` (every decoded request type has one)."""
    return await _HANDLERS[req.request_code](handler, req)


def error_response(req: RequestOrResponse, code: DLedgerResponseCode, self_id: str = "") -> RequestOrResponse:
    """The response type matching `req`, carrying `code` (used when a handler cannot run)."""
    resp = RESPONSE_TYPES[req.request_code]()
    resp.group, resp.remote_id, resp.local_id, resp.code = req.group, req.local_id, self_id, int(code)
    return resp


class RpcService(ABC):
    """Node-to-node (and client-to-node) requests. Each call raises DLedgerException(TIMEOUT)
    after `timeout_s`, DLedgerException(NETWORK_ERROR) when the peer cannot be reached."""

    handler: RpcHandler | None = None

    def register_handler(self, handler: RpcHandler) -> None:
        """Server side: the object whose handle_* methods answer incoming requests."""
        self.handler = handler

    @abstractmethod
    async def call(self, peer_id: str, req: RequestOrResponse, timeout_s: float) -> Any:
        """Send `req` to `peer_id` and return its response."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start listening (no-op for pure clients)."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Stop listening and close connections."""

    async def vote(self, peer_id: str, req: VoteRequest, timeout_s: float = 1.0) -> VoteResponse:
        return await self.call(peer_id, req, timeout_s)

    async def heartbeat(
        self, peer_id: str, req: HeartBeatRequest, timeout_s: float = 1.0
    ) -> HeartBeatResponse:
        return await self.call(peer_id, req, timeout_s)

    async def push(self, peer_id: str, req: PushEntryRequest, timeout_s: float = 1.0) -> PushEntryResponse:
        return await self.call(peer_id, req, timeout_s)

    async def append(
        self, peer_id: str, req: AppendEntryRequest, timeout_s: float = 3.0
    ) -> AppendEntryResponse:
        return await self.call(peer_id, req, timeout_s)

    async def get(self, peer_id: str, req: GetEntriesRequest, timeout_s: float = 3.0) -> GetEntriesResponse:
        return await self.call(peer_id, req, timeout_s)

    async def metadata(self, peer_id: str, req: MetadataRequest, timeout_s: float = 3.0) -> MetadataResponse:
        return await self.call(peer_id, req, timeout_s)

    async def leadership_transfer(
        self, peer_id: str, req: LeadershipTransferRequest, timeout_s: float = 3.0
    ) -> LeadershipTransferResponse:
        return await self.call(peer_id, req, timeout_s)

    async def install_snapshot(
        self, peer_id: str, req: InstallSnapshotRequest, timeout_s: float = 3.0
    ) -> InstallSnapshotResponse:
        return await self.call(peer_id, req, timeout_s)
