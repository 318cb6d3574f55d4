"""The SDK's HTTP/1.1 client: asyncio connections with keep-alive, responses parsed by httptools.

Why not httpx (measured on this machine, docs/PERFORMANCE.md "SDK"): httpcore's pool spends
0.5-1 ms of client CPU per request, and concurrent requests sharing one pool are serialised by
its assignment pass (quadratic in the connections, run on every request and response): 64
coroutines sending single messages were slower than one. This client holds one request per
connection at a time (the broker's uvicorn runs pipelined requests one by one anyway, and a
produce answers only after its commit, so N requests in flight need N connections), hands out
idle connections last-in first-out, and parses answers in C with httptools (llhttp), the parser
the broker itself serves with.

Every failure says how far the request got (`client.outcome.RequestPhase`): `CONNECT` (no byte
left this process: refused, connect timeout, no free connection in time), `SEND` (written in
part), `AWAIT` (written, no complete answer) — which decides whether it may have taken effect.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlencode, urlsplit

import httptools

from client.outcome import RequestPhase

log = logging.getLogger(__name__)

# An idle connection is dropped after this long: below uvicorn's keep-alive timeout (5 s), so the
# broker never closes a connection this client is about to reuse (a request written into a
# connection the server is closing gets no answer: its outcome would be unknown).
KEEPALIVE_EXPIRY_S = 4.0


class HttpTransportError(Exception):
    """A request that got no complete answer; `phase` says how far it got."""

    def __init__(self, message: str, phase: RequestPhase) -> None:
        super().__init__(message)
        self.phase = phase


@dataclass(slots=True)
class HttpResponse:
    """A complete answer: status, headers (names lower-case) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


class LateAnswer(NamedTuple):
    """The answer still on its way to a request whose caller was cancelled, handed to the request's
    `keep_late` (see `HttpClient.request`)."""

    answer: asyncio.Future[HttpResponse]
    sent_at: float  # the loop's time when the request was written
    abort: Callable[[], None]  # hang up instead of waiting for it


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; one request at a time."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[HttpResponse] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._header_name = b""
        self._complete = False
        self.late = False  # carries a cancelled request's answer: never reused, closed after it

    # ---- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            what = f"malformed answer from {self.origin.name}: {exc}"
            self._fail(HttpTransportError(what, RequestPhase.AWAIT))
            self.abort()

    def eof_received(self) -> bool:
        self.closed = True
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.origin.conns.discard(self)
        self._fail(
            HttpTransportError(
                f"connection to {self.origin.name} closed before a complete answer ({exc!r})",
                RequestPhase.AWAIT,
            )
        )

    # ---- httptools callbacks -------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        self._waiter = None
        if not self.parser.should_keep_alive():
            self.closed = True
        if waiter is not None and not waiter.done():
            status = self.parser.get_status_code()
            waiter.set_result(HttpResponse(status, self._headers, b"".join(self._body)))
        if self.late and self.transport is not None:
            self.closed = True
            self.transport.close()

    # ---- use -----------------------------------------------------------------------------------
    def _fail(self, exc: HttpTransportError) -> None:
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def request(
        self,
        data: bytes | list[bytes],
        timeout_s: float,
        keep_late: Callable[[LateAnswer], None] | None = None,
    ) -> HttpResponse:
        """Write one request and wait for its answer (a new parser per request keeps no state
        from the previous answer); `keep_late`: see `HttpClient.request`."""
        assert self.transport is not None and self._waiter is None
        self._headers = {}
        self._body = []
        self.parser = httptools.HttpResponseParser(self)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[HttpResponse] = loop.create_future()
        self._waiter = waiter
        sent_at = loop.time() if keep_late is not None else 0.0  # only a late answer's bound reads it
        if isinstance(data, list):
            self.transport.writelines(data)
        else:
            self.transport.write(data)
        try:
            async with asyncio.timeout(timeout_s):
                # Shielded when a late answer is wanted: cancelling the caller must not cancel it.
                return await (waiter if keep_late is None else asyncio.shield(waiter))
        except TimeoutError:
            self._waiter = None
            phase = RequestPhase.SEND if self.transport.get_write_buffer_size() else RequestPhase.AWAIT
            self.abort()
            raise HttpTransportError(
                f"no answer from {self.origin.name} within {timeout_s:g} s", phase
            ) from None
        except asyncio.CancelledError:
            if keep_late is not None and not self.closed:
                if not waiter.done():
                    self.late = True  # out of the pool (`_Origin.release`) until its answer
                waiter.add_done_callback(_retrieved)
                keep_late(LateAnswer(waiter, sent_at, self.abort))
                raise
            self._waiter = None
            self.abort()  # the answer would land on the next request of this connection
            raise


