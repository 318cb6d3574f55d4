"""The one request-body rule of LedgerMQ's HTTP servers (broker and name server): a body over the
limit is refused with 413 REQUEST_TOO_LARGE before more than the limit of it is in memory — a
declared Content-Length at once, a chunked body as soon as it passes.

`read_body` is the rule (pure ASGI); the broker's produce fast path calls it directly,
`BodyLimitMiddleware` applies it to every other route (whose handlers, Starlette/pydantic, would
otherwise read a body of any size before validating it)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from wire.codes import ErrorCode
from wire.problem import PROBLEM_CONTENT_TYPE, problem_body

log = logging.getLogger(__name__)

# JSON overhead allowance on top of maxMessageSize for one request (base64 grows 4/3).
_REQUEST_OVERHEAD_BYTES = 64 * 1024
MIN_REQUEST_LIMIT_BYTES = 8 * 1024 * 1024
# The most messages one pull answers (a larger maxMessages is refused): the broker's and its
# clients' one number.
MAX_PULL_MESSAGES = 1024
# The most messages one group receive answers (a larger maxMessages is refused).
MAX_RECEIVE_MESSAGES = 1024
# A receive's invisibleMs and waitMs ranges (a change of invisible time may also set 0: visible
# again at once).
MIN_INVISIBLE_MS = 100
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_RECEIVE_WAIT_MS = 3_600_000


def request_limit_bytes(max_message_size: int) -> int:
    """A broker's request-body limit: a batch may carry several messages, so the request is
    bounded, not just one message."""
    return max(MIN_REQUEST_LIMIT_BYTES, max_message_size * 4 // 3 + _REQUEST_OVERHEAD_BYTES)


class BodyTooLarge(Exception):
    """A request body over the limit (`detail` says by how much it was known)."""

    def __init__(self, detail: str, limit: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.limit = limit

    def problem(self) -> dict[str, Any]:
        """The problem+json body of the 413."""
        return problem_body(
            ErrorCode.REQUEST_TOO_LARGE, f"{self.detail}; the limit is {self.limit}", 413, limit=self.limit
        )


class BodyIncomplete(Exception):
    """The client disconnected before its body was complete, or declared a length that is no
    number (`field`, `detail`: what a 400 INVALID_REQUEST names)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


def declared_length(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The Content-Length header value of an ASGI scope's headers, if any."""
    for name, value in headers:
        if name == b"content-length" or name.lower() == b"content-length":
            return value.decode("latin-1")
    return None


async def read_body(scope: dict[str, Any], receive: Any, limit: int, declared: str | None) -> bytes:
    """The whole request body; BodyTooLarge past `limit` (logged), BodyIncomplete on a disconnect
    or a Content-Length that is no number."""
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise BodyIncomplete("Content-Length", f"not a number: {declared[:40]!r}")
        if int(declared) > limit:
            _log_refusal(scope, limit)
            raise BodyTooLarge(f"request body is {int(declared)} bytes", limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise BodyIncomplete("body", "client disconnected while sending the body")
        chunk = msg.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                _log_refusal(scope, limit)
                raise BodyTooLarge(f"request body exceeds {limit} bytes", limit)
            chunks.append(chunk)
        if not msg.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _log_refusal(scope: dict[str, Any], limit: int) -> None:
    log.warning("event=request_too_large method=%s path=%s limit=%d", scope["method"], scope["path"], limit)


class BodyLimitMiddleware:
    """Pure ASGI: reads the body under `read_body`'s rule, then hands it to the app in one piece."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive, self.limit, declared_length(scope["headers"]))
        except BodyTooLarge as exc:
            await _send_problem(send, 413, exc.problem(), close=True)
            return
        except BodyIncomplete as exc:
            doc = problem_body(ErrorCode.INVALID_REQUEST, str(exc), field=exc.field)
            await _send_problem(send, 400, doc, close=True)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            # The body first; later calls (disconnect detection) reach the server.
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_problem(send: Any, status: int, doc: dict[str, Any], *, close: bool) -> None:
    body = orjson.dumps(doc)
    headers = [
        (b"content-type", PROBLEM_CONTENT_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
