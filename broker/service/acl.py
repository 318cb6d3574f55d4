"""Access control of the broker's services (`aclEnable=true`, `aclConfigFile=...`).

The file is JSON, RocketMQ's plain ACL in spirit (bearer tokens instead of access keys):

    {"accounts": [
      {"name": "orders-app", "token": "s3cret",
       "admin": false,
       "topicPerms": {"orders": "PUB|SUB", "*": "DENY"},
       "groupPerms": {"billing": "SUB"}}
    ]}

Rights: `PUB` (produce), `SUB` (pull, receive/ack, read offsets), `DENY`. `*` is the default for
names not listed (DENY when absent). `admin: true` allows everything, including topic admin,
offset reset and leadership transfer. `monitor: true` is the read-only monitoring right: `/metrics`
and `/status` (which an admin may read too), nothing else unless granted. No or unknown token →
401; a known token without the right → 403. `/health` and the OpenAPI docs stay open.

A front-end turns the request's `Authorization` value into an `Account` once
(`AccessControl.authenticate`); the services authorize that account for what each operation
touches (`AccessControl.authorize`). With ACL off, `AccessControl.disabled()` lets everything
through and `authenticate` answers `ANONYMOUS` without looking at the value.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hmac
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from broker.errors import BrokerCode, BrokerError
from listener.certs import FileVersions

log = logging.getLogger(__name__)

# How often the ACL file is checked for changes (RocketMQ's FileWatchService: 500 ms).
RELOAD_INTERVAL_S = 1.0


class Right(enum.Flag):
    """What an account may do with a topic or group (RocketMQ's PUB/SUB; DENY = NONE)."""

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
    """A principal: who a request comes from, and its rights per topic and group."""

    name: str
    token: str
    admin: bool = False
    monitor: bool = False  # may read /metrics and /status
    topic_perms: dict[str, Right] = field(default_factory=dict)
    group_perms: dict[str, Right] = field(default_factory=dict)

    def allows(self, table: dict[str, Right], name: str, right: Right) -> bool:
        granted = table.get(name, table.get("*", Right.NONE))
        return right in granted

    def may_read_topic(self, topic: str) -> bool:
        """SUB on `topic`, or admin: what listings for this account show."""
        return self.admin or self.allows(self.topic_perms, topic, Right.SUB)

    def may_read_group(self, group: str) -> bool:
        """SUB on `group`, or admin."""
        return self.admin or self.allows(self.group_perms, group, Right.SUB)


# The caller of every request when ACL is off (never compared against a token).
ANONYMOUS = Account(name="anonymous", token="", admin=True)


class AccessControl:
    """Token → account (`authenticate`, 401), account → right (`authorize`, 403).
    Callers: the front-ends (`authenticate`), the services (`authorize`)."""

    def __init__(self, accounts: list[Account], *, enabled: bool = True, path: Path | None = None) -> None:
        self.accounts = accounts
        self.enabled = enabled
        self.path = path  # the file `reload_if_changed` watches
        self._versions = FileVersions([str(path)]) if path is not None else None
        self._watch: asyncio.Task[None] | None = None

    @classmethod
    def disabled(cls) -> AccessControl:
        """ACL off: every request is `ANONYMOUS` and allowed everything."""
        return cls([], enabled=False)

    @classmethod
    def load(cls, path: str | Path) -> AccessControl:
        """Parse the ACL file; ValueError names the file and the bad entry."""
        path = Path(path)
        versions = FileVersions([str(path)])  # before the read: a change during it is read again
        control = cls(_parse_accounts(path))
        control.path, control._versions = path, versions
        return control

    def reload_if_changed(self) -> bool:
        """Read the file again when it changed since it was last read (RocketMQ's plain ACL
        watches its file the same way): accounts added, rights changed or tokens revoked apply
        to the next request, without a restart. A file that cannot be read or parsed leaves the
        accounts in force (so a half-written file never locks everyone out) and is logged once
        per version of the file; True when the accounts were replaced."""
        if self.path is None or self._versions is None:
            return False
        version = self._versions.new_version()
        if version is None:
            return False
        try:
            accounts = _parse_accounts(self.path)
        except ValueError as exc:
            self._versions.refuse(version)
            kept = len(self.accounts)
            log.error("event=acl_reload_failed file=%s keptAccounts=%d error=%s", self.path, kept, exc)
            return False
        self.accounts = accounts
        self._versions.accept(version)
        log.info("event=acl_reloaded file=%s accounts=%d", self.path, len(accounts))
        return True

    def start_watching(self, interval_s: float = RELOAD_INTERVAL_S) -> None:
        """Check the file for changes every `interval_s` on the running loop (nothing to watch
        with ACL off)."""
        if self.path is not None and self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_file(interval_s))

    async def stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None

    async def _watch_file(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.reload_if_changed()
            except Exception:  # never let one bad round end the watch
                log.exception("event=acl_reload_error file=%s", self.path)

    def authenticate(self, authorization: str | None) -> Account:
        """The account of an `Authorization: Bearer <token>` value; UNAUTHORIZED without one."""
        if not self.enabled:
            return ANONYMOUS
        if not authorization or not authorization.lower().startswith("bearer "):
            raise BrokerError(BrokerCode.UNAUTHORIZED, "missing bearer token (Authorization: Bearer <token>)")
        token = authorization[7:].strip()
        for acc in self.accounts:
            if hmac.compare_digest(acc.token.encode(), token.encode()):
                return acc
        raise BrokerError(BrokerCode.UNAUTHORIZED, "unknown token")

    def visible_accounts(self, account: Account) -> list[Account]:
        """The accounts `account` may look at (read-only, tokens are never shown): every one for
        an admin, else its own; none with ACL off."""
        if not self.enabled:
            return []
        return list(self.accounts) if account.admin else [account]

    def authorize(
        self,
        account: Account,
        *,
        topic: str | None = None,
        group: str | None = None,
        right: Right = Right.NONE,
        admin: bool = False,
        monitor: bool = False,
    ) -> None:
        """FORBIDDEN unless `account` holds `right` on `topic` (and SUB on `group`), or is an admin;
        `admin=True` asks for an admin account, `monitor=True` for the monitoring right."""
        if account.admin:
            return
        if monitor and not account.monitor:
            raise BrokerError(BrokerCode.FORBIDDEN, f"account {account.name!r} lacks the monitoring right")
        if admin:
            raise BrokerError(BrokerCode.FORBIDDEN, f"account {account.name!r} is not an admin")
        if topic is not None and not account.allows(account.topic_perms, topic, right):
            raise BrokerError(
                BrokerCode.FORBIDDEN,
                f"account {account.name!r} lacks {right.name} on topic {topic!r}",
                topic=topic,
            )
        if group is not None and not account.allows(account.group_perms, group, Right.SUB):
            raise BrokerError(
                BrokerCode.FORBIDDEN, f"account {account.name!r} lacks SUB on group {group!r}", group=group
            )


def _parse_accounts(path: Path) -> list[Account]:
    """The accounts of the ACL file; ValueError names the file and the bad entry."""
    try:
        doc = orjson.loads(path.read_bytes())
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
                monitor=bool(a.get("monitor", False)),
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
    return accounts
