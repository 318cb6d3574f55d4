"""TCP transport for the DLedger RPC: length-prefixed binary frames (layout in protocol.py) over
persistent connections, one per peer, with request ids so many requests share a connection
(pipelining). Entry bodies travel as raw bytes inside DLedger-encoded entries.

- The frame length is checked against `max_frame_size` before any buffer grows for it; an
  oversized or malformed frame closes the connection (logged).
- Writes issued in one loop iteration are coalesced into one `writelines` (fewer syscalls under
  load, no added latency).
- A peer that cannot be reached is retried with exponential backoff (50 ms doubling to 1 s);
  calls during the backoff fail fast with NETWORK_ERROR instead of piling up.
- With a peer secret (`PeerAuth`, dledger/rpc/auth.py) every connection first runs the HMAC
  challenge/response handshake: the accepting side reads only handshake messages (a few hundred
  bytes at most, within `handshake_timeout_s`) until the other side proved it holds the secret,
  so an unauthenticated peer is refused before any request frame is read; afterwards a request
  whose sender is not the authenticated member is refused and the connection closed.
- With peer TLS (`PeerTls`, dledger/rpc/tls.py) every connection is mutual TLS 1.3 first, its
  handshake bounded by `handshake_timeout_s`; the HMAC handshake, if on, then runs inside it.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ipaddress
import itertools
import logging
import socket
import ssl
from typing import Any

import uvloop

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.rpc.auth import Acceptor, Connector, HandshakeError, PeerAuth, read_message
from dledger.rpc.protocol import (
    FRAME_HEAD,
    KIND_REQUEST,
    KIND_RESPONSE,
    MAX_FRAME_SIZE,
    RequestOrResponse,
    RpcService,
    decode_frame_body,
    dispatch,
    encode_frame_parts,
    error_response,
)
from dledger.rpc.tls import PeerTls

log = logging.getLogger("dledger.rpc.tcp")

_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 0.5
_CONNECT_TIMEOUT_S = 1.0
_MAX_UNSENT_BYTES = 64 * 1024 * 1024
_SMALL_BUF_SIZE = 256 * 1024
_SMALL_FRAME_MAX = 64 * 1024  # larger frames get a buffer of their own
_TLS_CHECK_INTERVAL_S = 1.0  # how often peer TLS files are looked at (etcd: every handshake)
_MAX_PENDING_HANDSHAKES = 64  # unauthenticated connections held at once; more are closed at once


class _FrameConnection(asyncio.BufferedProtocol):
    """Frame splitting and write coalescing shared by both ends of a connection.

    Reads go straight into our buffers (BufferedProtocol): small frames land in one reusable
    buffer and are copied out once; a large frame (a batch push or append) gets a buffer of its
    exact size as soon as its length prefix is known, so its bytes are copied from the kernel
    once and never moved again — accumulating a 1 MiB push in a growing bytearray used to cost
    more CPU on a follower than storing it."""

    def __init__(self, max_frame_size: int, name: str) -> None:
        self.max_frame_size = max_frame_size
        self.name = name
        self.transport: asyncio.Transport | None = None
        self._small = bytearray(_SMALL_BUF_SIZE)
        self._small_view = memoryview(self._small)
        self._start = 0  # first unparsed byte in _small
        self._end = 0  # first free byte in _small
        self._big: bytearray | None = None  # the one large frame being received, length prefix included
        self._big_fill = 0
        self._out: list[bytes] = []
        self.closed = False
        # The peer handshake in progress (None: no authentication, or done): until it is done
        # every byte received is a handshake message, never a frame.
        self.handshake: Acceptor | Connector | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def peer_name(self) -> str:
        return _peer_name(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None

    def write(self, parts: list[bytes]) -> None:
        """Queue one frame's pieces; everything queued in this loop iteration goes out in one writelines."""
        if self.transport is None:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.extend(parts)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def close(self, why: str) -> None:
        if self.transport is not None:
            log.warning("closing connection %s: %s", self.name, why)
            self.transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return memoryview(self._big)[self._big_fill :]
        # Never empty: buffer_updated keeps an unparsed tail within the last _SMALL_FRAME_MAX bytes
        # only while it is a small frame's head, and moves anything further back to the front.
        return self._small_view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        big = self._big
        if big is not None:
            self._big_fill += nbytes
            if self._big_fill == len(big):
                self._big = None
                _, kind, rtype, rid = FRAME_HEAD.unpack_from(big, 0)
                # The buffer is this frame's alone, so decoded entries may keep views into it.
                self._deliver([(kind, rtype, rid, memoryview(big)[FRAME_HEAD.size :])])
            return
        self._end += nbytes
        if self.handshake is not None:
            self._feed_handshake()
            if self.handshake is not None or self.transport is None or self.transport.is_closing():
                return
        self._parse_frames()

    def _feed_handshake(self) -> None:
        """Handle the handshake messages received so far (they are tiny: no buffer juggling)."""
        while self.handshake is not None:
            try:
                msg = read_message(self._small_view[self._start:self._end])
                if msg is None:
                    return
                mtype, body, used = msg
                reply = self.handshake.on_message(mtype, body)
            except HandshakeError as exc:
                self.handshake_failed(str(exc))
                return
            self._start += used
            if self._start == self._end:
                self._start = self._end = 0
            if reply and self.transport is not None:
                self.transport.write(reply)
            if self.handshake.complete:
                done, self.handshake = self.handshake, None
                self.handshake_done(done)

    def handshake_done(self, handshake: Acceptor | Connector) -> None:
        """The other side proved it holds the secret."""

    def handshake_failed(self, why: str) -> None:
        """The other side failed the handshake: close (subclasses log and report)."""
        self.handshake = None
        if self.transport is not None:
            self.transport.close()

    def _parse_frames(self) -> None:
        buf, off, end = self._small, self._start, self._end
        frames: list[tuple[int, int, int, memoryview]] = []
        while end - off >= 4:
            length = int.from_bytes(buf[off : off + 4], "big")
            if length > self.max_frame_size or length < FRAME_HEAD.size - 4:
                self.close(f"frame length {length} outside [11, {self.max_frame_size}]")
                self._start = self._end = 0
                return
            total = 4 + length
            if end - off >= total:
                body = bytes(buf[off + FRAME_HEAD.size : off + total])  # _small is reused: copy out
                _, kind, rtype, rid = FRAME_HEAD.unpack_from(buf, off)
                frames.append((kind, rtype, rid, memoryview(body)))
                off += total
                continue
            if total > _SMALL_FRAME_MAX:
                have = end - off
                big = bytearray(total)
                big[:have] = self._small_view[off:end]
                self._big, self._big_fill = big, have
                off = end
            break
        if off == end:
            off = end = 0
        elif off > _SMALL_BUF_SIZE - _SMALL_FRAME_MAX:  # keep room for a whole small frame
            n = end - off
            buf[:n] = bytes(self._small_view[off:end])  # may overlap: copy
            off, end = 0, n
        self._start, self._end = off, end
        if frames:
            self._deliver(frames)

    def _deliver(self, frames: list[tuple[int, int, int, memoryview]]) -> None:
        for kind, rtype, rid, body in frames:
            try:
                msg = decode_frame_body(kind, rtype, body)
            except DLedgerException as exc:
                self.close(f"bad frame type={rtype} kind={kind}: {exc}")
                return
            self.frame_received(kind, rid, msg)

    def frame_received(self, kind: int, rid: int, msg: RequestOrResponse) -> None:
        raise NotImplementedError


