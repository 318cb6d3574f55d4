"""Concurrent calls of one kind stored together: acks (AckMessage) and sends (SendMessage).

RocketMQ clients send and ack one message per call, many calls at once (`send_async`, a push
consumer's threads, a simple consumer's `ack_async`). Each store call is at least one entry
replicated through the log, so one per call would cost every member a log entry (append, push,
fsync, apply) and a quorum round trip per message. Calls for the same (account, group, topic) —
sends: the same topic, each caller admitted (rights, master) on its own first — that arrive
while one is being stored wait for it and then go together as the next one: one
`PopService.ack` for all their handles, one `ProduceService.put` for all their messages. Only
the transport is batched; what an ack or a send means stays the service's. A batch the service
refuses as a whole (one caller's bad input) is stored again caller by caller, so no call fails
for another's (a send tried again is never stored twice: its message id is its idempotency key).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from broker.errors import BrokerError

_Key = tuple[int, str, str]
# Refusals of what a caller sent (HTTP 400, 413), not of the store: a batch refused so is stored
# again caller by caller.
_INPUT_REFUSALS = frozenset({400, 413})


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


class SendBatcher:
    """Caller: the servicer's SendMessage (messages already converted and checked)."""

    def __init__(self, produce: Any) -> None:
        self.produce = produce  # broker.service.ProduceService
        self._waiting: dict[str, list[tuple[list[Any], asyncio.Future[list[Any]]]]] = {}
        self._running: set[str] = set()
        self.batches = 0

    async def send(self, account: Any, topic: str, msgs: list[Any]) -> list[Any]:
        """The service's results for `msgs`, in order (admitted first: a refusal of this caller's
        right or of a slave never waits for anyone)."""
        self.produce.admit(account, topic)
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(topic, []).append((msgs, fut))
        if topic not in self._running:
            self._running.add(topic)
            asyncio.get_running_loop().create_task(self._drain(topic))
        return await fut

    async def _drain(self, topic: str) -> None:
        try:
            while topic in self._waiting:
                await self._put(self._waiting.pop(topic), topic)
        finally:
            self._running.discard(topic)

    async def _put(self, batch: list[tuple[list[Any], asyncio.Future[list[Any]]]], topic: str) -> None:
        self.batches += 1
        msgs = [m for ms, _ in batch for m in ms]
        try:
            results = await self.produce.put(topic, msgs, [None] * len(msgs))
        except BrokerError as exc:
            if len(batch) == 1 or exc.status not in _INPUT_REFUSALS:
                for _, fut in batch:  # the store's answer (timeout, disk full, ...) is everyone's
                    _fail(fut, exc)
                return
            for item in batch:  # one caller's refused message must not fail the others
                await self._put([item], topic)
            return
        except BaseException as exc:
            for _, fut in batch:
                _fail(fut, exc)
            raise
        start = 0
        for ms, fut in batch:
            if not fut.done():
                fut.set_result(results[start : start + len(ms)])
            start += len(ms)
