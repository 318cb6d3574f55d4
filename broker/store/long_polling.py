"""`LongPollingService`: pulls that wait for a queue to grow (RocketMQ's `PullRequestHoldService`
and its message-arriving listener, as one small object on the event loop).

A waiter parks on one `asyncio.Event` per (topic, queueId); the dispatcher calls `notify` when it
writes a unit of that queue, which wakes every waiter of the queue at once (no per-waiter task, no
polling). Callers: the pull routes (`wait_for_message`), the dispatcher (`notify`).
"""

from __future__ import annotations

import asyncio

from broker.store.consume_queue_store import ConsumeQueueStore, QueueKey


class LongPollingService:
    """Waiters per queue, woken as messages are dispatched."""

    def __init__(self, queues: ConsumeQueueStore) -> None:
        self.queues = queues
        self.waiting: dict[QueueKey, asyncio.Event] = {}  # queues with waiters (empty: nobody polls)

    def notify(self, key: QueueKey) -> None:
        """A unit of queue `key` was written: wake its waiters."""
        ev = self.waiting.pop(key, None)
        if ev is not None:
            ev.set()

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """True once the queue's max offset passes `offset`, False after `timeout_s`."""
        key = (topic, queue_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while True:
            cq = self.queues.get(key)
            if cq is not None and cq.max_offset > offset:
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            ev = self.waiting.get(key)
            if ev is None:
                ev = self.waiting[key] = asyncio.Event()
            try:
                async with asyncio.timeout(left):  # no extra task per waiter, unlike wait_for in 3.11
                    await ev.wait()
            except TimeoutError:
                return False