def _retrieved(fut: asyncio.Future[HttpResponse]) -> None:
    """Mark a late answer's failure seen (a hang-up is the expected end of one nobody waited for)."""
    if not fut.cancelled():
        fut.exception()


class _Origin:
    """The connections to one `scheme://host:port`: idle ones last-in first-out, a cap on how many
    are open, and callers queued first-in first-out when all are busy."""

    def __init__(self, scheme: str, host: str, port: int, limit: int, ssl_ctx: ssl.SSLContext | None) -> None:
        self.name = f"{scheme}://{host}:{port}"
        self.host, self.port, self.limit, self.ssl = host, port, limit, ssl_ctx
        self.host_header = f"{host}:{port}".encode("latin-1")
        self.idle: list[_Connection] = []
        self.conns: set[_Connection] = set()  # every open connection, idle or busy
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self, connect_timeout_s: float, timeout_s: float) -> _Connection:
        """An idle connection, a new one (connect within `connect_timeout_s`) while fewer than
        `limit` are open, else the next one released, waited for up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed and now - conn.idle_since < KEEPALIVE_EXPIRY_S:
                    return conn
                self._drop(conn)
            if self.open < self.limit:
                self.open += 1
                try:
                    return await self._connect(min(connect_timeout_s, deadline - now))
                except BaseException:
                    self.open -= 1
                    self._wake()
                    raise
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                async with asyncio.timeout(max(0.0, deadline - now)):
                    await waiter
            except TimeoutError:
                raise HttpTransportError(
                    f"no free connection to {self.name} within {timeout_s:g} s ({self.limit} busy)",
                    RequestPhase.CONNECT,
                ) from None
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)

    async def _connect(self, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self.ssl
                )
        except TimeoutError:
            raise HttpTransportError(f"connect to {self.name} timed out", RequestPhase.CONNECT) from None
        except (OSError, ssl.SSLError) as exc:
            raise HttpTransportError(f"connect to {self.name}: {exc!r}", RequestPhase.CONNECT) from exc
        self.conns.add(conn)
        return conn

    def release(self, conn: _Connection) -> None:
        if conn.late:  # its own until a cancelled request's answer, then closed (or hung up on)
            self.open -= 1
            self._wake()
            return
        if conn.closed:
            self._drop(conn)
        else:
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        self._wake()

    def _drop(self, conn: _Connection) -> None:
        conn.abort()
        self.open -= 1

    def _wake(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for conn in list(self.conns):
            conn.abort()
        self.conns.clear()
        self.idle.clear()


class HttpClient:
    """HTTP/1.1 client over keep-alive connections, at most `max_connections` per origin.

    `request` returns the complete `HttpResponse` of any status, or raises `HttpTransportError`
    with the phase the request failed in."""

    def __init__(
        self,
        *,
        max_connections: int = 64,
        connect_timeout_s: float = 3.0,
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """With `ssl_context`, every origin is spoken to over TLS (`http://` URLs included: the
        addresses brokers register carry no scheme)."""
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self.ssl_context = ssl_context
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._extra = extra.encode("latin-1")
        self._origins: dict[str, _Origin] = {}

    def _origin(self, scheme: str, netloc: str) -> _Origin:
        key = f"{scheme}://{netloc}"
        origin = self._origins.get(key)
        if origin is None:
            host, _, port = netloc.rpartition(":")
            if not host or not port.isdigit():
                host, port = netloc, "443" if scheme == "https" else "80"
            ctx = self.ssl_context
            if ctx is None and scheme == "https":
                ctx = ssl.create_default_context()
            origin = _Origin(scheme, host.strip("[]"), int(port), self.max_connections, ctx)
            self._origins[key] = origin
        return origin

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        params: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        keep_late: Callable[[LateAnswer], None] | None = None,
    ) -> HttpResponse:
        """The answer. `keep_late`: for a request whose answer may matter even if the caller is
        cancelled once it is written (a receive the broker may already have handed messages): its
        connection is then not hung up on but kept, out of the pool, until that answer, handed
        over as a `LateAnswer` (whose `abort` hangs up)."""
        scheme, netloc, target = _split(url, params)
        origin = self._origin(scheme, netloc)
        data = _encode(method, target, origin.host_header, body, self._extra, headers)
        conn = await origin.acquire(self.connect_timeout_s, timeout_s)
        try:
            return await conn.request(data, timeout_s, keep_late)
        finally:
            origin.release(conn)

    async def aclose(self) -> None:
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()


def _split(url: str, params: dict[str, object] | None) -> tuple[str, str, str]:
    """(scheme, netloc, request target) of `url` with `params` added to its query."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpTransportError(f"unsupported URL {url!r}", RequestPhase.CONNECT)
    target = parts.path or "/"
    query = parts.query
    if params:
        query = (query + "&" if query else "") + urlencode(params)
    if query:
        target = f"{target}?{query}"
    return parts.scheme, parts.netloc, target


