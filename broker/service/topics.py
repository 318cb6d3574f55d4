"""`TopicAdminService`: list, describe, create/update and delete topics, and find a queue's offset
for a timestamp. Changes are replicated (records in the log) and answered after commit."""

from __future__ import annotations

from typing import NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.service.acl import AccessControl, Account, Right
from broker.service.state import BrokerState
from broker.topics import TopicConfig, validate_topic


def check_queue(cfg: TopicConfig, topic: str, queue_id: int) -> None:
    """QUEUE_NOT_EXIST unless `queue_id` is one of `topic`'s queues (for reads: any of them)."""
    if queue_id >= cfg.queue_nums:
        raise BrokerError(
            BrokerCode.QUEUE_NOT_EXIST,
            f"topic {topic!r} has queues 0..{cfg.queue_nums - 1}",
            field="queueId",
        )


class QueueRange(NamedTuple):
    """One queue's offsets: `min_offset` is the oldest still stored, `max_offset` the next one."""

    queue_id: int
    min_offset: int
    max_offset: int


class TopicInfo(NamedTuple):
    """A topic's config and the offset range of each of its queues."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    queues: list[QueueRange]
    attributes: dict[str, str]


class TopicAdminService:
    """Topic admin for one broker. Callers: the front-ends (topic routes, mqadmin, console)."""

    def __init__(self, state: BrokerState, acl: AccessControl) -> None:
        self.state = state
        self.store = state.store
        self.acl = acl

    def existing(self, topic: str) -> TopicConfig:
        """The config of `topic`; TOPIC_NOT_EXIST when there is none."""
        cfg = self.store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        return cfg

    def names(self) -> list[str]:
        """The user topics of this broker set."""
        return self.store.topics.names()

    def info(self, topic: str) -> TopicInfo:
        """Config and queue ranges of `topic` (no access check: for callers that made one)."""
        cfg = self.existing(topic)
        store = self.store
        return TopicInfo(
            topic,
            cfg.read_queue_nums,
            cfg.write_queue_nums,
            cfg.perm,
            [
                QueueRange(q, store.min_offset(topic, q), store.max_offset(topic, q))
                for q in range(cfg.queue_nums)
            ],
            dict(cfg.attributes),
        )

    def readable(self, account: Account) -> list[TopicInfo]:
        """Config and queue ranges of every topic `account` may read (all of them for an admin
        or without ACL), by name: a console's topic list in one answer."""
        return [self.info(t) for t in self.names() if account.may_read_topic(t)]

    def get(self, account: Account, topic: str) -> TopicInfo:
        """Config and queue ranges of `topic`, for a caller with SUB on it."""
        validate_topic(topic)
        self.acl.authorize(account, topic=topic, right=Right.SUB)
        return self.info(topic)

    async def create_or_update(
        self,
        account: Account,
        topic: str,
        read_queue_nums: int | None,
        write_queue_nums: int | None,
        perm: int,
        attributes: dict[str, str | None] | None = None,
    ) -> TopicInfo:
        """Create `topic` or change its queues/perm/attributes (admin, master only); None keeps
        the current number (or the default for a new topic). `attributes` are merged in (a None
        value removes one); `message.type` is fixed once the topic exists."""
        validate_topic(topic)
        self.acl.authorize(account, admin=True)
        self.state.require_master()
        await self.store.topics.create_or_update(topic, read_queue_nums, write_queue_nums, perm, attributes)
        self.state.topics_changed()
        return self.info(topic)

    async def delete(self, account: Account, topic: str) -> None:
        """Delete `topic` and its queues (admin, master only)."""
        validate_topic(topic)
        self.acl.authorize(account, admin=True)
        self.state.require_master()
        await self.store.topics.delete(topic)
        self.state.topics_changed()

    def offset_for_time(self, account: Account, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First offset of the queue stored at or after `timestamp_ms` (its max offset if none)."""
        validate_topic(topic)
        self.acl.authorize(account, topic=topic, right=Right.SUB)
        check_queue(self.existing(topic), topic, queue_id)
        return self.store.offset_for_timestamp(topic, queue_id, timestamp_ms)
