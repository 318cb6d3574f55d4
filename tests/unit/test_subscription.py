"""Consumer-group settings: validation, replicated records, defaults."""

import pytest

from broker.errors import BrokerError
from broker.retry_policy import RetryPolicyType
from broker.subscription import SubscriptionGroupConfig, SubscriptionGroupManager, apply_changes


async def test_update_writes_a_record_that_every_member_applies():
    written = []
    leader = SubscriptionGroupManager()
    follower = SubscriptionGroupManager()

    async def writer(topic, record):
        written.append((topic, record))
        leader.apply_record(record)
        follower.apply_record(record)

    leader.set_writer(writer)
    cfg = await leader.update("g1", {"retryMaxTimes": 3, "retryPolicy": {"type": "EXPONENTIAL"},
                                     "consumeMessageOrderly": True})
    assert cfg.retry_max_times == 3 and cfg.retry_policy.type is RetryPolicyType.EXPONENTIAL
    assert follower.get("g1") == cfg and written[0][0] == "RMQ_SYS_SUBSCRIPTION_GROUP"
    assert cfg.nack_delay_ms(0) == 5_000 and SubscriptionGroupConfig("g").nack_delay_ms(3) == 0
    cfg = await leader.update("g1", {"retryMaxTimes": None})  # back to the broker's default
    assert cfg.effective_retry_max_times(16) == 16 and cfg.consume_message_orderly is True
    await leader.delete("g1")
    assert follower.get("g1") == SubscriptionGroupConfig("g1")
    copy = SubscriptionGroupManager()
    copy.restore(leader.snapshot())
    assert copy.configured() == leader.configured()


def test_orderly_defaults_to_the_topic_type():
    assert SubscriptionGroupConfig("g").orderly_for(fifo_topic=True)
    assert not SubscriptionGroupConfig("g").orderly_for(fifo_topic=False)
    assert not SubscriptionGroupConfig("g", consume_message_orderly=False).orderly_for(fifo_topic=True)


@pytest.mark.parametrize("doc,field", [
    ({"retryMaxTimes": -1}, "retryMaxTimes"), ({"retryMaxTimes": True}, "retryMaxTimes"),
    ({"retryPolicy": {"type": "X"}}, "retryPolicy.type"),
    ({"consumeMessageOrderly": "yes"}, "consumeMessageOrderly"),
    ({"maxRetry": 1}, "maxRetry"),
])
def test_bad_changes_name_the_field(doc, field):
    with pytest.raises(BrokerError) as err:
        apply_changes(SubscriptionGroupConfig("g"), doc)
    assert err.value.extra["field"] == field