class _ServerConnection(_FrameConnection):
    """An accepted connection: (handshake,) requests in, responses out."""

    def __init__(self, service: TcpRpcService) -> None:
        super().__init__(service.max_frame_size, f"from peer at {service.self_id}")
        self.service = service
        self.peer_id: str | None = None  # the authenticated sender (None: authentication is off)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        svc = self.service
        svc.server_conns.add(self)
        if svc.auth is None:
            return
        if svc.pending_handshakes >= _MAX_PENDING_HANDSHAKES:
            svc.auth.log_refusal(self.peer_name(), f"{svc.pending_handshakes} handshakes already pending")
            transport.close()
            return
        svc.pending_handshakes += 1
        self.handshake = svc.auth.acceptor()
        timeout_s = svc.handshake_timeout_s
        self._deadline = asyncio.get_running_loop().call_later(
            timeout_s, self.handshake_failed, f"no handshake within {timeout_s} s")

    def _handshake_over(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
            self.service.pending_handshakes -= 1

    def handshake_done(self, handshake: Acceptor | Connector) -> None:
        self._handshake_over()
        assert isinstance(handshake, Acceptor)
        self.peer_id = handshake.peer_id
        self.name = f"from {self.peer_id} at {self.service.self_id}"

    def handshake_failed(self, why: str) -> None:
        if self.handshake is None:
            return  # done already (a late timer)
        self._handshake_over()
        assert self.service.auth is not None
        self.service.auth.log_refusal(self.peer_name(), why)
        super().handshake_failed(why)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handshake is not None:
            self._handshake_over()
            self.handshake = None
        super().connection_lost(exc)
        self.service.server_conns.discard(self)

    def frame_received(self, kind: int, rid: int, msg: RequestOrResponse) -> None:
        if kind != KIND_REQUEST:
            self.close("response frame on a server connection")
            return
        if self.peer_id is not None and msg.local_id != self.peer_id:
            # Bound to the member that authenticated: it may not speak for another one.
            self.close(f"{type(msg).__name__} sent as {msg.local_id!r} on a connection authenticated "
                       f"as {self.peer_id!r}")
            return
        task = asyncio.get_running_loop().create_task(self._serve(rid, msg))
        self.service.tasks.add(task)
        task.add_done_callback(self.service.tasks.discard)

    async def _serve(self, rid: int, req: RequestOrResponse) -> None:
        svc = self.service
        handler = svc.handler
        if req.group != svc.group or req.remote_id != svc.self_id:
            log.warning(
                "refusing frame for group=%r member=%r from %r at group=%s selfId=%s",
                req.group, req.remote_id, req.local_id, svc.group, svc.self_id,
            )  # fmt: skip
            code = (
                DLedgerResponseCode.UNKNOWN_GROUP
                if req.group != svc.group
                else DLedgerResponseCode.UNKNOWN_MEMBER
            )
            resp = error_response(req, code, svc.self_id)
        elif handler is None:
            resp = error_response(req, DLedgerResponseCode.NOT_LEADER, svc.self_id)
        else:
            try:
                resp = await dispatch(handler, req)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("handler failed for %s at selfId=%s", type(req).__name__, svc.self_id)
                resp = error_response(req, DLedgerResponseCode.INTERNAL_ERROR, svc.self_id)
        self.write(encode_frame_parts(KIND_RESPONSE, rid, resp))


def _peer_name(transport: asyncio.BaseTransport | None) -> str:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


def _accepting_tls(base: type) -> type:
    """`base` (a loop's own server-side TLS protocol) remembering who connected, so that a
    failed handshake can be logged with the address."""

    class AcceptingTls(base):  # type: ignore[valid-type, misc]
        peer = "?"

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.peer = _peer_name(transport)
            super().connection_made(transport)

    return AcceptingTls


# By whether the loop is uvloop's: each loop's transports take its own TLS protocol.
_ACCEPTING_TLS = {True: _accepting_tls(uvloop.loop.SSLProtocol),
                  False: _accepting_tls(asyncio.sslproto.SSLProtocol)}


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no TLS handshake in time"
    return str(exc) or type(exc).__name__


class _ClientConnection(_FrameConnection):
    """Our connection to one peer: (handshake,) requests out, responses matched by request id."""

    def __init__(self, peer_id: str, max_frame_size: int, auth: PeerAuth | None, tls: PeerTls | None) -> None:
        super().__init__(max_frame_size, f"to {peer_id}")
        self.peer_id = peer_id
        self.tls = tls
        self.answered = False  # a response came back: the peer accepted us
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_consume_exception)  # a failure nobody awaits any more is not an error
        if auth is None:
            self.ready.set_result(None)
        else:
            self.handshake = auth.connector(peer_id)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if isinstance(self.handshake, Connector):
            transport.write(self.handshake.hello())  # type: ignore[attr-defined]

    def handshake_done(self, handshake: Acceptor | Connector) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def handshake_failed(self, why: str) -> None:
        super().handshake_failed(why)
        if not self.ready.done():
            self.ready.set_exception(DLedgerException(DLedgerResponseCode.NETWORK_ERROR,
                                                      f"peer handshake with {self.peer_id} failed: {why}"))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.tls is not None and not self.answered and (self.pending or exc is not None):
            # TLS 1.3: the peer checks our certificate after our side of the handshake is done, so
            # its refusal closes the connection here, and the alert's reason is rarely passed on.
            why = _tls_reason(exc) if isinstance(exc, ssl.SSLError) else (
                f"{_tls_reason(exc) if exc is not None else 'closed'} after the TLS handshake, before any "
                "answer: does the peer trust the CA of our certificate?")
            self.tls.log_refusal(self.peer_id, why, outgoing=True)
        if not self.ready.done():
            self.ready.set_exception(DLedgerException(
                DLedgerResponseCode.NETWORK_ERROR,
                f"{self.peer_id} closed the connection during the peer handshake (refused: secrets differ?)"))
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(
                    DLedgerException(DLedgerResponseCode.NETWORK_ERROR, f"connection to {self.peer_id} lost")
                )

    def frame_received(self, kind: int, rid: int, msg: RequestOrResponse) -> None:
        self.answered = True
        fut = self.pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)


