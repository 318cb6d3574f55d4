"""`PopStateReplica`: the replicated part of group-consumption receipt state.

Records in the system topic `RMQ_SYS_POP_STATE` (written by the master's `PopService` through
`store.append_system_record`, so committed on a majority before the ack is answered) are applied
here on every member, in log order, and on replay at start:

    {"op": "ack", "group", "topic", "acks": {"<queueId>": [offset, ...]}, "marks": {"<queueId>": n}}
        offsets acknowledged (or dead-lettered) ABOVE the group's low-water mark `n`; offsets
        below the mark are covered by the committed offset (ConsumerOffsetManager), so the
        replica forgets them.
    {"op": "reconsume", "group", "topic", "counts": {"<queueId>": {"<offset>": n}}}
        how many times a message has been redelivered.

A new master rebuilds its `PopService` queues from committed offset + these sets, so after a
failover an acknowledged message is not delivered again and reconsume counts carry on. What
stays master-local: which messages are in flight and until when (they are redelivered at once
by a new master, counted as one more reconsume only if a redelivery was recorded).

Plain state, no I/O. Callers: the store dispatcher (`apply_record`; `snapshot`/`restore` for the
store's state snapshot), `PopService` (`acked`, `reconsume_counts`, `prune`, and `drop_topic` when a
topic delete is applied).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

SYS_POP_STATE = "RMQ_SYS_POP_STATE"

_Key = tuple[str, str, int]


class PopStateReplica:
    """(group, topic, queueId) → acked offsets above the committed offset, and reconsume counts."""

    def __init__(self) -> None:
        self._acked: dict[_Key, set[int]] = {}
        self._reconsume: dict[_Key, dict[int, int]] = {}

    def apply_record(self, record: dict[str, Any]) -> None:
        """Apply one replicated record (dispatcher, every member, log order)."""
        try:
            op, group, topic = record["op"], str(record["group"]), str(record["topic"])
            if op == "ack":
                for q, mark in (record.get("marks") or {}).items():
                    self.prune(group, topic, int(q), int(mark))
                for q, offsets in record["acks"].items():
                    key = (group, topic, int(q))
                    self._acked.setdefault(key, set()).update(int(o) for o in offsets)
                    counts = self._reconsume.get(key)
                    if counts:
                        for o in offsets:
                            counts.pop(int(o), None)
            elif op == "reconsume":
                for q, counts in record["counts"].items():
                    table = self._reconsume.setdefault((group, topic, int(q)), {})
                    for o, n in counts.items():
                        table[int(o)] = max(int(n), table.get(int(o), 0))
            else:
                log.error("event=bad_pop_record reason=unknown_op record=%r", record)
        except (KeyError, TypeError, ValueError, AttributeError):
            log.error("event=bad_pop_record record=%r", record)

    def snapshot(self) -> dict[str, Any]:
        """The whole replica, for the store's state snapshot (it outlives retention that way)."""
        return {"acked": [[g, t, q, sorted(offsets)] for (g, t, q), offsets in self._acked.items()],
                "reconsume": [[g, t, q, {str(o): n for o, n in counts.items()}]
                              for (g, t, q), counts in self._reconsume.items()]}

    def restore(self, snapshot: Any) -> None:
        """Replace the replica by a `snapshot()`'s (the store applies a state snapshot)."""
        snapshot = snapshot or {}
        self._acked = {(str(g), str(t), int(q)): {int(o) for o in offsets}
                       for g, t, q, offsets in snapshot.get("acked", ())}
        self._reconsume = {(str(g), str(t), int(q)): {int(o): int(n) for o, n in counts.items()}
                           for g, t, q, counts in snapshot.get("reconsume", ())}

    def acked(self, group: str, topic: str, queue_id: int) -> set[int]:
        """Offsets settled above the committed offset (a copy)."""
        return set(self._acked.get((group, topic, queue_id), ()))

    def reconsume_counts(self, group: str, topic: str, queue_id: int) -> dict[int, int]:
        """Offset → times redelivered (a copy)."""
        return dict(self._reconsume.get((group, topic, queue_id), {}))

    def prune(self, group: str, topic: str, queue_id: int, committed: int) -> None:
        """Forget what the committed offset now covers (keeps the tables bounded)."""
        key = (group, topic, queue_id)
        acked = self._acked.get(key)
        if acked:
            acked.difference_update([o for o in acked if o < committed])
            if not acked:
                del self._acked[key]
        counts = self._reconsume.get(key)
        if counts:
            for o in [o for o in counts if o < committed]:
                del counts[o]
            if not counts:
                del self._reconsume[key]

    def drop_topic(self, topic: str) -> None:
        """Forget every group's state of a deleted topic (called where the delete is applied, on
        every member, so a topic created again under the same name starts clean)."""
        for table in (self._acked, self._reconsume):
            for key in [k for k in table if k[1] == topic]:
                del table[key]
