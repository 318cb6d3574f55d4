"""`PullService`: read one queue from an offset, holding the caller (long polling) while the
queue has nothing new yet.

The per-message result is made by the front-end's `build(view, head, topic_at, props_at)`
straight from the stored bytes (no `MessageExt` in between on the hot path): the service owns the
rules (SUB right, topic readable, queue and offset ranges, the long-poll cap) and the metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from broker.errors import BrokerCode, BrokerError
from broker.filter import MessageFilter
from broker.service.acl import AccessControl, Account, Right
from broker.service.metrics import BrokerMetrics
from broker.service.state import BrokerState
from broker.service.topics import check_queue
from broker.store.get_service import DEFAULT_PULL_BYTES, MAX_PULL_MESSAGES, GetResult
from broker.topics import TopicConfig, validate_topic

__all__ = ["DEFAULT_PULL_BYTES", "MAX_PULL_MESSAGES", "GetResult", "MessageBuilder", "PullService"]

# build(view, head, topic_at, props_at) -> one message of the answer (see `read_messages`).
MessageBuilder = Callable[[memoryview, tuple, int, int], Any]


class PullService:
    """Pull by offset for one broker. Callers: the front-ends (HTTP hot path and route, gRPC)."""

    def __init__(self, state: BrokerState, acl: AccessControl, metrics: BrokerMetrics) -> None:
        self.state = state
        self.store = state.store
        self.acl = acl
        self.metrics = metrics
        self.config = state.config

    def readable_topic(self, topic: str) -> TopicConfig:
        """The config of `topic`; TOPIC_NOT_EXIST, or NO_PERMISSION when its perm (or the broker's
        `brokerPermission`) forbids reads."""
        if not self.config.broker_readable:
            raise BrokerError(BrokerCode.NO_PERMISSION, f"broker {self.config.broker_addr}: pulling is "
                              f"forbidden (brokerPermission={self.config.broker_permission})")
        cfg = self.store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if not cfg.is_readable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not readable (perm={cfg.perm})")
        return cfg

    async def pull(
        self,
        account: Account,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        wait_ms: int,
        build: MessageBuilder,
        message_filter: MessageFilter | None = None,
    ) -> GetResult:
        """Up to `max_messages` (1..MAX_PULL_MESSAGES) from `offset`, at most DEFAULT_PULL_BYTES
        of them; when `offset` is the queue's end, wait up to `wait_ms` (capped by
        brokerSuspendMaxTimeMillis) for a message to arrive. With `message_filter` only matching
        messages come back; `next_offset` moves past the others (an empty page may still move it)."""
        t0 = time.perf_counter()
        self.acl.authorize(account, topic=topic, right=Right.SUB)
        validate_topic(topic)
        check_queue(self.readable_topic(topic), topic, queue_id)
        store = self.store
        lo, hi = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        if offset < lo or offset > hi:
            raise BrokerError(
                BrokerCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} is outside [{lo}, {hi}] for {topic}/{queue_id}",
                field="offset",
                minOffset=lo,
                maxOffset=hi,
            )
        if offset == hi and wait_ms > 0 and self.config.long_polling_enable:
            # Held until the dispatcher signals a new message for this queue (no polling loop).
            wait_s = min(wait_ms, self.config.broker_suspend_max_time_millis) / 1000
            self.metrics.long_poll_waiters.inc()
            try:
                await store.wait_for_message(topic, queue_id, offset, wait_s)
            finally:
                self.metrics.long_poll_waiters.dec()
        result = store.read_messages(
            topic, queue_id, offset, max_messages, DEFAULT_PULL_BYTES, message_filter, build
        )
        tm = self.metrics.topic(topic)
        if result.messages:
            tm.get_messages.inc(len(result.messages))
        tm.get_latency.observe(time.perf_counter() - t0)
        return result
