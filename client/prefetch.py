"""The pull consumer's prefetching iterator: every queue of a topic, in every broker set, pulled
ahead of the application.

One fetch task per queue keeps up to `prefetch_pages` pages (binary, `batch` messages each,
long-polling `wait_ms` at the queue's end) waiting in a shared hand-over queue, so the next page
is on its way while the application works on the current one. Pages are handed over in the
order they arrive; a queue's messages come in offset order.

Positions and commits (with a group): when a message is handed to the application, its queue's
position becomes that message's offset — everything before it is done; the periodic commit
(`commit_interval_ms`) sends those positions, so after a crash at most the message in hand per
queue is delivered again (at least once). `close()` commits past the last message handed out.
A queue whose offset fell out of retention continues at its first stored message; an offset past
the end of the member that answered (one behind, after a restart) is asked again, never moved back.

The queues are looked up again every `QUEUES_WATCH_S` (RocketMQ's rebalance interval): a broker
set that joins the topic later (a new set, or one that could not be reached at start) and a
topic's added queues are read from then on — from the group's committed offset, else from their
first message (nothing stored in them is skipped). Only when no set at all can be reached does
the start fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from client.errors import LedgerMQError, OffsetOutOfRangeError
from client.loop import resume_at_loop_end
from client.received import PullResult, ReceivedMessage

if TYPE_CHECKING:
    from client.loop import BackgroundLoop

log = logging.getLogger(__name__)

RETRY_S = 1.0  # a queue whose set does not answer is asked again after this long
QUEUES_WATCH_S = 20.0  # how often the topic's queues are looked up again
BEHIND_GIVE_UP_S = 30.0  # an offset past the queue's end this long: the queue is shorter, go on at its end
_STARTS = ("committed", "earliest", "latest")


class PullSource(Protocol):
    """What the iterator needs of a pull consumer (`client.consumer.AsyncPullConsumer`)."""

    async def queues(self, topic: str, refresh: bool = False) -> list[Any]: ...  # .broker_name, .queue_id

    async def queue_offsets(self, topic: str, broker_name: str) -> dict[int, tuple[int, int]]: ...

    async def pull(
        self, topic: str, queue_id: int, offset: int, max_messages: int, wait_ms: int, broker_name: str,
        filter_expression: str | None = None, filter_type: str = "TAG",
    ) -> PullResult: ...

    async def committed_offsets(self, group: str, topic: str, broker_name: str) -> dict[int, int]: ...

    async def commit_offset(
        self, group: str, topic: str, offsets: dict[int, int], broker_name: str
    ) -> None: ...


class PullIterator:
    """Async iterator over every message of `topic` (see the module docstring). Callers: the
    application (`async for`, `next_page`, `commit`, `lag`, `close`)."""

    def __init__(
        self,
        consumer: PullSource,
        topic: str,
        group: str | None,
        start: str,
        batch: int,
        wait_ms: int,
        prefetch_pages: int,
        commit_interval_ms: int,
        filter_expression: str | None = None,
        filter_type: str = "TAG",
    ) -> None:
        if start not in _STARTS:
            raise ValueError(f"start must be one of {_STARTS}, not {start!r}")
        if start == "committed" and group is None:
            start = "earliest"
        self.consumer = consumer
        self.topic, self.group, self.start_at = topic, group, start
        self.batch, self.wait_ms = batch, wait_ms
        self.filter_expression, self.filter_type = filter_expression, filter_type
        self.prefetch_pages = prefetch_pages
        self.commit_interval_s = commit_interval_ms / 1000.0
        # (broker set, queue) -> offset of the message handed out last (its predecessors are done)
        self.positions: dict[tuple[str, int], int] = {}
        self._handed: set[tuple[str, int]] = set()  # queues with a message handed out since start
        self._committed: dict[tuple[str, int], int] = {}
        self._max: dict[tuple[str, int], int] = {}
        self._pages: asyncio.Queue[tuple[tuple[str, int], PullResult]] = asyncio.Queue()
        self._credits: dict[tuple[str, int], asyncio.Semaphore] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.queues_watch_s = QUEUES_WATCH_S
        self._current: list[ReceivedMessage] = []
        self._at = 0
        self._closed = False

    async def start(self) -> None:
        """Find the queues and their start offsets; start the fetch (and commit) tasks. Raises
        when no broker set holding the topic can be reached."""
        errors = await self._discover(await self.consumer.queues(self.topic), self.start_at)
        if errors and not self._credits:
            raise errors[0]
        loop = asyncio.get_running_loop()
        if self.group is not None and self.commit_interval_s > 0:
            self._tasks.append(loop.create_task(self._commit_every()))
        self._tasks.append(loop.create_task(self._watch_queues()))

    async def _discover(self, queues: list[Any], start_at: str) -> list[LedgerMQError]:
        """Start fetching the queues of `queues` not fetched yet, each set's from `start_at`; the
        errors of the sets that could not be asked for their offsets (tried again later)."""
        by_set: dict[str, list[Any]] = {}
        for mq in queues:
            if (mq.broker_name, mq.queue_id) not in self._credits:
                by_set.setdefault(mq.broker_name, []).append(mq)
        loop = asyncio.get_running_loop()
        errors = []
        for broker_name, mqs in by_set.items():
            try:
                starts = await self._start_offsets(broker_name, start_at)
            except LedgerMQError as exc:
                log.warning("pull iterator topic=%s: broker set %s not reached (%s); tried again in %g s",
                            self.topic, broker_name, exc, self.queues_watch_s)
                errors.append(exc)
                continue
            if self._closed:  # closed while we asked: start nothing close() would not stop
                break
            for mq in mqs:
                key = (broker_name, mq.queue_id)
                if mq.queue_id not in starts:
                    continue  # not in the set's topic config yet: a later round starts it
                self._credits[key] = asyncio.Semaphore(self.prefetch_pages)
                offset = starts[mq.queue_id]
                self._committed[key] = offset
                self._tasks.append(loop.create_task(self._fetch(key, offset)))
        return errors

    async def _watch_queues(self) -> None:
        """Queues that joined the topic after `start` are read from their committed offset, else
        from their first message. At the event loop's end, the positions of an iterator never
        closed are committed (`_closed_by_loop_end`)."""
        try:
            await self._watch_queues_forever()
        except asyncio.CancelledError:
            if self._closed or self.group is None:
                raise
            await self._closed_by_loop_end()

    async def _closed_by_loop_end(self) -> None:
        # Cancelled, but not by `close`: the event loop is ending (asyncio.run cancels every task
        # left once the program's coroutine returned). The positions are committed up to the
        # message last handed out, not past it (the program may have died on it), as the blocking
        # consumer does at interpreter exit; the runner waits for this task.
        resume_at_loop_end()
        self._closed = True
        log.warning("event=pull_iterator_closed_at_loop_end topic=%s group=%s hint=close the consumer "
                    "(or use async with) before its event loop ends to choose what is committed",
                    self.topic, self.group)
        await self.commit()

    async def _watch_queues_forever(self) -> None:
        while True:
            await asyncio.sleep(self.queues_watch_s)
            try:
                queues = await self.consumer.queues(self.topic, refresh=True)
            except LedgerMQError as exc:
                log.debug("pull iterator topic=%s: queue lookup failed: %s", self.topic, exc)
                continue
            known = len(self._credits)
            await self._discover(queues, "committed" if self.group is not None else "earliest")
            if len(self._credits) > known:
                log.info("pull iterator topic=%s: %d queues joined, now reading %d", self.topic,
                         len(self._credits) - known, len(self._credits))

    async def _start_offsets(self, broker_name: str, start_at: str) -> dict[int, int]:
        bounds = await self.consumer.queue_offsets(self.topic, broker_name)
        if start_at == "latest":
            return {q: hi for q, (_, hi) in bounds.items()}
        out = {q: lo for q, (lo, _) in bounds.items()}
        if start_at == "committed":
            assert self.group is not None
            committed = await self.consumer.committed_offsets(self.group, self.topic, broker_name)
            for q, off in committed.items():
                if off >= 0 and q in bounds:
                    out[q] = min(max(off, bounds[q][0]), bounds[q][1])
        return out

    async def _fetch(self, key: tuple[str, int], offset: int) -> None:
        broker_name, queue_id = key
        credits = self._credits[key]
        loop = asyncio.get_running_loop()
        behind_since = 0.0  # when a member first answered that this offset is past its queue's end
        while True:
            await credits.acquire()
            try:
                page = await self.consumer.pull(
                    self.topic, queue_id, offset, self.batch, self.wait_ms, broker_name,
                    self.filter_expression, self.filter_type,
                )
            except OffsetOutOfRangeError as exc:
                credits.release()
                lo, hi = exc.min_offset or 0, exc.max_offset or 0
                if offset < lo:  # retention deleted what was not read yet: go on at the first stored
                    log.warning(
                        "pull offset out of range topic=%s broker=%s queue=%d offset=%d min=%d max=%d",
                        self.topic, broker_name, queue_id, offset, lo, hi,
                    )  # fmt: skip
                    offset = lo
                    continue
                # The member that answered is behind this position (a slave that restarted, say):
                # never go back to its end, which would hand out messages again; ask again later.
                behind_since = behind_since or loop.time()
                if loop.time() - behind_since < BEHIND_GIVE_UP_S:
                    await asyncio.sleep(RETRY_S)
                    continue
                log.warning(  # still past the end after that long: the queue itself is shorter now
                    "pull offset past the queue's end topic=%s broker=%s queue=%d offset=%d max=%d: "
                    "going on at its end", self.topic, broker_name, queue_id, offset, hi,
                )  # fmt: skip
                offset, behind_since = hi, 0.0
                continue
            except LedgerMQError as exc:
                credits.release()
                what = f"topic={self.topic} broker={broker_name} queue={queue_id}"
                log.warning("pull failed %s: %s", what, exc)
                await asyncio.sleep(RETRY_S)
                continue
            behind_since = 0.0
            self._max[key] = page.max_offset
            if page.messages:
                self._pages.put_nowait((key, page))
            else:
                credits.release()
            offset = page.next_offset

    async def next_page(self, timeout_s: float | None = None) -> list[ReceivedMessage]:
        """The next page's messages ([] when none came within `timeout_s`). The caller hands
        them out in order, calling `handed(m)` for each (the iterators do)."""
        try:
            async with asyncio.timeout(timeout_s):
                key, page = await self._pages.get()
        except TimeoutError:
            return []
        self._credits[key].release()
        return page.messages

    def handed(self, m: ReceivedMessage) -> None:
        """`m` goes to the application: its predecessors in its queue are done."""
        key = (m.broker_name or "", m.queue_id)
        self.positions[key] = m.queue_offset
        self._handed.add(key)

    def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        return self

    async def __anext__(self) -> ReceivedMessage:
        while self._at >= len(self._current):
            if self._closed:
                raise StopAsyncIteration
            self._current, self._at = await self.next_page(), 0
        m = self._current[self._at]
        self._at += 1
        self.handed(m)
        return m

    def lag(self) -> int:
        """Messages stored and not yet handed out, over every queue (as of the last pages)."""
        total = 0
        for key, hi in self._max.items():
            pos = self.positions.get(key)
            total += max(0, hi - (pos + 1 if pos is not None else self._committed.get(key, 0)))
        return total

    async def commit(self, final: bool = False) -> None:
        """Commit the positions that moved (`final`: past the last message handed out)."""
        if self.group is None:
            return
        by_set: dict[str, dict[int, int]] = {}
        for key, pos in list(self.positions.items()):
            off = pos + 1 if final and key in self._handed else pos
            if self._committed.get(key) != off:
                by_set.setdefault(key[0], {})[key[1]] = off
        for broker_name, offsets in by_set.items():
            try:
                await self.consumer.commit_offset(self.group, self.topic, offsets, broker_name)
            except LedgerMQError as exc:
                log.warning("offset commit failed group=%s broker=%s: %s", self.group, broker_name, exc)
                continue
            for q, off in offsets.items():
                self._committed[(broker_name, q)] = off

    async def _commit_every(self) -> None:
        while True:
            await asyncio.sleep(self.commit_interval_s)
            await self.commit()

    async def close(self, past_in_hand: bool = True) -> None:
        """Stop prefetching and commit past the last message handed out (up to it, not past it,
        with `past_in_hand=False`: it is read again). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.commit(final=past_in_hand)


class SyncPullIterator:
    """The blocking form of `PullIterator`: `for m in it`, or `poll(timeout_s)` for a page."""

    def __init__(self, bg: BackgroundLoop, it: PullIterator) -> None:
        self._bg, self._it = bg, it
        self._buf: list[ReceivedMessage] = []
        self._at = 0

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return self

    def __next__(self) -> ReceivedMessage:
        while self._at >= len(self._buf):
            if self._it._closed:
                raise StopIteration
            self._buf, self._at = self._bg.call(self._it.next_page()), 0
        m = self._buf[self._at]
        self._at += 1
        self._it.handed(m)
        return m

    def poll(self, timeout_s: float) -> list[ReceivedMessage]:
        """The messages buffered, else the next page ([] when none came within `timeout_s`);
        each counts as handed out."""
        if self._at < len(self._buf):
            out, self._buf, self._at = self._buf[self._at :], [], 0
        else:
            out = self._bg.call(self._it.next_page(timeout_s))
        for m in out:
            self._it.handed(m)
        return out

    def lag(self) -> int:
        return self._it.lag()

    def commit(self) -> None:
        self._bg.call(self._it.commit())

    def close(self) -> None:
        self._bg.call(self._it.close())

    def __enter__(self) -> SyncPullIterator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
