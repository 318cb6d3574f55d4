"""Topic message types as RocketMQ 5: the topic attribute `message.type` and the type of a message.

A topic's type is NORMAL unless its `message.type` attribute says FIFO, DELAY, TRANSACTION or
MIXED (any type). A message's type is, first match wins (RocketMQ's `TopicMessageType
.parseFromMessageProperty`): TRANSACTION if it is transactional, DELAY if it carries a delay level
or a timer property, FIFO if it has a message group, else NORMAL. One departure: delay level 0 is
no delay (RocketMQ 4's broker schedules only a level > 0), so it does not make a message DELAY —
RocketMQ 5 would call it DELAY and store it at once, letting a DELAY topic take an undelayed
message that it refuses in every other form. A produce whose type differs
from its topic's (unless MIXED) is refused with MESSAGE_TYPE_MISMATCH, RocketMQ's
MESSAGE_PROPERTY_CONFLICT_WITH_TYPE; retry and DLQ topics take anything. The attribute is set when
the topic is created and cannot be changed after (RocketMQ's `TopicAttributes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from broker.errors import BrokerCode, BrokerError

MESSAGE_TYPE_ATTRIBUTE = "message.type"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
TIMER_PROPERTIES = (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_MS,
                    PROPERTY_TIMER_DELAY_SEC)
NO_DELAY_LEVEL = "0"


class TopicMessageType(StrEnum):
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"

    @classmethod
    def parse(cls, value: str | None) -> TopicMessageType:
        """The attribute's value (absent: NORMAL); ValueError naming the allowed ones."""
        if value is None or value == "":
            return cls.NORMAL
        try:
            return cls(value.strip().upper())
        except ValueError:
            raise ValueError(f"message.type must be one of {', '.join(t.value for t in cls)}, "
                             f"got {value!r}") from None


def topic_message_type(attributes: Mapping[str, str] | None) -> TopicMessageType:
    return TopicMessageType.parse((attributes or {}).get(MESSAGE_TYPE_ATTRIBUTE))


def timer_properties(properties: Mapping[str, str]) -> list[str]:
    """The timer properties a message carries (a delay level of 0 is none: no delay)."""
    return [k for k in TIMER_PROPERTIES if k in properties
            and not (k == PROPERTY_DELAY_TIME_LEVEL and properties[k] == NO_DELAY_LEVEL)]


def message_type_of(properties: Mapping[str, str]) -> TopicMessageType:
    """The type of a message from its properties, RocketMQ's order of precedence."""
    if properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
        return TopicMessageType.TRANSACTION
    if timer_properties(properties):
        return TopicMessageType.DELAY
    if PROPERTY_SHARDING_KEY in properties:
        return TopicMessageType.FIFO
    return TopicMessageType.NORMAL


def is_retry_or_dlq(topic: str) -> bool:
    return topic.startswith(("%RETRY%", "%DLQ%"))


def check_message_type(topic: str, topic_type: TopicMessageType, message_type: TopicMessageType,
                       where: str = "messages", properties: Mapping[str, str] | None = None) -> None:
    """Refuse a message whose type is not its topic's (MESSAGE_TYPE_MISMATCH). With the message's
    `properties`, a delay level of 0 sent to a DELAY topic is named as the cause."""
    if topic_type is TopicMessageType.MIXED or message_type is topic_type or is_retry_or_dlq(topic):
        return
    detail = f"topic {topic!r} takes {topic_type.value} messages, this one is {message_type.value}"
    if (topic_type is TopicMessageType.DELAY and properties is not None
            and properties.get(PROPERTY_DELAY_TIME_LEVEL) == NO_DELAY_LEVEL):
        where = f"{where}.delayTimeLevel"
        detail += " (delayTimeLevel 0 means no delay: send a level of 1 or more)"
    raise BrokerError(BrokerCode.MESSAGE_TYPE_MISMATCH, detail, field=where, topic=topic,
                      topicMessageType=topic_type.value, messageType=message_type.value)
