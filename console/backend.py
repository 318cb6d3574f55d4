"""How the console reaches the cluster: one SDK admin client per access token, each counting the
requests a page view makes, and the operators' sessions (token kept here, never in the browser).

Callers: `console.app` (one `Backend` per app). Affects nothing in the cluster by itself."""

from __future__ import annotations

import contextvars
import secrets
import time
from dataclasses import dataclass
from typing import Any

from client.admin import AsyncAdmin
from client.transport import AsyncTransport
from console.throughput import Throughput

# Requests sent to name servers and brokers on behalf of the page view being served.
_page_requests: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "console_page_requests", default=None
)

SESSION_COOKIE = "ledgermq_console_session"
# An operator's session lasts a working day, then the console asks for the token again.
SESSION_TTL_S = 12 * 3600
# Bound on one call to a broker or name server: a page must render (with the member shown as
# down) even when a member does not answer.
REQUEST_TIMEOUT_S = 5.0


class CountingTransport(AsyncTransport):
    """The SDK transport, counting every request (in total and for the current page view)."""

    def __init__(self, token: str | None, timeout_s: float, ca_file: str | None = None) -> None:
        super().__init__(token=token, timeout_s=timeout_s, ca_file=ca_file)
        self.total = 0

    async def request(self, method: str, url: str, **kw: Any) -> Any:
        self.total += 1
        counter = _page_requests.get()
        if counter is not None:
            counter[0] += 1
        return await super().request(method, url, **kw)


def start_page_count() -> list[int]:
    """Count the backend requests of the page view being served from here on; read `[0]`."""
    counter = [0]
    _page_requests.set(counter)
    return counter


@dataclass
class Session:
    token: str
    expires_at: float


class Backend:
    """Admin clients by token (None = no access control) and sessions by cookie value."""

    def __init__(self, namesrv_addr: str, ca_file: str | None = None) -> None:
        self.namesrv_addr = namesrv_addr
        self.ca_file = ca_file  # the cluster's CA when it serves HTTPS
        self._admins: dict[str | None, AsyncAdmin] = {}
        self._sessions: dict[str, Session] = {}
        # Broker address → DLedger member id, from the members' last answers (a member that
        # stops answering keeps its name on the cluster page).
        self.member_ids: dict[str, str] = {}
        self.throughput = Throughput()

    def admin(self, token: str | None) -> AsyncAdmin:
        admin = self._admins.get(token)
        if admin is None:
            transport = CountingTransport(token, REQUEST_TIMEOUT_S, self.ca_file)
            admin = AsyncAdmin(self.namesrv_addr, transport=transport)
            self._admins[token] = admin
        return admin

    def requests_total(self) -> int:
        """Requests sent to name servers and brokers since start, by the clients still open."""
        return sum(getattr(a.transport, "total", 0) for a in self._admins.values())

    # -- sessions ----------------------------------------------------------------------------------
    def open_session(self, token: str) -> str:
        sid = secrets.token_urlsafe(24)
        self._sessions[sid] = Session(token, time.monotonic() + SESSION_TTL_S)
        return sid

    def session_token(self, sid: str | None) -> str | None:
        """The token of a live session, else None."""
        if not sid:
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        if session.expires_at < time.monotonic():
            del self._sessions[sid]
            return None
        return session.token

    async def close_session(self, sid: str | None) -> None:
        session = self._sessions.pop(sid or "", None)
        if session is not None and all(s.token != session.token for s in self._sessions.values()):
            admin = self._admins.pop(session.token, None)
            if admin is not None:
                await admin.close()

    async def close(self) -> None:
        for admin in self._admins.values():
            await admin.close()
        self._admins.clear()
        self._sessions.clear()
