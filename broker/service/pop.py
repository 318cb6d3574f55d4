"""Group consumption, RocketMQ 5 "simple consumer" style: receive / ack / nack / invisible.

State per (group, topic, queue), kept by the master (`PopService`):

- `read_ptr`  — next offset never handed out;
- `inflight`  — offset → (invisible until, reconsume count, delivery id) for handed-out messages;
- committed offset — the replicated low-water mark: every offset below it is acked (or sent to
  the DLQ). It is written through `ConsumerOffsetManager.commit` (a record in the replicated log)
  whenever the low-water mark moves, so it survives failover.

What is replicated and what is not: the committed low-water mark (ConsumerOffsetManager) and,
in `RMQ_SYS_POP_STATE` records (`pop_state.py`), acks above the mark and redelivery counts — each
written through the log before the ack/receive is answered. Which messages are in flight, and
until when, lives in the master's memory: after a failover (or term change) the new master
delivers those again at once (at least once, never lost), never an acked one. Receipt handles
carry the service epoch and a delivery id, so a handle from an old master or an earlier delivery
is refused; an ack retried with the handle that was acked answers OK again.

A message whose reconsume count would exceed the group's `retryMaxTimes` (default
`maxReconsumeTimes`) goes to `%DLQ%{group}` (created on demand, one queue) and counts as acked. A
nack makes a message visible again after the group's retry policy's backoff (at once without one).
A new group starts at each queue's min offset.

Message model (issue 15): a receive may carry a filter (`broker.filter`): messages it does not
match are never handed out and count as settled, so the committed offset moves past them. An
orderly group (`consumeMessageOrderly`, by default on FIFO topics) hands out a message group's
next message only once the one before it is acked or dead-lettered (`broker.fifo.FifoGate` per
queue); other message groups go on in parallel. After a failover the gate is rebuilt from the
replicated acks, so that order holds across masters too.

Edges: retention can move a queue's min offset past the read pointer or an in-flight offset —
the group skips forward (what left the disk is gone; one warning line names the range). A topic
delete drops every group's state of that topic, replicated and in memory (`drop_topic`, hooked on
the delete as every member applies it), and a queue whose read pointer lies past its end (the
topic was re-created) is rebuilt. Every await in a request re-checks what it read before: a
concurrent ack, receive, topic delete or term change may have changed it meanwhile.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.errors import BrokerCode, BrokerError, invalid
from broker.fifo import PROPERTY_SHARDING_KEY, FifoGate
from broker.filter import MessageFilter
from broker.message import Message, MessageExt, MessageHead
from broker.message_type import TopicMessageType, topic_message_type
from broker.service.acl import AccessControl, Account, Right
from broker.service.message_model import MessageModelService
from broker.service.metrics import BrokerMetrics
from broker.service.pop_state import SYS_POP_STATE, PopStateReplica
from broker.service.state import BrokerState
from broker.service.trace import DeliveryEvent, DeliveryTrace
from broker.store.get_service import DEFAULT_PULL_BYTES, decode_ext
from broker.topics import validate_topic
from wire.limits import MAX_INVISIBLE_MS, MAX_RECEIVE_MESSAGES, MAX_RECEIVE_WAIT_MS, MIN_INVISIBLE_MS

log = logging.getLogger(__name__)

DLQ_PREFIX = "%DLQ%"

# A group's DLQ topic, %DLQ%{group}, must still be a legal topic name (at most 127 characters).
MAX_GROUP_LENGTH = 120
GROUP_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,120}$")

# An entry being written to the DLQ: due never, so no concurrent receive hands it out meanwhile.
_RESERVED_UNTIL_MS = 1 << 62
# A DLQ write that failed (disk full, DLQ not writable, ...) is tried again this much later.
DLQ_RETRY_MS = 1_000
# Per queue, how many recent OK acks (offset → delivery id) are remembered so that an ack retried
# with the same handle answers OK again; older retries answer EXPIRED (still never redelivered).
RECENT_ACKS_PER_QUEUE = 1024
# A receipt handle: "{master epoch}.{queue id}.{queue offset}.{delivery id}", at most 128 chars.
_HANDLE = re.compile(r"([^.]*)\.([0-9]+)\.([0-9]+)\.([0-9]+)", re.ASCII)
_Handle = tuple[str, int, int, int]  # (epoch, queue id, queue offset, delivery id)
_tuple_new = tuple.__new__


class AckStatus(enum.StrEnum):
    """The outcome of settling one receipt handle."""

    OK = "OK"  # settled now, or this very handle was settled before (a retry)
    EXPIRED = "EXPIRED"  # redelivered, dead-lettered, expired from disk, or another master's


class Rendering(NamedTuple):
    """How `receive` hands a message out: `from_view(view, head, topic_at, props_at)` makes it
    straight from the store's validated bytes (`read_messages`' build: a front-end renders its
    answer there, with no `MessageExt` in between), `from_ext` from a `MessageExt` (a message read
    back for redelivery, or whose properties the receive needed: an orderly group's)."""

    from_view: Callable[[memoryview, MessageHead, int, int], Any]
    from_ext: Callable[[MessageExt], Any]


# The default: every message as a `MessageExt`.
AS_MESSAGE_EXT = Rendering(decode_ext, lambda m: m)


class ReceivedMessage(NamedTuple):
    """One message handed out by `receive`: invisible to the group until `receipt_handle` is
    acked, nacked or its invisible time passes."""

    message: Any  # a MessageExt, or what the receive's `Rendering` made of it
    receipt_handle: str
    reconsume_times: int


class AckResult(NamedTuple):
    """What `ack`/`nack` did with one receipt handle."""

    receipt_handle: str
    status: AckStatus


@dataclass
class Inflight:
    invisible_until_ms: int
    reconsume_times: int
    delivery_id: int


@dataclass
class QueueState:
    read_ptr: int
    committed: int
    inflight: dict[int, Inflight] = field(default_factory=dict)
    # From the replicated pop state: offsets above the mark already settled (skipped when read),
    # and redelivery counts recorded by an earlier master.
    acked: set[int] = field(default_factory=set)
    reconsume_base: dict[int, int] = field(default_factory=dict)
    # offset → delivery id of its OK ack on this master (bounded, oldest first: an OrderedDict,
    # since dropping a plain dict's first key scans the holes left by the keys dropped before).
    recent_acks: OrderedDict[int, int] = field(default_factory=OrderedDict)
    # An orderly group's per-message-group order: messages read but held behind their group's head.
    gate: FifoGate | None = None

    def low_water_mark(self) -> int:
        mark = min(self.inflight) if self.inflight else self.read_ptr
        return mark if self.gate is None else min(mark, self.gate.low_water_mark(self.read_ptr))

    def settled(self, offset: int) -> None:
        """`offset` was acked or dead-lettered: its message group may go on."""
        if self.gate is not None:
            self.gate.settle(offset)

    def remember_ack(self, offset: int, delivery_id: int) -> None:
        """Record an OK ack, so a retry with the same handle (and only that one) answers OK."""
        recent = self.recent_acks
        recent[offset] = delivery_id
        if len(recent) > RECENT_ACKS_PER_QUEUE:
            recent.popitem(last=False)


@dataclass
class GroupTopicState:
    term: int
    orderly: bool = False
    queues: dict[int, QueueState] = field(default_factory=dict)
    turn: int = 0
    # Orderly: set when a head settles, so a receive waiting for its group's turn wakes up.
    settled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Batch:
    """One receive's harvest: the messages handed out, and what to replicate before answering."""

    max_messages: int
    invisible_ms: int
    message_filter: MessageFilter | None = None
    retry_max_times: int = 16
    render: Rendering = AS_MESSAGE_EXT
    out: list[ReceivedMessage] = field(default_factory=list)
    recounts: dict[int, dict[int, int]] = field(default_factory=dict)  # qid → offset → count
    dead: dict[int, list[int]] = field(default_factory=dict)  # qid → offsets settled without ack

    def full(self) -> bool:
        return len(self.out) >= self.max_messages


class _Found(NamedTuple):
    """A receipt handle looked up: `status` is OK (live), ACKED (this very handle was acked) or
    EXPIRED (redelivered, dead-lettered, expired from disk, another master, unknown queue)."""

    qs: QueueState
    queue_id: int
    offset: int
    delivery_id: int
    status: str

    def key(self, topic: str) -> tuple[str, int, int]:
        """The message's (topic, queue id, queue offset)."""
        return topic, self.queue_id, self.offset


def _in_range(field_name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise invalid(field_name, f"must be in {lo}..{hi}, got {value}")


def _now_ms() -> int:
    return int(time.time() * 1000)


class PopService:
    """Receipt state of all groups on this master. Callers: the front-ends (receive, ack, nack,
    change_invisible); the topic-delete hook (`drop_topic`). Affects: committed offsets and
    pop-state records (replicated) and the DLQ topics.

    `install()` registers the replicated pop state with the store; it must run before the store
    starts, so the replay at start rebuilds it."""

    def __init__(self, state: BrokerState, acl: AccessControl, metrics: BrokerMetrics,
                 model: MessageModelService) -> None:
        self.state = state
        self.model = model
        self.store = state.store
        self.config = state.config
        self.acl = acl
        self.metrics = metrics
        self.replica = PopStateReplica()
        self.epoch = secrets.token_hex(4)
        self._next_delivery = 1
        self._states: dict[tuple[str, str], GroupTopicState] = {}
        self.trace = DeliveryTrace(_now_ms)

    def install(self) -> None:
        """Apply pop-state records on every member, in log order (and on replay at start), and
        forget a deleted topic's state where the delete is applied — chained onto the store's own
        topic-delete hook, so slaves and a later master forget it too."""
        store = self.store
        store.register_system_state(SYS_POP_STATE, self.replica)
        store_on_delete = store.topics.on_delete

        def on_topic_deleted(topic: str) -> None:
            if store_on_delete is not None:
                store_on_delete(topic)
            self.drop_topic(topic)

        store.topics.on_delete = on_topic_deleted

    def _admit(self, account: Account, group: str, topic: str) -> None:
        if not GROUP_NAME_RE.match(group):
            raise invalid(
                "group", f"1-{MAX_GROUP_LENGTH} characters of letters, digits, % | _ -, got {group[:130]!r}"
            )
        validate_topic(topic)
        self.acl.authorize(account, topic=topic, group=group, right=Right.SUB)

    # -- state ---------------------------------------------------------------------------------
    def _state(self, group: str, topic: str) -> GroupTopicState:
        state = self.state
        state.require_master()
        store = self.store
        cfg = store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if not cfg.is_readable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not readable (perm={cfg.perm})")
        term = state.term()
        orderly = self.model.group(group).orderly_for(
            topic_message_type(cfg.attributes) is TopicMessageType.FIFO
        )
        st = self._states.get((group, topic))
        if st is None or st.term != term or st.orderly != orderly:
            if st is not None:
                log.info(
                    "event=pop_state_reset group=%s topic=%s oldTerm=%d term=%d orderly=%s",
                    group,
                    topic,
                    st.term,
                    term,
                    orderly,
                )
            st = GroupTopicState(term, orderly)
            self._states[(group, topic)] = st
        # readQueueNums lowered: the higher queues are no longer read (and may no longer exist,
        # so touching them would fail every request of the group).
        for q in [q for q in st.queues if q >= cfg.read_queue_nums]:
            del st.queues[q]
        for q in range(cfg.read_queue_nums):
            qs = st.queues.get(q)
            if qs is not None and qs.read_ptr > store.max_offset(topic, q):
                # Read past the queue's end: the topic was deleted and created again under us.
                log.warning(
                    "event=pop_state_stale group=%s topic=%s queueId=%d readPtr=%d maxOffset=%d",
                    group,
                    topic,
                    q,
                    qs.read_ptr,
                    store.max_offset(topic, q),
                )
                qs = None
            if qs is None:
                qs = st.queues[q] = self._load_queue(group, topic, q)
                if orderly:
                    qs.gate = FifoGate()
        return st

    def _load_queue(self, group: str, topic: str, queue_id: int) -> QueueState:
        """A queue's state from the replicated committed offset and pop state."""
        store = self.store
        committed = store.offsets.query(group, topic, queue_id)
        lo, hi = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        if committed > hi:
            # Past the end: left by an earlier topic of this name. The delete drops it (also in
            # the replay at start); this is the backstop. Start over at the min offset.
            log.warning(
                "event=pop_state_stale group=%s topic=%s queueId=%d committed=%d maxOffset=%d",
                group,
                topic,
                queue_id,
                committed,
                hi,
            )
            return QueueState(read_ptr=lo, committed=-1)
        if 0 <= committed < lo:
            self._log_skip(group, topic, queue_id, committed, lo)
        start = max(committed, lo)
        return QueueState(
            read_ptr=start,
            committed=committed,
            acked={o for o in self.replica.acked(group, topic, queue_id) if start <= o < hi},
            reconsume_base={
                o: n
                for o, n in self.replica.reconsume_counts(group, topic, queue_id).items()
                if start <= o < hi
            },
        )

    def _live(self, group: str, topic: str, st: GroupTopicState) -> bool:
        """False once `st` was replaced or dropped (new term, topic deleted) — checked after
        every await, so a request that outlived its state writes nothing for it."""
        return self._states.get((group, topic)) is st

    def drop_topic(self, topic: str) -> None:
        """A topic was deleted (applied on every member, in log order): forget every group's
        receipt state of it, replicated and in memory, so a topic created again under the same
        name is read from its start."""
        self.replica.drop_topic(topic)
        self.trace.drop_topic(topic)
        dropped = [key for key in self._states if key[1] == topic]
        for key in dropped:
            del self._states[key]
        log.info("event=pop_state_dropped topic=%s groups=%d", topic, len(dropped))

    def queue_state(self, group: str, topic: str, queue_id: int) -> QueueState | None:
        """This master's receipt state of one queue for `group` in the current term (None when
        the group has not received from it here). Read-only for callers: `broker.service.deliveries`."""
        st = self._states.get((group, topic))
        if st is None or st.term != self.state.term():
            return None
        return st.queues.get(queue_id)

    def inflight_counts(self) -> dict[tuple[str, str], int]:
        """(group, topic) → messages received and neither acked nor visible again yet, on this
        master (RocketMQ's "in-flight" count of a consumer group)."""
        term = self.state.term()
        return {
            key: sum(len(qs.inflight) for qs in st.queues.values())
            for key, st in self._states.items()
            if st.term == term
        }

    def _log_skip(self, group: str, topic: str, queue_id: int, start: int, end: int) -> None:
        log.warning(
            "event=pop_skipped_expired group=%s topic=%s queueId=%d fromOffset=%d toOffset=%d count=%d",
            group,
            topic,
            queue_id,
            start,
            end,
            end - start,
        )

    def _new_delivery_id(self) -> int:
        self._next_delivery += 1
        return self._next_delivery - 1

    def _handle(self, queue_id: int, offset: int, delivery_id: int) -> str:
        return f"{self.epoch}.{queue_id}.{offset}.{delivery_id}"

    def _parse_handle(self, handle: str, field_name: str) -> _Handle:
        m = _HANDLE.fullmatch(handle) if len(handle) <= 128 else None
        if m is None:
            raise invalid(field_name, f"malformed receipt handle {handle[:80]!r}")
        epoch, qid, off, delivery = m.groups()
        return epoch, int(qid), int(off), int(delivery)

    # -- receive -------------------------------------------------------------------------------
    async def receive(
        self,
        account: Account,
        group: str,
        topic: str,
        max_messages: int,
        invisible_ms: int,
        wait_ms: int,
        message_filter: MessageFilter | None = None,
        render: Rendering = AS_MESSAGE_EXT,
        gone: asyncio.Event | None = None,
    ) -> list[ReceivedMessage]:
        """Up to `max_messages` messages of `topic` for `group`, each invisible to the group for
        `invisible_ms`; when there are none, wait up to `wait_ms` (capped by
        brokerSuspendMaxTimeMillis) for one. `message_filter` (`MessageModelService
        .message_filter`): only matching messages are handed out, the others settle at once.
        `render`: what each handed-out message is (a `MessageExt` by default). `gone`: set by
        the front-end when the client hangs up; the wait ends then, and nothing is handed out
        (what a collect took meanwhile is made visible again at once)."""
        _in_range("maxMessages", max_messages, 1, MAX_RECEIVE_MESSAGES)
        _in_range("invisibleMs", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        _in_range("waitMs", wait_ms, 0, MAX_RECEIVE_WAIT_MS)
        self._admit(account, group, topic)
        if not self.config.broker_readable:  # acks of what was received before still settle
            raise BrokerError(BrokerCode.NO_PERMISSION, f"broker {self.config.broker_addr}: receiving is "
                              f"forbidden (brokerPermission={self.config.broker_permission})")
        deadline = time.monotonic() + min(wait_ms, self.config.broker_suspend_max_time_millis) / 1000
        while True:
            st = self._state(group, topic)
            retry_max = self.model.retry_max_times(group)
            batch = _Batch(max_messages, invisible_ms, message_filter, retry_max, render)
            out = await self._collect(group, topic, st, batch)
            if gone is not None and gone.is_set():
                # Handed to a closed connection, they would wait out their invisible time.
                await self._release(account, group, topic, out)
                return []
            remaining = deadline - time.monotonic()
            if out or remaining <= 0 or not self.config.long_polling_enable:
                return out
            await self._wait(topic, st, remaining, gone)

    async def _release(self, account: Account, group: str, topic: str, out: list[ReceivedMessage]) -> None:
        for r in out:
            try:
                await self.change_invisible(account, group, topic, r.receipt_handle, 0)
            except BrokerError as exc:  # settled meanwhile (an ack of an older handle): nothing to do
                log.debug("event=pop_release_skipped group=%s topic=%s code=%s", group, topic, exc.code)

    async def _collect(
        self, group: str, topic: str, st: GroupTopicState, batch: _Batch
    ) -> list[ReceivedMessage]:
        qids = sorted(st.queues)
        if not qids:
            return batch.out
        st.turn = (st.turn + 1) % len(qids)  # spread consumers of a group over the queues
        for qid in qids[st.turn :] + qids[: st.turn]:
            qs = st.queues.get(qid)
            if qs is None:
                continue
            if qs.gate is not None:
                self._deliver_ready(group, topic, qid, qs, batch)  # 0. heads whose turn came (orderly)
            await self._redeliver(group, topic, st, qid, qs, batch)  # 1. visible again
            if not self._live(group, topic, st) or st.queues.get(qid) is not qs:
                # Replaced while we awaited (topic deleted, new term, queue re-created): what we
                # hold is stale, and writing it would resurrect it. Its handles answer EXPIRED.
                return batch.out
            self._read_new(group, topic, qid, qs, batch)  # 2. never handed out
            if batch.full():
                break
        if batch.recounts:
            await self.store.append_system_record(
                SYS_POP_STATE,
                {
                    "op": "reconsume",
                    "group": group,
                    "topic": topic,
                    "counts": {str(q): {str(o): n for o, n in c.items()} for q, c in batch.recounts.items()},
                },
            )
        await self._settle(group, topic, st, batch.dead)
        if batch.out:
            self.metrics.get_messages.labels(topic=topic).inc(len(batch.out))
        return batch.out

    async def _redeliver(
        self, group: str, topic: str, st: GroupTopicState, qid: int, qs: QueueState, batch: _Batch
    ) -> None:
        """Hand out again what became visible (invisible time passed or nacked); past
        maxReconsumeTimes, dead-letter it instead."""
        gone: list[int] = []
        now = _now_ms()
        for off in sorted(o for o, f in qs.inflight.items() if f.invisible_until_ms <= now):
            if batch.full() or not self._live(group, topic, st) or st.queues.get(qid) is not qs:
                break
            # Looked up again each time: while an earlier message of this loop was being
            # dead-lettered, a concurrent ack may have settled this one or a receive taken it.
            fl = qs.inflight.get(off)
            if fl is None or fl.invisible_until_ms > _now_ms():
                continue
            msg = self._read_one(topic, qid, off)
            if msg is None:  # expired from disk (retention): nothing to redeliver
                del qs.inflight[off]
                qs.settled(off)
                gone.append(off)
                batch.dead.setdefault(qid, []).append(off)
                continue
            if fl.reconsume_times + 1 > batch.retry_max_times:
                if await self._dead_letter(group, topic, qs, off, fl, msg):
                    batch.dead.setdefault(qid, []).append(off)
                continue
            fl.reconsume_times += 1
            batch.recounts.setdefault(qid, {})[off] = fl.reconsume_times
            now = _now_ms()
            item = batch.render.from_ext(msg)
            batch.out.append(self._deliver(topic, group, qid, off, fl, item, now, now + batch.invisible_ms))
        if gone:
            log.warning(
                "event=pop_inflight_expired group=%s topic=%s queueId=%d offsets=%s minOffset=%d",
                group,
                topic,
                qid,
                gone[:16],
                self.store.min_offset(topic, qid),
            )

    def _read_one(self, topic: str, qid: int, off: int) -> MessageExt | None:
        """The message at `off`, or None once it is no longer on disk."""
        store = self.store
        if not store.min_offset(topic, qid) <= off < store.max_offset(topic, qid):
            return None
        msgs = store.get_messages(topic, qid, off, 1).messages
        return msgs[0] if msgs and msgs[0].queue_offset == off else None

    def _read_new(self, group: str, topic: str, qid: int, qs: QueueState, batch: _Batch) -> None:
        """Hand out messages never handed out (skipping those an earlier master saw acked).
        No await: nothing else runs between reading the pointer and moving it."""
        store = self.store
        lo = store.min_offset(topic, qid)
        if qs.read_ptr < lo:  # retention deleted what the group had not read yet
            self._log_skip(group, topic, qid, qs.read_ptr, lo)
            qs.read_ptr = lo
            qs.acked = {o for o in qs.acked if o >= lo}
            qs.reconsume_base = {o: n for o, n in qs.reconsume_base.items() if o >= lo}
        now = _now_ms()
        gate = qs.gate
        render = batch.render
        # An orderly group needs each message's properties (its message group): a MessageExt.
        build = render.from_view if gate is None else decode_ext

        def build_with_offset(view: memoryview, head: MessageHead, topic_at: int, props_at: int) -> tuple:
            return head.queue_offset, build(view, head, topic_at, props_at)

        while (
            not batch.full()
            and qs.read_ptr < store.max_offset(topic, qid)
            and (gate is None or gate.can_read_more())
        ):
            res = store.read_messages(
                topic,
                qid,
                qs.read_ptr,
                batch.max_messages - len(batch.out),
                DEFAULT_PULL_BYTES,
                batch.message_filter,
                build_with_offset,
            )
            for off, item in res.messages:
                if off in qs.acked:
                    qs.acked.discard(off)
                    continue
                if gate is not None:
                    if not gate.admit(off, item.properties.get(PROPERTY_SHARDING_KEY)):
                        continue  # behind its message group's head: handed out once that settles
                    item = render.from_ext(item)
                base = qs.reconsume_base.pop(off, 0)
                fl = Inflight(0, base + 1 if base else 0, 0)
                if base:
                    batch.recounts.setdefault(qid, {})[off] = fl.reconsume_times
                qs.inflight[off] = fl
                until = now + batch.invisible_ms
                batch.out.append(self._deliver(topic, group, qid, off, fl, item, now, until))
            if res.next_offset <= qs.read_ptr:
                break
            qs.read_ptr = res.next_offset

    def _deliver_ready(self, group: str, topic: str, qid: int, qs: QueueState, batch: _Batch) -> None:
        """Orderly: hand out the messages that became their group's head (the one before them
        was settled). One gone from disk meanwhile settles in turn."""
        assert qs.gate is not None
        now = _now_ms()
        while not batch.full():
            ready = qs.gate.take_ready(batch.max_messages - len(batch.out))
            if not ready:
                return
            for off in ready:
                msg = self._read_one(topic, qid, off)
                if msg is None:
                    qs.settled(off)
                    batch.dead.setdefault(qid, []).append(off)
                    continue
                base = qs.reconsume_base.pop(off, 0)
                fl = Inflight(0, base + 1 if base else 0, 0)
                if base:
                    batch.recounts.setdefault(qid, {})[off] = fl.reconsume_times
                qs.inflight[off] = fl
                item = batch.render.from_ext(msg)
                until = now + batch.invisible_ms
                batch.out.append(self._deliver(topic, group, qid, off, fl, item, now, until))

    def _deliver(
        self, topic: str, group: str, qid: int, off: int, fl: Inflight, item: Any, now_ms: int, until_ms: int
    ) -> ReceivedMessage:
        fl.invisible_until_ms = until_ms
        fl.delivery_id = delivery = self._new_delivery_id()
        times = fl.reconsume_times
        event = DeliveryEvent.REDELIVERED if times else DeliveryEvent.RECEIVED
        self.trace.record((topic, qid, off), group, event, times, now_ms)
        # tuple.__new__: a NamedTuple's own constructor is Python code.
        return _tuple_new(ReceivedMessage, (item, self._handle(qid, off, delivery), times))

    async def _wait(
        self, topic: str, st: GroupTopicState, remaining_s: float, gone: asyncio.Event | None
    ) -> None:
        """Sleep until a queue gets a new message (dispatcher wake-up), an in-flight message turns
        visible, the client is `gone`, or `remaining_s` passes."""
        now = _now_ms()
        expiries = [f.invisible_until_ms for qs in st.queues.values() for f in qs.inflight.values()]
        timeout = remaining_s
        if expiries:
            timeout = max(0.0, min(timeout, (min(expiries) - now) / 1000))
        tasks = [
            asyncio.ensure_future(self.store.wait_for_message(topic, q, qs.read_ptr, timeout))
            for q, qs in st.queues.items()
        ]
        if st.orderly:
            st.settled.clear()
            tasks.append(asyncio.ensure_future(st.settled.wait()))
        if tasks and gone is not None:
            tasks.append(asyncio.ensure_future(gone.wait()))
        if not tasks:  # a topic with no readable queue: nothing can arrive, just honour waitMs
            await asyncio.sleep(timeout)
            return
        self.metrics.long_poll_waiters.inc()
        try:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.metrics.long_poll_waiters.dec()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _dead_letter(
        self,
        group: str,
        topic: str,
        qs: QueueState,
        off: int,
        fl: Inflight,
        msg: MessageExt,
        *,
        quiet: bool = True,
    ) -> bool:
        """Send a message out of retries to the DLQ; True once it is there and out of flight.
        While the write is in progress the entry is reserved: a fresh delivery id no client holds
        (its last handle no longer acks it — it is being dead-lettered, not acked) and no expiry
        (no concurrent receive hands it out). Removed only after the write succeeded, so a
        failed write loses nothing: the message is tried again later."""
        fl.delivery_id = self._new_delivery_id()
        fl.invisible_until_ms = _RESERVED_UNTIL_MS
        try:
            await self._to_dlq(group, topic, msg, fl.reconsume_times + 1)
        except BrokerError as exc:
            fl.invisible_until_ms = _now_ms() + DLQ_RETRY_MS
            log.warning(
                "event=dlq_failed group=%s topic=%s queueId=%d offset=%d code=%s retryMs=%d",
                group,
                topic,
                msg.queue_id,
                off,
                exc.code,
                DLQ_RETRY_MS,
            )
            if not quiet:
                raise
            return False
        except BaseException:
            fl.invisible_until_ms = _now_ms()  # cancelled mid-write: due again at once (idempotent)
            raise
        if qs.inflight.get(off) is fl:
            del qs.inflight[off]
            dead = DeliveryEvent.DEAD_LETTERED
            self.trace.record((topic, msg.queue_id, off), group, dead, fl.reconsume_times + 1)
            qs.settled(off)
            return True
        return False

    async def _to_dlq(self, group: str, topic: str, msg: MessageExt, times: int) -> None:
        dlq = DLQ_PREFIX + group
        topics = self.store.topics
        if topics.get(dlq) is None:
            await topics.create_or_update(dlq, 1, 1, 6)
        props = dict(msg.user_properties)
        props.update({"ORIGIN_MESSAGE_ID": msg.msg_id, "RETRY_TOPIC": topic, "RECONSUME_TIME": str(times)})
        dead = Message(
            topic=dlq,
            body=msg.body,
            tags=msg.tags,
            keys=msg.keys,
            properties=props,
            idempotency_key=f"dlq.{group}.{topic}.{msg.queue_id}.{msg.queue_offset}",
            born_timestamp=msg.born_timestamp,
            born_host=msg.born_host,
        )
        await self.store.put_messages(dlq, [dead], 0)
        self.metrics.dlq_messages.labels(group=group).inc()
        log.info(
            "event=message_to_dlq group=%s topic=%s queueId=%d offset=%d reconsumeTimes=%d",
            group,
            topic,
            msg.queue_id,
            msg.queue_offset,
            times,
        )

    async def _settle(
        self, group: str, topic: str, st: GroupTopicState, settled: dict[int, list[int]]
    ) -> None:
        """Replicate what was just settled: offsets above the new low-water mark as a pop-state
        record, then the mark itself as the group's committed offset."""
        if not self._live(group, topic, st):
            return
        moved: dict[int, int] = {}
        above: dict[str, list[int]] = {}
        marks: dict[str, int] = {}
        for qid, qs in st.queues.items():
            mark = qs.low_water_mark()
            qs.acked = {o for o in qs.acked if o >= mark}
            high = [o for o in settled.get(qid, ()) if o >= mark]
            if high:
                above[str(qid)] = high
                marks[str(qid)] = mark
            if mark > qs.committed:
                moved[qid] = mark
        if above:
            await self.store.append_system_record(
                SYS_POP_STATE, {"op": "ack", "group": group, "topic": topic, "acks": above, "marks": marks}
            )
            if not self._live(group, topic, st):
                return  # dropped meanwhile (topic deleted): committing would resurrect its offsets
        if moved:
            await self.store.offsets.commit_many(group, topic, moved)
            for qid, mark in moved.items():
                qs = st.queues.get(qid)
                if qs is not None:
                    qs.committed = max(qs.committed, mark)

    # -- settle --------------------------------------------------------------------------------
    def _check_handles(self, handles: list[str]) -> list[_Handle]:
        """Each handle parsed; a malformed one is refused before any is settled: a 400 must
        leave no trace."""
        parse = self._parse_handle
        return [parse(h, f"receiptHandles[{i}]") for i, h in enumerate(handles)]

    def _find(self, st: GroupTopicState, parsed: _Handle) -> _Found:
        """What a (parsed) receipt handle settles: OK, ACKED (this very handle, acked here
        already) or EXPIRED."""
        epoch, qid, off, delivery = parsed
        qs = st.queues.get(qid)
        if qs is None or epoch != self.epoch:  # no such queue (now), or another master's handle
            return _Found(qs or QueueState(0, 0), qid, off, delivery, "EXPIRED")
        fl = qs.inflight.get(off)
        if fl is not None and fl.delivery_id == delivery:
            return _Found(qs, qid, off, delivery, "OK")
        if fl is None and qs.recent_acks.get(off) == delivery:
            return _Found(qs, qid, off, delivery, "ACKED")  # this very handle was acked: harmless
        return _Found(qs, qid, off, delivery, "EXPIRED")

    async def ack(self, account: Account, group: str, topic: str, handles: list[str]) -> list[AckResult]:
        """Settle received messages (replicated before this returns); a malformed handle refuses
        the whole request before any is settled."""
        self._admit(account, group, topic)
        st = self._state(group, topic)
        parsed = self._check_handles(handles)
        statuses: list[AckStatus] = []
        settled: dict[int, list[int]] = {}
        acked_now: dict[str, _Found] = {}
        now = _now_ms()
        record = self.trace.record
        for h, ph in zip(handles, parsed, strict=True):
            if h in acked_now:  # the same handle twice in one request: one ack
                statuses.append(AckStatus.OK)
                continue
            found = self._find(st, ph)
            if found.status == "OK":
                fl = found.qs.inflight.pop(found.offset)
                found.qs.settled(found.offset)
                settled.setdefault(found.queue_id, []).append(found.offset)
                acked_now[h] = found
                record(found.key(topic), group, DeliveryEvent.ACKED, fl.reconsume_times, now)
            statuses.append(AckStatus.EXPIRED if found.status == "EXPIRED" else AckStatus.OK)
        await self._settle(group, topic, st, settled)
        if settled and st.orderly:
            st.settled.set()
        # Only now (the ack is in the log) may a retry of these handles answer OK.
        for found in acked_now.values():
            found.qs.remember_ack(found.offset, found.delivery_id)
        if acked_now:
            self.metrics.acked.labels(group=group).inc(len(acked_now))
        return [AckResult(h, s) for h, s in zip(handles, statuses, strict=True)]

    async def nack(self, account: Account, group: str, topic: str, handles: list[str]) -> list[AckResult]:
        """Give received messages back: visible again after the group's retry-policy backoff
        (at once when the group has no policy), redelivered by a later receive."""
        self._admit(account, group, topic)
        st = self._state(group, topic)
        parsed = self._check_handles(handles)
        results = []
        now = _now_ms()
        settings = self.model.group(group)
        for h, ph in zip(handles, parsed, strict=True):
            found = self._find(st, ph)
            if found.status == "OK":
                fl = found.qs.inflight[found.offset]
                fl.invisible_until_ms = now + settings.nack_delay_ms(fl.reconsume_times)
                self.trace.record(found.key(topic), group, DeliveryEvent.NACKED, fl.reconsume_times)
            results.append(AckResult(h, AckStatus.OK if found.status == "OK" else AckStatus.EXPIRED))
        return results

    async def change_invisible(
        self, account: Account, group: str, topic: str, handle: str, invisible_ms: int
    ) -> str:
        """Keep a received message invisible for `invisible_ms` from now; the new receipt handle
        (the old one no longer settles it). MESSAGE_NOT_FOUND when it is no longer in flight."""
        _in_range("invisibleMs", invisible_ms, 0, MAX_INVISIBLE_MS)
        self._admit(account, group, topic)
        st = self._state(group, topic)
        found = self._in_flight(st, handle)
        fl = found.qs.inflight[found.offset]
        fl.invisible_until_ms = _now_ms() + invisible_ms
        fl.delivery_id = self._new_delivery_id()
        return self._handle(found.queue_id, found.offset, fl.delivery_id)

    def _in_flight(self, st: GroupTopicState, handle: str) -> _Found:
        found = self._find(st, self._parse_handle(handle, "receiptHandle"))
        if found.status != "OK":
            raise BrokerError(
                BrokerCode.MESSAGE_NOT_FOUND,
                "no message in flight for this receipt handle "
                "(redelivered, settled, or issued by another master)",
                field="receiptHandle",
            )
        return found

    async def dead_letter(self, account: Account, group: str, topic: str, handle: str) -> None:
        """Send a received message to `%DLQ%{group}` now (RocketMQ's forwardToDeadLetterQueue) and
        settle it; replicated before this returns. MESSAGE_NOT_FOUND when it is no longer in
        flight; a failed DLQ write raises and leaves the message in flight (due again shortly)."""
        self._admit(account, group, topic)
        st = self._state(group, topic)
        found = self._in_flight(st, handle)
        fl = found.qs.inflight[found.offset]
        msg = self._read_one(topic, found.queue_id, found.offset)
        if msg is None:  # gone from disk (retention): nothing to forward, settle it
            del found.qs.inflight[found.offset]
            found.qs.settled(found.offset)
        elif not await self._dead_letter(group, topic, found.qs, found.offset, fl, msg, quiet=False):
            return  # settled meanwhile by a concurrent request: nothing left to do
        await self._settle(group, topic, st, {found.queue_id: [found.offset]})
