"""A private event loop on a background thread: how the blocking clients run the async ones.

Kafka's producer has an I/O thread; the blocking `Producer`, `PullConsumer`, `SimpleConsumer`,
`PushConsumer` and `Admin` run their async twins on one such thread each, so their connections,
prefetches and coalesced acks make progress while the caller's thread does its own work (an
`asyncio.Runner` in the caller's thread would only run the loop inside each call).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


class BackgroundLoop:
    """A uvloop event loop running on a daemon thread named `name`."""

    def __init__(self, name: str) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self.closed = False

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (from another thread only)."""
        if self.closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call_soon(self, fn: Any, *args: Any) -> None:
        """Schedule `fn(*args)` on the loop (thread-safe)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        """Stop the loop and join the thread (after the caller closed what runs on it)."""
        if self.closed:
            return
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def construct(cls: type[T], *args: Any, **kw: Any) -> T:
    """`cls(*args, **kw)` built on the loop that will use it (its futures and connections)."""
    return cls(*args, **kw)