def _encode(
    method: str, target: str, host: bytes, body: bytes, extra: bytes, headers: dict[str, str] | None
) -> bytes | list[bytes]:
    """One request's bytes (a large body apart, so it is not copied)."""
    head = [
        f"{method} {target} HTTP/1.1\r\nHost: ".encode("latin-1"),
        host,
        b"\r\nContent-Length: ",
        str(len(body)).encode(),
        b"\r\n",
        extra,
    ]
    if headers:
        head.append("".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1"))
    head.append(b"\r\n")
    data = b"".join(head)
    if body:
        return [data, body] if len(body) > 16384 else data + body
    return data


# How often to ask, and what: a check that returns why the answer is no longer wanted, or None.
Watch = tuple[float, Callable[[], str | None]]


class _BlockingConnection:
    """One blocking socket (TCP or TLS) of `BlockingHttpClient`; one request at a time."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock = sock
        self.name = name
        self.idle_since = 0.0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._complete = False
        self._keep_alive = True
        self._parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()

    def closed_by_peer(self) -> bool:
        """Whether the server has closed this idle connection (or sent it something unasked): a
        request written into it would get no answer, and its outcome would be unknown."""
        if isinstance(self.sock, ssl.SSLSocket):  # no MSG_PEEK through TLS: readable at all is enough
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        self.sock.setblocking(False)  # with a timeout set, recv would first wait for data
        try:
            self.sock.recv(1, socket.MSG_PEEK)  # b"" at end of stream
        except BlockingIOError:
            return False
        except OSError:
            pass
        return True

    def request(
        self, data: bytes | list[bytes], timeout_s: float, watch: Watch | None = None
    ) -> HttpResponse:
        """Write one request and read its answer; HttpTransportError with the phase it failed in
        (the connection is then unusable). With `watch` (seconds, check), `check()` is asked
        every that many seconds while no answer has come: a reason it returns ends the wait."""
        self._headers, self._body, self._complete = {}, [], False
        parser = self._parser = httptools.HttpResponseParser(self)
        deadline = time.monotonic() + timeout_s
        check_at = deadline if watch is None else time.monotonic() + watch[0]
        phase = RequestPhase.SEND
        try:
            self.sock.settimeout(timeout_s)
            if isinstance(data, list):
                self.sock.sendall(data[0])
                self.sock.sendall(data[1])
            else:
                self.sock.sendall(data)
            phase = RequestPhase.AWAIT
            while not self._complete:
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    raise TimeoutError
                if watch is not None and now >= check_at:
                    reason = watch[1]()
                    if reason:
                        raise HttpTransportError(f"no answer from {self.name} yet, given up: {reason}", phase)
                    check_at = now + watch[0]
                self.sock.settimeout(min(left, check_at - now) if watch is not None else left)
                try:
                    chunk = self.sock.recv(65536)
                except TimeoutError:
                    if watch is None:
                        raise
                    continue  # the deadline or the next check
                if not chunk:
                    raise HttpTransportError(
                        f"connection to {self.name} closed before a complete answer", phase
                    )
                parser.feed_data(chunk)
        except TimeoutError:
            raise HttpTransportError(f"no answer from {self.name} within {timeout_s:g} s", phase) from None
        except httptools.HttpParserError as exc:
            raise HttpTransportError(f"malformed answer from {self.name}: {exc}", phase) from None
        except OSError as exc:
            raise HttpTransportError(f"{self.name}: {exc!r}", phase) from exc
        return HttpResponse(parser.get_status_code(), self._headers, b"".join(self._body))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class BlockingHttpClient:
    """`HttpClient` for a thread that waits for its answer anyway (`Producer.send`): blocking
    sockets, no event loop. Handing a request to the producer's I/O thread and the answer back
    costs two thread wake-ups, ~0.2 ms of a 0.9 ms send here (docs/PERFORMANCE.md). Idle
    connections are shared by threads (last-in first-out), dropped after `KEEPALIVE_EXPIRY_S`
    or when the server closed them; there is no cap: each waiting thread holds one."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 3.0,
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.ssl_context = ssl_context
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._extra = extra.encode("latin-1")
        self._idle: dict[str, list[_BlockingConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        watch: Watch | None = None,
    ) -> HttpResponse:
        """The complete answer of any status, or HttpTransportError with the phase it failed in.
        `watch`: see `_BlockingConnection.request`."""
        scheme, netloc, target = _split(url, None)
        host, _, port = netloc.rpartition(":")
        if not host or not port.isdigit():
            host, port = netloc, "443" if scheme == "https" else "80"
        host = host.strip("[]")
        key = f"{scheme}://{host}:{port}"
        data = _encode(method, target, f"{host}:{port}".encode("latin-1"), body, self._extra, headers)
        conn = self._acquire(key, scheme, host, int(port))
        try:
            resp = conn.request(data, timeout_s, watch)
        except BaseException:
            conn.close()
            raise
        if conn._keep_alive:
            conn.idle_since = time.monotonic()
            with self._lock:
                if not self._closed:
                    self._idle.setdefault(key, []).append(conn)
                    return resp
        conn.close()
        return resp

    def _acquire(self, key: str, scheme: str, host: str, port: int) -> _BlockingConnection:
        now = time.monotonic()
        while True:
            with self._lock:
                if self._closed:
                    raise HttpTransportError("the client is closed", RequestPhase.CONNECT)
                idle = self._idle.get(key)
                conn = idle.pop() if idle else None
            if conn is None:
                return self._connect(key, scheme, host, port)
            if now - conn.idle_since < KEEPALIVE_EXPIRY_S and not conn.closed_by_peer():
                return conn
            conn.close()

    def _connect(self, key: str, scheme: str, host: str, port: int) -> _BlockingConnection:
        try:
            sock = socket.create_connection((host, port), timeout=self.connect_timeout_s)
        except TimeoutError:
            raise HttpTransportError(f"connect to {key} timed out", RequestPhase.CONNECT) from None
        except OSError as exc:
            raise HttpTransportError(f"connect to {key}: {exc!r}", RequestPhase.CONNECT) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ctx = self.ssl_context or (ssl.create_default_context() if scheme == "https" else None)
        if ctx is not None:
            try:
                sock = ctx.wrap_socket(sock, server_hostname=host)
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise HttpTransportError(f"connect to {key}: {exc!r}", RequestPhase.CONNECT) from exc
        return _BlockingConnection(sock, key)

    def close(self) -> None:
        """Close the idle connections; requests under way finish and close theirs."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()
