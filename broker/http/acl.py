"""`AuthMiddleware`: every HTTP request except `OPEN_PATHS` is authenticated once, before routing
or body validation (so an anonymous caller learns nothing, not even which input is wrong), and its
`Account` is handed to the route in `request.state.account`; the services authorize it
(`broker.service.acl`). With ACL off every request is `ANONYMOUS`."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from apidocs import DOC_PATHS
from broker.errors import BrokerError
from broker.service.acl import AccessControl, Account

# /metrics and /status are not open: they need the monitoring right (broker.service.acl).
OPEN_PATHS = frozenset({"/health", "/openapi.json"}) | DOC_PATHS


def account_of(request: Request) -> Account:
    """The account `AuthMiddleware` authenticated for this request."""
    account: Account = request.state.account
    return account


def authorization_of(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The Authorization header of an ASGI scope's headers, if any."""
    for name, value in headers:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


async def send_unauthorized(send: Any, exc: BrokerError) -> None:
    """The 401 (or other auth failure) answer, with the challenge header."""
    body = orjson.dumps(exc.problem())
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="ledgermq"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    """Pure ASGI middleware: authenticate, then route with the account in the scope's state."""

    def __init__(self, app: Any, acl: AccessControl) -> None:
        self.app = app
        self.acl = acl

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        try:
            account = self.acl.authenticate(authorization_of(scope["headers"]))
        except BrokerError as exc:
            await send_unauthorized(send, exc)
            return
        scope.setdefault("state", {})["account"] = account
        await self.app(scope, receive, send)
