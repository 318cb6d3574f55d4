"""`PushConsumer` / `AsyncPushConsumer`: a listener called for each message of a topic, as
RocketMQ's push consumer does, over the group-consumption API (receive / ack / nack / invisible).

- One receive loop per broker set keeps a long-poll receive outstanding (`receive_batch`
  messages, at most what the cache has room for: `max_cached_messages` / `max_cached_bytes`,
  flow control; RocketMQ's defaults 1,024 messages / 64 MiB). A receive asks for at most what
  the handlers finished in the last third of the invisible time (at least
  `consume_thread_count`), less what already waits: a message that waited longer than that in
  the cache would turn visible again before a handler started it. Each loop asks for at most its
  share of that, so every set is polled however idle the others are. 128 per receive rather than
  RocketMQ's 32 per pull: each receive costs the broker a fixed share of its CPU, and RocketMQ
  has a pull per queue in flight where this has one receive per broker set.
- `consume_thread_count` workers call the listener: threads for a plain function, tasks for a
  coroutine function. A listener that returns acks the message (acks coalesced per set); one
  that raises, or returns `ConsumeResult.FAILURE` (RocketMQ 5's listener result) or `False`,
  gives it back after a backoff (`retry_backoff_ms`, doubling per attempt up to
  `retry_backoff_max_ms`) through its invisibility time, so it comes back with attempt + 1 (the
  broker dead-letters it after `maxReconsumeTimes`). Any other return value (None,
  `ConsumeResult.SUCCESS`, True, ...) acks.
- A handler that runs long keeps its message hidden: the invisibility is renewed at 2/3 of
  `invisible_ms` (LedgerMQ has no server-side renewal), swapping in the new receipt handle.
- `shutdown(timeout_s)` stops receiving, lets running handlers finish (up to `timeout_s`), gives
  back the messages no handler started (visible again at once), then sends the pending acks.
- `lag()` is the group's lag over every queue of the topic (committed low-water marks).
- `start()` fails (and closes the consumer) when the topic has no route or one broker refuses
  the subscription's filter, as RocketMQ's client checks its subscription at start.
- Every `SETS_WATCH_S` the topic's route is read again (RocketMQ's rebalance interval): a broker
  set that joins it later (a new set, or one that was down when the consumer started) gets its
  receive loops then. A set that fails keeps its loops, retrying every second.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from client.consumer import HANG_UP_AFTER_S, AsyncSimpleConsumer
from client.errors import LedgerMQError
from client.loop import BackgroundLoop, close_at_exit, closed, construct
from client.received import ReceivedMessage
from client.transport import seg
from wire.codes import ErrorCode
from wire.limits import MAX_INVISIBLE_MS, MAX_RECEIVE_MESSAGES, MAX_RECEIVE_WAIT_MS, MIN_INVISIBLE_MS

log = logging.getLogger(__name__)
# The broker refused the subscription's filter itself: no receive can succeed.
_FILTER_REFUSED = frozenset({ErrorCode.ILLEGAL_FILTER_EXPRESSION, ErrorCode.FILTER_NOT_SUPPORTED})

Listener = Callable[[ReceivedMessage], Any]


class ConsumeResult(enum.Enum):
    """What a push listener may return, as RocketMQ 5's `MessageListener.consume` does:
    FAILURE (or False, or raising) gives the message back for another attempt; SUCCESS (or None,
    or any other value) acks it."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


class ListenerFailure(Exception):
    """The listener returned `ConsumeResult.FAILURE` or False: not consumed."""


def _failure(result: Any) -> ListenerFailure | None:
    # Identity checks: a listener's other return values (0, "", [] ...) still ack.
    if result is ConsumeResult.FAILURE or result is False:
        return ListenerFailure(f"the listener returned {result!r}")
    return None


