"""`TimerService`: delay and timer messages, replicated through the log and fired exactly once.

**Admission** (the produce path, on the master): a message with a delay level (`DELAY`, RocketMQ
4's 1..18 over `messageDelayLevel`) or a timer property (`TIMER_DELAY_SEC`, `TIMER_DELAY_MS`, or
the absolute `TIMER_DELIVER_MS`, which gRPC's `delivery_timestamp` maps to) is due at a time the
master computes once (`due_ms`). If that time has passed it is stored as a normal message; else
it is stored — committed before the producer's answer — in the timer queue `rmq_sys_wheel_timer`/0
with `TIMER_OUT_MS` (the due time), `REAL_TOPIC` and `REAL_QID`. The consume-queue unit's tags code
holds the due time (RocketMQ's trick for SCHEDULE_TOPIC), so the index is rebuilt from the timer
queue alone.

**Firing** (master only): when a timer is due on the master's clock, one log entry carries the real
message (its own topic and queue, `TIMER_DELIVER_MS` = the due time, the producer's UNIQ_KEY) and a
*delete marker* in the timer queue naming the timer's offset (tags code `-(offset)-1`). Every member
removes the timer when it applies the marker. So a timer fires at most once whatever fails over
(RocketMQ 5 re-delivers up to a checkpoint interval after a switch): the entry that delivers it is
the entry that retires it. A new master only fires after it has applied everything committed (the
role-change handler's rule), so it sees every marker its predecessor committed; a fire whose entry
was not committed is lost with its entry and fired again. A fire whose outcome is unknown (commit
timeout) is never retried blind: the timer stays in flight until its marker is applied or the term
changes. Never early: a timer is taken only when `now >= due` on the master's clock.

**Recall** (RocketMQ 5.3): the send answer of a timer message carries a recall handle; a recall
before the due time writes a marker alone and answers truthfully (recalled, already delivered,
being delivered, not found) — RocketMQ answers success without looking.

**Lookup** by message id: a producer knows its delayed message by its UNIQ_KEY (the send answer's
`messageId`, RocketMQ's message id); `find` answers where its timer stands (SCHEDULED, RECALLED,
DELIVERED) from `TimerKeys` (`keys.py`, 4 bytes per timer-queue unit), on every member. After a
restart the keys of the timers still pending are read back in the background (`_fill_keys`).

The pending timers are a `TimerIndex` per member (time-bucketed, 16 bytes a timer, spilled to disk
past `timerMaxResident`); see `index.py`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import time
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.message import (
    PROPERTY_IDEMPOTENCY_KEY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    DispatchInfo,
    Message,
    MessageExt,
    new_uniq_key,
)
from broker.message_type import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
)
from broker.timer.index import TimerIndex
from broker.timer.keys import TimerKeys

if TYPE_CHECKING:
    from broker.store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)

TIMER_TOPIC = "rmq_sys_wheel_timer"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TIMER_DEL_OFFSET = "TIMER_DEL_OFFSET"  # a delete marker: the timer-queue offset it retires
PROPERTY_TIMER_DEL_REASON = "TIMER_DEL_REASON"
# Properties of the timer copy that the delivered message does not carry.
_ADMISSION_PROPERTIES = frozenset({
    PROPERTY_TIMER_OUT_MS, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TAGS,
    PROPERTY_KEYS, PROPERTY_IDEMPOTENCY_KEY})
FIRE_BATCH = 256  # timers taken per round of the fire loop
_ENTRY_BYTES = 192 * 1024  # one fire entry: real messages + markers, under DLedger's 256 KiB pack
_IDLE_S = 1.0  # the fire loop looks again at least this often
_RETRY_S = 1.0  # after a fire the store refused
_FOLLOWER_GRACE_MS = 10_000  # a follower drops fired timers of slots this long past
_FLOOR_EVERY_MS = 60_000  # how often the retired-timer bitmap is cut at the oldest pending timer
_RECALL_VERSION = "v1"
_RECALLED = "RECALLED"  # a marker's reason: the timer was recalled
# A real topic that refuses the delivered message for good: the timer is retired without it.
_UNDELIVERABLE = frozenset({BrokerCode.TOPIC_NOT_EXIST, BrokerCode.NO_PERMISSION, BrokerCode.QUEUE_NOT_EXIST})
Item = tuple[str, int | None, Message]  # (topic, queue id or None, message) of an atomic put
_FILL_CHUNK = 256  # timer-queue messages read per step of the start-up key fill


class TimerState(StrEnum):
    """Where a timer stands, as a lookup by message id shows it."""

    SCHEDULED = "SCHEDULED"  # pending: not yet due, or due and about to be fired
    DELIVERED = "DELIVERED"  # fired: its message is in its topic
    RECALLED = "RECALLED"


class FoundTimer(NamedTuple):
    """A timer found by its message id: its copy in the timer queue, and its state."""

    offset: int
    message: MessageExt
    state: TimerState


def _marker_offset(item: Item) -> int:
    return int(item[2].properties[PROPERTY_TIMER_DEL_OFFSET])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _illegal(detail: str, field: str) -> BrokerError:
    return BrokerError(BrokerCode.ILLEGAL_DELIVERY_TIME, detail, field=field)


class TimerService:
    """Timers of one broker. Callers: the produce path (`due_ms`, `timer_message`), the store's
    dispatcher (`tags_code`, `on_unit`, `rebuild`), the recall route/RPC (`recall`), the broker's
    lifecycle (`start`, `stop`)."""

    def __init__(self, store: DefaultMessageStore, *, delay_levels_ms: tuple[int, ...], max_delay_ms: int,
                 enabled: bool = True, recall_enabled: bool = True, resident_limit: int | None = None,
                 clock_ms: Callable[[], int] = _now_ms) -> None:
        self.store = store
        self.delay_levels_ms = delay_levels_ms
        self.max_delay_ms = max_delay_ms
        self.enabled = enabled
        self.recall_enabled = recall_enabled
        self.clock_ms = clock_ms
        spill_dir = os.path.join(store.config.store_path_root_dir, "timerspill")
        self.index = TimerIndex(resident_limit=resident_limit,
                                spill_dir=spill_dir if resident_limit else None)
        self.fired = 0  # delivered by this member as master (a metric)
        self.late_ms_max = 0
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._term = -2
        self._floor_raised_ms = 0
        self.keys = TimerKeys()
        self._recalled: set[int] = set()  # timer-queue offsets of recalled timers, above the floor
        self._unkeyed: tuple[int, int] | None = None  # [from, to) still to read keys from after a start
        self._fill_task: asyncio.Task[None] | None = None

    # ---- admission ---------------------------------------------------------------------------

    def due_ms(self, properties: dict[str, str], now_ms: int, where: str = "messages") -> int | None:
        """When a message with these properties is due (None: not a timer message, or due
        already). ILLEGAL_DELIVERY_TIME for an unreadable value or one past `timerMaxDelaySec`."""
        level = properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if level is not None:
            if not (level.isascii() and level.lstrip("-").isdigit()):
                raise _illegal(f"delayTimeLevel must be an integer 1..{len(self.delay_levels_ms)}, "
                               f"got {level[:40]!r}", f"{where}.delayTimeLevel")
            n = int(level)
            if n < 0:
                levels = len(self.delay_levels_ms)
                raise _illegal(f"delayTimeLevel must be 1..{levels} (0: no delay), got {n}",
                               f"{where}.delayTimeLevel")
            if n == 0:
                return None
            due = now_ms + self.delay_levels_ms[min(n, len(self.delay_levels_ms)) - 1]  # above max: the last
        else:
            due = self._timer_property_due(properties, now_ms, where)
            if due is None:
                return None
        if not self.enabled:
            raise BrokerError(BrokerCode.ILLEGAL_DELIVERY_TIME, "timer messages are disabled on this broker "
                              "(timerWheelEnable=false)", field=where)
        if due - now_ms > self.max_delay_ms:
            raise _illegal(f"delivery time is {due - now_ms} ms ahead, beyond timerMaxDelaySec "
                           f"({self.max_delay_ms // 1000} s)", f"{where}.deliverAt")
        return due if due > now_ms else None

    def _timer_property_due(self, properties: dict[str, str], now_ms: int, where: str) -> int | None:
        for key, scale, absolute, name in ((PROPERTY_TIMER_DELAY_SEC, 1000, False, "delaySec"),
                                           (PROPERTY_TIMER_DELAY_MS, 1, False, "delayMs"),
                                           (PROPERTY_TIMER_DELIVER_MS, 1, True, "deliverAt")):
            raw = properties.get(key)
            if raw is None:
                continue
            if not (raw.isascii() and raw.lstrip("-").isdigit()) or len(raw) > 19:
                raise _illegal(f"{name} must be an integer, got {raw[:40]!r}", f"{where}.{name}")
            value = int(raw) * scale
            return value if absolute else now_ms + value
        return None

    def timer_message(self, msg: Message, topic: str, queue_id: int | None, due_ms: int) -> Message:
        """The copy stored in the timer queue until `due_ms` (same body, keys, tags, UNIQ_KEY)."""
        props = dict(msg.properties)
        props[PROPERTY_TIMER_OUT_MS] = str(due_ms)
        props[PROPERTY_REAL_TOPIC] = topic
        if queue_id is not None:
            props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        props.setdefault(PROPERTY_UNIQ_KEY, new_uniq_key())
        return Message(TIMER_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props, flag=msg.flag,
                       idempotency_key=msg.idempotency_key, born_timestamp=msg.born_timestamp,
                       born_host=msg.born_host)

    def recall_handle(self, topic: str, queue_offset: int, due_ms: int, uniq_key: str) -> str:
        """What a producer keeps to recall the timer stored at `queue_offset` of the timer queue."""
        raw = f"{_RECALL_VERSION} {topic} {self.store.config.broker_name} {due_ms} {queue_offset} {uniq_key}"
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    # ---- the dispatcher (every member, log order) --------------------------------------------

    def tags_code(self, info: DispatchInfo) -> int:
        """The consume-queue code of a timer-queue message: its due time, or -(offset)-1 for a
        marker retiring the timer at `offset`."""
        props = info.properties
        target = props.get(PROPERTY_TIMER_DEL_OFFSET)
        if target is not None:
            return -int(target) - 1
        return int(props.get(PROPERTY_TIMER_OUT_MS, "0"))

    def on_unit(self, info: DispatchInfo) -> None:
        """A timer-queue message was dispatched: a timer to index, or a marker retiring one."""
        code = info.tags_code  # = tags_code(info), set by the dispatcher
        if code < 0:
            self.index.remove(-code - 1)
            if info.properties.get(PROPERTY_TIMER_DEL_REASON) == _RECALLED:
                self._recalled.add(-code - 1)
            return
        self.index.add(code, info.queue_offset)
        uniq = info.properties.get(PROPERTY_UNIQ_KEY)
        if uniq:
            self.keys.add(info.queue_offset, uniq)
        if self.store.is_master:
            self._wakeup.set()  # perhaps due before what the fire loop sleeps for

    def rebuild(self) -> None:
        """At start: the pending timers from the timer queue, read backwards so each marker is
        seen before the timer it retires (one bit per unit, no per-timer state)."""
        cq = self.store.consume_queues.get((TIMER_TOPIC, 0))
        if cq is None:
            return
        lo, hi = cq.min_offset, cq.max_offset
        self.index.raise_floor(lo)
        self.keys.reset(lo)
        self._recalled.clear()
        self._unkeyed = (lo, hi) if hi > lo else None
        retired = bytearray((hi - lo + 7) // 8)
        pending = 0
        chunk = 4096
        end = hi
        while end > lo:
            start = max(lo, end - chunk)
            units = cq.get_units(start, end - start)
            for i in range(len(units) - 1, -1, -1):
                _, size, code = units[i]
                if size <= 0:
                    continue
                off = start + i
                if code < 0:
                    target = -code - 1 - lo
                    if target >= 0:
                        retired[target >> 3] |= 1 << (target & 7)
                elif not retired[(off - lo) >> 3] & (1 << ((off - lo) & 7)):
                    self.index.add(code, off)
                    pending += 1
            end = start
        log.info("event=timers_rebuilt pending=%d scanned=%d from=%d", pending, hi - lo, lo)

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="timer-fire")
        if self._unkeyed is not None:
            self._fill_task = loop.create_task(self._fill_keys(), name="timer-keys")

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._fill_task is not None:
            self._fill_task.cancel()
            await asyncio.gather(self._fill_task, return_exceptions=True)
            self._fill_task = None
        if self._task is not None:
            await self._task
            self._task = None

    def install(self) -> None:
        """Hook into the store (before it starts): the timer queue's dispatch, the start-up
        rebuild, and role changes."""
        self.store.register_dispatch_hook(TIMER_TOPIC, self)
        self.store.register_recovery_hook(self.rebuild)
        self.store.register_retention_floor(self.retention_floor)
        self.store.role.add_listener(self._on_role_change)

    def retention_floor(self) -> int | None:
        """Retention keeps the log from the oldest pending timer on (its message is the timer).
        None: no timer pending."""
        cq = self.store.consume_queues.get((TIMER_TOPIC, 0))
        if cq is None or not len(self.index):
            return None
        lwm = self.index.low_water_mark(cq.max_offset)
        return cq.get_unit(lwm)[0] if cq.min_offset <= lwm < cq.max_offset else None

    def _raise_floor(self, now: int) -> None:
        """Now and then: forget the retirement bits below the oldest pending timer."""
        if now - self._floor_raised_ms < _FLOOR_EVERY_MS:
            return
        self._floor_raised_ms = now
        cq = self.store.consume_queues.get((TIMER_TOPIC, 0))
        if cq is not None:
            self.index.raise_floor(max(self.index.low_water_mark(cq.max_offset), cq.min_offset))
            self.keys.cut(self.index.floor)
            self._recalled = {off for off in self._recalled if off >= self.index.floor}

    def _on_role_change(self, *_: object) -> None:
        """Any role change: whatever was in flight goes back to pending (its marker, if its entry
        committed, still retires it)."""
        self.index.release_all()
        self._wakeup.set()

    # ---- firing (master) -------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            try:
                wait_s = await self._round()
            except Exception:  # keep firing: one bad round must not stop every timer
                log.exception("event=timer_round_failed")
                wait_s = _RETRY_S
            if wait_s > 0 and not self._stopping:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), wait_s)
                except TimeoutError:
                    pass

    async def _round(self) -> float:
        """Fire what is due; returns how long to sleep (0: go on at once)."""
        now = self.clock_ms()
        store = self.store
        self._raise_floor(now)
        if not store.is_master:
            self.index.compact(now, _FOLLOWER_GRACE_MS)
            return _IDLE_S
        term = store.role.term
        if term != self._term:
            self.index.release_all()  # in flight in another term: its marker decides, or we refire
            self._term = term
        due = self.index.take_due(now, FIRE_BATCH)
        if due:
            if not await self._fire(due, now):
                return _RETRY_S
            return 0
        nxt = self.index.next_due_ms(now)
        return _IDLE_S if nxt is None else max(0.001, min(_IDLE_S, (nxt - now) / 1000))

    async def _fire(self, due: list[tuple[int, int]], now: int) -> bool:
        """One entry per ~192 KiB: each timer's real message and its marker. False if the store
        refused (the timers are pending again and retried later)."""
        units: list[list[Item]] = []
        size = 0
        for due_ms, off in due:
            ext = self._read_timer(off)
            if ext is None:
                units.append([self._marker(off, "UNREADABLE")])
                continue
            units.append([self.real_message(ext, due_ms), self._marker(off, "FIRED")])
            size += len(ext.body) + 512
            self.late_ms_max = max(self.late_ms_max, now - due_ms)
            if size >= _ENTRY_BYTES:
                if not await self._put(units):
                    return False
                units, size = [], 0
        return not units or await self._put(units)

    async def _put(self, units: list[list[Item]]) -> bool:
        """Write `units` (each a real message + its marker, or a marker alone) in one entry."""
        try:
            await self.store.put_messages_atomic([item for unit in units for item in unit])
        except BrokerError as exc:
            if exc.extra.get("outcome") in ("unknown", "committed"):
                # Appended, maybe committed: its markers decide. Never fire these blind again.
                log.warning("event=timer_fire_outcome_unknown timers=%d code=%s", len(units), exc.code)
                return True
            if exc.code in _UNDELIVERABLE and len(units) > 1:
                return all([await self._put([unit]) for unit in units])
            if exc.code in _UNDELIVERABLE:
                off = _marker_offset(units[0][-1])
                log.error("event=timer_dropped offset=%d topic=%s code=%s", off, units[0][0][0], exc.code)
                return await self._put([[self._marker(off, "UNDELIVERABLE")]])
            for unit in units:
                self.index.release(_marker_offset(unit[-1]))
            log.warning("event=timer_fire_refused timers=%d code=%s detail=%s", len(units), exc.code,
                        exc.detail)
            return False
        self.fired += sum(1 for unit in units if len(unit) == 2)
        return True

    def _read_timer(self, offset: int) -> MessageExt | None:
        try:
            got = self.store.get_messages(TIMER_TOPIC, 0, offset, 1).messages
        except BrokerError as exc:
            log.error("event=timer_unreadable offset=%d code=%s", offset, exc.code)
            return None
        if not got or got[0].queue_offset != offset:
            log.error("event=timer_unreadable offset=%d reason=not in the timer queue", offset)
            return None
        return got[0]

    def real_message(self, ext: MessageExt, due_ms: int) -> Item:
        """The message a timer delivers (its topic, queue and properties), from its copy `ext`."""
        props = {k: v for k, v in ext.properties.items() if k not in _ADMISSION_PROPERTIES}
        props[PROPERTY_TIMER_DELIVER_MS] = str(due_ms)
        topic = ext.properties.get(PROPERTY_REAL_TOPIC, "")
        qid_raw = ext.properties.get(PROPERTY_REAL_QUEUE_ID)
        queue_id = int(qid_raw) if qid_raw is not None and qid_raw.isdigit() else None
        cfg = self.store.topics.get(topic)
        if queue_id is not None and cfg is not None and queue_id >= cfg.write_queue_nums:
            queue_id %= cfg.write_queue_nums  # the topic lost queues meanwhile
        # Its UNIQ_KEY as its idempotency key: every member's idempotency table then finds the
        # delivered message by the id its producer was answered with (`GET /messages/{id}`).
        msg = Message(topic, ext.body, tags=ext.tags, keys=ext.keys, properties=props, flag=ext.flag,
                      idempotency_key=ext.uniq_key, born_timestamp=ext.born_timestamp,
                      born_host=ext.born_host)
        return topic, queue_id, msg

    def _marker(self, offset: int, reason: str) -> Item:
        props = {PROPERTY_TIMER_DEL_OFFSET: str(offset), PROPERTY_TIMER_DEL_REASON: reason,
                 PROPERTY_UNIQ_KEY: new_uniq_key()}
        return TIMER_TOPIC, 0, Message(TIMER_TOPIC, b"", properties=props)

    # ---- lookup by message id -------------------------------------------------------------------

    def find(self, uniq_key: str) -> FoundTimer | None:
        """The latest timer stored with `uniq_key` and where it stands; None when no timer above
        the settled floor has it. SERVICE_UNAVAILABLE while the keys are still being read back
        after a start and none matched yet."""
        for off in reversed(self.keys.candidates(uniq_key)):
            ext = self._read_timer(off)
            if ext is None or ext.uniq_key != uniq_key or PROPERTY_TIMER_DEL_OFFSET in ext.properties:
                continue
            if not self.index.is_removed(off):
                state = TimerState.SCHEDULED
            else:
                state = TimerState.RECALLED if off in self._recalled else TimerState.DELIVERED
            return FoundTimer(off, ext, state)
        if self._unkeyed is not None:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "the timers' message ids are still being read "
                              "after a start; ask again in a moment")
        return None

    async def _fill_keys(self) -> None:
        """After a start: the keys of the timers in the timer queue when it was rebuilt (and which
        of them were recalled), read in chunks between other work."""
        assert self._unkeyed is not None
        offset, end = self._unkeyed
        read = 0
        try:
            while offset < end:
                offset = max(offset, self.keys.base)
                if offset >= end:
                    break
                got = self.store.get_messages(TIMER_TOPIC, 0, offset, min(_FILL_CHUNK, end - offset))
                for ext in got.messages:
                    if ext.queue_offset >= end:
                        break
                    props = ext.properties
                    target = props.get(PROPERTY_TIMER_DEL_OFFSET)
                    if target is None:
                        if ext.uniq_key:
                            self.keys.add(ext.queue_offset, ext.uniq_key)
                    elif props.get(PROPERTY_TIMER_DEL_REASON) == _RECALLED and target.isdigit():
                        self._recalled.add(int(target))
                read += len(got.messages)
                if got.next_offset <= offset:
                    break
                offset = got.next_offset
                await asyncio.sleep(0)
        except BrokerError as exc:
            log.error("event=timer_keys_fill_failed offset=%d code=%s detail=%s", offset, exc.code,
                      exc.detail)
        self._unkeyed = None
        log.info("event=timer_keys_filled read=%d", read)

    # ---- recall ----------------------------------------------------------------------------------

    async def recall(self, topic: str, handle: str) -> str:
        """Retire a timer before it is due. Returns the recalled message's UNIQ_KEY. RECALL_FAILED
        (already delivered or recalled, due already), MESSAGE_NOT_FOUND (no such timer),
        INVALID_REQUEST (a handle that does not decode)."""
        if not self.recall_enabled:
            raise BrokerError(BrokerCode.RECALL_FAILED,
                              "recall is disabled on this broker (recallMessageEnable=false)")
        parts = self._decode_handle(handle)
        _, h_topic, broker, due_raw, off_raw, uniq = parts
        if h_topic != topic:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"the recall handle is for topic {h_topic!r}",
                              field="recallHandle")
        if broker != self.store.config.broker_name:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"the recall handle is for broker {broker!r}",
                              field="recallHandle")
        due, off = int(due_raw), int(off_raw)
        ext = self._read_timer(off)
        if (ext is None or ext.properties.get(PROPERTY_TIMER_OUT_MS) != due_raw or ext.uniq_key != uniq
                or ext.properties.get(PROPERTY_REAL_TOPIC) != topic):
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, "no timer message for this recall handle "
                              "(expired from the log, or never stored)", field="recallHandle")
        if self.index.is_removed(off):
            raise BrokerError(BrokerCode.RECALL_FAILED, "the message was already delivered or recalled")
        if due <= self.clock_ms() or not self.index.reserve(off, due):
            raise BrokerError(BrokerCode.RECALL_FAILED, "the message is due: it is being delivered")
        try:
            await self.store.put_messages_atomic([self._marker(off, _RECALLED)])
        except BrokerError as exc:
            if exc.extra.get("outcome") not in ("unknown", "committed"):
                self.index.release(off)
            raise
        log.info("event=timer_recalled topic=%s offset=%d uniqKey=%s", topic, off, uniq)
        return uniq

    @staticmethod
    def _decode_handle(handle: Any) -> list[str]:
        if not isinstance(handle, str) or not 0 < len(handle) <= 1024:
            raise BrokerError(BrokerCode.INVALID_REQUEST, "recallHandle must be a non-empty string",
                              field="recallHandle")
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
        except (binascii.Error, ValueError):
            raw = ""
        parts = raw.split(" ")
        if (len(parts) != 6 or parts[0] != _RECALL_VERSION or not parts[3].isdigit()
                or not parts[4].isdigit()):
            raise BrokerError(BrokerCode.INVALID_REQUEST, "recallHandle does not decode",
                              field="recallHandle")
        return parts

    def stats(self) -> dict[str, int]:
        return {**self.index.stats(), "fired": self.fired, "late_ms_max": self.late_ms_max,
                "key_bytes": self.keys.nbytes()}
