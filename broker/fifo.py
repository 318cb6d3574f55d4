"""FIFO messages: a message group's queue, and the rule that hands out a group's next message only
once the one before it is settled.

**Queue choice** (`wire.groups.queue_of_group`, shared with the SDK). A message with a `messageGroup`
(property `__SHARDINGKEY`, as RocketMQ stores it) lands in queue `consistentHash(group.hashCode(),
writeQueueNums)` — Guava's jump consistent hash
over Java's `String.hashCode()`, exactly as RocketMQ's proxy chooses (`SendMessageActivity`), so a
group maps to the same queue here as on RocketMQ, and raising the queue count moves few groups. The
server chooses for every message, batches included (RocketMQ's proxy round-robins FIFO batches,
#10924); the client's queue id is ignored for a grouped message.

**Ordered consumption.** `FifoGate` holds, per (consumer group, topic, queue), the *head* of each
message group (handed out and not yet acked or dead-lettered) and the messages read behind a head.
A group's next message becomes deliverable only when its head settles; other groups go on in
parallel (no whole-queue blocking as in RocketMQ's orderly pop). The gate is the master's working
state; what survives a failover is what the pop-state records replicate (acks above the committed
offset, reconsume counts), from which a new master re-reads the queue and rebuilds the gate: a
group's head is then the first message of the group not acked, so a message is never handed out
before every earlier message of its group was acked or dead-lettered.
"""

from __future__ import annotations

from collections import deque

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
MAX_MESSAGE_GROUP_BYTES = 64


def message_group_problem(message_group: object) -> str | None:
    """Why `message_group` cannot be used (None: it can): a non-empty string of at most 64 UTF-8
    bytes without control characters (RocketMQ's proxy refuses the rest: ILLEGAL_MESSAGE_GROUP)."""
    if not isinstance(message_group, str) or not message_group:
        return "a message group is a non-empty string"
    if len(message_group.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_GROUP_BYTES:
        return f"a message group is at most {MAX_MESSAGE_GROUP_BYTES} bytes"
    if any(ord(c) < 0x20 or c == "\x7f" for c in message_group):
        return "a message group has no control characters"
    return None


class FifoGate:
    """Which messages of one queue may be handed out now, for one consumer group.

    Callers (the pop service, on the master): `admit` for each message read in queue order;
    `settle` when a head is acked or dead-lettered; `take_ready` for held messages whose turn
    came. Messages without a group share the group "" (ordered by queue, like RocketMQ's orderly
    consumption)."""

    def __init__(self, max_held: int = 1024) -> None:
        self.max_held = max_held
        self._heads: dict[str, int] = {}  # message group -> offset handed out, not settled
        self._group_of_head: dict[int, str] = {}
        self._held: dict[str, deque[int]] = {}  # message group -> offsets read behind its head
        self._held_count = 0
        self._ready: deque[tuple[int, str]] = deque()  # held messages whose head settled

    def admit(self, offset: int, message_group: str | None) -> bool:
        """A message read in queue order: True = hand it out now (it becomes its group's head);
        False = it waits behind its group's head (returned by `take_ready` later)."""
        group = message_group or ""
        if group in self._heads or group in self._held:
            self._held.setdefault(group, deque()).append(offset)
            self._held_count += 1
            return False
        self._heads[group] = offset
        self._group_of_head[offset] = group
        return True

    def settle(self, offset: int) -> None:
        """The head at `offset` was acked or dead-lettered: its group's next message is ready."""
        group = self._group_of_head.pop(offset, None)
        if group is None:
            return
        del self._heads[group]
        waiting = self._held.get(group)
        if waiting:
            nxt = waiting.popleft()
            self._held_count -= 1
            if not waiting:
                del self._held[group]
            self._heads[group] = nxt  # reserved for the group: nothing else of it goes first
            self._group_of_head[nxt] = group
            self._ready.append((nxt, group))

    def take_ready(self, limit: int) -> list[int]:
        """Up to `limit` held messages that are now their group's head, in settle order."""
        out = []
        while self._ready and len(out) < limit:
            out.append(self._ready.popleft()[0])
        return out

    def can_read_more(self) -> bool:
        """False while `max_held` messages wait behind heads (stop reading the queue ahead)."""
        return self._held_count < self.max_held

    def is_head(self, offset: int) -> bool:
        return offset in self._group_of_head

    def low_water_mark(self, read_ptr: int) -> int:
        """The lowest offset not settled: heads, held and ready messages, else `read_ptr`."""
        lows = [read_ptr, *self._group_of_head]
        lows.extend(w[0] for w in self._held.values() if w)
        return min(lows)

    @property
    def held(self) -> int:
        return self._held_count
