"""`MessageModel`: the produce-time rules of RocketMQ's message types, and the services behind them.

`route` decides, for each admitted message of a produce, where it is stored — in one place for
every front-end (HTTP now, gRPC's SendMessage the same way):

- the message's type (`broker.message_type`) must be its topic's `message.type`
  (MESSAGE_TYPE_MISMATCH), and a message has one type: delay, transaction and message group do
  not combine (MESSAGE_ILLEGAL, as RocketMQ's clients refuse them);
- FIFO: the queue of its message group (`broker.fifo.queue_of_group`), whatever queue was asked;
- DELAY: the timer queue until due (`TimerService`), or the topic at once if its time has passed;
- TRANSACTION: the half topic until committed (`TransactionService`);
- NORMAL: the topic, in the queue asked (or the store's round robin).

The send answer of a delayed message names when it is due and a recall handle; of a
transactional one, its transaction id. Its queue offset is -1: it has no place in its topic yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.fifo import PROPERTY_SHARDING_KEY, message_group_problem
from broker.message import PROPERTY_UNIQ_KEY, Message
from broker.message_type import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    TopicMessageType,
    check_message_type,
    message_type_of,
    timer_properties,
    topic_message_type,
)
from broker.store.offsets import PutResult
from broker.subscription import SubscriptionGroupManager
from broker.timer.service import PROPERTY_TIMER_OUT_MS, TIMER_TOPIC, TimerService
from broker.transaction.service import (
    HALF_TOPIC,
    PROPERTY_CHECK_IMMUNITY_S,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_ID,
    TransactionService,
)
from wire.groups import queue_of_group

if TYPE_CHECKING:
    from broker.store.message_store import DefaultMessageStore

_AS_IS_TOPICS = (TopicMessageType.NORMAL, TopicMessageType.MIXED)

# The properties the message model reads or writes: a front-end that carries a message's type in
# fields of its own (gRPC's message_group, delivery_timestamp, message_type) keeps them out of
# the user properties it shows.
MODEL_PROPERTIES = frozenset({
    PROPERTY_SHARDING_KEY, PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_ID,
    PROPERTY_CHECK_IMMUNITY_S, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TIMER_OUT_MS,
    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC,
})


class MessageShape(NamedTuple):
    """What a stored message is, in a front-end's terms: its type, its message group and the time
    it was due (a delayed message), from its properties."""

    message_type: TopicMessageType
    message_group: str | None
    deliver_at_ms: int | None


def message_shape(properties: dict[str, str]) -> MessageShape:
    due = properties.get(PROPERTY_TIMER_DELIVER_MS) or properties.get(PROPERTY_TIMER_OUT_MS)
    return MessageShape(message_type_of(properties), properties.get(PROPERTY_SHARDING_KEY),
                        int(due) if due is not None and due.isdigit() else None)


class SendResult(NamedTuple):
    """A `PutResult` (same first fields) plus what a typed message's sender needs."""

    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    deliver_at_ms: int | None = None
    recall_handle: str | None = None
    transaction_id: str | None = None
    message_id: str | None = None  # its UNIQ_KEY: what it is looked up and delivered by


@dataclass(slots=True)
class Routed:
    """Where one message of a produce goes."""

    topic: str
    queue_id: int | None
    message: Message
    system: bool = False  # a broker topic (timer queue, half topic): stored with the system path
    real_queue_id: int | None = None
    deliver_at_ms: int | None = None
    transaction: bool = False


