"""`ConsumeQueueStore`: every consume queue of a broker, by (topic, queueId) (RocketMQ 5's name).

Queues live under `{storePathRootDir}/consumequeue/{topic}/{queueId}/`. This object opens them at
start, creates one on a topic's first dispatched message, drops a deleted topic's, and applies
what the commit log's retention did (units pointing below its first byte are no longer served).
Callers: the reput dispatcher (`queue`, `create`), the reads (`get`), the store's recovery and
housekeeping (`load`, `truncate_dirty`, `correct_min_offsets`, `flush_all` …).
"""

from __future__ import annotations

import logging
import os
from collections.abc import ItemsView, ValuesView

from broker.store.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue
from broker.topics import TOPIC_NAME_RE

log = logging.getLogger("broker.store.message_store")

QueueKey = tuple[str, int]


class ConsumeQueueStore:
    """(topic, queueId) → `ConsumeQueue`."""

    def __init__(self, root_dir: str, file_size: int) -> None:
        self.root_dir = root_dir
        self.file_size = file_size
        self.queues: dict[QueueKey, ConsumeQueue] = {}

    def load(self) -> None:
        """Open and recover every queue on disk."""
        os.makedirs(self.root_dir, exist_ok=True)
        for topic in sorted(os.listdir(self.root_dir)):
            tdir = os.path.join(self.root_dir, topic)
            if not TOPIC_NAME_RE.match(topic) or not os.path.isdir(tdir):
                log.warning("event=cq_dir_ignored path=%s reason=not a topic name", tdir)
                continue
            for qname in sorted(os.listdir(tdir)):
                if not qname.isdigit():
                    continue
                cq = ConsumeQueue(self.root_dir, topic, int(qname), self.file_size)
                cq.load()
                cq.recover()
                self.queues[(topic, int(qname))] = cq

    def get(self, key: QueueKey) -> ConsumeQueue | None:
        return self.queues.get(key)

    def create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A new (empty, or left on disk) queue, opened and registered."""
        cq = ConsumeQueue(self.root_dir, topic, queue_id, self.file_size)
        cq.load()
        self.queues[(topic, queue_id)] = cq
        return cq

    def drop_topic(self, topic: str) -> list[QueueKey]:
        """Delete every queue of `topic` (files too); returns their keys."""
        keys = [k for k in self.queues if k[0] == topic]
        for key in keys:
            self.queues.pop(key).destroy()
        return keys

    def items(self) -> ItemsView[QueueKey, ConsumeQueue]:
        return self.queues.items()

    def values(self) -> ValuesView[ConsumeQueue]:
        return self.queues.values()

    # ---- recovery and housekeeping --------------------------------------------------------------

    def truncate_dirty(self, data_end: int) -> None:
        """Cut units of messages the commit log no longer holds past `data_end` (a torn tail)."""
        for cq in self.queues.values():
            cq.truncate_dirty(data_end)

    def min_phys_end(self, default: int) -> int:
        """End of the least advanced queue: every message below it was dispatched."""
        return min((cq.max_phys_end for cq in self.queues.values()), default=default)

    def max_phys_end(self) -> int:
        """End of the furthest queue: every message below it was committed."""
        return max((cq.max_phys_end for cq in self.queues.values()), default=0)

    def correct_min_offsets(self, min_phys: int) -> None:
        """Units pointing below the commit log's first byte (deleted files) are no longer served;
        whole queue files below them are deleted."""
        for cq in self.queues.values():
            if cq.max_offset > cq.min_offset and cq.get_unit(cq.min_offset)[0] < min_phys:
                cq.correct_min_offset(min_phys)
                cq.files.delete_files_before(cq.min_logic_offset * CQ_STORE_UNIT_SIZE)

    def dirty(self) -> list[ConsumeQueue]:
        """Queues with pages written since their last flush."""
        return [cq for cq in self.queues.values() if cq.files.dirty_files()]

    def close_all(self) -> None:
        for cq in self.queues.values():
            cq.close()
