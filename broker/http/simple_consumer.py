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
is refused.

A message whose reconsume count would exceed `maxReconsumeTimes` goes to `%DLQ%{group}` (created on
demand, one queue) and counts as acked. A new group starts at each queue's min offset.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from broker.errors import BrokerCode, BrokerError
from broker.http.acl import Right
from broker.http.codec import message_json
from broker.http.context import HttpContext
from broker.http.pop_state import SYS_POP_STATE, PopStateReplica
from broker.http.problems import invalid
from broker.http.schemas import (
    PROBLEM_RESPONSES,
    AckIn,
    InvisibleIn,
    InvisibleOut,
    ReceiveIn,
    ReceiveOut,
    SettleOut,
)
from broker.message import Message, MessageExt
from broker.topics import validate_topic

log = logging.getLogger(__name__)

DLQ_PREFIX = "%DLQ%"
GroupPath = Annotated[str, Path(min_length=1, max_length=120, pattern=r"^[%|a-zA-Z0-9_-]{1,120}$")]


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

    def low_water_mark(self) -> int:
        return min(self.inflight) if self.inflight else self.read_ptr


@dataclass
class GroupTopicState:
    term: int
    queues: dict[int, QueueState] = field(default_factory=dict)
    turn: int = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


class PopService:
    """Receipt state of all groups on this master. Callers: the /consumers/{group}/receive|ack|
    nack|invisible routes. Affects: committed offsets (replicated) and the DLQ topics."""

    def __init__(self, ctx: HttpContext, replica: PopStateReplica) -> None:
        self.ctx = ctx
        self.replica = replica
        self.epoch = secrets.token_hex(4)
        self._next_delivery = 1
        self._states: dict[tuple[str, str], GroupTopicState] = {}

    # -- state ---------------------------------------------------------------------------------
    def _state(self, group: str, topic: str) -> GroupTopicState:
        ctx = self.ctx
        ctx.require_master()
        cfg = ctx.store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if not cfg.is_readable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not readable (perm={cfg.perm})")
        term = ctx.term()
        st = self._states.get((group, topic))
        if st is None or st.term != term:
            if st is not None:
                log.info(
                    "event=pop_state_reset group=%s topic=%s oldTerm=%d term=%d", group, topic, st.term, term
                )
            st = GroupTopicState(term)
            self._states[(group, topic)] = st
        for q in range(cfg.read_queue_nums):
            if q not in st.queues:
                committed = ctx.store.offsets.query(group, topic, q)
                start = max(committed, ctx.store.min_offset(topic, q))
                st.queues[q] = QueueState(
                    read_ptr=start,
                    committed=committed,
                    acked={o for o in self.replica.acked(group, topic, q) if o >= start},
                    reconsume_base=self.replica.reconsume_counts(group, topic, q),
                )
        return st

    def _handle(self, queue_id: int, offset: int, delivery_id: int) -> str:
        return f"{self.epoch}.{queue_id}.{offset}.{delivery_id}"

    def _parse_handle(self, handle: str, field_name: str) -> tuple[str, int, int, int]:
        parts = handle.split(".")
        if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[1:]) or len(handle) > 128:
            raise invalid(field_name, f"malformed receipt handle {handle[:80]!r}")
        return parts[0], int(parts[1]), int(parts[2]), int(parts[3])

    # -- receive -------------------------------------------------------------------------------
    async def receive(
        self, group: str, topic: str, max_messages: int, invisible_ms: int, wait_ms: int
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + min(wait_ms, self.ctx.config.broker_suspend_max_time_millis) / 1000
        while True:
            st = self._state(group, topic)
            out = await self._collect(group, topic, st, max_messages, invisible_ms)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0 or not self.ctx.config.long_polling_enable:
                return out
            await self._wait(topic, st, remaining)

    async def _collect(
        self, group: str, topic: str, st: GroupTopicState, max_messages: int, invisible_ms: int
    ) -> list[dict[str, Any]]:
        store = self.ctx.store
        now = _now_ms()
        out: list[dict[str, Any]] = []
        qids = sorted(st.queues)
        if not qids:
            return out
        recounts: dict[int, dict[int, int]] = {}
        dead: dict[int, list[int]] = {}
        st.turn = (st.turn + 1) % len(qids)  # spread consumers of a group over the queues
        for qid in qids[st.turn :] + qids[: st.turn]:
            qs = st.queues[qid]
            # 1. redeliver what became visible again (invisible time passed or nacked)
            for off in sorted(o for o, f in qs.inflight.items() if f.invisible_until_ms <= now):
                if len(out) >= max_messages:
                    break
                fl = qs.inflight[off]
                msgs = store.get_messages(topic, qid, off, 1).messages
                if not msgs or msgs[0].queue_offset != off:
                    del qs.inflight[off]  # expired from disk: nothing to redeliver
                    dead.setdefault(qid, []).append(off)
                    continue
                if fl.reconsume_times + 1 > self.ctx.config.max_reconsume_times:
                    del qs.inflight[off]
                    await self._to_dlq(group, topic, msgs[0], fl.reconsume_times + 1)
                    dead.setdefault(qid, []).append(off)
                    continue
                fl.reconsume_times += 1
                recounts.setdefault(qid, {})[off] = fl.reconsume_times
                out.append(self._deliver(qid, off, fl, msgs[0], now + invisible_ms))
            # 2. new messages (skipping those an earlier master saw acknowledged)
            while len(out) < max_messages and qs.read_ptr < store.max_offset(topic, qid):
                res = store.get_messages(topic, qid, qs.read_ptr, max_messages - len(out))
                for msg in res.messages:
                    off = msg.queue_offset
                    if off in qs.acked:
                        qs.acked.discard(off)
                        continue
                    base = qs.reconsume_base.pop(off, 0)
                    fl = Inflight(0, base + 1 if base else 0, 0)
                    if base:
                        recounts.setdefault(qid, {})[off] = fl.reconsume_times
                    qs.inflight[off] = fl
                    out.append(self._deliver(qid, off, fl, msg, now + invisible_ms))
                if res.next_offset <= qs.read_ptr:
                    break
                qs.read_ptr = res.next_offset
            if len(out) >= max_messages:
                break
        if recounts:
            await self.ctx.store.append_system_record(
                SYS_POP_STATE,
                {
                    "op": "reconsume",
                    "group": group,
                    "topic": topic,
                    "counts": {str(q): {str(o): n for o, n in c.items()} for q, c in recounts.items()},
                },
            )
        await self._settle(group, topic, st, dead)
        if out:
            self.ctx.metrics.get_messages.labels(topic=topic).inc(len(out))
        return out

    def _deliver(self, qid: int, off: int, fl: Inflight, msg: MessageExt, until_ms: int) -> dict[str, Any]:
        fl.invisible_until_ms = until_ms
        fl.delivery_id = self._next_delivery
        self._next_delivery += 1
        doc = message_json(msg)
        doc["reconsumeTimes"] = fl.reconsume_times
        doc["receiptHandle"] = self._handle(qid, off, fl.delivery_id)
        return doc

    async def _wait(self, topic: str, st: GroupTopicState, remaining_s: float) -> None:
        """Sleep until a queue gets a new message (dispatcher wake-up), an in-flight message turns
        visible, or `remaining_s` passes."""
        now = _now_ms()
        expiries = [f.invisible_until_ms for qs in st.queues.values() for f in qs.inflight.values()]
        timeout = remaining_s
        if expiries:
            timeout = max(0.0, min(timeout, (min(expiries) - now) / 1000))
        tasks = [
            asyncio.ensure_future(self.ctx.store.wait_for_message(topic, q, qs.read_ptr, timeout))
            for q, qs in st.queues.items()
        ]
        if not tasks:  # a topic with no readable queue: nothing can arrive, just honour waitMs
            await asyncio.sleep(timeout)
            return
        self.ctx.metrics.long_poll_waiters.inc()
        try:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.ctx.metrics.long_poll_waiters.dec()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _to_dlq(self, group: str, topic: str, msg: MessageExt, times: int) -> None:
        dlq = DLQ_PREFIX + group
        topics = self.ctx.store.topics
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
        await self.ctx.store.put_messages(dlq, [dead], 0)
        self.ctx.metrics.dlq_messages.labels(group=group).inc()
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
            await self.ctx.store.append_system_record(
                SYS_POP_STATE, {"op": "ack", "group": group, "topic": topic, "acks": above, "marks": marks}
            )
        if moved:
            await self.ctx.store.offsets.commit_many(group, topic, moved)
            for qid, mark in moved.items():
                st.queues[qid].committed = max(st.queues[qid].committed, mark)

    # -- settle --------------------------------------------------------------------------------
    def _find(self, st: GroupTopicState, handle: str, field_name: str) -> tuple[QueueState, int, str]:
        epoch, qid, off, delivery = self._parse_handle(handle, field_name)
        qs = st.queues.get(qid)
        if qs is None:  # well-formed, but no such queue (now): nothing in flight to settle
            return QueueState(0, 0), off, "EXPIRED"
        fl = qs.inflight.get(off)
        if epoch == self.epoch and fl is not None and fl.delivery_id == delivery:
            return qs, off, "OK"
        if epoch == self.epoch and fl is None and off < qs.read_ptr:
            return qs, off, "ACKED"  # already settled: acking twice is harmless
        return qs, off, "EXPIRED"

    async def ack(self, group: str, topic: str, handles: list[str]) -> list[dict[str, Any]]:
        st = self._state(group, topic)
        results = []
        settled: dict[int, list[int]] = {}
        for i, h in enumerate(handles):
            qs, off, state = self._find(st, h, f"receiptHandles[{i}]")
            if state == "OK":
                del qs.inflight[off]
                settled.setdefault(self._parse_handle(h, "receiptHandles")[1], []).append(off)
            results.append({"receiptHandle": h, "status": "EXPIRED" if state == "EXPIRED" else "OK"})
        await self._settle(group, topic, st, settled)
        acked = sum(1 for r in results if r["status"] == "OK")
        if acked:
            self.ctx.metrics.acked.labels(group=group).inc(acked)
        return results

    async def nack(self, group: str, topic: str, handles: list[str]) -> list[dict[str, Any]]:
        st = self._state(group, topic)
        results = []
        now = _now_ms()
        for i, h in enumerate(handles):
            qs, off, state = self._find(st, h, f"receiptHandles[{i}]")
            if state == "OK":
                qs.inflight[off].invisible_until_ms = now  # visible again at once
            results.append({"receiptHandle": h, "status": "OK" if state == "OK" else "EXPIRED"})
        return results

    async def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        st = self._state(group, topic)
        qs, off, state = self._find(st, handle, "receiptHandle")
        if state != "OK":
            raise BrokerError(
                BrokerCode.MESSAGE_NOT_FOUND,
                "no message in flight for this receipt handle "
                "(redelivered, settled, or issued by another master)",
                field="receiptHandle",
            )
        fl = qs.inflight[off]
        fl.invisible_until_ms = _now_ms() + invisible_ms
        fl.delivery_id = self._next_delivery
        self._next_delivery += 1
        return self._handle(self._parse_handle(handle, "receiptHandle")[1], off, fl.delivery_id)


def build_router(ctx: HttpContext) -> APIRouter:
    router = APIRouter()
    replica = PopStateReplica()
    # Registered before the store starts (BrokerRuntime builds the app first), so replay at
    # start rebuilds it; on every member, in log order.
    ctx.store.register_system_handler(SYS_POP_STATE, replica.apply_record)
    pop = PopService(ctx, replica)
    ctx.pop = pop  # type: ignore[attr-defined]  # exposed for metrics/tests

    def check(group: str, topic: str, request: Request) -> None:
        validate_topic(topic)
        ctx.authorize(request.headers, topic=topic, group=group, right=Right.SUB)

    def _json(doc: Any) -> Response:
        return Response(orjson.dumps(doc), media_type="application/json")

    @router.post(
        "/consumers/{group}/receive",
        tags=["consumers"],
        response_model=ReceiveOut,
        responses=PROBLEM_RESPONSES,
        summary="Receive messages, invisible to the group until acked",
    )
    async def receive(group: GroupPath, body: ReceiveIn, request: Request) -> Response:
        check(group, body.topic, request)
        msgs = await pop.receive(group, body.topic, body.maxMessages, body.invisibleMs, body.waitMs)
        return _json({"messages": msgs})

    @router.post(
        "/consumers/{group}/ack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Acknowledge received messages",
    )
    async def ack(group: GroupPath, body: AckIn, request: Request) -> Response:
        check(group, body.topic, request)
        return _json({"results": await pop.ack(group, body.topic, body.receiptHandles)})

    @router.post(
        "/consumers/{group}/nack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Give messages back for redelivery now",
    )
    async def nack(group: GroupPath, body: AckIn, request: Request) -> Response:
        check(group, body.topic, request)
        return _json({"results": await pop.nack(group, body.topic, body.receiptHandles)})

    @router.post(
        "/consumers/{group}/invisible",
        tags=["consumers"],
        response_model=InvisibleOut,
        responses=PROBLEM_RESPONSES,
        summary="Change a received message's invisible time",
    )
    async def invisible(group: GroupPath, body: InvisibleIn, request: Request) -> Response:
        check(group, body.topic, request)
        handle = await pop.change_invisible(group, body.topic, body.receiptHandle, body.invisibleMs)
        return _json({"receiptHandle": handle})

    return router
