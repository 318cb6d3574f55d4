"""`GetMessageService`: reads of committed messages — by queue offset (pull), by commit-log offset
(a msgId), and queue offsets by time.

Every read goes through a consume queue to the commit log's bytes, and every message is checked
(layout and body CRC) before it is handed out: the page cache can rot after dispatch, and a corrupt
message is reported (MESSAGE_CORRUPTED), never served. Callers: the pull and admin routes, the
group-consumption service, through `DefaultMessageStore`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.errors import BrokerCode, BrokerError
from broker.message import (
    FIXED_OVERHEAD,
    MESSAGE_MAGIC_CODE,
    PHY_POS_POSITION,
    STORE_TIMESTAMP_POSITION,
    MessageExt,
    MessageHead,
    bytes_to_properties,
    decode_message,
    message_ext_from,
    parse_message,
)
from broker.store.base import CommitLog
from broker.store.consume_queue import ConsumeQueue
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.topics import TopicConfigManager, validate_topic
from wire.limits import MAX_PULL_MESSAGES

if TYPE_CHECKING:
    from broker.filter import MessageFilter

_LONG = struct.Struct(">q")
_SIZE_AND_MAGIC = struct.Struct(">ii")
FILTER_SCAN_UNITS = 1024  # consume-queue units a filtered read looks at before it answers
DEFAULT_PULL_BYTES = 4 * 1024 * 1024

BuildMessage = Callable[[memoryview, MessageHead, int, int], Any]
"""build(view, head, topic start, properties start): one read message as the caller wants it."""


@dataclass(slots=True)
class GetResult:
    """Messages read from one queue; `next_offset` is where the next pull starts."""

    messages: list[Any]
    next_offset: int
    min_offset: int
    max_offset: int


def decode_ext(view: memoryview, head: MessageHead, topic_at: int, props_at: int) -> MessageExt:
    """`read_messages`' build for a `MessageExt` (what `get_messages` returns)."""
    return message_ext_from(view, head, topic_at, props_at, head.physical_offset)  # checked by read_messages


