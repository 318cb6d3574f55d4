"""A private event loop on a background thread: how the blocking clients run the async ones.

Kafka's producer has an I/O thread; the blocking `Producer`, `PullConsumer`, `SimpleConsumer`,
`PushConsumer` and `Admin` run their async twins on one such thread each, so their connections,
prefetches and coalesced acks make progress while the caller's thread does its own work (an
`asyncio.Runner` in the caller's thread would only run the loop inside each call).

Those threads are daemons, so a program that forgets to close a client still exits; what the
client still held (a producer's unsent messages, a consumer's coalesced acks and positions) is
then sent by `close_at_exit`'s hook instead of vanishing with the thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

log = logging.getLogger(__name__)

# id(client) -> its closing method, held strongly: a client that is not closed lives on, as a
# started thread does, until it is closed or the interpreter exits. Its I/O thread runs either way;
# held weakly, a dropped idle client was collected under its running loop (its tasks destroyed
# while pending, with asyncio's "Task was destroyed" errors) and its thread never stopped.
_UNCLOSED: dict[int, Any] = {}
_UNCLOSED_LOCK = threading.Lock()
# A program that makes clients and drops them unclosed (one per request, say) is told as their
# number doubles from this, each with its own thread and connections.
_MANY_UNCLOSED = 64


def close_at_exit(client: object, close: Any) -> None:
    """Run `close` (a bound method of `client`) when the interpreter exits, unless `closed(client)`
    came first. Daemon I/O threads die with the interpreter: without this, `send_async`s not yet
    flushed would be lost without a word (kafka-python closes a forgotten producer at exit too)."""
    with _UNCLOSED_LOCK:
        _UNCLOSED[id(client)] = close
        count = len(_UNCLOSED)
    if count >= _MANY_UNCLOSED and count & (count - 1) == 0:
        log.warning("event=many_unclosed_clients count=%d hint=close each client (or use a with block), "
                    "or share one: each holds an I/O thread and connections until closed", count)


def closed(client: object) -> None:
    """`client` was closed by the program: nothing to do for it at exit."""
    with _UNCLOSED_LOCK:
        _UNCLOSED.pop(id(client), None)


def _close_unclosed() -> None:
    # atexit runs after the main thread ended but while daemon threads still run, so each
    # client's own I/O thread does the work; each close is bounded by the client's timeouts.
    with _UNCLOSED_LOCK:
        pending = list(_UNCLOSED.values())
        _UNCLOSED.clear()
    for close in pending:
        name = type(close.__self__).__name__
        log.warning("event=client_closed_at_exit client=%s hint=close it (or use a with block) to choose "
                    "when its pending work is sent", name)
        try:
            close()
        except Exception as exc:  # one client's failure must not keep the others from closing
            log.warning("event=client_close_at_exit_failed client=%s error=%r", name, exc)


atexit.register(_close_unclosed)


def resume_at_loop_end() -> None:
    """Take back the cancellation of the current task: the event loop's end cancelled it (asyncio.run
    cancels every task left), and it has a client's last work to do first, which the runner waits for."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


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


_LAZY_LOCK = threading.Lock()
_ENDED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))
_CANCELLED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED))


class LightFuture(concurrent.futures.Future):
    """A `concurrent.futures.Future` whose condition variable is made only when a thread needs
    it (to wait, or to add a callback): a batching producer resolves most of its futures before
    anyone looks at them, and making a Condition and its RLock was half the caller's cost of a
    `send_async` (measured with py-spy). Resolved on the producer's loop; everything else as the
    base class."""

    def __init__(self) -> None:
        self._cond: threading.Condition | None = None
        self._state = PENDING
        self._result = None
        self._exception: BaseException | None = None
        # The base class's two lists, made on first use too: a producer holds thousands of futures
        # at once for as long as their sends take, and every container among them is one more
        # object each full run of the cyclic collector walks (a third of a send_async's cost).
        self._waiter_list: list[Any] | None = None
        self._callback_list: list[Any] | None = None

    # The base class only reads and mutates these (under the condition), never assigns them.
    @property  # type: ignore[override]
    def _waiters(self) -> list[Any]:
        waiters = self._waiter_list
        if waiters is None:
            waiters = self._waiter_list = []
        return waiters

    @property  # type: ignore[override]
    def _done_callbacks(self) -> list[Any]:
        callbacks = self._callback_list
        if callbacks is None:
            callbacks = self._callback_list = []
        return callbacks

    @property  # type: ignore[override]
    def _condition(self) -> threading.Condition:
        cond = self._cond
        if cond is None:
            with _LAZY_LOCK:
                if self._cond is None:
                    self._cond = threading.Condition()
                cond = self._cond
        return cond

    def done(self) -> bool:
        return self._state in _ENDED  # one attribute read: no lock needed

    def cancelled(self) -> bool:
        return self._state in _CANCELLED

    def set_result(self, result: Any) -> None:
        with _LAZY_LOCK:
            if self._cond is None:  # nobody waits or listens yet, and nobody can start meanwhile
                if self._state != PENDING:
                    raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
                self._result = result
                self._state = FINISHED
                return
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        with _LAZY_LOCK:
            if self._cond is None:
                if self._state != PENDING:
                    raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
                self._exception = exception
                self._state = FINISHED
                return
        super().set_exception(exception)