class _Peer:
    """Connection state for one peer: the live connection, or backoff after failures."""

    def __init__(self, peer_id: str, addr: str) -> None:
        self.peer_id = peer_id
        host, _, port = addr.rpartition(":")
        self.host, self.port = host, int(port)
        self.conn: _ClientConnection | None = None
        self.connecting: asyncio.Future[None] | None = None
        self.backoff_s = 0.0
        self.next_attempt = 0.0


class TcpRpcService(RpcService):
    """Server (listening on our own peer address) and client (to every peer) in one object.
    A pure client (DLedgerClient) passes `listen=False` and any unique `self_id`."""

    def __init__(
        self, group: str, self_id: str, peers: dict[str, str], *, listen: bool = True,
        max_frame_size: int = MAX_FRAME_SIZE, auth: PeerAuth | None = None, handshake_timeout_s: float = 5.0,
        tls: PeerTls | None = None,
    ) -> None:  # fmt: skip
        self.group = group
        self.self_id = self_id
        self.peers = {p: _Peer(p, a) for p, a in peers.items()}
        self.listen = listen
        self.max_frame_size = max_frame_size
        self.auth = auth  # None: no peer authentication (loopback, trusted networks)
        self.tls = tls  # None: plaintext peer links
        self.server_ssl = tls.server_context() if tls is not None and listen else None
        self.client_ssl = tls.client_context() if tls is not None else None
        self.handshake_timeout_s = handshake_timeout_s
        self.pending_handshakes = 0
        self.server: asyncio.base_events.Server | None = None
        self.server_conns: set[_ServerConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)

    async def start(self) -> None:
        if not self.listen:
            return
        me = self.peers[self.self_id]
        loop = asyncio.get_running_loop()
        factory = (lambda: _ServerConnection(self)) if self.server_ssl is None else self._accept_tls
        self.server = await loop.create_server(factory, me.host, me.port, reuse_address=True)
        if self.tls is not None:
            task = loop.create_task(self._watch_tls_files())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        log.info("listening group=%s selfId=%s on %s:%d peerAuth=%s peerTls=%s", self.group, self.self_id,
                 me.host, me.port, "hmac" if self.auth is not None else "off",
                 "on" if self.tls is not None else "off")
        if self.auth is None and self.tls is None and not _is_loopback(me.host):
            log.warning("event=peer_auth_off group=%s selfId=%s listen=%s:%d: anyone who reaches this port "
                        "can vote, push or truncate; set peerSecretFile (or peer TLS)",
                        self.group, self.self_id, me.host, me.port)

    def _accept_tls(self) -> asyncio.BaseProtocol:
        """The protocol of an accepted connection with peer TLS: the loop's TLS server side over a
        `_ServerConnection`, as `create_server(ssl=...)` makes it, but a handshake that fails (a
        plaintext client, a certificate from another CA or none, too slow) is logged: the loop's
        own server drops it without a word."""
        assert self.tls is not None and self.server_ssl is not None
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        protocol_class = _ACCEPTING_TLS[isinstance(loop, uvloop.Loop)]
        proto = protocol_class(loop, _ServerConnection(self), self.server_ssl, waiter, server_side=True,
                               ssl_handshake_timeout=self.handshake_timeout_s)  # fmt: skip
        log_refusal = self.tls.log_refusal

        def handshake_over(fut: asyncio.Future[None]) -> None:
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:
                log_refusal(proto.peer, _tls_reason(exc))

        waiter.add_done_callback(handshake_over)
        return proto  # type: ignore[no-any-return]

    async def _watch_tls_files(self) -> None:
        """A rotated peer certificate is used for new connections without a restart."""
        assert self.tls is not None
        while True:
            await asyncio.sleep(_TLS_CHECK_INTERVAL_S)
            try:
                self.tls.reload_into(self.server_ssl, self.client_ssl)
            except (OSError, ssl.SSLError) as exc:  # replaced again between the check and the load
                log.warning("event=peer_tls_reload_failed group=%s selfId=%s error=%s", self.group,
                            self.self_id, exc)

    async def shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for c in list(self.server_conns):
            if c.transport is not None:
                c.transport.close()
        for t in list(self.tasks):
            t.cancel()
        for p in self.peers.values():
            if p.conn is not None and p.conn.transport is not None:
                p.conn.transport.close()
            p.conn = None

    async def _connect(self, peer: _Peer) -> _ClientConnection:
        conn = peer.conn
        if conn is not None and not conn.closed:
            return conn
        loop = asyncio.get_running_loop()
        if peer.connecting is not None:
            await asyncio.shield(peer.connecting)
            if peer.conn is not None and not peer.conn.closed:
                return peer.conn
            raise DLedgerException(DLedgerResponseCode.NETWORK_ERROR, f"cannot connect to {peer.peer_id}")
        if loop.time() < peer.next_attempt:
            raise DLedgerException(
                DLedgerResponseCode.NETWORK_ERROR, f"{peer.peer_id} unreachable (backing off)"
            )
        peer.connecting = loop.create_future()
        conn = None
        try:
            if self.client_ssl is None:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: _ClientConnection(peer.peer_id, self.max_frame_size, self.auth, None),
                        peer.host, peer.port,
                    ),
                    _CONNECT_TIMEOUT_S,
                )
            else:
                conn = await self._connect_tls(peer)
            await asyncio.wait_for(asyncio.shield(conn.ready), self.handshake_timeout_s)
            peer.conn = conn
            peer.backoff_s = 0.0
            return conn
        except (OSError, TimeoutError, DLedgerException) as exc:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            peer.backoff_s = min(max(peer.backoff_s * 2, _BACKOFF_MIN_S), _BACKOFF_MAX_S)
            peer.next_attempt = loop.time() + peer.backoff_s
            why = str(exc) or type(exc).__name__
            if self.tls is not None and isinstance(exc, ssl.SSLError):
                self.tls.log_refusal(f"{peer.peer_id}@{peer.host}:{peer.port}", why, outgoing=True)
            elif self.auth is not None and conn is not None:
                self.auth.log_refusal(f"{peer.peer_id}@{peer.host}:{peer.port}", why, outgoing=True)
            raise DLedgerException(DLedgerResponseCode.NETWORK_ERROR,
                                   f"connect to {peer.peer_id}: {why}") from exc
        finally:
            peer.connecting.set_result(None)
            peer.connecting = None

    async def _connect_tls(self, peer: _Peer) -> _ClientConnection:
        """TCP within the connect timeout, then the TLS handshake within the handshake timeout (a
        member busy starting up may take longer than a connect to finish one)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(peer.host, peer.port, type=socket.SOCK_STREAM)
        family, stype, proto, _, addr = infos[0]
        sock = socket.socket(family, stype, proto)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, addr), _CONNECT_TIMEOUT_S)
            _, conn = await loop.create_connection(
                lambda: _ClientConnection(peer.peer_id, self.max_frame_size, self.auth, self.tls),
                sock=sock, ssl=self.client_ssl, server_hostname=peer.host,
                ssl_handshake_timeout=self.handshake_timeout_s)
        except BaseException:
            sock.close()
            raise
        return conn

    async def call(self, peer_id: str, req: RequestOrResponse, timeout_s: float) -> Any:
        peer = self.peers.get(peer_id)
        if peer is None:
            raise DLedgerException(DLedgerResponseCode.UNKNOWN_MEMBER, f"no address for {peer_id}")
        conn = peer.conn
        if conn is None or conn.closed:
            conn = await self._connect(peer)
        transport = conn.transport
        if transport is not None and transport.get_write_buffer_size() > _MAX_UNSENT_BYTES:
            # The peer is not reading (stopped, or far slower than us): fail fast rather than buffer more.
            raise DLedgerException(DLedgerResponseCode.NETWORK_ERROR, f"{peer_id} is not reading its socket")
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        fut = loop.create_future()
        conn.pending[rid] = fut
        conn.write(encode_frame_parts(KIND_REQUEST, rid, req))
        handle = loop.call_later(timeout_s, _expire, fut, peer_id, timeout_s)
        try:
            return await fut
        finally:
            handle.cancel()
            conn.pending.pop(rid, None)


def _consume_exception(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _expire(fut: asyncio.Future[Any], peer_id: str, timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(
            DLedgerException(DLedgerResponseCode.TIMEOUT, f"no answer from {peer_id} in {timeout_s}s")
        )
