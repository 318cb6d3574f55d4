"""Access control for the broker HTTP API (`aclEnable=true`, `aclConfigFile=...`).

The file is JSON, RocketMQ's plain ACL in spirit (bearer tokens instead of access keys):

    {"accounts": [
      {"name": "orders-app", "token": "s3cret",
       "admin": false,
       "topicPerms": {"orders": "PUB|SUB", "*": "DENY"},
       "groupPerms": {"billing": "SUB"}}
    ]}

Rights: `PUB` (produce), `SUB` (pull, receive/ack, read offsets), `DENY`. `*` is the default for
names not listed (DENY when absent). `admin: true` allows everything, including topic admin,
offset reset and leadership transfer. No or unknown token → 401; a known token without the
right → 403. `/health`, `/metrics`, `/status` and the OpenAPI docs stay open.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from broker.errors import BrokerCode, BrokerError


class Right(enum.Flag):
    NONE = 0
    PUB = 1
    SUB = 2


def _parse_right(value: Any, where: str) -> Right:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string like 'PUB|SUB' or 'DENY'")
    right = Right.NONE
    for part in value.upper().split("|"):
        part = part.strip()
        if part == "DENY":
            continue
        if part not in ("PUB", "SUB"):
            raise ValueError(f"{where}: unknown right {part!r} (PUB, SUB, DENY)")
        right |= Right[part]
    return right


@dataclass
class Account:
    name: str
    token: str
    admin: bool = False
    topic_perms: dict[str, Right] = field(default_factory=dict)
    group_perms: dict[str, Right] = field(default_factory=dict)

    def allows(self, table: dict[str, Right], name: str, right: Right) -> bool:
        granted = table.get(name, table.get("*", Right.NONE))
        return right in granted


class AccessControl:
    """Token → account; `check` raises BrokerError(UNAUTHORIZED/FORBIDDEN)."""

    def __init__(self, accounts: list[Account]) -> None:
        self.accounts = accounts

    @classmethod
    def load(cls, path: str | Path) -> AccessControl:
        """Parse the ACL file; ValueError names the file and the bad entry."""
        try:
            doc = orjson.loads(Path(path).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"aclConfigFile {path}: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("accounts"), list):
            raise ValueError(f'aclConfigFile {path}: expected {{"accounts": [...]}}')
        accounts = []
        for i, a in enumerate(doc["accounts"]):
            where = f"aclConfigFile {path}: accounts[{i}]"
            if not isinstance(a, dict) or not isinstance(a.get("token"), str) or not a["token"]:
                raise ValueError(f"{where}: needs a non-empty 'token'")
            accounts.append(
                Account(
                    name=str(a.get("name", f"account{i}")),
                    token=a["token"],
                    admin=bool(a.get("admin", False)),
                    topic_perms={
                        k: _parse_right(v, f"{where}.topicPerms.{k}")
                        for k, v in (a.get("topicPerms") or {}).items()
                    },
                    group_perms={
                        k: _parse_right(v, f"{where}.groupPerms.{k}")
                        for k, v in (a.get("groupPerms") or {}).items()
                    },
                )
            )
        return cls(accounts)

    def authenticate(self, authorization: str | None) -> Account:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise BrokerError(BrokerCode.UNAUTHORIZED, "missing bearer token (Authorization: Bearer <token>)")
        token = authorization[7:].strip()
        for acc in self.accounts:
            if hmac.compare_digest(acc.token.encode(), token.encode()):
                return acc
        raise BrokerError(BrokerCode.UNAUTHORIZED, "unknown token")

    def check(
        self,
        authorization: str | None,
        *,
        topic: str | None = None,
        group: str | None = None,
        right: Right = Right.NONE,
        admin: bool = False,
    ) -> Account:
        """Authenticate and authorize one request."""
        acc = self.authenticate(authorization)
        if acc.admin:
            return acc
        if admin:
            raise BrokerError(BrokerCode.FORBIDDEN, f"account {acc.name!r} is not an admin")
        if topic is not None and not acc.allows(acc.topic_perms, topic, right):
            raise BrokerError(
                BrokerCode.FORBIDDEN,
                f"account {acc.name!r} lacks {right.name} on topic {topic!r}",
                topic=topic,
            )
        if group is not None and not acc.allows(acc.group_perms, group, Right.SUB):
            raise BrokerError(
                BrokerCode.FORBIDDEN, f"account {acc.name!r} lacks SUB on group {group!r}", group=group
            )
        return acc


OPEN_PATHS = frozenset(
    {"/health", "/metrics", "/status", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
)


class AclAuthMiddleware:
    """Pure ASGI middleware: with ACL on, every request except OPEN_PATHS must carry a known
    bearer token, checked before routing or body validation (so an anonymous caller learns
    nothing, not even which input is wrong). Authorization per topic/group stays in the routes."""

    def __init__(self, app: Any, acl: AccessControl) -> None:
        self.app = app
        self.acl = acl

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        auth = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value.decode("latin-1")
                break
        try:
            self.acl.authenticate(auth)
        except BrokerError as exc:
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
            return
        await self.app(scope, receive, send)
