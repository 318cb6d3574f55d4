"""Calls that reach a slave and need the master: forwarded to the master's gRPC endpoint.

Clients keep a route for up to 30 s (the Python client refreshes it on a schedule, not on
errors), so after a failover or a leadership transfer they still call the old master, now a
slave. Rather than failing those calls until the next refresh, a slave passes them to its
master — the one the log names (`BrokerState.master_grpc_addr`) — with the client's metadata
(its signature verifies there too) and answers with the master's reply. While no master is known
(an election, ~1-1.5 s) it waits for one, within the call's deadline. A forwarded call is
marked and never forwarded twice: a member that is no master either answers NOT_MASTER. Where
the master is: the name servers' word (`RouteResolver.master_grpc_addr`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from broker.errors import BrokerCode, BrokerError
from broker.grpc.protocol import spb_grpc

log = logging.getLogger(__name__)

FORWARDED = "x-ledgermq-forwarded"
# How long a slave waits for a master to be known before it answers NOT_MASTER.
MASTER_WAIT_S = 3.0
MASTER_POLL_S = 0.05
_DEFAULT_TIMEOUT_S = 10.0


class Forwarder:
    """One channel per master address. Callers: the servicer's master-only RPCs."""

    def __init__(self, state: Any, master_grpc_addr: Callable[[], Awaitable[str | None]]) -> None:
        self.state = state  # broker.service.BrokerState
        self._master_grpc_addr = master_grpc_addr
        self._channels: dict[str, tuple[grpc.aio.Channel, Any]] = {}
        self.forwarded = 0

    def must_forward(self, meta: dict[str, str]) -> bool:
        """True when this call has to go to the master (we are not it). A call forwarded to us
        already is served here, so a stale view cannot bounce it around."""
        if self.state.is_master():
            return False
        if meta.get(FORWARDED):
            self.state.require_master()  # raises NOT_MASTER naming the master we know
        return True

    async def _master(self, context: Any) -> str:
        deadline = time.monotonic() + min(MASTER_WAIT_S, _remaining(context))
        while True:
            addr = await self._master_grpc_addr()
            if addr is not None or time.monotonic() >= deadline:
                break
            await asyncio.sleep(MASTER_POLL_S)
        if addr is None:
            raise BrokerError(
                BrokerCode.NOT_MASTER,
                f"broker {self.state.config.broker_name}: no master with a gRPC endpoint is known right "
                "now (an election is in progress); retry",
            )
        return addr

    def _stub(self, addr: str) -> Any:
        entry = self._channels.get(addr)
        if entry is None:
            channel = grpc.aio.insecure_channel(addr, options=[("grpc.max_receive_message_length", -1)])
            entry = self._channels[addr] = (channel, spb_grpc.MessagingServiceStub(channel))
        return entry[1]

    @staticmethod
    def _metadata(context: Any) -> list[tuple[str, str]]:
        md = [(k, v) for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)]
        md.append((FORWARDED, "1"))
        return md

    async def unary(self, method: str, request: Any, context: Any) -> Any:
        """The master's answer to a unary call."""
        addr = await self._master(context)
        self.forwarded += 1
        try:
            return await getattr(self._stub(addr), method)(
                request, metadata=self._metadata(context), timeout=_remaining(context)
            )
        except grpc.aio.AioRpcError as exc:
            raise _unreachable(addr, exc) from None

    async def stream(self, method: str, request: Any, context: Any) -> AsyncIterator[Any]:
        """The master's answers to a server-streaming call."""
        addr = await self._master(context)
        self.forwarded += 1
        call = getattr(self._stub(addr), method)(
            request, metadata=self._metadata(context), timeout=_remaining(context)
        )
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as exc:
            raise _unreachable(addr, exc) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        for channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()


def _remaining(context: Any) -> float:
    remaining = context.time_remaining()
    return _DEFAULT_TIMEOUT_S if remaining is None else max(0.0, remaining)


def _unreachable(addr: str, exc: grpc.aio.AioRpcError) -> BrokerError:
    log.warning("event=grpc_forward_failed master=%s code=%s detail=%s", addr, exc.code(), exc.details())
    return BrokerError(
        BrokerCode.NOT_MASTER, f"the master at {addr} did not answer ({exc.code().name}); retry"
    )
