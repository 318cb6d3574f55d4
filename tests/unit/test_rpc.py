"""RPC: frame codec round trips, and the TCP transport on real loopback sockets."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import DLedgerEntry
from dledger.rpc import auth
from dledger.rpc.protocol import (
    FRAME_HEAD,
    KIND_REQUEST,
    KIND_RESPONSE,
    AppendEntryRequest,
    AppendEntryResponse,
    GetEntriesResponse,
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    MetadataResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    VoteRequest,
    VoteResponse,
    decode_frame_body,
    encode_frame,
    roundtrip,
)
from dledger.rpc.tcp import TcpRpcService
from tests.ports import free_port


def entry(i: int, body: bytes) -> DLedgerEntry:
    return DLedgerEntry(body=body, index=i, term=3, pos=i * 100)


@pytest.mark.parametrize(
    ("msg", "kind"),
    [
        (VoteRequest(group="g", remote_id="n1", local_id="n0", term=4, ledger_end_index=9, ledger_end_term=3,
                     pre_vote=True), KIND_REQUEST),
        (VoteResponse(term=4, vote_result=5), KIND_RESPONSE),
        (HeartBeatRequest(group="g", leader_id="n0", term=2), KIND_REQUEST),
        (HeartBeatResponse(code=403, term=9), KIND_RESPONSE),
        (PushEntryRequest(type=PushType.APPEND, commit_index=5, prev_index=6, prev_term=3,
                          entries=[entry(7, b"\x00\xffraw"), entry(8, b"")]), KIND_REQUEST),
        (PushEntryResponse(index=8, begin_index=0, end_index=8), KIND_RESPONSE),
        (AppendEntryRequest(bodies=[b"a", b"", bytes(range(256))]), KIND_REQUEST),
        (AppendEntryResponse(index=3, pos=96, positions=[96, 150]), KIND_RESPONSE),
        (GetEntriesResponse(entries=[entry(1, b"x")]), KIND_RESPONSE),
        (MetadataResponse(json=b'{"role":"LEADER"}'), KIND_RESPONSE),
        (LeadershipTransferRequest(transfer_id="n0", transferee_id="n2", take_leadership_term=5),
         KIND_REQUEST),
    ],
)  # fmt: skip
def test_every_message_round_trips_through_its_frame(msg: object, kind: int) -> None:
    back = roundtrip(msg, kind)  # type: ignore[arg-type]
    if isinstance(msg, (PushEntryRequest, GetEntriesResponse)):
        for e in msg.entries:
            e.compute_size_in_bytes()
    assert back == msg


def test_entry_bodies_travel_as_raw_bytes() -> None:
    body = b"\x01\x02payload-that-is-not-json\xff"
    frame = encode_frame(KIND_REQUEST, 7, PushEntryRequest(entries=[entry(0, body)]))
    assert body in frame
    length, kind, rtype, rid = FRAME_HEAD.unpack_from(frame, 0)
    assert (length + 4, kind, rtype, rid) == (len(frame), KIND_REQUEST, 51004, 7)


def test_truncated_or_trailing_bytes_are_refused() -> None:
    frame = encode_frame(KIND_REQUEST, 1, AppendEntryRequest(bodies=[b"abc"]))
    body = memoryview(frame)[FRAME_HEAD.size :]
    with pytest.raises(DLedgerException) as exc:
        decode_frame_body(KIND_REQUEST, 50001, body[:-1])
    assert exc.value.code == DLedgerResponseCode.UNEXPECTED_ARGUMENT
    with pytest.raises(DLedgerException):
        decode_frame_body(KIND_REQUEST, 50001, memoryview(bytes(body) + b"x"))
    with pytest.raises(DLedgerException):
        decode_frame_body(KIND_REQUEST, 12345, body)


class Echo:
    """A handler answering heartbeats after a delay given in the term (to test pipelining)."""

    async def handle_heartbeat(self, req: HeartBeatRequest) -> HeartBeatResponse:
        await asyncio.sleep(req.term / 1000)
        return HeartBeatResponse(
            group=req.group, remote_id=req.local_id, local_id=req.remote_id, term=req.term
        )

    async def handle_push(self, req: PushEntryRequest) -> PushEntryResponse:
        """Answers with the sum of the body bytes, so a mangled frame shows in the answer."""
        total = sum(sum(e.body) for e in req.entries)
        return PushEntryResponse(
            group=req.group,
            term=req.term,
            index=req.entries[-1].index,
            begin_index=len(req.entries),
            end_index=total,
        )


async def test_tcp_pipelines_many_requests_on_one_connection_and_matches_answers() -> None:
    peers = {"n0": f"127.0.0.1:{free_port()}"}
    server = TcpRpcService("g", "n0", peers)
    server.register_handler(Echo())  # type: ignore[arg-type]
    await server.start()
    client = TcpRpcService("g", "c", peers, listen=False)
    try:
        terms = [50 - i for i in range(50)]  # later requests answer first
        resps = await asyncio.gather(
            *(client.heartbeat("n0", HeartBeatRequest(group="g", remote_id="n0", local_id="c", term=t), 2.0)
              for t in terms)
        )  # fmt: skip
        assert [r.term for r in resps] == terms
        assert len(server.server_conns) == 1
    finally:
        await client.shutdown()
        await server.shutdown()


async def test_tcp_refuses_a_frame_for_another_group_or_member() -> None:
    peers = {"n0": f"127.0.0.1:{free_port()}"}
    server = TcpRpcService("g", "n0", peers)
    server.register_handler(Echo())  # type: ignore[arg-type]
    await server.start()
    other = TcpRpcService("other", "c", peers, listen=False)
    try:
        resp = await other.heartbeat("n0", HeartBeatRequest(group="other", remote_id="n0", term=1), 2.0)
        assert resp.code == DLedgerResponseCode.UNKNOWN_GROUP
        resp = await other.heartbeat("n0", HeartBeatRequest(group="g", remote_id="n9", term=1), 2.0)
        assert resp.code == DLedgerResponseCode.UNKNOWN_MEMBER
    finally:
        await other.shutdown()
        await server.shutdown()


async def test_tcp_closes_connection_on_oversized_frame_before_reading_it() -> None:
    peers = {"n0": f"127.0.0.1:{free_port()}"}
    server = TcpRpcService("g", "n0", peers, max_frame_size=1024)
    server.register_handler(Echo())  # type: ignore[arg-type]
    await server.start()
    try:
        host, port = peers["n0"].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(struct.pack(">I", 1 << 30))  # claims 1 GB; nothing else sent
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 2.0) == b""  # closed by the server
        writer.close()
    finally:
        await server.shutdown()


@pytest.mark.parametrize("chunk", [1, 3, 4096, 70_000])
async def test_tcp_reassembles_small_and_large_frames_split_at_any_byte(chunk: int) -> None:
    """Frames written in arbitrary pieces, several per read and large ones (which get a receive
    buffer of their own) between small ones, all arrive intact and in order."""
    peers = {"n0": f"127.0.0.1:{free_port()}"}
    server = TcpRpcService("g", "n0", peers)
    server.register_handler(Echo())  # type: ignore[arg-type]
    await server.start()
    frames, expected = [], []
    for rid, n in enumerate([1, 700, 2, 1, 300, 5], start=1):  # 700 x 1 KB: a large frame
        entries = [entry(i, bytes([i % 251]) * 1024) for i in range(n)]
        req = PushEntryRequest(group="g", remote_id="n0", local_id="c", term=1, entries=entries)
        frames.append(encode_frame(KIND_REQUEST, rid, req))
        expected.append((rid, n, sum(sum(e.body) for e in entries)))
        hb = HeartBeatRequest(group="g", remote_id="n0", local_id="c", term=0)
        frames.append(encode_frame(KIND_REQUEST, 100 + rid, hb))
    data = b"".join(frames)
    try:
        host, port = peers["n0"].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        step = chunk if chunk > 3 else 997  # byte-sized writes across the large frame would take long
        for off in range(0, len(data), step):
            piece = data[off : off + step]
            if chunk <= 3:
                for i in range(0, len(piece), chunk):
                    writer.write(piece[i : i + chunk])
                    await writer.drain()
            else:
                writer.write(piece)
                await writer.drain()
        got = {}
        while len(got) < len(frames):
            head = await asyncio.wait_for(reader.readexactly(4), 5.0)
            rest = await reader.readexactly(int.from_bytes(head, "big"))
            _, kind, rtype, rid = FRAME_HEAD.unpack_from(head + rest)
            got[rid] = decode_frame_body(kind, rtype, memoryview(rest)[FRAME_HEAD.size - 4 :])
        for rid, n, total in expected:
            assert got[rid].code == DLedgerResponseCode.SUCCESS
            assert (got[rid].begin_index, got[rid].end_index) == (n, total)
            assert isinstance(got[100 + rid], HeartBeatResponse)
        writer.close()
    finally:
        await server.shutdown()


async def test_tcp_unreachable_peer_fails_fast_then_reconnects_when_it_is_back() -> None:
    peers = {"n0": f"127.0.0.1:{free_port()}"}
    client = TcpRpcService("g", "c", peers, listen=False)
    req = HeartBeatRequest(group="g", remote_id="n0", local_id="c", term=1)
    with pytest.raises(DLedgerException) as exc:
        await client.heartbeat("n0", req, 1.0)
    assert exc.value.code == DLedgerResponseCode.NETWORK_ERROR
    server = TcpRpcService("g", "n0", peers)
    server.register_handler(Echo())  # type: ignore[arg-type]
    await server.start()
    try:
        for _ in range(40):
            try:
                resp = await client.heartbeat("n0", req, 1.0)
                break
            except DLedgerException:
                await asyncio.sleep(0.05)
        assert resp.term == 1
        # The server goes away: a pending call fails with NETWORK_ERROR, not a hang.
        await server.shutdown()
        with pytest.raises(DLedgerException):
            await client.heartbeat("n0", req, 1.0)
    finally:
        await client.shutdown()
        await server.shutdown()


def test_push_with_raw_stored_bytes_encodes_exactly_like_entry_by_entry() -> None:
    from dledger.entry import encode

    entries = [entry(i, bytes([i]) * (10 + i)) for i in range(5)]
    raw = b"".join(bytes(encode(e)) for e in entries)
    plain = encode_frame(KIND_REQUEST, 3, PushEntryRequest(commit_index=2, entries=entries))
    fast = encode_frame(KIND_REQUEST, 3, PushEntryRequest(commit_index=2, entries=entries, raw=raw))
    assert plain == fast
    back = decode_frame_body(KIND_REQUEST, 51004, memoryview(fast)[FRAME_HEAD.size :])
    assert [e.body for e in back.entries] == [e.body for e in entries]  # type: ignore[attr-defined]


KEY_A = b"a" * 40
KEY_B = b"b" * 40


async def test_tcp_peer_auth_accepts_the_secret_and_a_rotated_key_and_refuses_others() -> None:
    """The handshake runs before any frame: a client holding one of the member's keys talks to
    it (rotation: the member accepts [new, old], a client still on the old key gets in); one with
    another key, or none, never gets an answer."""
    peers = {"n0": f"127.0.0.1:{free_port()}"}
    server = TcpRpcService("g", "n0", peers, auth=auth.PeerAuth("g", "n0", [KEY_B, KEY_A]))
    server.register_handler(Echo())  # type: ignore[arg-type]
    await server.start()
    old_key = TcpRpcService("g", "c", peers, listen=False, auth=auth.PeerAuth("g", "c", [KEY_A]))
    wrong = TcpRpcService("g", "w", peers, listen=False, auth=auth.PeerAuth("g", "w", [b"w" * 40]))
    plain = TcpRpcService("g", "p", peers, listen=False)
    try:
        hb = HeartBeatRequest(group="g", remote_id="n0", local_id="c", term=7)
        resp = await old_key.heartbeat("n0", hb, 2.0)
        assert resp.term == 7
        for client, who in ((wrong, "w"), (plain, "p")):
            with pytest.raises(DLedgerException) as ex:
                hb = HeartBeatRequest(group="g", remote_id="n0", local_id=who, term=1)
                await client.heartbeat("n0", hb, 1.0)
            assert ex.value.code in (DLedgerResponseCode.NETWORK_ERROR, DLedgerResponseCode.TIMEOUT)
        assert server.pending_handshakes == 0
    finally:
        for s in (old_key, wrong, plain, server):
            await s.shutdown()


async def test_tcp_peer_auth_binds_the_connection_to_the_authenticated_member() -> None:
    peers = {"n0": f"127.0.0.1:{free_port()}"}
    server = TcpRpcService("g", "n0", peers, auth=auth.PeerAuth("g", "n0", [KEY_A]))
    server.register_handler(Echo())  # type: ignore[arg-type]
    await server.start()
    client = TcpRpcService("g", "n1", peers, listen=False, auth=auth.PeerAuth("g", "n1", [KEY_A]))
    try:
        ok = await client.heartbeat("n0", HeartBeatRequest(group="g", remote_id="n0", local_id="n1", term=3),
                                    2.0)
        assert ok.term == 3
        with pytest.raises(DLedgerException):  # speaking as n2 on n1's connection: closed, no answer
            await client.heartbeat("n0", HeartBeatRequest(group="g", remote_id="n0", local_id="n2", term=4),
                                   1.0)
    finally:
        await client.shutdown()
        await server.shutdown()


@given(data=st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_any_bytes_fed_to_the_accepting_handshake_are_refused_cleanly(data: bytes) -> None:
    """Whatever arrives before authentication ends in HandshakeError (a refusal) or waits for
    more bytes; never another exception, never an OK without the secret."""
    acceptor = auth.PeerAuth("g", "n0", [KEY_A]).acceptor()
    buf = data
    try:
        while (msg := auth.read_message(buf)) is not None:
            mtype, body, used = msg
            acceptor.on_message(mtype, body)
            buf = buf[used:]
    except auth.HandshakeError:
        pass
    assert not acceptor.complete
