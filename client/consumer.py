"""Consumers: `PullConsumer` (offset-based pull with long polling, and a prefetching iterator over
every queue of a topic) and `SimpleConsumer` (RocketMQ 5 style receive / ack with invisibility
time, the next receive pipelined and acks coalesced), each sync and async. The push consumer is
`client.push`."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from client.errors import (
    BrokerUnreachableError,
    ForbiddenError,
    LedgerMQError,
    NotMasterError,
    ServerError,
    TopicNotExistError,
)
from client.fault import LatencyFaultTolerance
from client.http import HttpResponse, LateAnswer
from client.loop import BackgroundLoop, LightFuture, close_at_exit, closed, construct
from client.prefetch import PullIterator, SyncPullIterator
from client.received import PULL_BINARY_CONTENT_TYPE, PullResult, ReceivedMessage, decode_binary_page
from client.transport import (
    PERM_READ,
    AsyncTransport,
    BrokerSetRoute,
    RouteCache,
    decode_answer,
    new_client_id,
    seg,
    split_addrs,
)
from wire.codes import ErrorCode
from wire.limits import MAX_RECEIVE_MESSAGES

__all__ = [
    "AsyncPullConsumer",
    "AsyncSimpleConsumer",
    "MessageQueue",
    "PullConsumer",
    "PullResult",
    "ReceivedMessage",
    "SimpleConsumer",
]

log = logging.getLogger(__name__)

FILTER_TYPES = ("TAG", "SQL92")
# At close, a receive still out this long after is a long poll with nothing for us: it is hung up
# on (the broker then ends it handing out nothing) instead of being waited for up to its waitMs.
# The moment lets an answer already on its way arrive, so its messages are given back at once.
HANG_UP_AFTER_S = 0.5
# How long a consumer's request (a receive's long poll above all) may go unanswered before the
# set's master is looked up again (and then as often while it stays unanswered): a master that
# hangs or is cut off is replaced by the set within ~1-2 s (DLedger's heartbeats), its receives
# move within about this long after. One name-server read per topic per interval while long polls
# are out, shared by the consumer's requests.
MASTER_WATCH_S = 3.0


def filter_fields(filter_type: str, expression: str | None) -> dict[str, str]:
    """A subscription's filter as request fields (RocketMQ's `FilterExpression`): TAG
    (`"TagA || TagB"`) or SQL92 over the properties (`"a > 1 AND TAGS = 'x'"`, needs the brokers'
    `enablePropertyFilter=true`); none for no expression or the TAG `*` (every message). A bad
    expression is refused by the broker (ILLEGAL_FILTER_EXPRESSION, naming it)."""
    if filter_type not in FILTER_TYPES:
        raise ValueError(f"filter_type must be one of {', '.join(FILTER_TYPES)}, got {filter_type!r}")
    if expression is None or (filter_type == "TAG" and expression.strip() == "*"):
        return {}
    return {"filterType": filter_type, "filterExpression": expression}


@dataclass(frozen=True, slots=True)
class MessageQueue:
    """One queue of a topic in one broker set."""

    topic: str
    broker_name: str
    queue_id: int


class _RouteUser:
    def __init__(
        self,
        namesrv_addr: str | list[str] | None,
        broker_addr: str | list[str] | None,
        token: str | None,
        request_timeout_s: float,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.transport = AsyncTransport(
            token=token,
            timeout_s=request_timeout_s,
            ca_file=ca_file,
            client_cert=client_cert,
            headers=headers,
        )
        self.routes = RouteCache(self.transport, split_addrs(namesrv_addr), split_addrs(broker_addr))

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _broker(self, topic: str, broker_name: str | None) -> BrokerSetRoute:
        route = await self.routes.get(topic)
        if broker_name is None:
            if not route.brokers:
                raise TopicNotExistError(f"no broker set holds topic {topic!r}")
            return route.brokers[0]
        broker = route.broker(broker_name)
        if broker is None:
            route = await self.routes.get(topic, refresh=True)
            broker = route.broker(broker_name)
        if broker is None:
            raise TopicNotExistError(f"broker set {broker_name!r} does not hold topic {topic!r}")
        return broker

    async def _read(self, topic: str, broker_name: str | None, method: str, path: str, **kw: Any) -> Any:
        """A read-only request: master first, then any slave (they serve committed data)."""
        broker = await self._broker(topic, broker_name)
        last: LedgerMQError | None = None
        for url in broker.urls():
            try:
                return await self.transport.request(method, url + path, **kw)
            except (BrokerUnreachableError, NotMasterError) as exc:
                last = exc
        self.routes.invalidate(topic)
        raise last or BrokerUnreachableError(f"no address for broker set {broker.broker_name}")

    async def _write(
        self,
        topic: str,
        broker: BrokerSetRoute,
        path: str,
        body: dict[str, Any],
        method: str = "POST",
        keep_late: Callable[[LateAnswer], None] | None = None,
    ) -> Any:
        """`body` to the set's master; the cached route is dropped when it is unreachable or no
        longer the master.

        A request still unanswered after `MASTER_WATCH_S` (a long poll, or a master that stopped
        answering: hung, or cut off from its set and the clients) has the set's master looked up
        again every `MASTER_WATCH_S`; when the set has elected another meanwhile, the request is
        hung up on and sent there. Without this a receive would wait out its request timeout
        (waitMs + 10 s) on a master that can no longer serve it. Sending a consumer's write again
        is safe: what a hung-up receive took is visible again after its invisible time (at once
        if the old master ever reads the hang-up), settling a handle twice answers OK, and an
        offset commit sets the same offsets again. `keep_late`: see `client.http.HttpClient.request`."""
        url = broker.write_url()
        while True:
            try:
                send = self.transport.request(method, url + path, json=body, keep_late=keep_late)
                answer, moved_to = await self.routes.unless_master_moves(
                    topic, broker.broker_name, url, send, MASTER_WATCH_S
                )
            except (BrokerUnreachableError, NotMasterError):
                self.routes.invalidate(topic)
                raise
            if moved_to is None:
                return answer
            log.warning("broker set %s elected master %s while %s left a request unanswered for %g s or "
                        "more: sending it to the new master (%s %s)", broker.broker_name, moved_to, url,
                        MASTER_WATCH_S, topic, path)
            url = moved_to

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self.transport.aclose()


class AsyncPullConsumer(_RouteUser):
    """Pull by offset from any queue; the caller keeps offsets (or commits them with
    `commit_offset`), or lets `iterate` do both."""

    def __init__(
        self,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        request_timeout_s: float = 40.0,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
    ) -> None:
        super().__init__(namesrv_addr, broker_addr, token, request_timeout_s, ca_file, client_cert)
        self._iterators: list[PullIterator] = []

    async def queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        """Every readable queue of `topic`, per broker set (`refresh`: the route asked again, not
        the cached one). A route that does not carry queue numbers (broker_addr mode, or a topic
        the name servers do not route yet) is completed from the broker's own topic config;
        TopicNotExistError when no set holds the topic."""
        route = await self.routes.get(topic, refresh=refresh)
        out: list[MessageQueue] = []
        missing = 0
        for b in route.brokers:
            if not b.perm & PERM_READ:  # the topic's perm, or its broker's brokerPermission
                continue
            nums = b.read_queue_nums
            if nums == 0:
                try:
                    doc = await self._read(topic, b.broker_name, "GET", f"/topics/{seg(topic)}")
                except TopicNotExistError:
                    missing += 1
                    continue
                nums = int(doc.get("readQueueNums", 0))
            out += [MessageQueue(topic, b.broker_name, q) for q in range(nums)]
        if missing and missing == len(route.brokers):
            raise TopicNotExistError(f"no broker set holds topic {topic!r}")
        return out

    async def queue_offsets(self, topic: str, broker_name: str | None = None) -> dict[int, tuple[int, int]]:
        """{queue id: (min offset, max offset)} of `topic` in one broker set."""
        doc = await self._read(topic, broker_name, "GET", f"/topics/{seg(topic)}")
        return {q["queueId"]: (q["minOffset"], q["maxOffset"]) for q in doc.get("queues", [])}

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        wait_ms: int = 0,
        broker_name: str | None = None,
        filter_expression: str | None = None,
        filter_type: str = "TAG",
    ) -> PullResult:
        """Up to `max_messages` from `offset` (long-polling up to `wait_ms` at the queue's end),
        read from the set's master or, if it does not answer, a slave. The page travels in the
        broker's binary form (`client.received`). With a filter (`filter_fields`) the page holds
        only matching messages and `next_offset` is past what the broker skipped."""
        broker = await self._broker(topic, broker_name)
        path = f"/topics/{seg(topic)}/queues/{seg(queue_id)}/messages"
        params = {"offset": offset, "maxMessages": max_messages, "waitMs": wait_ms, "format": "binary",
                  **filter_fields(filter_type, filter_expression)}
        last: LedgerMQError | None = None
        urls = broker.urls()
        master = urls[0] if broker.master_addr else None
        while urls:
            url = urls.pop(0)
            try:
                if url != master:
                    resp = await self.transport.send("GET", url + path, params=params)
                else:  # a long poll on a master that stops answering moves with the set's master
                    answer, moved_to = await self.routes.unless_master_moves(
                        topic, broker.broker_name, url, self.transport.send("GET", url + path, params=params),
                        MASTER_WATCH_S,
                    )
                    if moved_to is not None:
                        log.warning("broker set %s elected master %s while %s left a pull unanswered: "
                                    "pulling from the new master", broker.broker_name, moved_to, url)
                        master = moved_to
                        urls.insert(0, moved_to)
                        continue
                    resp = answer
            except BrokerUnreachableError as exc:
                last = exc
                continue
            if resp.status == 200 and resp.content_type == PULL_BINARY_CONTENT_TYPE:
                return decode_binary_page(resp.body, topic, broker.broker_name)
            try:
                decode_answer(resp, f"GET {url}{path}")
            except NotMasterError as exc:
                last = exc
                continue
            raise ServerError(f"pull from {url}: unexpected answer {resp.status} {resp.content_type}")
        self.routes.invalidate(topic)
        raise last or BrokerUnreachableError(f"no address for broker set {broker.broker_name}")

    async def committed_offsets(
        self, group: str, topic: str, broker_name: str | None = None
    ) -> dict[int, int]:
        doc = await self._read(
            topic, broker_name, "GET", f"/consumers/{seg(group)}/offsets", params={"topic": topic}
        )
        return {o["queueId"]: o["offset"] for o in doc["offsets"] if o["topic"] == topic}

    async def commit_offset(
        self, group: str, topic: str, offsets: dict[int, int], broker_name: str | None = None
    ) -> None:
        broker = await self._broker(topic, broker_name)
        await self._write(topic, broker, f"/consumers/{seg(group)}/offsets",
                          {"topic": topic, "offsets": {str(k): v for k, v in offsets.items()}}, method="PUT")

    async def iterate(
        self,
        topic: str,
        group: str | None = None,
        *,
        start: str = "committed",
        batch: int = 256,
        wait_ms: int = 1000,
        prefetch_pages: int = 2,
        commit_interval_ms: int = 5000,
        filter_expression: str | None = None,
        filter_type: str = "TAG",
    ) -> PullIterator:
        """Every message of every queue of `topic` (all broker sets), pulled ahead of the caller
        (`client.prefetch.PullIterator`): `async for m in await c.iterate("t", "g")`. With a
        `group`, positions are committed every `commit_interval_ms` and at `close()`. `start`:
        `committed` (the group's offsets; earliest where it has none), `earliest`, `latest`.
        A filter (`filter_fields`) hands out only the matching messages."""
        filter_fields(filter_type, filter_expression)  # a bad filter_type fails here, not in a pull task
        it = PullIterator(self, topic, group, start, batch, wait_ms, prefetch_pages, commit_interval_ms,
                          filter_expression, filter_type)
        await it.start()
        self._iterators.append(it)
        return it

    async def close(self, past_in_hand: bool = True) -> None:
        """Close the iterators (committing their positions: `PullIterator.close`) and the
        connections."""
        for it in self._iterators:
            await it.close(past_in_hand)
        self._iterators.clear()
        await super().close()


class AsyncSimpleConsumer(_RouteUser):
    """Group consumption: `receive` hides messages for `invisible_ms`; `ack` settles them; an
    unacked message comes back with `reconsume_times` + 1, and after the broker's
    maxReconsumeTimes it goes to `%DLQ%{group}`.

    Pipelined: with `receive_ahead=True`, once a receive has answered with a full batch (a
    backlog), the next one (same invisible time, next broker set) is sent at once, so the next
    `receive` call finds its messages waiting. A receive sent ahead asks for as many messages as
    the caller took in the last third of the invisible time (at least the `max_messages` asked,
    at most `receive_ahead_max`): every request costs the broker a fixed share of its CPU, so a
    fast consumer fetches in large batches, while a slow one never holds more than it can use in
    time. A message waits in the buffer only while two thirds of its invisible time remain (the
    caller's handler gets those); an older one, and what the caller never takes, is given back
    (visible again at once) in the background, at the next receive with another invisible time
    or at `close`. Off by default, as a message received ahead is delivered, to the broker's
    counts, whether or not the caller takes it. `ack_async` coalesces the acks of a broker set
    into one request (flushed at `ACK_BATCH` handles or after 2 ms): one replicated record per
    request on the broker.

    `filter_expression` / `filter_type` subscribe to part of the topic, as RocketMQ's
    `FilterExpression` (`filter_fields`): the broker hands the group only matching messages."""

    ACK_BATCH = 256
    ACK_LINGER_S = 0.002
    # Receipt-handle changes in flight at once when giving messages back.
    RELEASE_CONCURRENCY = 16

    def __init__(
        self,
        group: str,
        topic: str,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        invisible_ms: int = 30_000,
        request_timeout_s: float = 40.0,
        fault_isolation_ms: int = 10_000,
        receive_ahead: bool = False,
        receive_ahead_max: int = 256,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
        client_id: str | None = None,
        client_type: str = "SIMPLE_CONSUMER",
        filter_expression: str | None = None,
        filter_type: str = "TAG",
    ) -> None:
        self.filter = filter_fields(filter_type, filter_expression)  # the receive request's fields
        if not 1 <= receive_ahead_max <= MAX_RECEIVE_MESSAGES:
            raise ValueError(
                f"receive_ahead_max must be in 1..{MAX_RECEIVE_MESSAGES}, got {receive_ahead_max}"
            )
        self.client_id = client_id or new_client_id()
        # The id names this instance in the brokers' client lists; the type is RocketMQ's
        # (SIMPLE_CONSUMER, or PUSH_CONSUMER for the one a PushConsumer drives).
        headers = {"X-Client-Id": self.client_id, "X-Client-Type": client_type}
        super().__init__(namesrv_addr, broker_addr, token, request_timeout_s, ca_file, client_cert, headers)
        self.group, self.topic, self.invisible_ms = group, topic, invisible_ms
        self.fault = LatencyFaultTolerance(fault_isolation_ms)
        self.receive_ahead = receive_ahead
        self.receive_ahead_max = receive_ahead_max
        self._turn = itertools.count()
        # Received ahead, not taken yet: (when received, message), all with invisible time _ahead_for.
        self._buffer: collections.deque[tuple[float, ReceivedMessage]] = collections.deque()
        self._ahead: asyncio.Task[None] | None = None  # a receive sent ahead, buffering its answer
        self._ahead_for: int | None = None
        self._backlog = False  # the last answer was as large as asked: more is waiting
        # (when, how many) the caller took: the rate a receive sent ahead is sized by.
        self._taken: collections.deque[tuple[float, int]] = collections.deque()
        self._taken_sum = 0  # the sum of _taken's counts
        self._acks: dict[str | None, list[tuple[ReceivedMessage, Any]]] = {}  # futures of either kind
        self._ack_timer: asyncio.TimerHandle | None = None
        self._ack_tasks: set[asyncio.Task[None]] = set()
        self._side: set[asyncio.Task[Any]] = set()
        # Receives sent ahead, cancelled on the wire, whose answers are still awaited: (the set, timer).
        self._late: dict[LateAnswer, tuple[str, asyncio.TimerHandle]] = {}
        self._closed = False
        self._guard: AsyncGenerator[None, None] | None = None  # `_until_loop_end`, from the first receive

    async def receive(
        self, max_messages: int = 16, wait_ms: int = 0, invisible_ms: int | None = None
    ) -> list[ReceivedMessage]:
        """Receive from the topic's broker sets in turn (one set per call). A set that cannot
        serve (no connection, no master) is skipped for `fault_isolation_ms` and the next set
        asked in the same call, as is one that does not hold the topic (the route is fetched
        again); the error is raised only when no set could serve."""
        if self._guard is None:
            self._guard = self._until_loop_end()
            await self._guard.asend(None)
        invisible = self.invisible_ms if invisible_ms is None else invisible_ms
        if self._ahead_for is not None and self._ahead_for != invisible:
            await self._give_back_ahead()
        out = self._take(max_messages)
        if not out and self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            await ahead
            out = self._take(max_messages)
        if not out:
            size = self._fetch_size(max_messages, invisible) if self.receive_ahead else max_messages
            self._ahead_for = invisible
            self._keep(await self._receive_now(size, wait_ms, invisible))
            out = self._take(max_messages)
        self._receive_ahead(max_messages, wait_ms, invisible)
        return out

    def take_ahead(
        self, max_messages: int, invisible_ms: int | None
    ) -> tuple[list[ReceivedMessage], list[ReceivedMessage]]:
        """For a caller on another thread (`SimpleConsumer.receive`): what `receive` would hand out
        first from the messages received ahead, without the loop — ([], []) when nothing fresh
        is buffered for this invisible time (then `receive` it is). Also returns the stale
        messages it took out: hand both to `taken` on the loop."""
        invisible = self.invisible_ms if invisible_ms is None else invisible_ms
        if self._ahead_for != invisible or not self._buffer:
            return [], []
        return self._pop_fresh(max_messages)

    def taken(self, out: list[ReceivedMessage], stale: list[ReceivedMessage], max_messages: int,
              wait_ms: int, invisible_ms: int | None) -> None:
        """On the loop, after `take_ahead`: count what the caller took, give back the stale ones,
        send the next receive ahead if it is due."""
        self._count_taken(out, stale)
        invisible = self.invisible_ms if invisible_ms is None else invisible_ms
        self._receive_ahead(max_messages, wait_ms, invisible)

    def _receive_ahead(self, max_messages: int, wait_ms: int, invisible: int) -> None:
        if self.receive_ahead and self._backlog and self._ahead is None:
            size = self._fetch_size(max_messages, invisible)
            if len(self._buffer) <= size // 2:  # half used: the next batch is on its way meanwhile
                ahead = self._receive_into_buffer(size, wait_ms, invisible)
                self._ahead = asyncio.get_running_loop().create_task(ahead)

    async def _receive_into_buffer(self, max_messages: int, wait_ms: int, invisible_ms: int) -> None:
        self._keep(await self._receive_now(max_messages, wait_ms, invisible_ms, ahead=True))

    def _late_answer(self, broker_name: str, late: LateAnswer) -> None:
        """A receive sent ahead was cancelled on the wire (`close`, the event loop's end, a master
        move): the broker may already have handed it messages. Its answer is still read for up to
        `HANG_UP_AFTER_S` from the request, and what it brings given back (visible again at once);
        after that it is hung up on, and the broker hands a receive whose client is gone nothing."""
        loop = asyncio.get_running_loop()
        timer = loop.call_at(late.sent_at + HANG_UP_AFTER_S, late.abort)
        self._late[late] = (broker_name, timer)
        late.answer.add_done_callback(functools.partial(self._late_answered, late))

    def _late_answered(self, late: LateAnswer, answer: asyncio.Future[HttpResponse]) -> None:
        broker_name, timer = self._late.pop(late)
        timer.cancel()
        if answer.cancelled() or answer.exception() is not None:
            return  # hung up on: nothing was handed out
        try:
            doc = decode_answer(answer.result(), "a receive cut off on the wire")
        except LedgerMQError as exc:
            log.debug("a receive cut off on the wire answered %s", exc)
            return
        msgs = [ReceivedMessage.from_json(m, broker_name) for m in doc["messages"]]
        if msgs:
            log.info("giving back %d messages a receive cut off on the wire brought", len(msgs))
            self._side_task(self._release(msgs))

    def _fetch_size(self, max_messages: int, invisible_ms: int) -> int:
        """What a receive asks for: what the caller took in the last third of the invisible time,
        within [max_messages, receive_ahead_max]."""
        horizon = time.monotonic() - invisible_ms / 3000
        taken = self._taken
        while taken and taken[0][0] < horizon:
            self._taken_sum -= taken.popleft()[1]
        return max(max_messages, min(self.receive_ahead_max, self._taken_sum))

    def _keep(self, msgs: list[ReceivedMessage]) -> None:
        """Buffer messages just received (their invisible time runs from now)."""
        now = time.monotonic()
        self._buffer.extend((now, m) for m in msgs)

    def _take(self, max_messages: int) -> list[ReceivedMessage]:
        """Up to `max_messages` buffered messages with two thirds of their invisible time left;
        older ones are given back in the background."""
        if not self._buffer:
            return []
        out, stale = self._pop_fresh(max_messages)
        self._count_taken(out, stale)
        return out

    def _pop_fresh(self, max_messages: int) -> tuple[list[ReceivedMessage], list[ReceivedMessage]]:
        """(up to `max_messages` fresh buffered messages, the stale ones met before them), taken
        out of the buffer one atomic pop at a time: safe from any thread."""
        buffer = self._buffer
        fresh_after = time.monotonic() - (self._ahead_for or self.invisible_ms) / 3000
        out: list[ReceivedMessage] = []
        stale: list[ReceivedMessage] = []
        while len(out) < max_messages:
            try:
                at, msg = buffer.popleft()
            except IndexError:
                break
            (out if at >= fresh_after else stale).append(msg)
        return out, stale

    def _count_taken(self, out: list[ReceivedMessage], stale: list[ReceivedMessage]) -> None:
        if stale:
            log.info("giving back %d received-ahead messages the caller did not take in time", len(stale))
            self._side_task(self._release(stale))
        if out:
            self._taken.append((time.monotonic(), len(out)))
            self._taken_sum += len(out)

    async def _give_back_ahead(self) -> None:
        """Give back what was received ahead (buffered and on the wire)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await asyncio.wait((ahead,), timeout=HANG_UP_AFTER_S)
            if not ahead.done():
                ahead.cancel()
            await asyncio.wait((ahead,))
            exc = None if ahead.cancelled() else ahead.exception()
            if isinstance(exc, LedgerMQError):
                log.warning("a receive sent ahead failed: %s", exc)
            elif exc is not None:
                raise exc
        if self._late:  # each is answered, or hung up on, within HANG_UP_AFTER_S of its request
            await asyncio.wait([late.answer for late in self._late], timeout=HANG_UP_AFTER_S + 1.0)
        held: list[ReceivedMessage] = []
        while self._buffer:  # pop by pop: a caller thread may be taking from it (`take_ahead`)
            held.append(self._buffer.popleft()[1])
        self._ahead_for = None
        await self._release(held)

    def _side_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _receive_now(
        self, max_messages: int, wait_ms: int, invisible_ms: int, ahead: bool = False
    ) -> list[ReceivedMessage]:
        """One receive from the next set that can serve. `ahead`: a receive sent ahead, whose
        answer is still taken when it is cancelled on the wire (`_late_answer`)."""
        route = await self.routes.get(self.topic)
        brokers = [b for b in route.brokers if b.perm & PERM_READ]  # RocketMQ's consumers: readable sets
        if not brokers:
            return []
        body = {
            "topic": self.topic,
            "maxMessages": max_messages,
            "waitMs": wait_ms,
            # 0 is the caller's value (the broker refuses it), not "use the default"
            "invisibleMs": invisible_ms,
            **self.filter,
        }
        turn = next(self._turn)
        ordered = [brokers[(turn + i) % len(brokers)] for i in range(len(brokers))]
        ok = set(self.fault.available(b.broker_name for b in ordered))
        ordered.sort(key=lambda b: b.broker_name not in ok)  # stable: avoided sets last
        last: LedgerMQError | None = None
        for broker in ordered:
            keep_late = functools.partial(self._late_answer, broker.broker_name) if ahead else None
            try:
                doc = await self._write(
                    self.topic, broker, f"/consumers/{seg(self.group)}/receive", body, keep_late=keep_late
                )
            except (BrokerUnreachableError, NotMasterError) as exc:
                self.fault.update(broker.broker_name, 0, failed=True)
                last = exc
                continue
            except ForbiddenError as exc:
                if exc.problem.get("code") != ErrorCode.NO_PERMISSION:
                    raise
                # The set stopped serving reads (brokerPermission) after this route was fetched:
                # the others serve this receive, a fresh route leaves it out.
                self.routes.invalidate(self.topic)
                last = exc
                continue
            except TopicNotExistError as exc:
                # A set that does not hold the topic: named by the every-set route offered for a
                # topic no set has registered yet (created a moment ago), or by a route from before
                # the topic was deleted there. The others serve; a fresh route names the holders.
                self.routes.invalidate(self.topic)
                last = exc
                continue
            got = [ReceivedMessage.from_json(m, broker.broker_name) for m in doc["messages"]]
            self._backlog = len(got) == max_messages
            return got
        assert last is not None
        raise last

    async def _release(self, msgs: list[ReceivedMessage]) -> None:
        """Give back messages received ahead that the caller will not see: visible again at once
        (invisibility 0), not a nack, which would count as a failed delivery."""
        for i in range(0, len(msgs), self.RELEASE_CONCURRENCY):
            chunk = msgs[i : i + self.RELEASE_CONCURRENCY]
            outcomes = await asyncio.gather(
                *(self.change_invisible_duration(m, 0) for m in chunk), return_exceptions=True
            )
            for exc in outcomes:
                if isinstance(exc, LedgerMQError):  # it comes back when its invisibility ends anyway
                    log.warning("release of a received-ahead message failed: %s", exc)
                elif isinstance(exc, BaseException):
                    raise exc

    async def _settle(self, action: str, msgs: list[ReceivedMessage]) -> dict[str, Any]:
        """One request per broker set; `{"results": [...]}` with one entry per message, in the
        caller's order. A failure of one set's request is raised (sets answered before it have
        applied theirs; settling again is harmless: an acked handle answers OK)."""
        by_broker: dict[str | None, list[int]] = {}
        for i, m in enumerate(msgs):
            by_broker.setdefault(received(m).broker_name, []).append(i)
        results: list[dict[str, Any] | None] = [None] * len(msgs)
        for name, idx in by_broker.items():
            broker = await self._broker(self.topic, name)
            handles = [msgs[i].receipt_handle for i in idx]
            doc = await self._write(
                self.topic,
                broker,
                f"/consumers/{seg(self.group)}/{action}",
                {"topic": self.topic, "receiptHandles": handles},
            )
            answered = doc.get("results") or []
            if len(answered) != len(idx):
                raise ServerError(
                    f"{action} on {broker.broker_name}: {len(answered)} results for {len(idx)} handles"
                )
            for i, r in zip(idx, answered, strict=True):
                results[i] = r
        return {"results": results}

    async def ack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        """Settle messages: `{"results": [{"receiptHandle", "status"}]}` in the order given;
        status EXPIRED when the handle is no longer current (the message was redelivered)."""
        return await self._settle("ack", list(msgs))

    def ack_async(self, msg: ReceivedMessage) -> asyncio.Future[dict[str, Any]]:
        """Ack `msg` in the next coalesced request of its broker set; the future resolves to its
        `{"receiptHandle", "status"}` (or the request's error)."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.ack_into(msg, fut)
        return fut

    def ack_into(self, msg: ReceivedMessage, fut: Any) -> None:
        """`ack_async` resolving `fut` (any future with `done`/`set_result`/`set_exception`: the
        blocking twin passes its own, with no asyncio future to chain)."""
        received(msg)
        loop = asyncio.get_running_loop()
        pending = self._acks.setdefault(msg.broker_name, [])
        pending.append((msg, fut))
        if len(pending) >= self.ACK_BATCH:
            self._flush_acks_of(msg.broker_name)
        elif self._ack_timer is None:
            self._ack_timer = loop.call_later(self.ACK_LINGER_S, self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_timer = None
        for name in list(self._acks):
            self._flush_acks_of(name)

    def _flush_acks_of(self, broker_name: str | None) -> None:
        pending = self._acks.pop(broker_name, None)
        if pending:
            task = asyncio.get_running_loop().create_task(self._send_acks(pending))
            self._ack_tasks.add(task)
            task.add_done_callback(functools.partial(self._ack_task_ended, pending))

    def _ack_task_ended(self, pending: list[tuple[ReceivedMessage, Any]], task: asyncio.Task[None]) -> None:
        self._ack_tasks.discard(task)
        if task.cancelled():
            # Nothing but the event loop's end cancels an ack request (perhaps before it started):
            # its acks wait again, for `_until_loop_end` to send.
            for msg, fut in pending:
                if not fut.done():
                    self._acks.setdefault(msg.broker_name, []).append((msg, fut))

    async def _send_acks(self, pending: list[tuple[ReceivedMessage, Any]]) -> None:
        try:
            doc = await self._settle("ack", [m for m, _ in pending])
        except LedgerMQError as exc:
            for _, fut in pending:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), r in zip(pending, doc["results"], strict=True):
            if not fut.done():
                fut.set_result(r)

    async def flush_acks(self) -> None:
        """Send the coalesced acks now and wait for their answers."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        self._flush_acks()
        if self._ack_tasks:
            await asyncio.gather(*self._ack_tasks, return_exceptions=True)

    async def nack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        """Give messages back now (redelivered at once, counted as a reconsume); results as `ack`."""
        return await self._settle("nack", list(msgs))

    async def change_invisible_duration(self, msg: ReceivedMessage, invisible_ms: int) -> ReceivedMessage:
        """Hide `msg` for `invisible_ms` from now; on success it carries its new handle (the old
        one is kept if the request fails)."""
        broker = await self._broker(self.topic, received(msg).broker_name)
        doc = await self._write(
            self.topic,
            broker,
            f"/consumers/{seg(self.group)}/invisible",
            {"topic": self.topic, "receiptHandle": msg.receipt_handle, "invisibleMs": invisible_ms},
        )
        msg.receipt_handle = doc.get("receiptHandle", msg.receipt_handle)
        return msg

    async def close(self) -> None:
        """Send pending acks, give back messages received ahead, close the connections."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._settle_all()
        finally:
            if self._guard is not None:
                await self._guard.aclose()

    async def _settle_all(self) -> None:
        await self.flush_acks()
        try:
            await self._give_back_ahead()
        except LedgerMQError:
            pass
        if self._side:
            await asyncio.gather(*self._side, return_exceptions=True)
        await super().close()

    async def _until_loop_end(self) -> AsyncGenerator[None, None]:
        """Suspended from the first receive until `close`. When the event loop ends first (an
        AsyncSimpleConsumer never closed: asyncio.run cancels every task left, then closes the
        async generators left), the acks still coalesced or cut off go out and what was received
        ahead is given back, as the blocking consumer does at interpreter exit; else those
        messages would come back only after their invisible time."""
        try:
            yield
        finally:
            if not self._closed:
                self._closed = True
                log.warning("event=simple_consumer_closed_at_loop_end group=%s acks=%d ahead=%d hint=close "
                            "the consumer (or use async with) before its event loop ends", self.group,
                            sum(map(len, self._acks.values())), len(self._buffer))
                await self._settle_all()


def received(msg: Any) -> ReceivedMessage:
    """`msg` if it is a message a receive handed out (it has a receipt handle to settle it by);
    TypeError or ValueError saying what it is otherwise."""
    if not isinstance(msg, ReceivedMessage):
        raise TypeError(f"expected a ReceivedMessage (what receive returned), got {type(msg).__name__}")
    if msg.receipt_handle is None:
        raise ValueError(f"message {msg.msg_id} has no receipt handle (was it received?)")
    return msg


class _SyncWrapper:
    """Runs an async client on a background event loop (`client.loop`)."""

    _async_cls: type

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._bg = BackgroundLoop(f"ledgermq-{self._async_cls.__name__}")
        try:
            self._c = self._bg.call(construct(self._async_cls, *args, **kw))
        except BaseException:
            self._bg.close()
            raise
        close_at_exit(self, self._close_at_exit)

    def _run(self, coro: Any) -> Any:
        return self._bg.call(coro)

    def close(self) -> None:
        """Close the connections and the background loop (a second call does nothing)."""
        self._close(self._c.close)

    def _close_at_exit(self) -> None:
        self._close(self._c.close)

    def _close(self, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        closed(self)
        if self._bg.closed:
            return
        try:
            self._bg.call(close())
        finally:
            self._bg.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PullConsumer(_SyncWrapper):
    """Blocking twin of `AsyncPullConsumer` (same methods; `iterate` returns a plain iterator).
    Never closed by the program, it is closed at interpreter exit, committing its iterators'
    positions up to the message last handed out (that one is read again)."""

    _async_cls = AsyncPullConsumer

    def _close_at_exit(self) -> None:
        # The program may have died on the message in hand: its position is committed up to it,
        # not past it, so the group reads it again (at least once).
        self._close(functools.partial(self._c.close, past_in_hand=False))

    def queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        return self._run(self._c.queues(topic, refresh))

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        wait_ms: int = 0,
        broker_name: str | None = None,
        filter_expression: str | None = None,
        filter_type: str = "TAG",
    ) -> PullResult:
        return self._run(self._c.pull(topic, queue_id, offset, max_messages, wait_ms, broker_name,
                                      filter_expression, filter_type))

    def committed_offsets(self, group: str, topic: str, broker_name: str | None = None) -> dict[int, int]:
        return self._run(self._c.committed_offsets(group, topic, broker_name))

    def commit_offset(
        self, group: str, topic: str, offsets: dict[int, int], broker_name: str | None = None
    ) -> None:
        self._run(self._c.commit_offset(group, topic, offsets, broker_name))

    def iterate(self, topic: str, group: str | None = None, **kw: Any) -> SyncPullIterator:
        """See `AsyncPullConsumer.iterate`: `for m in consumer.iterate("t", "g"): ...`."""
        return SyncPullIterator(self._bg, self._run(self._c.iterate(topic, group, **kw)))


class SimpleConsumer(_SyncWrapper):
    """Blocking twin of `AsyncSimpleConsumer` (same methods; `ack_async` returns a
    `concurrent.futures.Future`). Never closed by the program, it is closed at interpreter exit:
    its `ack_async` acks are sent and what it received ahead is given back."""

    _async_cls = AsyncSimpleConsumer

    def receive(
        self, max_messages: int = 16, wait_ms: int = 0, invisible_ms: int | None = None
    ) -> list[ReceivedMessage]:
        """See `AsyncSimpleConsumer.receive`. Messages received ahead are taken on the calling
        thread; the loop hears of it without the caller waiting (no round trip to the I/O thread
        and back for each call: a sixth of the receive(32) loop's throughput here)."""
        out, stale = self._c.take_ahead(max_messages, invisible_ms)
        if out or stale:
            self._bg.call_soon(self._c.taken, out, stale, max_messages, wait_ms, invisible_ms)
        if out:
            return out
        return self._run(self._c.receive(max_messages, wait_ms, invisible_ms))

    def ack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        return self._run(self._c.ack(*msgs))

    def ack_async(self, *msgs: ReceivedMessage) -> list[concurrent.futures.Future[dict[str, Any]]]:
        """Queue acks (coalesced per broker set) and return at once; one future per message."""
        for m in msgs:  # a wrong argument raises here, not on the I/O thread
            received(m)
        futs: list[concurrent.futures.Future[dict[str, Any]]] = [LightFuture() for _ in msgs]
        self._bg.call_soon(self._queue_acks, msgs, futs)
        return futs

    def _queue_acks(self, msgs: tuple[ReceivedMessage, ...], futs: list[concurrent.futures.Future]) -> None:
        for m, f in zip(msgs, futs, strict=True):
            self._c.ack_into(m, f)

    def flush_acks(self) -> None:
        self._run(self._c.flush_acks())

    def nack(self, *msgs: ReceivedMessage) -> dict[str, Any]:
        return self._run(self._c.nack(*msgs))

    def change_invisible_duration(self, msg: ReceivedMessage, invisible_ms: int) -> ReceivedMessage:
        return self._run(self._c.change_invisible_duration(msg, invisible_ms))
