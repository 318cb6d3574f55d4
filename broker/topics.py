"""Topic configuration (queue numbers, permission) and topic-name validation.

A topic name is RocketMQ's: 1-127 characters of `[%|a-zA-Z0-9_-]`. The character set has no `/`
and no `.`, so a topic name can never name a path outside `{storePathRootDir}/consumequeue/`.
Reserved names (RocketMQ's system topics and our `RMQ_SYS_` record topics) are refused for users.

Topic configs are replicated: `TopicConfigManager` writes each change as a record into the commit
log (system topic `RMQ_SYS_TOPIC_CONFIG`, via the writer the message store installs) and applies
records as the reput dispatcher feeds them, on every member — so slaves and a new master after a
failover know exactly the topics the old master had.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from broker.errors import BrokerCode, BrokerError
from broker.message_type import MESSAGE_TYPE_ATTRIBUTE, TopicMessageType
from wire.names import MAX_TOPIC_LENGTH as MAX_TOPIC_LENGTH  # re-exported: the name rules
from wire.names import TOPIC_NAME_RE as TOPIC_NAME_RE

log = logging.getLogger(__name__)

MAX_QUEUE_NUMS = 1024

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
DEFAULT_PERM = PERM_READ | PERM_WRITE

SYSTEM_TOPIC_PREFIX = "RMQ_SYS_"
SYS_TOPIC_CONFIG = "RMQ_SYS_TOPIC_CONFIG"
SYS_CONSUMER_OFFSETS = "RMQ_SYS_CONSUMER_OFFSETS"
SYS_BROKER_MEMBERS = "RMQ_SYS_BROKER_MEMBERS"
SYS_STATE_SNAPSHOT = "RMQ_SYS_STATE_SNAPSHOT"  # the whole replicated state, re-written ahead of retention
RESERVED_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "rmq_sys_REVIVE_LOG", "DefaultHeartBeatSyncerTopic",
})


def is_system_topic(name: str) -> bool:
    """Topics the broker itself writes (never created, produced to or deleted by users)."""
    return name.upper().startswith(SYSTEM_TOPIC_PREFIX) or name in RESERVED_TOPICS


def validate_topic(name: Any, *, allow_system: bool = False) -> str:
    """Return `name` if it is a legal topic name; BrokerError(INVALID_TOPIC) saying why otherwise."""
    if not isinstance(name, str) or not name:
        raise BrokerError(BrokerCode.INVALID_TOPIC, "topic name is empty", topic=name)
    if len(name) > MAX_TOPIC_LENGTH:
        raise BrokerError(BrokerCode.INVALID_TOPIC,
                          f"topic name is {len(name)} characters, at most {MAX_TOPIC_LENGTH}", topic=name)
    if not TOPIC_NAME_RE.match(name):
        bad = next(c for c in name if not re.match(r"[%|a-zA-Z0-9_-]", c))
        raise BrokerError(BrokerCode.INVALID_TOPIC,
                          f"topic name contains {bad!r}; allowed: letters, digits, % | _ -", topic=name)
    if not allow_system and is_system_topic(name):
        raise BrokerError(BrokerCode.INVALID_TOPIC, f"topic name {name!r} is reserved", topic=name)
    return name


@dataclass(slots=True)
class TopicConfig:
    """One topic: read/write queue numbers, permission bits (RocketMQ's PermName) and attributes
    (RocketMQ 5's `TopicAttributes`: `message.type`)."""

    topic_name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = DEFAULT_PERM
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def queue_nums(self) -> int:
        """Queues that exist on disk (RocketMQ serves reads on readQueueNums, writes on writeQueueNums)."""
        return max(self.read_queue_nums, self.write_queue_nums)

    def is_readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    def is_writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    def check_writable(self) -> TopicConfig:
        """This config, if its permission lets messages in; NO_PERMISSION otherwise."""
        if not self.perm & PERM_WRITE:
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {self.topic_name!r} is not writeable "
                              f"(perm {self.perm})", topic=self.topic_name)
        return self

    def check_write_queue(self, queue_id: Any, field: str = "queueId") -> int:
        """`queue_id` if it is one of the write queues; QUEUE_NOT_EXIST naming `field` otherwise."""
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) \
                or not 0 <= queue_id < self.write_queue_nums:
            raise BrokerError(BrokerCode.QUEUE_NOT_EXIST, f"queue {queue_id!r} does not exist: topic "
                              f"{self.topic_name!r} has {self.write_queue_nums} write queues",
                              topic=self.topic_name, queueId=queue_id, field=field)
        return queue_id


