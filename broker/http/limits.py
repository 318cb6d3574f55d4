"""`BodyLimitMiddleware`: a request body over the limit is refused (413 problem+json) before the
app holds more than the limit of it in memory.

The produce route enforces its own limit while reading (`HotPath._read_body`); this guards every
other route of the broker and the name server, whose handlers (Starlette/pydantic) would otherwise
read a body of any size before validating it."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import orjson

from client.errors import PROBLEM_CONTENT_TYPE, problem_body

log = logging.getLogger(__name__)


class BodyLimitMiddleware:
    """Pure ASGI: reads the body up to `limit` bytes, then replays it to the app."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k.lower() == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, send, f"request body is {int(declared)} bytes")
            return
        buffered: deque[dict[str, Any]] = deque()
        size = 0
        while True:
            msg = await receive()
            buffered.append(msg)
            if msg["type"] != "http.request":
                break  # a disconnect: the app sees it in order
            size += len(msg.get("body", b""))
            if size > self.limit:
                await self._refuse(scope, send, f"request body exceeds {self.limit} bytes")
                return
            if not msg.get("more_body", False):
                break

        async def replay() -> dict[str, Any]:
            # After the buffered body, later calls (disconnect detection) reach the server.
            return buffered.popleft() if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: dict[str, Any], send: Any, detail: str) -> None:
        log.warning(
            "event=request_too_large method=%s path=%s limit=%d", scope["method"], scope["path"], self.limit
        )
        body = orjson.dumps(
            problem_body("REQUEST_TOO_LARGE", f"{detail}; the limit is {self.limit}", 413, limit=self.limit)
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_CONTENT_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
