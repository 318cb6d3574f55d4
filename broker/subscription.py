"""Consumer-group settings (RocketMQ's `SubscriptionGroupConfig`), replicated through the log.

Per group: `retryMaxTimes` (deliveries after the first before the DLQ; default the broker's
`maxReconsumeTimes`, 16), the redelivery backoff `retryPolicy` (`broker.retry_policy`: RocketMQ 5's
CUSTOMIZED or EXPONENTIAL, with its defaults; none set = a nacked message comes back at once, as
LedgerMQ's nack always did, where RocketMQ applies CUSTOMIZED to every group), and
`consumeMessageOrderly` — true: the group consumes in order (a message group's next message only
after the previous one is settled); false: concurrently; absent: in order on FIFO topics only.
RocketMQ requires an orderly group for FIFO consumption; defaulting to the topic's type spares an
HTTP user the extra step, and an explicit value behaves as RocketMQ's.

Changes are records in `RMQ_SYS_SUBSCRIPTION_GROUP`, applied on every member in log order and
replayed at start, so a new master applies the same policy. Callers: the admin API and `mqadmin`
(`update`, `delete`, `get`, `groups`), the pop service (`get`), the dispatcher (`apply_record`),
the gRPC endpoint (settings it sends to clients).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from broker.errors import BrokerCode, BrokerError
from broker.retry_policy import RetryPolicy, RetryPolicyError
from broker.topics import TOPIC_NAME_RE

log = logging.getLogger(__name__)

SYS_SUBSCRIPTION_GROUP = "RMQ_SYS_SUBSCRIPTION_GROUP"
MAX_RETRY_TIMES = 1000
_FIELDS = {"retryMaxTimes", "retryPolicy", "consumeMessageOrderly"}


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    """One group's settings; `retry_max_times`/`consume_message_orderly` None = the default."""

    group_name: str
    retry_max_times: int | None = None
    retry_policy: RetryPolicy | None = None
    consume_message_orderly: bool | None = None

    def effective_retry_max_times(self, broker_default: int) -> int:
        return broker_default if self.retry_max_times is None else self.retry_max_times

    def nack_delay_ms(self, reconsume_times: int) -> int:
        """How long a nacked message stays invisible (0 without a retry policy)."""
        return 0 if self.retry_policy is None else self.retry_policy.delay_ms(reconsume_times)

    def orderly_for(self, fifo_topic: bool) -> bool:
        """Does this group consume a topic in order?"""
        return fifo_topic if self.consume_message_orderly is None else self.consume_message_orderly

    def to_wire(self, broker_default_retry: int) -> dict[str, Any]:
        """The admin API's form (effective values, and which ones are explicit)."""
        return {"group": self.group_name,
                "retryMaxTimes": self.effective_retry_max_times(broker_default_retry),
                "retryPolicy": None if self.retry_policy is None else self.retry_policy.to_dict(),
                "consumeMessageOrderly": self.consume_message_orderly}

    def to_record(self) -> dict[str, Any]:
        return {"group": self.group_name, "retryMaxTimes": self.retry_max_times,
                "retryPolicy": None if self.retry_policy is None else self.retry_policy.to_dict(),
                "consumeMessageOrderly": self.consume_message_orderly}


def validate_group(name: Any) -> str:
    """A consumer group name: the characters and length of a topic name (INVALID_REQUEST)."""
    if not isinstance(name, str) or not TOPIC_NAME_RE.match(name):
        raise BrokerError(BrokerCode.INVALID_REQUEST, "group must be 1-127 of letters, digits, % | _ -",
                          field="group")
    return name


def apply_changes(current: SubscriptionGroupConfig, doc: Any) -> SubscriptionGroupConfig:
    """`current` with the fields `doc` sets (null resets a field to its default); INVALID_REQUEST
    naming the bad field."""
    if not isinstance(doc, dict):
        raise BrokerError(BrokerCode.INVALID_REQUEST, "expected a JSON object", field="body")
    unknown = set(doc) - _FIELDS
    if unknown:
        raise BrokerError(BrokerCode.INVALID_REQUEST, f"unknown field {sorted(unknown)[0]!r}; "
                          f"known: {', '.join(sorted(_FIELDS))}", field=sorted(unknown)[0])
    changes: dict[str, Any] = {}
    if "retryMaxTimes" in doc:
        n = doc["retryMaxTimes"]
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_RETRY_TIMES):
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"retryMaxTimes must be 0..{MAX_RETRY_TIMES}",
                              field="retryMaxTimes")
        changes["retry_max_times"] = n
    if "retryPolicy" in doc:
        try:
            changes["retry_policy"] = (None if doc["retryPolicy"] is None
                                       else RetryPolicy.from_dict(doc["retryPolicy"]))
        except RetryPolicyError as exc:
            raise BrokerError(BrokerCode.INVALID_REQUEST, str(exc), field=exc.field) from None
    if "consumeMessageOrderly" in doc:
        v = doc["consumeMessageOrderly"]
        if v is not None and not isinstance(v, bool):
            raise BrokerError(BrokerCode.INVALID_REQUEST, "consumeMessageOrderly must be true, false or null",
                              field="consumeMessageOrderly")
        changes["consume_message_orderly"] = v
    return replace(current, **changes)


RecordWriter = Callable[[str, dict[str, Any]], Awaitable[None]]


class SubscriptionGroupManager:
    """The replicated group settings of one broker set."""

    def __init__(self, writer: RecordWriter | None = None) -> None:
        self._writer = writer
        self._groups: dict[str, SubscriptionGroupConfig] = {}

    def set_writer(self, writer: RecordWriter) -> None:
        self._writer = writer

    def get(self, group: str) -> SubscriptionGroupConfig:
        """The group's settings (defaults for a group never configured)."""
        return self._groups.get(group) or SubscriptionGroupConfig(group)

    def configured(self) -> list[str]:
        return sorted(self._groups)

    async def update(self, group: str, doc: Any) -> SubscriptionGroupConfig:
        """Validate `doc` against the current settings, write the result (master; returns once
        applied here)."""
        validate_group(group)
        cfg = apply_changes(self.get(group), doc)
        await self._write(cfg.to_record())
        return self.get(group)

    async def delete(self, group: str) -> None:
        """Back to the defaults."""
        validate_group(group)
        await self._write({"group": group, "deleted": True})

    async def _write(self, record: dict[str, Any]) -> None:
        if self._writer is None:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "group settings are not started")
        await self._writer(SYS_SUBSCRIPTION_GROUP, record)

    def apply_record(self, record: dict[str, Any]) -> None:
        """Apply a replicated record (dispatcher, every member, log order)."""
        try:
            group = str(record["group"])
            if record.get("deleted"):
                self._groups.pop(group, None)
                return
            policy = record.get("retryPolicy")
            self._groups[group] = SubscriptionGroupConfig(
                group, record.get("retryMaxTimes"),
                None if policy is None else RetryPolicy.from_dict(policy),
                record.get("consumeMessageOrderly"))
        except (KeyError, TypeError, ValueError) as exc:
            log.error("event=bad_subscription_group_record record=%r error=%s", record, exc)

    def snapshot(self) -> dict[str, Any]:
        return {"groups": [c.to_record() for c in self._groups.values()]}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self._groups.clear()
        for record in snapshot.get("groups", []):
            self.apply_record(record)
