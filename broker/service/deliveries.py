"""`DeliveryQueryService`: where a message stands with each consumer group — not received yet,
in flight (until when), acked, dead-lettered — and its delivery history on this master.

The state comes from what survives a failover (the group's committed offset, the replicated
acks and redelivery counts) and from the master's receipt state (what is in flight); the
history from `DeliveryTrace` (this master only). Callers: the front-ends
(`GET /messages/{msgId}/deliveries`, the console's message page)."""

from __future__ import annotations

import enum
from typing import NamedTuple

from broker.message import MessageExt
from broker.service.acl import AccessControl, Account, Right
from broker.service.pop import PopService
from broker.service.query import MessageQueryService
from broker.service.state import BrokerState
from broker.service.trace import DeliveryEvent, TraceRecord


class DeliveryState(enum.StrEnum):
    NOT_RECEIVED = "NOT_RECEIVED"  # the group has not been handed it yet
    IN_FLIGHT = "IN_FLIGHT"  # received, invisible until `invisible_until_ms`, not settled
    VISIBLE_AGAIN = "VISIBLE_AGAIN"  # not acked in time (or nacked): the next receive redelivers it
    ACKED = "ACKED"
    DEAD_LETTERED = "DEAD_LETTERED"  # out of retries: in %DLQ%{group}


class GroupDelivery(NamedTuple):
    """One group's view of one message."""

    group: str
    state: DeliveryState
    reconsume_times: int
    invisible_until_ms: int | None
    events: list[TraceRecord]


class DeliveryQueryService:
    """Per-group delivery state and history of stored messages (master only: the in-flight part
    lives there)."""

    def __init__(
        self, state: BrokerState, acl: AccessControl, pop: PopService, query: MessageQueryService
    ) -> None:
        self.state = state
        self.store = state.store
        self.acl = acl
        self.pop = pop
        self.query = query

    def deliveries(self, account: Account, msg_id: str) -> tuple[MessageExt, list[GroupDelivery]]:
        """The message `msg_id` and, for every group that reads its topic (that `account` may
        read), its delivery state and the events this master saw; SUB on the topic."""
        self.state.require_master()
        msg = self.query.lookup(msg_id)
        self.acl.authorize(account, topic=msg.topic, right=Right.SUB)
        key = (msg.topic, msg.queue_id, msg.queue_offset)
        events = self.pop.trace.events(*key)
        groups = {e.group for e in events} | {
            g for g in self.store.offsets.groups() if self.store.offsets.offsets_of(g, msg.topic)
        }
        groups |= {g for g, t in self.pop.inflight_counts() if t == msg.topic}
        return msg, [
            self._group(g, key, [e for e in events if e.group == g])
            for g in sorted(groups)
            if account.may_read_group(g)
        ]

    def _group(self, group: str, key: tuple[str, int, int], events: list[TraceRecord]) -> GroupDelivery:
        topic, queue_id, offset = key
        qs = self.pop.queue_state(group, topic, queue_id)
        counted = max([e.reconsume_times for e in events], default=0)
        replica_count = self.pop.replica.reconsume_counts(group, topic, queue_id).get(offset, 0)
        fl = qs.inflight.get(offset) if qs is not None else None
        if fl is not None:
            visible = fl.invisible_until_ms <= self.pop.trace.clock_ms()
            state = DeliveryState.VISIBLE_AGAIN if visible else DeliveryState.IN_FLIGHT
            return GroupDelivery(group, state, fl.reconsume_times, fl.invisible_until_ms, events)
        times = max(counted, replica_count)
        if events and events[-1].event == DeliveryEvent.DEAD_LETTERED:
            return GroupDelivery(group, DeliveryState.DEAD_LETTERED, times, None, events)
        settled = (
            offset < self.store.offsets.query(group, topic, queue_id)
            or (qs is not None and offset < qs.read_ptr)
            or offset in self.pop.replica.acked(group, topic, queue_id)
        )
        state = DeliveryState.ACKED if settled else DeliveryState.NOT_RECEIVED
        return GroupDelivery(group, state, times, None, events)
