"""Server-side invisibility renewal for push consumers (`ReceiveMessage.auto_renew`).

A push consumer receives without an invisible time and expects the server to keep each message
invisible until it acks — RocketMQ's proxy does it in its `DefaultReceiptHandleManager`. Here:
a message received with `auto_renew` is invisible for `AUTO_RENEW_INVISIBLE_MS`, and renewed
through the pop service's `change_invisible` `RENEW_AHEAD_MS` before it would reappear, for at
most `MAX_RENEW_MS` — and only while the client is alive: one that has made no call for
`CLIENT_SILENT_MS` (push consumers heartbeat every 10 s) crashed or hung, so its messages are let
go and reappear at their current deadline for the group's other consumers. The pop service issues
a new handle on each change; the client keeps the first one, so settling calls swap it for the
latest (`current`) right before they call the service (no await in between: a renewal cannot slip
in).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from broker.errors import BrokerError

log = logging.getLogger(__name__)

AUTO_RENEW_INVISIBLE_MS = 60_000
RENEW_AHEAD_MS = 10_000
MAX_RENEW_MS = 3 * 3600 * 1000
CLIENT_SILENT_MS = 30_000
TICK_S = 1.0

_Key = tuple[str, str, str]  # group, topic, the handle the client holds


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Renewal:
    handle: str  # the latest handle the pop service issued
    due_ms: int  # renew at this time
    give_up_ms: int
    client_id: str
    account: Any


class InvisibilityRenewer:
    """Handles under renewal. Callers: the servicer (`track`, `current`, `settled`,
    `forget_client`); its own task renews."""

    def __init__(self, pop: Any) -> None:
        self.pop = pop  # broker.service.PopService
        self._renewals: dict[_Key, _Renewal] = {}
        self._last_call_ms: dict[str, int] = {}  # client id -> its last call, for clients under renewal
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="grpc-invisibility-renewal")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def __len__(self) -> int:
        return len(self._renewals)

    def seen(self, client_id: str) -> None:
        """The client made a call (any RPC): it is alive."""
        if client_id in self._last_call_ms:
            self._last_call_ms[client_id] = _now_ms()

    def track(self, group: str, topic: str, handle: str, client_id: str, account: Any) -> None:
        now = _now_ms()
        self._last_call_ms[client_id] = now
        self._renewals[(group, topic, handle)] = _Renewal(
            handle, now + AUTO_RENEW_INVISIBLE_MS - RENEW_AHEAD_MS, now + MAX_RENEW_MS, client_id, account
        )

    def current(self, group: str, topic: str, handle: str) -> str:
        """The handle that settles what the client knows as `handle` now."""
        r = self._renewals.get((group, topic, handle))
        return r.handle if r is not None else handle

    def settled(self, group: str, topic: str, handle: str) -> None:
        """Acked, dead-lettered or handed back to the client's own invisibility: stop renewing."""
        self._renewals.pop((group, topic, handle), None)

    def forget_client(self, client_id: str) -> None:
        """The client shut down: its messages become visible at their current deadline."""
        for key in [k for k, r in self._renewals.items() if r.client_id == client_id]:
            del self._renewals[key]
        self._last_call_ms.pop(client_id, None)

    def expire_silent(self) -> None:
        """Stop renewing for clients silent for CLIENT_SILENT_MS (crashed without saying so)."""
        now = _now_ms()
        for cid in [c for c, t in self._last_call_ms.items() if now - t > CLIENT_SILENT_MS]:
            log.info("event=grpc_renewal_client_silent clientId=%s", cid)
            self.forget_client(cid)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.expire_silent()
            now = _now_ms()
            for key in [k for k, r in self._renewals.items() if r.due_ms <= now]:
                await self._renew(key)

    async def _renew(self, key: _Key) -> None:
        r = self._renewals.get(key)
        if r is None:
            return
        if _now_ms() >= r.give_up_ms:
            del self._renewals[key]
            log.info("event=grpc_renewal_max group=%s topic=%s", key[0], key[1])
            return
        group, topic, _ = key
        try:
            new = await self.pop.change_invisible(r.account, group, topic, r.handle, AUTO_RENEW_INVISIBLE_MS)
        except BrokerError as exc:
            # Settled meanwhile, redelivered, or this broker is no master any more: nothing to keep.
            if self._renewals.get(key) is r:
                del self._renewals[key]
            log.info("event=grpc_renewal_stopped group=%s topic=%s code=%s", group, topic, exc.code.value)
            return
        if self._renewals.get(key) is r:
            r.handle = new
            r.due_ms = _now_ms() + AUTO_RENEW_INVISIBLE_MS - RENEW_AHEAD_MS
