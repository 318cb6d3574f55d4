"""Concurrent calls of one kind stored together: acks (AckMessage) and sends (SendMessage).

RocketMQ clients send and ack one message per call, many calls at once (`send_async`, a push
consumer's threads, a simple consumer's `ack_async`). Each store call is at least one entry
replicated through the log, so one per call would cost every member a log entry (append, push,
fsync, apply) and a quorum round trip per message. Calls for the same (account, group, topic) —
sends: the same topic, each caller admitted (rights, master) on its own first — that arrive
while one is being stored wait for it and then go together as the next one: one
`PopService.ack` for all their handles, one `ProduceService.put` for all their messages. Only
the transport is batched; what an ack or a send means stays the service's. A batch the service
refuses as a whole for what one caller sent is stored again caller by caller, so no call fails
for another's (a send tried again is never stored twice: its message id is its idempotency key).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from broker.errors import BrokerError
from broker.message import Message
from broker.message_model import SendResult
from broker.service import Account
from broker.service.pop import AckResult, PopService
from broker.service.produce import ProduceService
from broker.store.offsets import PutResult

C = TypeVar("C")  # what the store call needs besides the items (the first caller's)
T = TypeVar("T")  # one item a caller brings (a handle, a message)
R = TypeVar("R")  # the store's result for one item

# Refusals of what a caller sent (HTTP 400, 413), not of the store: a batch of sends refused so is
# stored again caller by caller; any other refusal (timeout, disk full, ...) is everyone's answer.
_INPUT_REFUSALS = frozenset({400, 413})

_Waiting = list[tuple[list[T], asyncio.Future[list[R]]]]


class CallBatcher(Generic[C, T, R]):
    """Calls with the same key that arrive while a batch of that key is being stored wait for it,
    then go together as the next batch: one `store(context, items)` for all their items, each
    caller getting the results of its own items, in order. When the store refuses a batch of
    several callers with a BrokerError that `split` accepts, each caller is stored alone."""

    def __init__(
        self,
        store: Callable[[C, list[T]], Awaitable[list[R]]],
        split: Callable[[BrokerError], bool],
    ) -> None:
        self._store = store
        self._split = split
        self._waiting: dict[Hashable, _Waiting[T, R]] = {}
        self._running: set[Hashable] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # the drains (held: a bare task may be collected)
        self.batches = 0  # store calls made (observability, tests)

    async def call(self, key: Hashable, context: C, items: list[T]) -> list[R]:
        """The store's results for `items`, in order. Callers of one key must bring the same
        `context` (the key says what it is)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[R]] = loop.create_future()
        self._waiting.setdefault(key, []).append((items, fut))
        if key not in self._running:
            self._running.add(key)
            task = loop.create_task(self._drain(key, context))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _drain(self, key: Hashable, context: C) -> None:
        try:
            while key in self._waiting:
                await self._settle(self._waiting.pop(key), context)
        finally:
            self._running.discard(key)

    async def _settle(self, batch: _Waiting[T, R], context: C) -> None:
        self.batches += 1
        try:
            results = await self._store(context, [item for items, _ in batch for item in items])
        except BrokerError as exc:
            if len(batch) == 1 or not self._split(exc):
                for _, fut in batch:
                    _fail(fut, exc)
                return
            for caller in batch:  # one caller's bad input must not fail the others
                await self._settle([caller], context)
            return
        except BaseException as exc:
            for _, fut in batch:
                _fail(fut, exc)
            raise
        start = 0
        for items, fut in batch:
            if not fut.done():
                fut.set_result(results[start : start + len(items)])
            start += len(items)


def _fail(fut: asyncio.Future[list[R]], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class AckBatcher:
    """Caller: the servicer's AckMessage. `current` maps a client's handle to the latest one
    (server-side renewal) right before the service is called."""

    def __init__(self, pop: PopService, current: Callable[[str, str, str], str]) -> None:
        self.pop = pop
        self.current = current
        # Any refusal of a batch of acks is retried caller by caller: a handle of one caller that
        # the service cannot read must not fail the acks of the others.
        self._calls: CallBatcher[tuple[Account, str, str], str, AckResult] = CallBatcher(
            self._ack, lambda exc: True
        )

    @property
    def batches(self) -> int:
        return self._calls.batches

    async def ack(self, account: Account, group: str, topic: str, handles: list[str]) -> list[AckResult]:
        """The service's AckResults for `handles` (the client's own handles), in order."""
        return await self._calls.call((id(account), group, topic), (account, group, topic), handles)

    def _ack(self, context: tuple[Account, str, str], handles: list[str]) -> Awaitable[list[AckResult]]:
        account, group, topic = context
        # The latest handles, then the service at once: no renewal can slip in between.
        return self.pop.ack(account, group, topic, [self.current(group, topic, h) for h in handles])


class SendBatcher:
    """Caller: the servicer's SendMessage (messages already converted and checked)."""

    def __init__(self, produce: ProduceService) -> None:
        self.produce = produce
        self._calls: CallBatcher[str, Message, PutResult | SendResult] = CallBatcher(
            self._put, lambda exc: exc.status in _INPUT_REFUSALS
        )

    @property
    def batches(self) -> int:
        return self._calls.batches

    async def send(self, account: Account, topic: str, msgs: list[Message]) -> list[PutResult | SendResult]:
        """The service's results for `msgs`, in order (admitted first: a refusal of this caller's
        right or of a slave never waits for anyone)."""
        self.produce.admit(account, topic)
        return await self._calls.call(topic, topic, msgs)

    def _put(self, topic: str, msgs: list[Message]) -> Awaitable[list[PutResult | SendResult]]:
        return self.produce.put(topic, msgs, [None] * len(msgs))
