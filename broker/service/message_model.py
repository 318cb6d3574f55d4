"""`MessageModelService`: RocketMQ's message types behind every front-end — the produce routing of
typed messages, transaction end and check-back, timer recall, consumer-group settings.

The rules live in the domain modules (`broker.message_model`, `broker.timer`, `broker.transaction`,
`broker.subscription`, `broker.fifo`, `broker.filter`); this service adds what a front-end call
needs around them: the caller's rights, the master check, the broker's configuration, and the
lifecycle of the two background loops (the timer fire loop and the transaction check loop, which
act only while this broker is master).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.filter import FilterError, MessageFilter, build_filter
from broker.message import Message, MessageExt
from broker.message_model import MessageModel, Routed
from broker.service.acl import AccessControl, Account, Right
from broker.service.metrics import BrokerMetrics
from broker.service.state import BrokerState
from broker.subscription import SYS_SUBSCRIPTION_GROUP, SubscriptionGroupConfig, SubscriptionGroupManager
from broker.timer.levels import parse_delay_levels
from broker.timer.service import PROPERTY_TIMER_OUT_MS, TimerService, TimerState
from broker.transaction.service import TransactionCheck, TransactionService
from broker.transaction.state import TransactionState

log = logging.getLogger(__name__)

MAX_CHECK_WAIT_MS = 60_000
HALF_STATE = "HALF"  # how a message of an OPEN transaction shows


class TypedMessage(NamedTuple):
    """A delayed or transactional message found by its message id (UNIQ_KEY) in the timer queue or
    the half topic: its stored copy as it will be (or was) delivered — its own topic and queue
    (-1: not chosen yet), queue offset -1 — where it stands (`state`: SCHEDULED, DELIVERED,
    RECALLED; HALF, COMMITTED, ROLLED_BACK, DISCARDED), whether its message is in its topic, and
    from when (ms) it may have been stored there."""

    message: MessageExt
    state: str
    delivered: bool
    delivered_from_ms: int


class MessageModelService:
    """Callers: the produce service (`route`, `model.result`), the pull and pop services
    (`message_filter`, `group`), the front-ends (the rest), the broker runtime (`install`,
    `start`, `stop`)."""

    def __init__(self, state: BrokerState, acl: AccessControl, metrics: BrokerMetrics) -> None:
        self.state = state
        self.acl = acl
        self.metrics = metrics
        config = state.config
        store = state.store
        self.enable_property_filter = config.enable_property_filter
        self.subscriptions = SubscriptionGroupManager(store.append_system_record)
        self.timers = TimerService(store, delay_levels_ms=parse_delay_levels(config.message_delay_level),
                                   max_delay_ms=config.timer_max_delay_sec * 1000,
                                   enabled=config.timer_wheel_enable,
                                   recall_enabled=config.recall_message_enable,
                                   resident_limit=config.timer_resident_max)
        self.transactions = TransactionService(store, timeout_ms=config.transaction_time_out,
                                               check_interval_ms=config.transaction_check_interval,
                                               check_max=config.transaction_check_max)
        self.model = MessageModel(store, self.timers, self.transactions, self.subscriptions)

    def install(self) -> None:
        """Register the replicated state and the dispatch hooks; before the store starts."""
        self.state.store.register_system_state(SYS_SUBSCRIPTION_GROUP, self.subscriptions)
        self.timers.install()
        self.transactions.install()

    async def start(self) -> None:
        await self.timers.start()
        await self.transactions.start()

    async def stop(self) -> None:
        await self.timers.stop()
        await self.transactions.stop()

    # ---- produce (called by ProduceService) --------------------------------------------------

    def route(self, cfg: Any, topic: str, msgs: Sequence[Message], queue_ids: Sequence[int | None],
              now_ms: int) -> list[Routed]:
        return self.model.route(cfg, topic, msgs, queue_ids, now_ms)

    # ---- consumption (called by PullService / PopService and the front-ends) -----------------

    def message_filter(self, filter_type: str | None, expression: str | None) -> MessageFilter:
        """The filter of a pull or receive: ILLEGAL_FILTER_EXPRESSION for one that does not
        parse, FILTER_NOT_SUPPORTED for SQL92 while `enablePropertyFilter=false`."""
        try:
            return build_filter(filter_type, expression, self.enable_property_filter)
        except FilterError as exc:
            code = (BrokerCode.FILTER_NOT_SUPPORTED if "enablePropertyFilter" in str(exc)
                    else BrokerCode.ILLEGAL_FILTER_EXPRESSION)
            raise BrokerError(code, str(exc), field="filterExpression") from None

    def group(self, group: str) -> SubscriptionGroupConfig:
        """A consumer group's settings (defaults when never configured)."""
        return self.subscriptions.get(group)

    def retry_max_times(self, group: str) -> int:
        return self.group(group).effective_retry_max_times(self.state.config.max_reconsume_times)

    # ---- lookup by message id (called by the query service) ---------------------------------------

    def typed_message(self, message_id: str) -> TypedMessage | None:
        """The delayed or transactional message sent with `message_id` (its UNIQ_KEY), on any
        member; None when none is known (never sent, or settled long enough ago to be forgotten)."""
        found = self.transactions.find(message_id)
        if found is not None:
            half, ext = found
            state = HALF_STATE if half.state is TransactionState.OPEN else half.state.value
            view = _as_delivered(ext, self.transactions.real_message(ext))
            return TypedMessage(view, state, half.state is TransactionState.COMMITTED,
                                half.resolved_ms or half.store_ms)
        timer = self.timers.find(message_id)
        if timer is None:
            return None
        raw_due = timer.message.properties.get(PROPERTY_TIMER_OUT_MS, "")
        due = int(raw_due) if raw_due.isdigit() else timer.message.store_timestamp
        view = _as_delivered(timer.message, self.timers.real_message(timer.message, due))
        return TypedMessage(view, timer.state.value, timer.state is TimerState.DELIVERED, due)

    # ---- transactions ----------------------------------------------------------------------------

    async def end_transaction(self, account: Account, topic: str, transaction_id: str, resolution: str,
                              *, producer_group: str | None = None,
                              from_check: bool = False) -> TransactionState:
        """Commit or roll back a transaction (idempotent; see `TransactionService.end`)."""
        self.acl.authorize(account, topic=topic, right=Right.PUB)
        self.state.require_master()
        return await self.transactions.end(topic, transaction_id, resolution, producer_group=producer_group,
                                           from_check=from_check)

    def transaction(self, account: Account, topic: str, transaction_id: str) -> dict[str, Any]:
        """Where a transaction stands: its state and how many times it was checked back."""
        self.acl.authorize(account, topic=topic, right=Right.PUB)
        half = self.transactions.table.get(transaction_id)
        if half is None or half.topic != topic:
            raise BrokerError(BrokerCode.TRANSACTION_NOT_FOUND, f"no transaction {transaction_id} of topic "
                              f"{topic!r} on this broker", transactionId=transaction_id)
        return {"transactionId": transaction_id, "topic": topic, "state": half.state.value,
                "producerGroup": half.producer_group, "checkTimes": half.check_times}

    async def transaction_checks(self, account: Account, producer_group: str, max_checks: int,
                                 wait_ms: int) -> list[TransactionCheck]:
        """Check-backs for `producer_group`, long-polled (HTTP; gRPC pushes them over Telemetry).
        Only checks of topics the caller may produce to are handed out."""
        self.state.require_master()
        cap_ms = min(MAX_CHECK_WAIT_MS, self.state.config.broker_suspend_max_time_millis)
        wait_s = min(max(0, wait_ms), cap_ms) / 1000
        got = await self.transactions.hub.poll(producer_group, max_checks, wait_s)
        out = []
        for check in got:
            try:
                self.acl.authorize(account, topic=check.topic, right=Right.PUB)
            except BrokerError:
                continue  # asked again next round, to a producer that may resolve it
            out.append(check)
        return out

    # ---- timers ------------------------------------------------------------------------------------

    async def recall(self, account: Account, topic: str, handle: str) -> str:
        """Recall a delayed message before it is due; returns its message id (UNIQ_KEY)."""
        self.acl.authorize(account, topic=topic, right=Right.PUB)
        self.state.require_master()
        return await self.timers.recall(topic, handle)

    # ---- consumer-group settings --------------------------------------------------------------------

    def group_config(self, account: Account, group: str) -> dict[str, Any]:
        self.acl.authorize(account, group=group, right=Right.SUB)
        return self.group(group).to_wire(self.state.config.max_reconsume_times)

    async def update_group_config(self, account: Account, group: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Change a group's settings (admin; replicated)."""
        self.acl.authorize(account, admin=True)
        self.state.require_master()
        cfg = await self.subscriptions.update(group, doc)
        log.info("event=group_config_updated group=%s config=%s", group, cfg.to_record())
        return cfg.to_wire(self.state.config.max_reconsume_times)


def _as_delivered(copy: MessageExt, real: tuple[str, int | None, Message]) -> MessageExt:
    """A timer's or half's stored copy shown as the message it delivers: its topic, queue (-1
    when the store chooses at delivery) and properties; queue offset -1 (no place there yet). The
    copy's own place (commit-log offset, store host: its msgId) is kept."""
    topic, queue_id, msg = real
    return dataclasses.replace(copy, topic=topic, queue_id=-1 if queue_id is None else queue_id,
                               queue_offset=-1, properties=msg.all_properties())
