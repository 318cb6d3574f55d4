"""Topic message types: a message's type from its properties and the produce-time check."""

import pytest

from broker.errors import BrokerCode, BrokerError
from broker.message_type import TopicMessageType as T
from broker.message_type import check_message_type, message_type_of, topic_message_type


def test_message_type_precedence_as_rocketmq():
    assert message_type_of({}) is T.NORMAL
    assert message_type_of({"__SHARDINGKEY": "g"}) is T.FIFO
    assert message_type_of({"DELAY": "3", "__SHARDINGKEY": "g"}) is T.DELAY
    assert message_type_of({"TIMER_DELIVER_MS": "1"}) is T.DELAY
    assert message_type_of({"TRAN_MSG": "true", "DELAY": "3"}) is T.TRANSACTION


def test_topic_type_attribute():
    assert topic_message_type(None) is T.NORMAL and topic_message_type({"message.type": "fifo"}) is T.FIFO
    with pytest.raises(ValueError, match="NORMAL"):
        topic_message_type({"message.type": "ORDERED"})


def test_wrong_type_refused_with_its_code_mixed_and_dlq_take_anything():
    check_message_type("t", T.FIFO, T.FIFO)
    check_message_type("t", T.MIXED, T.DELAY)
    check_message_type("%DLQ%g", T.NORMAL, T.FIFO)
    with pytest.raises(BrokerError) as err:
        check_message_type("t", T.FIFO, T.NORMAL, "messages[2]")
    assert err.value.code is BrokerCode.MESSAGE_TYPE_MISMATCH and err.value.status == 400
    assert err.value.extra["field"] == "messages[2]" and err.value.extra["topicMessageType"] == "FIFO"


def test_delay_level_zero_is_no_delay_and_names_itself_on_a_delay_topic():
    """RocketMQ 4 schedules only a level > 0: level 0 is an undelayed (NORMAL) message, refused
    by a DELAY topic like any undelayed message, the field named."""
    assert message_type_of({"DELAY": "0"}) is T.NORMAL
    assert message_type_of({"DELAY": "0", "__SHARDINGKEY": "g"}) is T.FIFO
    assert message_type_of({"DELAY": "1"}) is T.DELAY
    check_message_type("t", T.NORMAL, message_type_of({"DELAY": "0"}), "messages[0]", {"DELAY": "0"})
    with pytest.raises(BrokerError) as err:
        check_message_type("t", T.DELAY, T.NORMAL, "messages[1]", {"DELAY": "0"})
    assert err.value.code is BrokerCode.MESSAGE_TYPE_MISMATCH
    assert err.value.extra["field"] == "messages[1].delayTimeLevel" and "delayTimeLevel 0" in err.value.detail
