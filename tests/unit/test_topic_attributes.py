"""Topic attributes (RocketMQ 5's `message.type`): checked, replicated in the topic record, fixed
once the topic exists."""

import pytest

from broker.errors import BrokerCode, BrokerError
from broker.topics import TopicConfigManager, merge_attributes


async def test_attributes_ride_in_the_topic_record_and_message_type_is_fixed():
    leader, follower = TopicConfigManager(), TopicConfigManager()

    async def writer(_topic, record):
        leader.apply_record(record)
        follower.apply_record(record)

    leader.set_writer(writer)
    cfg = await leader.create_or_update("T", 4, 4, 6, {"message.type": "fifo"})
    assert cfg.attributes == {"message.type": "FIFO"} == follower.get("T").attributes
    cfg = await leader.create_or_update("T", 8, 8, 6)  # queues change, the type stays
    assert cfg.read_queue_nums == 8 and cfg.attributes == {"message.type": "FIFO"}
    await leader.create_or_update("T", 8, 8, 6, {"message.type": "FIFO"})  # restated: fine
    with pytest.raises(BrokerError) as err:
        await leader.create_or_update("T", 8, 8, 6, {"message.type": "NORMAL"})
    assert err.value.code == BrokerCode.INVALID_REQUEST
    assert err.value.extra["field"] == "attributes.message.type"
    await leader.create_or_update("U", 1, 1, 6)  # created without: NORMAL, and fixed as such
    await leader.create_or_update("U", 1, 1, 6, {"message.type": "NORMAL"})
    with pytest.raises(BrokerError):
        await leader.create_or_update("U", 1, 1, 6, {"message.type": "DELAY"})
    follower.apply_record({"topic_name": "Old", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 6})
    assert follower.get("Old").attributes == {}  # a record from before attributes


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"message.type": "ORDERED"}, "attributes.message.type"),
        ({"message.type": 5}, "attributes.message.type"),
        ({"queue.type": "x"}, "attributes.queue.type"),
        ("FIFO", "attributes"),
    ],
)
def test_bad_attributes_name_the_field(changes, field):
    with pytest.raises(BrokerError) as err:
        merge_attributes({}, changes, exists=False)
    assert err.value.extra["field"] == field