class MessageModel:
    """The message-model services of one broker. Callers: the produce service (`route`,
    `result`), the pop service (`subscriptions`), the front-ends (timers.recall, transactions)."""

    def __init__(self, store: DefaultMessageStore, timers: TimerService, transactions: TransactionService,
                 subscriptions: SubscriptionGroupManager) -> None:
        self.store = store
        self.timers = timers
        self.transactions = transactions
        self.subscriptions = subscriptions

    def route(self, cfg: Any, topic: str, msgs: Sequence[Message], queue_ids: Sequence[int | None],
              now_ms: int) -> list[Routed] | None:
        """Where each of `msgs` (bound for `topic`, config `cfg`) is stored; None when they are
        all stored as they are (no property at all, a NORMAL or MIXED topic: the bulk of
        produce, checked by one pass). BrokerError naming the message (`messages[i]`) when one
        breaks a rule; nothing is routed then."""
        topic_type = topic_message_type(getattr(cfg, "attributes", None))
        if topic_type in _AS_IS_TOPICS and not any(m.properties for m in msgs):
            return None
        out: list[Routed] = []
        for i, (msg, qid) in enumerate(zip(msgs, queue_ids, strict=True)):
            where = f"messages[{i}]"
            props = msg.properties
            kind = message_type_of(props)
            _check_single_type(props, kind, where)
            check_message_type(topic, topic_type, kind, where, props)
            if kind is TopicMessageType.FIFO:
                group = props[PROPERTY_SHARDING_KEY]
                problem = message_group_problem(group)
                if problem:
                    raise BrokerError(BrokerCode.ILLEGAL_MESSAGE_GROUP, problem,
                                      field=f"{where}.messageGroup")
                out.append(Routed(topic, queue_of_group(group, cfg.write_queue_nums), msg))
            elif kind is TopicMessageType.DELAY:
                due = self.timers.due_ms(props, now_ms, where)
                if due is None:
                    out.append(Routed(topic, qid, msg))
                else:
                    out.append(Routed(TIMER_TOPIC, 0, self.timers.timer_message(msg, topic, qid, due), True,
                                      qid, deliver_at_ms=due))
            elif kind is TopicMessageType.TRANSACTION:
                half = self.transactions.half_message(msg, topic, qid, where)
                out.append(Routed(HALF_TOPIC, 0, half, True, qid, transaction=True))
            else:
                out.append(Routed(topic, qid, msg))
        return out

    def result(self, topic: str, routed: Routed, put: PutResult) -> PutResult | SendResult:
        """The send answer of one routed message."""
        if not routed.system:
            return put
        qid = -1 if routed.real_queue_id is None else routed.real_queue_id
        uniq = routed.message.properties[PROPERTY_UNIQ_KEY]
        deliver_at_ms = routed.deliver_at_ms
        if routed.message.idempotency_key is not None:
            # Perhaps a repeat answered with the first put's result: name that put's message
            # (its UNIQ_KEY, its due time), not this request's new one.
            stored = self.store.look_message_by_offset(put.commit_log_offset, put.store_size)
            uniq = stored.uniq_key or uniq
            if deliver_at_ms is not None:
                deliver_at_ms = int(stored.properties.get(PROPERTY_TIMER_OUT_MS, deliver_at_ms))
        if deliver_at_ms is not None:
            handle = self.timers.recall_handle(topic, put.queue_offset, deliver_at_ms, uniq)
            return SendResult(put.msg_id, qid, -1, put.commit_log_offset, put.store_size,
                              deliver_at_ms=deliver_at_ms, recall_handle=handle, message_id=uniq)
        return SendResult(put.msg_id, qid, -1, put.commit_log_offset, put.store_size, transaction_id=uniq,
                          message_id=uniq)


def typed_properties(*, deliver_at_ms: int | None = None, delay_ms: int | None = None,
                     delay_level: int | None = None, message_group: str | None = None,
                     transactional: bool = False, producer_group: str | None = None) -> dict[str, str]:
    """The RocketMQ properties a front-end's typed fields stand for (HTTP `deliverAt`, `delayMs`,
    `delayTimeLevel`, `messageGroup`, `transactional`, `producerGroup`; gRPC's
    `delivery_timestamp`, `message_group`, message type TRANSACTION): `TIMER_DELIVER_MS`,
    `TIMER_DELAY_MS`, `DELAY`, `__SHARDINGKEY`, `TRAN_MSG`, `PGROUP` — what `route` reads, and what a
    client may also put in a message's properties itself."""
    props: dict[str, str] = {}
    if deliver_at_ms is not None:
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_at_ms)
    if delay_ms is not None:
        props[PROPERTY_TIMER_DELAY_MS] = str(delay_ms)
    if delay_level is not None:
        props[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
    if message_group is not None:
        props[PROPERTY_SHARDING_KEY] = message_group
    if transactional:
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
    if producer_group is not None:
        props[PROPERTY_PRODUCER_GROUP] = producer_group
    return props


def _check_single_type(props: dict[str, str], kind: TopicMessageType, where: str) -> None:
    """One message, one type, one delivery time: a delayed or transactional message cannot also be
    grouped, nor a transactional one delayed (RocketMQ's clients refuse these combinations), and a
    delayed message names its time once (RocketMQ reads the first timer property it finds and
    ignores the others: a silent choice between two times the sender both meant)."""
    if kind is TopicMessageType.TRANSACTION and (message_type_of({k: v for k, v in props.items()
                                                                  if k != "TRAN_MSG"})
                                                 is not TopicMessageType.NORMAL):
        raise BrokerError(BrokerCode.MESSAGE_ILLEGAL, "a transactional message cannot be delayed or have "
                          "a message group", field=where)
    if kind is TopicMessageType.DELAY and PROPERTY_SHARDING_KEY in props:
        raise BrokerError(BrokerCode.MESSAGE_ILLEGAL, "a delayed message cannot have a message group",
                          field=where)
    if kind is TopicMessageType.DELAY:
        timers = timer_properties(props)
        if len(timers) > 1:
            names = " and ".join(_TIMER_FIELDS[k] for k in timers)
            raise BrokerError(BrokerCode.MESSAGE_ILLEGAL, f"{names} cannot be combined: a delayed message "
                              "has one delivery time, send only one of them", field=where)


# The front-end names of the timer properties (HTTP's fields; TIMER_DELAY_SEC only as a property).
_TIMER_FIELDS = {PROPERTY_DELAY_TIME_LEVEL: "delayTimeLevel", PROPERTY_TIMER_DELAY_MS: "delayMs",
                 PROPERTY_TIMER_DELIVER_MS: "deliverAt",
                 PROPERTY_TIMER_DELAY_SEC: "properties.TIMER_DELAY_SEC"}