class GetMessageService:
    """Reads. State: none of its own (queues, topics and the log are the store's)."""

    def __init__(self, topics: TopicConfigManager, queues: ConsumeQueueStore, commit_log: CommitLog) -> None:
        self.topics = topics
        self.queues = queues
        self.commit_log = commit_log

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        validate_topic(topic, allow_system=True)
        cfg = self.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if not isinstance(queue_id, int) or not 0 <= queue_id < cfg.queue_nums:
            raise BrokerError(BrokerCode.QUEUE_NOT_EXIST, f"queue {queue_id!r} does not exist: topic "
                              f"{topic!r} has {cfg.queue_nums} queues", topic=topic, queueId=queue_id)
        return self.queues.get((topic, queue_id))

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queue(topic, queue_id)
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queue(topic, queue_id)
        return cq.max_offset if cq else 0

    def queue_offsets(self, topic: str) -> list[tuple[int, int, int]]:
        """[(queueId, minOffset, maxOffset)] of every queue of `topic`."""
        cfg = self.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        out = []
        for q in range(cfg.queue_nums):
            cq = self.queues.get((topic, q))
            out.append((q, cq.min_offset if cq else 0, cq.max_offset if cq else 0))
        return out

    def get_messages(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
                     max_bytes: int = DEFAULT_PULL_BYTES,
                     message_filter: MessageFilter | None = None) -> GetResult:
        """Read committed messages from `offset`. `message_filter` (None = all; `broker.filter`) is
        checked first on the consume-queue unit's tags code, then on the stored properties, so
        a message that does not match is never returned; the units it skips still move
        `next_offset`. OFFSET_OUT_OF_RANGE outside [min, max]."""
        return self.read_messages(topic, queue_id, offset, max_messages, max_bytes, message_filter,
                                  decode_ext)

    def read_messages(self, topic: str, queue_id: int, offset: int, max_messages: int,
                      max_bytes: int, message_filter: MessageFilter | None,
                      build: BuildMessage) -> GetResult:
        """`get_messages` with the per-message result made by `build(view, head, topic_at,
        props_at)` straight from the mapped bytes (the pull route builds its JSON there, with no
        `MessageExt` in between). Every message is checked (layout and body CRC) before `build`
        sees it; the view is only valid inside `build` (it aliases the mapped file).

        The CRC is checked on every read, not only at dispatch: the consume queue points at bytes
        in the page cache that can rot after they were dispatched, and a corrupt message must be
        reported (MESSAGE_CORRUPTED), never served. It costs ~1 us per KB."""
        cq = self._queue(topic, queue_id)
        if not isinstance(max_messages, int) or not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise BrokerError(BrokerCode.INVALID_REQUEST,
                              f"maxMessages must be in 1..{MAX_PULL_MESSAGES}, got {max_messages!r}",
                              field="maxMessages")
        lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
        if not isinstance(offset, int) or not lo <= offset <= hi:
            raise BrokerError(BrokerCode.OFFSET_OUT_OF_RANGE, f"offset {offset!r} outside [{lo}, {hi}] of "
                              f"{topic}/{queue_id}", minOffset=lo, maxOffset=hi)
        if cq is None or offset == hi:
            return GetResult([], offset, lo, hi)
        f = None if message_filter is None or message_filter.match_all else message_filter
        # A filter reads on past what it skips, up to a budget (RocketMQ's maxFilterMessageSize):
        # a pull whose filter matches nothing answers at once with next_offset moved on.
        scan = max_messages if f is None else max(max_messages, FILTER_SCAN_UNITS)
        out: list[Any] = []
        size_sum = 0
        next_offset = offset
        get_data = self.commit_log.get_data
        for phys, size, code in cq.get_units(offset, scan):
            if out and (len(out) >= max_messages or size_sum + size > max_bytes):
                break
            if size > 0 and (f is None or f.accepts_code(code)):
                try:
                    view = get_data(phys, size)
                    head, topic_at, props_at = parse_message(view, phys)
                except BrokerError:
                    if out:
                        break  # return what we have; the next pull meets the error
                    raise
                if f is None or f.matches(bytes_to_properties(view[props_at + 2:head.total_size])):
                    out.append(build(view, head, topic_at, props_at))
                    size_sum += size
                del view
            next_offset += 1
        return GetResult(out, next_offset, lo, hi)

    def look_message_by_offset(self, commit_log_offset: int, size: int | None = None) -> MessageExt:
        """The message whose bytes start at `commit_log_offset` (a msgId's offset). Raises
        MESSAGE_NOT_FOUND / MESSAGE_CORRUPTED."""
        if not isinstance(commit_log_offset, int) or commit_log_offset < 0:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"bad commit-log offset {commit_log_offset!r}")
        if size is None:
            # A message starts here only if the magic is there and its stamped PHYSICALOFFSET
            # names this very offset (a msgId pointing into the middle of something is "not found").
            head = self.commit_log.get_data(commit_log_offset, PHY_POS_POSITION + 8)
            size, magic = _SIZE_AND_MAGIC.unpack_from(head, 0)
            stamped = _LONG.unpack_from(head, PHY_POS_POSITION)[0]
            if magic != MESSAGE_MAGIC_CODE or stamped != commit_log_offset or size < FIXED_OVERHEAD:
                raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND,
                                  f"no message starts at commit-log offset {commit_log_offset}",
                                  commitLogOffset=commit_log_offset)
        return decode_message(self.commit_log.get_data(commit_log_offset, size), commit_log_offset)

    def store_time_of(self, phys: int, size: int) -> int | None:
        try:
            return _LONG.unpack_from(self.commit_log.get_data(phys + STORE_TIMESTAMP_POSITION, 8))[0]
        except BrokerError:
            return None

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """First queue offset stored at or after `ts_ms` (max offset if none)."""
        cq = self._queue(topic, queue_id)
        return cq.offset_for_timestamp(ts_ms, self.store_time_of) if cq else 0

