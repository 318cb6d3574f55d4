"""Slow and idle clients cannot hold a listener's descriptors: `GuardedHttpToolsProtocol` is
uvicorn's httptools protocol with

- a header deadline (`requestHeaderTimeoutMs`) from the accept, or from a keep-alive request's
  first byte, to the end of its headers — an idle connect and a slow header both end there with a
  408 and a close;
- a body deadline (`requestBodyTimeoutMs` + Content-Length at `requestBodyMinBytesPerSec`) from the
  end of the headers to the end of the body — a body trickled in ends with the connection aborted
  (the handler sees a disconnect);
- uvicorn's own keep-alive timer (`serverChannelMaxIdleTimeSeconds`) between requests;
- caps on open connections per listener and per client IP (`ConnectionGuard`): a connection over a
  cap is answered 503 problem+json "too many connections" and closed at once.

Deadlines are per phase, never reset by a byte, and stop once a request is fully received, so a
long poll or a slow handler is not cut. A request that arrives in one read (the produce path)
arms no timer at all: the deadline timer is armed only when a read ends mid-request.

HTTP/1.1 pipelining is bounded: uvicorn queues every request a read brings while one is being
answered, and resumes reading after each answer, so a client that pipelines without reading its
answers had the master hold ~100 MB of queued requests on one connection (measured: 111,000 GETs).
Reading is paused again after each answer while requests are still queued (a handler that reads
a body still resumes it, so the bound is the next check), and a read that queues more than
`MAX_PIPELINED` closes the connection (`event=pipeline_overflow`; none of the queued requests had
started). Writes to a connection already closed are dropped, as asyncio's transports do (uvloop
raises): uvicorn marks only the last parsed request of a closed connection as disconnected.

It also sends each response in one write (`_ResponseWriter`): uvicorn writes the head at
`http.response.start` and the body at `http.response.body`, two syscalls per answer, and on
loopback each wakes the client (measured on a master: the second write took 40-140 us of its
loop, and a client may wake twice for one answer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from listener.config import ListenerConfig
from wire.codes import ErrorCode
from wire.problem import PROBLEM_CONTENT_TYPE, problem_body

log = logging.getLogger(__name__)

_IDLE, _HEADERS, _BODY = 0, 1, 2
LOG_INTERVAL_S = 1.0  # at most one line per listener, event and reason per second
# A refused connection's request may already be in flight: closing with unread bytes sends a
# reset that can destroy our 503 before the client reads it. So the 503 is followed by a FIN and
# what arrives is read and dropped until the client closes, for at most LINGER_S and for at most
# MAX_LINGERING connections at once (past that, closed at once like a flood deserves).
LINGER_S = 1.0
MAX_LINGERING = 256
# Requests a connection may have queued behind the one being answered (browsers pipeline none;
# a client library that pipelines keeps a few in flight).
MAX_PIPELINED = 256


def _problem_response(code: ErrorCode, reason: bytes, detail: str, **extra: Any) -> bytes:
    body = orjson.dumps(problem_body(code, detail, **extra))
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\ncontent-type: " % (code.status, reason),
            PROBLEM_CONTENT_TYPE.encode(),
            b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body),
            body,
        ]
    )


class _ThrottledLog:
    """One log line per interval for a repeated event, with how many were folded into it."""

    def __init__(self) -> None:
        self.last = 0.0
        self.folded = 0

    def __call__(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last < LOG_INTERVAL_S:
            self.folded += 1
            return
        log.warning(msg + " alsoSinceLastLine=%d", *args, self.folded)
        self.last, self.folded = now, 0


class ConnectionGuard:
    """A listener's connection accounting and deadlines; shared by its connections.
    Callers: `GuardedHttpToolsProtocol` (admit/release/expired), the listener (counters)."""

    def __init__(self, name: str, config: ListenerConfig, max_connections: int | None = None) -> None:
        self.name = name
        self.max_connections = max_connections or config.max_connections
        self.max_per_ip = min(config.max_connections_per_ip, self.max_connections)
        self.header_timeout_s = config.request_header_timeout_ms / 1000
        self.body_timeout_s = config.request_body_timeout_ms / 1000
        self.body_rate = config.request_body_min_bytes_per_sec
        self.open = 0
        self.per_ip: dict[str, int] = {}
        self.refused = 0
        self.timed_out = 0
        self.lingering = 0
        self._refusal_logs = {"maxConnections": _ThrottledLog(), "maxConnectionsPerIp": _ThrottledLog()}
        self._timeout_logs = {_HEADERS: _ThrottledLog(), _BODY: _ThrottledLog()}
        self._pipeline_log = _ThrottledLog()

    def admit(self, ip: str) -> str | None:
        """Count a new connection from `ip`; the cap it would break instead (then not counted)."""
        if self.open >= self.max_connections:
            return "maxConnections"
        if self.per_ip.get(ip, 0) >= self.max_per_ip:
            return "maxConnectionsPerIp"
        self.open += 1
        self.per_ip[ip] = self.per_ip.get(ip, 0) + 1
        return None

    def release(self, ip: str) -> None:
        self.open -= 1
        left = self.per_ip[ip] - 1
        if left:
            self.per_ip[ip] = left
        else:
            del self.per_ip[ip]

    def refusal(self, ip: str, cap: str) -> bytes:
        """The 503 for a connection over `cap` (logged, throttled)."""
        self.refused += 1
        limit = self.max_connections if cap == "maxConnections" else self.max_per_ip
        self._refusal_logs[cap](
            "event=connection_refused listener=%s remote=%s reason=%s open=%d fromRemote=%d limit=%d",
            self.name, ip, cap, self.open, self.per_ip.get(ip, 0), limit,
        )
        detail = f"too many connections ({cap}={limit}); retry later"
        unavailable = ErrorCode.SERVICE_UNAVAILABLE
        return _problem_response(unavailable, b"Service Unavailable", detail, outcome="refused")

    def pipeline_overflow(self, ip: str, queued: int) -> None:
        """A connection closed for queueing more than MAX_PIPELINED requests (logged, throttled)."""
        self._pipeline_log(
            "event=pipeline_overflow listener=%s remote=%s queued=%d limit=%d: connection closed",
            self.name, ip, queued, MAX_PIPELINED,
        )

    def expired(self, ip: str, phase: int) -> None:
        self.timed_out += 1
        what = "headers" if phase == _HEADERS else "body"
        limit_ms = round((self.header_timeout_s if phase == _HEADERS else self.body_timeout_s) * 1000)
        self._timeout_logs[phase](
            "event=request_read_timeout listener=%s remote=%s phase=%s timeoutMs=%d",
            self.name, ip, what, limit_ms,
        )

    def body_deadline_s(self, headers: list[tuple[bytes, bytes]]) -> float:
        """Seconds allowed for a body: the base plus its declared length at the minimum rate."""
        for name, value in headers:
            if name == b"content-length":
                if value.isdigit():
                    return self.body_timeout_s + int(value) / self.body_rate
                break
        return self.body_timeout_s


_TIMEOUT_408 = _problem_response(
    ErrorCode.REQUEST_TIMEOUT, b"Request Timeout", "request headers not received in time"
)


_CONTINUE = b"HTTP/1.1 100 "


class _ResponseWriter:
    """One request cycle's transport: the response head (uvicorn's first write of a cycle, but an
    interim 100 Continue) is held until the first body write and both leave in one `writelines`;
    anything after goes straight through. The head is sent alone when the response ends without a
    body write (HEAD, an empty answer written as no bytes) or the cycle closes the connection."""

    __slots__ = ("_head", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():
            return  # the client is gone; what it would have read is dropped
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))
        elif self._started or data.startswith(_CONTINUE):
            self._transport.write(data)
        else:
            self._started = True
            self._head = data

    def flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a `ConnectionGuard` (built by `listener.server`)."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._ip = ""
        self._admitted = False
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase = _IDLE

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self._ip = peer[0] if isinstance(peer, tuple) else str(peer)
        cap = self.guard.admit(self._ip)
        if cap is not None:
            self._refuse(transport, cap)
            return
        self._admitted = True
        super().connection_made(transport)
        self._arm(_HEADERS, self.guard.header_timeout_s)  # the first request's headers

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            self._refused = False
            self._cancel()
            self.guard.lingering -= 1
            return
        if not self._admitted:
            return
        self._admitted = False
        self._cancel()
        self.guard.release(self._ip)
        super().connection_lost(exc)

    def eof_received(self) -> None:
        # Returning None closes the transport: the end of a lingering refusal too.
        return None

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or cycle.transport is not self.transport:
            return  # no new cycle (an upgrade), or this one already writes through a writer
        writer = _ResponseWriter(self.transport)
        cycle.transport = writer  # type: ignore[assignment]
        completed = cycle.on_response

        def on_response() -> None:
            writer.flush()
            completed()
            if self.pipeline:
                # uvicorn resumes reading after every answer: not while requests still wait.
                self.flow.pause_reading()

        cycle.on_response = on_response

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused connection's request, dropped
        super().data_received(data)
        if len(self.pipeline) > MAX_PIPELINED:
            self.guard.pipeline_overflow(self._ip, len(self.pipeline))
            self.pipeline.clear()
            self.transport.close()
            return
        # Where the parse stands, from uvicorn's own per-request state (no callback overridden,
        # so a request read in one piece costs one comparison): a begun request's scope has no
        # "method" until its headers are complete; its cycle wants more body until it is whole.
        scope = self.scope
        if scope is None:
            return  # nothing begun yet: the accept's header deadline stands
        if "method" not in scope:
            phase = _HEADERS
        else:
            cycle = self.cycle
            phase = _BODY if cycle is not None and cycle.more_body and cycle.scope is scope else _IDLE
        if phase == self._timer_phase:
            return
        self._cancel()
        if phase == _HEADERS:
            self._arm(_HEADERS, self.guard.header_timeout_s)
        elif phase == _BODY:
            self._arm(_BODY, self.guard.body_deadline_s(self.headers))

    def _refuse(self, transport: asyncio.Transport, cap: str) -> None:
        transport.write(self.guard.refusal(self._ip, cap))
        if self.guard.lingering < MAX_LINGERING and transport.can_write_eof():
            self._refused = True
            self.guard.lingering += 1
            transport.write_eof()
            self._timer = self.loop.call_later(LINGER_S, transport.abort)
        else:
            transport.close()

    def _arm(self, phase: int, seconds: float) -> None:
        self._timer_phase = phase
        self._timer = self.loop.call_later(seconds, self._expired)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_phase = _IDLE

    def _expired(self) -> None:
        phase, self._timer, self._timer_phase = self._timer_phase, None, _IDLE
        if self.transport.is_closing():
            return
        self.guard.expired(self._ip, phase)
        if phase == _HEADERS and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(_TIMEOUT_408)
            self.transport.close()
        else:
            # A body being trickled in: its handler is reading it and will see the disconnect.
            self.transport.abort()
