"""`OffsetService`: a consumer group's committed offsets per topic and queue, with lag, and
committing them (replicated, master only)."""

from __future__ import annotations

from typing import NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.service.acl import AccessControl, Account, Right
from broker.service.state import BrokerState
from broker.topics import validate_topic


class OffsetRow(NamedTuple):
    """A group's committed offset of one queue (-1: none yet), the queue's max offset and the lag."""

    topic: str
    queue_id: int
    offset: int
    max_offset: int
    lag: int


class TopicLag(NamedTuple):
    """A group's lag summed over the queues of one topic."""

    topic: str
    queues: int
    lag: int


class GroupLag(NamedTuple):
    """A group's total lag and its lag per topic."""

    group: str
    lag: int
    topics: list[TopicLag]


class OffsetService:
    """Consumer offsets for one broker. Callers: the front-ends (offset routes, SDK, Spark)."""

    def __init__(self, state: BrokerState, acl: AccessControl) -> None:
        self.state = state
        self.store = state.store
        self.acl = acl

    def groups(self) -> list[str]:
        """Groups with committed offsets."""
        return self.store.offsets.groups()

    def lag_summaries(self, account: Account) -> list[GroupLag]:
        """Every group `account` may read, with its lag per topic it may read (everything for an
        admin or without ACL): a console's group list in one answer."""
        out = []
        for group in self.groups():
            if not account.may_read_group(group):
                continue
            per_topic: dict[str, list[OffsetRow]] = {}
            for row in self._rows(group, None):
                if account.may_read_topic(row.topic):
                    per_topic.setdefault(row.topic, []).append(row)
            topics = [TopicLag(t, len(rows), sum(r.lag for r in rows)) for t, rows in per_topic.items()]
            out.append(GroupLag(group, sum(t.lag for t in topics), topics))
        return out

    def query(self, account: Account, group: str, topic: str | None = None) -> list[OffsetRow]:
        """Every queue of the topics `group` committed offsets for (or of `topic` only, with a row
        per queue even before any commit), sorted by topic then queue."""
        if topic is not None:
            validate_topic(topic, allow_system=True)
        self.acl.authorize(account, topic=topic, group=group, right=Right.SUB)
        return self._rows(group, topic)

    def _rows(self, group: str, topic: str | None) -> list[OffsetRow]:
        store = self.store
        committed = store.offsets.offsets_of(group, topic)
        if topic is not None and topic not in committed and store.topics.get(topic) is not None:
            committed[topic] = {}
        rows = []
        for t, queues in sorted(committed.items()):
            cfg = store.topics.get(t)
            qids = sorted(set(queues) | set(range(cfg.queue_nums if cfg else 0)))
            for q in qids:
                off = queues.get(q, -1)
                hi = store.max_offset(t, q) if cfg else 0
                rows.append(OffsetRow(t, q, off, hi, max(0, hi - max(off, 0))))
        return rows

    async def commit(
        self, account: Account, group: str, topic: str, offsets: dict[str, int]
    ) -> list[OffsetRow]:
        """Commit `offsets` (queueId as the wire spells it → offset, each within [0, max]) for
        `group` on `topic`, all or none; the group's rows of `topic` after the commit."""
        validate_topic(topic, allow_system=True)
        self.acl.authorize(account, topic=topic, group=group, right=Right.SUB)
        self.state.require_master()
        store = self.store
        cfg = store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        checked: dict[int, int] = {}
        for key, off in offsets.items():
            if not (key.isascii() and key.isdigit()) or int(key) >= cfg.queue_nums:
                raise BrokerError(
                    BrokerCode.QUEUE_NOT_EXIST,
                    f"offsets: queue {key!r} is not in 0..{cfg.queue_nums - 1}",
                    field=f"offsets.{key}",
                )
            hi = store.max_offset(topic, int(key))
            if not 0 <= off <= hi:
                raise BrokerError(
                    BrokerCode.OFFSET_OUT_OF_RANGE,
                    f"offsets.{key}: {off} is outside [0, {hi}]",
                    field=f"offsets.{key}",
                    minOffset=0,
                    maxOffset=hi,
                )
            checked[int(key)] = off
        if checked:
            await store.offsets.commit_many(group, topic, checked)
        return self._rows(group, topic)
