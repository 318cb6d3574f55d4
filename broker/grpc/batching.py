"""Acks of concurrent AckMessage calls settled together.

RocketMQ clients ack one message per call, many calls at once (a push consumer's threads, a
simple consumer's `ack_async`). Each settle the pop service does is a record replicated through
the log, so one per call would cost a quorum round trip per message. Calls for the same
(account, group, topic) that arrive while a settle is in flight wait for it and then go
together as the next one: one `PopService.ack` for all their handles. Only the transport is
batched; what an ack means stays the service's. A batch the service refuses as a whole (one
caller's malformed handle) is settled again caller by caller, so no call fails for another's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from broker.errors import BrokerError

_Key = tuple[int, str, str]


class AckBatcher:
    """Caller: the servicer's AckMessage. `current` maps a client's handle to the latest one
    (server-side renewal) right before the service is called."""

    def __init__(self, pop: Any, current: Callable[[str, str, str], str]) -> None:
        self.pop = pop  # broker.service.PopService
        self.current = current
        self._waiting: dict[_Key, list[tuple[list[str], asyncio.Future[list[Any]]]]] = {}
        self._running: set[_Key] = set()
        self.batches = 0

    async def ack(self, account: Any, group: str, topic: str, handles: list[str]) -> list[Any]:
        """The service's AckResults for `handles` (the client's own handles), in order."""
        key = (id(account), group, topic)
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((handles, fut))
        if key not in self._running:
            self._running.add(key)
            asyncio.get_running_loop().create_task(self._drain(key, account, group, topic))
        return await fut

    async def _drain(self, key: _Key, account: Any, group: str, topic: str) -> None:
        try:
            while key in self._waiting:
                batch = self._waiting.pop(key)
                await self._settle(batch, account, group, topic)
        finally:
            self._running.discard(key)

    async def _settle(
        self, batch: list[tuple[list[str], asyncio.Future[list[Any]]]], account: Any, group: str, topic: str
    ) -> None:
        self.batches += 1
        # The latest handles, then the service at once: no renewal can slip in between.
        handles = [self.current(group, topic, h) for hs, _ in batch for h in hs]
        try:
            results = await self.pop.ack(account, group, topic, handles)
        except BrokerError as exc:
            if len(batch) == 1:
                _fail(batch[0][1], exc)
                return
            for hs, fut in batch:  # one caller's bad input must not fail the others
                await self._settle([(hs, fut)], account, group, topic)
            return
        except BaseException as exc:
            for _, fut in batch:
                _fail(fut, exc)
            raise
        start = 0
        for hs, fut in batch:
            if not fut.done():
                fut.set_result(results[start : start + len(hs)])
            start += len(hs)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