def validate_queue_nums(read_queue_nums: Any, write_queue_nums: Any, perm: Any) -> None:
    """BrokerError(INVALID_REQUEST) naming the bad field."""
    for name, value in (("readQueueNums", read_queue_nums), ("writeQueueNums", write_queue_nums)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_QUEUE_NUMS:
            raise BrokerError(BrokerCode.INVALID_REQUEST,
                              f"{name} must be an integer in 1..{MAX_QUEUE_NUMS}, got {value!r}", field=name)
    if not isinstance(perm, int) or isinstance(perm, bool) or not 0 <= perm <= 15:
        raise BrokerError(BrokerCode.INVALID_REQUEST, f"perm must be an integer in 0..15, got {perm!r}",
                          field="perm")


# Attribute -> (check of a value, changeable after creation). RocketMQ's message.type is fixed once set.
TOPIC_ATTRIBUTES: dict[str, tuple[Callable[[str], object], bool]] = {
    MESSAGE_TYPE_ATTRIBUTE: (TopicMessageType.parse, False),
}


def merge_attributes(current: dict[str, str] | None, changes: Any, exists: bool) -> dict[str, str]:
    """`current` with `changes` applied ({key: value}, a None value removes the key), checked
    against `TOPIC_ATTRIBUTES`; INVALID_REQUEST naming `attributes.<key>`. On an existing topic a
    fixed attribute may only be restated."""
    if changes is None:
        return dict(current or {})
    if not isinstance(changes, dict):
        raise BrokerError(BrokerCode.INVALID_REQUEST, "attributes must be an object", field="attributes")
    out = dict(current or {})
    for key, value in changes.items():
        where = f"attributes.{key}"
        known = TOPIC_ATTRIBUTES.get(key)
        if known is None:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"unknown topic attribute {key!r}; known: "
                              f"{', '.join(sorted(TOPIC_ATTRIBUTES))}", field=where)
        check, changeable = known
        if value is not None:
            if not isinstance(value, str):
                raise BrokerError(BrokerCode.INVALID_REQUEST, f"{key} must be a string", field=where)
            try:
                value = str(check(value))
            except ValueError as exc:
                raise BrokerError(BrokerCode.INVALID_REQUEST, str(exc), field=where) from None
        before = out.get(key) or (str(check("")) if exists else None)
        if exists and not changeable and value != before:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"topic attribute {key} cannot be changed once the "
                              f"topic exists (it is {before}); delete and create the topic again",
                              field=where)
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


RecordWriter = Callable[[str, dict[str, Any]], Awaitable[None]]