class AsyncPushConsumer:
    """See the module docstring. `listener(message)`: a function or a coroutine function; its
    exception means "not consumed"."""

    # Receives on the wire per broker set: while one answer is decoded and handed to the
    # handlers, the next is already being served.
    RECEIVES_PER_SET = 2
    # How often the route is read again for broker sets that joined the topic (RocketMQ: 20 s).
    SETS_WATCH_S = 20.0

    def __init__(
        self,
        group: str,
        topic: str,
        listener: Listener,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        consume_thread_count: int = 20,
        receive_batch: int = 128,
        wait_ms: int = 20_000,
        invisible_ms: int = 30_000,
        max_cached_messages: int = 1024,
        max_cached_bytes: int = 64 * 1024 * 1024,
        retry_backoff_ms: int = 1000,
        retry_backoff_max_ms: int = 60_000,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
        filter_expression: str | None = None,
        filter_type: str = "TAG",
    ) -> None:
        _check_arguments(listener, consume_thread_count, receive_batch, wait_ms, invisible_ms,
                         max_cached_messages, max_cached_bytes, retry_backoff_ms, retry_backoff_max_ms)
        self.listener = listener
        self.is_async = inspect.iscoroutinefunction(listener)
        self.simple = AsyncSimpleConsumer(
            group,
            topic,
            namesrv_addr,
            broker_addr=broker_addr,
            token=token,
            invisible_ms=invisible_ms,
            request_timeout_s=wait_ms / 1000.0 + 10.0,
            receive_ahead=False,
            ca_file=ca_file,
            client_cert=client_cert,
            client_type="PUSH_CONSUMER",
            filter_expression=filter_expression,
            filter_type=filter_type,
        )
        self.group, self.topic = group, topic
        self.consume_thread_count = consume_thread_count
        self.receive_batch, self.wait_ms, self.invisible_ms = receive_batch, wait_ms, invisible_ms
        self.max_cached_messages, self.max_cached_bytes = max_cached_messages, max_cached_bytes
        self.retry_backoff_ms, self.retry_backoff_max_ms = retry_backoff_ms, retry_backoff_max_ms
        self.stats = {"received": 0, "consumed": 0, "failed": 0, "renewed": 0, "released": 0}
        self._cached = 0
        self._asked = 0  # messages the receives on the wire may bring
        # Handlers finished per 100 ms bucket: (bucket, count), the last third of invisible_ms.
        self._done: collections.deque[list[int]] = collections.deque()
        self._cached_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        # Received, no handler yet: a deque the worker tasks take from (coroutine listener), or
        # a queue the worker threads block on (plain function).
        self._waiting: collections.deque[ReceivedMessage] = collections.deque()
        self._thread_q: queue.SimpleQueue[ReceivedMessage | None] = queue.SimpleQueue()
        self._work = asyncio.Event()
        # id(msg) -> (msg, when its invisibility was last set): what handlers hold now.
        self._in_handler: dict[int, tuple[ReceivedMessage, float]] = {}
        # Handler outcomes from the threads, taken by the loop in bulk (one wake-up per burst).
        self._outcomes: collections.deque[tuple[ReceivedMessage, BaseException | None]] = collections.deque()
        self._outcomes_lock = threading.Lock()
        self._outcomes_woken = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._polls: set[asyncio.Future[Any]] = set()  # the receive loops' requests on the wire
        self._sets: set[str] = set()  # broker sets with receive loops
        self._renewer: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._renewing: dict[int, asyncio.Future[None]] = {}  # id(msg) -> its renewal in flight
        self._workers: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[Any]] = set()
        self._running = False

    async def start(self) -> None:
        """Start receiving from every broker set of the topic and calling the listener.

        Raises what stops it from consuming at all, as RocketMQ's client does when it checks its
        subscription with a broker at start: the topic has no route (`TopicNotExistError`), or a
        filter the broker refuses (a `LedgerMQError` with code ILLEGAL_FILTER_EXPRESSION, or
        FILTER_NOT_SUPPORTED for SQL92 on brokers without `enablePropertyFilter`). A consumer
        whose start failed is closed."""
        loop = self._loop = asyncio.get_running_loop()
        try:
            route = await self.simple.routes.get(self.topic)
            if self.simple.filter and route.brokers:
                await self._check_filter(route.brokers[0].broker_name)
        except BaseException:
            await self.simple.close()
            raise
        self._running = True
        for broker in route.brokers:
            self._start_set(broker.broker_name)
        if self.is_async:
            self._workers = [loop.create_task(self._worker()) for _ in range(self.consume_thread_count)]
        else:
            self._threads = [
                threading.Thread(
                    target=self._thread_worker, name=f"ledgermq-push-{self.group}-{i}", daemon=True
                )
                for i in range(self.consume_thread_count)
            ]
            for t in self._threads:
                t.start()
        self._renewer = loop.create_task(self._renew_every())
        self._watcher = loop.create_task(self._watch_sets())

    async def _check_filter(self, broker_name: str) -> None:
        """Have one broker parse the filter, with nothing read or hidden: a pull past any
        queue's end, which the broker refuses after parsing the filter (OFFSET_OUT_OF_RANGE, or
        an empty page). Only a refusal of the filter itself is raised: the receive loops deal
        with everything else as they do later (an unreachable set is retried)."""
        params = {"offset": 2**62, "maxMessages": 1, "waitMs": 0, **self.simple.filter}
        try:
            await self.simple._read(
                self.topic, broker_name, "GET", f"/topics/{seg(self.topic)}/queues/0/messages", params=params
            )
        except LedgerMQError as exc:
            if exc.code in _FILTER_REFUSED:
                raise
            log.debug("push filter check group=%s topic=%s: %s", self.group, self.topic, exc)

    # ---- receiving -----------------------------------------------------------------------------
    def _start_set(self, broker_name: str) -> None:
        assert self._loop is not None
        self._sets.add(broker_name)
        for _ in range(self.RECEIVES_PER_SET):
            self._tasks.append(self._loop.create_task(self._receive_loop(broker_name)))

    async def _watch_sets(self) -> None:
        """Receive from broker sets that joined the topic's route after `start`."""
        while self._running:
            await asyncio.sleep(self.SETS_WATCH_S)
            try:
                route = await self.simple.routes.get(self.topic, refresh=True)
            except LedgerMQError as exc:  # the cached route stays; the next round asks again
                log.debug("push route refresh failed group=%s topic=%s: %s", self.group, self.topic, exc)
                continue
            for broker in route.brokers:
                if self._running and broker.broker_name not in self._sets:
                    log.info("push consumer group=%s topic=%s: broker set %s joined the route, receiving "
                             "from it", self.group, self.topic, broker.broker_name)
                    self._start_set(broker.broker_name)

    async def _receive_loop(self, broker_name: str) -> None:
        body = {"topic": self.topic, "waitMs": self.wait_ms, "invisibleMs": self.invisible_ms,
                **self.simple.filter}
        path = f"/consumers/{seg(self.group)}/receive"
        failing = ""  # the error the last receive failed with: said once, not once a second
        while self._running:
            allowance = self._allowance()
            # Each loop asks for at most its share of what may wait for a handler: a loop that
            # asks again right after an empty long poll must not hold all of it while the loops
            # of the other broker sets wait (an idle set would starve one that has messages).
            share = -(-allowance // (len(self._sets) * self.RECEIVES_PER_SET))
            room = min(
                self.receive_batch,
                self.max_cached_messages - self._cached - self._asked,
                allowance - self._asked,
                share,
            )
            if room <= 0 or self._cached_bytes >= self.max_cached_bytes:
                self._room.clear()
                await self._room.wait()
                continue  # (shutdown sets _room too: the loop condition ends it)
            try:
                broker = await self.simple._broker(self.topic, broker_name)
                self._asked += room
                ask = {**body, "maxMessages": room}
                poll = asyncio.ensure_future(self.simple._write(self.topic, broker, path, ask))
                self._polls.add(poll)
                try:
                    doc = await poll
                except asyncio.CancelledError:
                    if self._running or _being_cancelled():
                        raise
                    return  # hung up on by `shutdown`: the broker hands a gone client nothing
                finally:
                    self._polls.discard(poll)
                    self._asked -= room
                    self._room.set()  # what this receive did not bring, another loop may ask for
            except LedgerMQError as exc:
                if str(exc) != failing:
                    failing = str(exc)
                    log.warning("push receive failed group=%s broker=%s (retrying every second): %s",
                                self.group, broker_name, exc)
                await asyncio.sleep(1.0)  # RocketMQ's back-off after a failed receive
                continue
            if failing:
                failing = ""
                log.info("push receive works again group=%s broker=%s", self.group, broker_name)
            if not self._running:  # shut down while the long poll was out: give them back
                await self._give_back([ReceivedMessage.from_json(m, broker_name) for m in doc["messages"]])
                return
            hand = self._waiting.append if self.is_async else self._thread_q.put
            for m in doc["messages"]:
                msg = ReceivedMessage.from_json(m, broker_name)
                self._cached += 1
                self._cached_bytes += len(msg.body)
                hand(msg)
            self.stats["received"] += len(doc["messages"])
            if doc["messages"] and self.is_async:
                self._work.set()

    def _allowance(self) -> int:
        """How many more messages may wait for a handler: what handlers finished in the last third
        of the invisible time (at least one per handler), less what waits already."""
        horizon = int(time.monotonic() * 10) - self.invisible_ms // 300
        done = self._done
        while done and done[0][0] < horizon:
            done.popleft()
        waiting = self._cached - len(self._in_handler)
        return max(self.consume_thread_count, sum(c for _, c in done)) - waiting

    # ---- consuming -----------------------------------------------------------------------------
    async def _worker(self) -> None:
        """A coroutine listener's worker task."""
        while True:
            while not self._waiting:
                if not self._running:
                    return
                self._work.clear()
                await self._work.wait()
            msg = self._waiting.popleft()
            self._in_handler[id(msg)] = (msg, time.monotonic())
            try:
                result = await self.listener(msg)
            except Exception as exc:  # the listener's failure: consume again later
                self._outcome(msg, exc)
            else:
                self._outcome(msg, _failure(result))

    def _thread_worker(self) -> None:
        """A plain-function listener's worker thread: takes messages until it gets None."""
        loop = self._loop
        assert loop is not None
        while (msg := self._thread_q.get()) is not None:
            self._in_handler[id(msg)] = (msg, time.monotonic())
            try:
                outcome: BaseException | None = _failure(self.listener(msg))
            except Exception as exc:  # the listener's failure: consume again later
                outcome = exc
            self._outcomes.append((msg, outcome))
            with self._outcomes_lock:
                if self._outcomes_woken:
                    continue
                self._outcomes_woken = True
            loop.call_soon_threadsafe(self._take_outcomes)

    def _take_outcomes(self) -> None:
        with self._outcomes_lock:
            self._outcomes_woken = False
        while self._outcomes:
            self._outcome(*self._outcomes.popleft())

    def _outcome(self, msg: ReceivedMessage, exc: BaseException | None) -> None:
        """On the loop: a handler is done with `msg` — ack it, or give it back after a backoff."""
        self._in_handler.pop(id(msg), None)
        self._cached -= 1
        bucket = int(time.monotonic() * 10)
        if self._done and self._done[-1][0] == bucket:
            self._done[-1][1] += 1
        else:
            self._done.append([bucket, 1])
        self._cached_bytes -= len(msg.body)
        if not self._room.is_set():
            self._room.set()
        if exc is None:
            self.stats["consumed"] += 1
            renewing = self._renewing.get(id(msg))
            if renewing is None:
                self.simple.ack_async(msg).add_done_callback(_log_ack_failure)
            else:  # ack with the handle the renewal brings, not the one it replaces
                self._side_task(self._ack_after(renewing, msg))
            return
        self.stats["failed"] += 1
        log.info(
            "push listener failed group=%s msg=%s attempt=%d: %r", self.group, msg.msg_id, msg.attempt, exc
        )
        self._side_task(self._retry_later(msg))

    async def _retry_later(self, msg: ReceivedMessage) -> None:
        delay_ms = min(self.retry_backoff_ms * 2 ** (msg.attempt - 1), self.retry_backoff_max_ms)
        try:
            await self.simple.change_invisible_duration(msg, delay_ms)
        except LedgerMQError as exc:  # it comes back when its invisibility ends anyway
            log.warning("push backoff failed group=%s msg=%s: %s", self.group, msg.msg_id, exc)

    # ---- invisibility renewal ------------------------------------------------------------------
    async def _renew_every(self) -> None:
        """Every sixth of `invisible_ms`, renew what handlers have held for 2/3 of it (one scan
        for all, instead of a timer per message)."""
        period = self.invisible_ms / 6000.0
        due_after = self.invisible_ms * 2 / 3000.0
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for key, (msg, since) in list(self._in_handler.items()):
                if now - since >= due_after:
                    self._in_handler[key] = (msg, now)
                    self._side_task(self._renew(msg))

    async def _renew(self, msg: ReceivedMessage) -> None:
        done = asyncio.get_running_loop().create_future()
        self._renewing[id(msg)] = done
        try:
            await self.simple.change_invisible_duration(msg, self.invisible_ms)
            self.stats["renewed"] += 1
        except LedgerMQError as exc:
            log.warning("push renewal failed group=%s msg=%s: %s", self.group, msg.msg_id, exc)
        finally:
            del self._renewing[id(msg)]
            done.set_result(None)

    async def _ack_after(self, renewal: asyncio.Future[None], msg: ReceivedMessage) -> None:
        await renewal
        self.simple.ack_async(msg).add_done_callback(_log_ack_failure)

    def _side_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    # ---- shutdown and lag ----------------------------------------------------------------------
    async def _give_back(self, msgs: list[ReceivedMessage]) -> None:
        """Make received messages visible again at once (invisibility 0), not counted as consumed."""
        for msg in msgs:
            try:
                await self.simple.change_invisible_duration(msg, 0)
                self.stats["released"] += 1
            except LedgerMQError as exc:
                log.warning("push release failed group=%s msg=%s: %s", self.group, msg.msg_id, exc)

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop receiving; let running handlers finish (up to `timeout_s`); give back what no
        handler started; send the pending acks; close the connections. Idempotent."""
        if not self._running and not self._tasks and not self._threads:
            return
        self._running = False
        if self._watcher is not None:
            self._watcher.cancel()  # no set joins from now on: _tasks is complete
            await asyncio.gather(self._watcher, return_exceptions=True)
        receive_tasks = list(self._tasks)
        unstarted = self._take_unstarted()  # no handler starts another message from now on
        self._work.set()
        # A receive on the wire may already hold messages for us: a moment to answer, then its
        # messages are given back; one still long-polling after it has nothing for us and is
        # hung up on (the broker ends a receive whose client is gone handing out nothing), not
        # waited for up to wait_ms as RocketMQ's push consumer does.
        self._room.set()
        if receive_tasks:
            _, late = await asyncio.wait(receive_tasks, timeout=HANG_UP_AFTER_S)
            for poll in list(self._polls):  # long polls with nothing for us yet
                poll.cancel()
            if late:
                _, late = await asyncio.wait(late, timeout=self.wait_ms / 1000.0 + 5.0)
            for t in late:
                t.cancel()
            await asyncio.gather(*receive_tasks, return_exceptions=True)
        unstarted += self._take_unstarted()  # what the last receives handed over meanwhile
        for _ in self._threads:
            self._thread_q.put(None)
        deadline = time.monotonic() + timeout_s
        if self._workers:
            _, pending = await asyncio.wait(self._workers, timeout=timeout_s)
            for t in pending:
                t.cancel()
        if self._threads:
            await _join_all(self._threads, deadline)
        self._take_outcomes()
        if self._renewer is not None:
            self._renewer.cancel()
        await self._give_back(unstarted)
        if self._side:
            await asyncio.gather(*self._side, return_exceptions=True)
        await self.simple.flush_acks()
        self._tasks.clear()
        self._sets.clear()
        await self.simple.close()

    def _take_unstarted(self) -> list[ReceivedMessage]:
        out = list(self._waiting)
        self._waiting.clear()
        while True:
            try:
                msg = self._thread_q.get_nowait()
            except queue.Empty:
                return out
            if msg is not None:
                out.append(msg)

    async def lag(self) -> int:
        """Messages of the topic the group has not consumed yet, over every queue and set."""
        total = 0
        route = await self.simple.routes.get(self.topic)
        for broker in route.brokers:
            doc = await self.simple._read(
                self.topic, broker.broker_name, "GET", f"/consumers/{seg(self.group)}/offsets",
                params={"topic": self.topic},
            )  # fmt: skip
            total += sum(max(0, o.get("lag", 0)) for o in doc["offsets"] if o["topic"] == self.topic)
        return total


def _check_arguments(listener: Any, threads: int, batch: int, wait_ms: int, invisible_ms: int,
                     cached: int, cached_bytes: int, backoff_ms: int, backoff_max_ms: int) -> None:
    """Refuse, when the consumer is made, what would otherwise only surface as receives the
    broker refuses and the receive loops retry every second."""
    if not callable(listener):
        raise TypeError(f"listener must be callable (message -> result), got {type(listener).__name__}")
    for name, value, lo, hi in (
        ("consume_thread_count", threads, 1, 10_000),
        ("receive_batch", batch, 1, MAX_RECEIVE_MESSAGES),
        ("wait_ms", wait_ms, 0, MAX_RECEIVE_WAIT_MS),
        ("invisible_ms", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS),
        ("max_cached_messages", cached, 1, 2**31),
        ("max_cached_bytes", cached_bytes, 1, 2**62),
        ("retry_backoff_ms", backoff_ms, 0, MAX_INVISIBLE_MS),
        ("retry_backoff_max_ms", backoff_max_ms, backoff_ms, MAX_INVISIBLE_MS),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _join_all(threads: list[threading.Thread], deadline: float) -> None:
    """Join `threads` by `deadline` without blocking the loop. On a thread of its own, not
    `asyncio.to_thread`: at interpreter exit (a PushConsumer closed by `client.loop`'s hook) the
    executors refuse new work."""
    loop = asyncio.get_running_loop()
    joined = loop.create_future()

    def join() -> None:
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        loop.call_soon_threadsafe(lambda: joined.done() or joined.set_result(None))

    threading.Thread(target=join, name="ledgermq-push-join", daemon=True).start()
    await joined


def _log_ack_failure(fut: asyncio.Future[Any]) -> None:
    exc = fut.exception()
    if exc is not None:  # the message comes back when its invisibility ends: at least once
        log.warning("push ack failed: %s", exc)


class PushConsumer:
    """Blocking `AsyncPushConsumer` on a background event loop; a plain-function listener runs
    on `consume_thread_count` threads. `start()`, `shutdown(timeout_s)`, `lag()`, `stats`.
    Never shut down by the program, it is shut down at interpreter exit (running handlers
    finish and are acked, messages no handler started are given back)."""

    def __init__(self, group: str, topic: str, listener: Listener, *args: Any, **kw: Any) -> None:
        self._bg = BackgroundLoop(f"ledgermq-push-{group}")
        try:
            self._c: AsyncPushConsumer = self._bg.call(
                construct(AsyncPushConsumer, group, topic, listener, *args, **kw)
            )
        except BaseException:  # a bad argument: no I/O thread left behind
            self._bg.close()
            raise
        self._lock = threading.Lock()
        close_at_exit(self, self.shutdown)

    @property
    def stats(self) -> dict[str, int]:
        return self._c.stats

    def start(self) -> None:
        """`AsyncPushConsumer.start`; when it raises, the background loop is closed too."""
        try:
            self._bg.call(self._c.start())
        except BaseException:
            closed(self)  # nothing left to shut down at exit
            with self._lock:
                self._bg.close()
            raise

    def lag(self) -> int:
        return self._bg.call(self._c.lag())

    def shutdown(self, timeout_s: float = 30.0) -> None:
        closed(self)
        with self._lock:
            if self._bg.closed:
                return
            try:
                self._bg.call(self._c.shutdown(timeout_s))
            finally:
                self._bg.close()

    def __enter__(self) -> PushConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
