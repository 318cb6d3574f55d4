"""Calls that reach a slave and need the master: forwarded to the master's gRPC endpoint.

Clients keep a route for up to 30 s (the Python client refreshes it on a schedule, not on
errors), so after a failover or a leadership transfer they still call the old master, now a
slave; and routes name some queues at slaves on purpose (`route.spread`), so a send that failed
at a dead master is retried at a member that survived. A slave passes such calls to its master
with the client's metadata (its signature verifies there too) and answers with the master's
reply. Where the master is: the log's word, else the name servers' (`RouteResolver.
master_grpc_addr`). While no master is known, or the one known does not answer (a SIGKILLed
master, ~1-1.5 s until the next is elected) or answers that it is no master (yet), the slave
asks again until one takes the call, within the call's deadline and MASTER_WAIT_S: each failure
the client sees costs it one of its few send attempts. Only calls that got no answer are tried
again (a send again is safe anyway: its message id is its idempotency key). A forwarded call is
marked and never forwarded twice: a member that is no master either answers NOT_MASTER.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from broker.errors import BrokerCode, BrokerError
from broker.grpc.protocol import Code, spb_grpc

log = logging.getLogger(__name__)

FORWARDED = "x-ledgermq-forwarded"
# How long a slave waits for a master that takes the call before it answers NOT_MASTER.
MASTER_WAIT_S = 3.0
MASTER_POLL_S = 0.05
# A forwarded call the master leaves unanswered this long has the set's master looked up again,
# and as often after (the log's word: no I/O once known): when the set has elected another one
# meanwhile (the old one hangs, or is cut off), the call is given up there and forwarded to the
# new master, instead of waiting out the client's deadline on one that can no longer serve it.
MOVED_CHECK_S = 0.5
# `_unless_master_moves`'s answer when the master moved before the call answered.
_MOVED = object()
_DEFAULT_TIMEOUT_S = 10.0
# Answers that mean "the member you reached is not the master (yet)": ask again.
_NOT_MASTER_CODES = frozenset({Code.HA_NOT_AVAILABLE})


class Forwarder:
    """One channel per master address. Callers: the servicer's master-only RPCs."""

    def __init__(
        self,
        state: Any,
        master_grpc_addr: Callable[[frozenset[str]], Awaitable[str | None]],
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.state = state  # broker.service.BrokerState
        self._master_grpc_addr = master_grpc_addr
        self._channels: dict[str, tuple[grpc.aio.Channel, Any]] = {}
        self._credentials = credentials  # TLS to the master's port (broker/grpc/tls.py), else plaintext
        self.forwarded = 0
        self.retried = 0

    def must_forward(self, meta: dict[str, str]) -> bool:
        """True when this call has to go to the master (we are not it). A call forwarded to us
        already is served here, so a stale view cannot bounce it around."""
        if self.state.is_master():
            return False
        if meta.get(FORWARDED):
            self.state.require_master()  # raises NOT_MASTER naming the master we know
        return True

    async def _master(self, deadline: float, failed: set[str]) -> str | None:
        """A master endpoint not in `failed`, waiting for one until `deadline` (None: none came)."""
        while True:
            addr = await self._master_grpc_addr(frozenset(failed))
            if addr is not None or time.monotonic() >= deadline:
                return addr
            await asyncio.sleep(MASTER_POLL_S)

    def _deadline(self, context: Any) -> float:
        return time.monotonic() + min(MASTER_WAIT_S, _remaining(context))

    def _no_master(self, failed: set[str]) -> BrokerError:
        tried = f" ({', '.join(sorted(failed))} did not take it)" if failed else ""
        return BrokerError(
            BrokerCode.NOT_MASTER,
            f"broker {self.state.config.broker_name}: no master took the call within "
            f"{MASTER_WAIT_S:.0f}s{tried}; an election is in progress, retry",
        )

    def _stub(self, addr: str) -> Any:
        entry = self._channels.get(addr)
        if entry is None:
            options = [("grpc.max_receive_message_length", -1)]
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(addr, options=options)
            else:
                channel = grpc.aio.secure_channel(addr, self._credentials, options=options)
            entry = self._channels[addr] = (channel, spb_grpc.MessagingServiceStub(channel))
        return entry[1]

    @staticmethod
    def _metadata(context: Any) -> list[tuple[str, str]]:
        md = [(k, v) for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)]
        md.append((FORWARDED, "1"))
        return md

    async def unary(self, method: str, request: Any, context: Any) -> Any:
        """The master's answer to a unary call."""
        deadline, failed = self._deadline(context), set[str]()
        answer = None
        while True:
            addr = await self._master(deadline, failed)
            if addr is None:
                if answer is not None:
                    return answer  # the last member's own NOT_MASTER answer
                raise self._no_master(failed)
            self.forwarded += 1
            try:
                # The generated stub's RPC by its protocol name (one forwarder for every RPC),
                # not a probe of our own objects.
                reply = await self._unless_master_moves(addr, getattr(self._stub(addr), method)(
                    request, metadata=self._metadata(context), timeout=_remaining(context)
                ))
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise _unreachable(addr, exc) from None
                log.info("event=grpc_forward_retry master=%s code=%s", addr, exc.code().name)
                failed.add(addr)  # gone: ask for another
            else:
                if reply is _MOVED:
                    failed.add(addr)  # hung or cut off: the set's new master takes it
                else:
                    answer = reply
                    if answer.status.code not in _NOT_MASTER_CODES:
                        return answer
                    await asyncio.sleep(MASTER_POLL_S)  # not master yet (catching up): ask again
            self.retried += 1
            if time.monotonic() >= deadline:
                if answer is not None:
                    return answer
                raise self._no_master(failed)

    async def stream(self, method: str, request: Any, context: Any) -> AsyncIterator[Any]:
        """The master's answers to a server-streaming call (tried again only while nothing has
        come back)."""
        deadline, failed = self._deadline(context), set[str]()
        while True:
            addr = await self._master(deadline, failed)
            if addr is None:
                raise self._no_master(failed)
            self.forwarded += 1
            call = getattr(self._stub(addr), method)(  # the stub's RPC by name, as above
                request, metadata=self._metadata(context), timeout=_remaining(context)
            )
            answered = gone = False
            try:
                items = call.__aiter__()
                try:
                    first = await self._unless_master_moves(addr, items.__anext__())
                except StopAsyncIteration:
                    return
                if first is _MOVED:
                    gone = True  # hung or cut off: the set's new master takes it
                elif first.status.code in _NOT_MASTER_CODES and time.monotonic() < deadline:
                    pass  # that member is no master (yet): ask again
                else:
                    answered = True
                    yield first
                    async for item in items:
                        yield item
                    return
            except grpc.aio.AioRpcError as exc:
                if answered or exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                    raise _unreachable(addr, exc) from None
                log.info("event=grpc_forward_retry master=%s code=%s", addr, exc.code().name)
                gone = True
            finally:
                call.cancel()
            if answered:
                return
            if gone:
                failed.add(addr)
            else:
                await asyncio.sleep(MASTER_POLL_S)
            self.retried += 1

    async def _unless_master_moves(self, addr: str, answer: Awaitable[Any]) -> Any:
        """What `answer` (of a call forwarded to master `addr`) brings, or `_MOVED` when the set
        names another master before it comes (the call is then cancelled)."""
        waiting = asyncio.ensure_future(answer)
        started = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait((waiting,), timeout=MOVED_CHECK_S)
                if done:
                    return waiting.result()
                master = await self._master_grpc_addr(frozenset())
                if master is not None and master != addr:
                    log.info("event=grpc_forward_moved master=%s new_master=%s after_s=%.1f", addr, master,
                             time.monotonic() - started)
                    return _MOVED
        finally:
            if not waiting.done():
                waiting.cancel()

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