class TopicConfigManager:
    """The topic table. Callers: the HTTP admin routes (`create_or_update`, `delete`), the produce
    path (`get`, `auto_create`), the reput dispatcher (`apply_record`, `ensure_from_data`)."""

    def __init__(self, default_queue_nums: int = 8, auto_create: bool = True) -> None:
        self.default_queue_nums = default_queue_nums
        self.auto_create_enable = auto_create
        self._topics: dict[str, TopicConfig] = {}
        self._writer: RecordWriter | None = None
        self.on_delete: Callable[[str], None] | None = None  # the store drops the topic's queues
        # topic -> log position of its last delete record: a message of the topic stored below it
        # belongs to a deleted incarnation and is never dispatched again (a restart re-dispatches
        # from the queue furthest behind, which may be before a delete and a re-creation).
        self.deleted_at: dict[str, int] = {}
        self._creating: dict[str, asyncio.Future[TopicConfig]] = {}

    def set_writer(self, writer: RecordWriter) -> None:
        """Installed by the message store: appends a record to the commit log and waits for commit."""
        self._writer = writer

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self._topics

    def names(self, include_system: bool = False) -> list[str]:
        return sorted(t for t in self._topics if include_system or not is_system_topic(t))

    def all(self) -> dict[str, TopicConfig]:
        return dict(self._topics)

    async def create_or_update(self, topic: str, read_queue_nums: int | None = None,
                               write_queue_nums: int | None = None, perm: int = DEFAULT_PERM,
                               attributes: dict[str, str | None] | None = None) -> TopicConfig:
        """Validate, write the change to the log (master only) and return the applied config.
        `attributes` are merged into the topic's (see `merge_attributes`)."""
        validate_topic(topic)
        rq = self.default_queue_nums if read_queue_nums is None else read_queue_nums
        wq = rq if write_queue_nums is None else write_queue_nums
        validate_queue_nums(rq, wq, perm)
        current = self._topics.get(topic)
        merged = merge_attributes(current.attributes if current else None, attributes, current is not None)
        cfg = TopicConfig(topic, rq, wq, perm, merged)
        await self._write(cfg.to_record())  # returns once the dispatcher applied it
        return self._topics.get(topic, cfg)

    async def writable(self, topic: str) -> TopicConfig:
        """The config of a topic messages may be put to: created first when it does not exist and
        autoCreateTopicEnable (TOPIC_NOT_EXIST otherwise), NO_PERMISSION when not writable. The one
        home of the rule for every producer path."""
        cfg = self._topics.get(topic)
        if cfg is None:
            cfg = await self.auto_create(topic)
        return cfg.check_writable()

    async def auto_create(self, topic: str) -> TopicConfig:
        """Create `topic` with defaultTopicQueueNums if autoCreateTopicEnable, else TOPIC_NOT_EXIST."""
        existing = self._topics.get(topic)
        if existing is not None:
            return existing
        validate_topic(topic)
        if not self.auto_create_enable:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist "
                              "(autoCreateTopicEnable=false)", topic=topic)
        creating = self._creating.get(topic)
        if creating is not None:  # concurrent first puts to a new topic write one record
            return await asyncio.shield(creating)
        task = asyncio.ensure_future(self.create_or_update(topic))
        self._creating[topic] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._creating.pop(topic, None)
            else:
                task.add_done_callback(lambda _t: self._creating.pop(topic, None))

    async def delete(self, topic: str) -> None:
        validate_topic(topic)
        if topic not in self._topics:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        await self._write({"topic_name": topic, "deleted": True})

    async def _write(self, record: dict[str, Any]) -> None:
        if self._writer is None:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "topic store is not started")
        await self._writer(SYS_TOPIC_CONFIG, record)

    def apply_record(self, record: dict[str, Any], phys: int = -1) -> None:
        """Apply a replicated topic record stored at log position `phys` (dispatcher, on every
        member, in log order)."""
        topic = record.get("topic_name")
        if not isinstance(topic, str):
            log.error("event=bad_topic_record record=%r", record)
            return
        if record.get("deleted"):
            self.deleted_at[topic] = max(self.deleted_at.get(topic, -1), phys)
            self._apply_delete(topic)
            return
        attributes = record.get("attributes")  # absent in records written before attributes existed
        self._topics[topic] = TopicConfig(topic, int(record["read_queue_nums"]),
                                          int(record["write_queue_nums"]), int(record["perm"]),
                                          dict(attributes) if isinstance(attributes, dict) else {})

    def _apply_delete(self, topic: str) -> None:
        if self._topics.pop(topic, None) is not None:
            log.info("event=topic_deleted topic=%s", topic)
        if self.on_delete is not None:  # also when unknown here: what it left elsewhere goes too
            self.on_delete(topic)

    def snapshot(self) -> dict[str, Any]:
        """The whole table (configs and delete positions) for a state snapshot."""
        return {"topics": [cfg.to_record() for cfg in self._topics.values()],
                "deletedAt": dict(self.deleted_at)}

    def restore(self, snapshot: Any) -> None:
        """Replace the table by a `snapshot()`'s."""
        snapshot = snapshot or {}
        self._topics = {r["topic_name"]: TopicConfig(str(r["topic_name"]), int(r["read_queue_nums"]),
                                                     int(r["write_queue_nums"]), int(r["perm"]))
                        for r in snapshot.get("topics", ())}
        self.deleted_at = {str(t): int(p) for t, p in (snapshot.get("deletedAt") or {}).items()}

    def ensure_from_data(self, topic: str, queue_id: int) -> None:
        """A message of a topic we have no record for (system topics, or data older than the
        records): register it so its queues are served."""
        cfg = self._topics.get(topic)
        if cfg is None:
            nums = max(queue_id + 1, 1 if is_system_topic(topic) else self.default_queue_nums)
            self._topics[topic] = TopicConfig(topic, nums, nums, DEFAULT_PERM)
        elif queue_id >= cfg.queue_nums:
            cfg.read_queue_nums = max(cfg.read_queue_nums, queue_id + 1)
            cfg.write_queue_nums = max(cfg.write_queue_nums, queue_id + 1)
