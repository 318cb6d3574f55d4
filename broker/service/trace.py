"""`DeliveryTrace`: what happened to each recently consumed message, per consumer group — received,
redelivered, acked, nacked, dead-lettered — with the time, like RocketMQ's message trace but kept
by the master in memory, bounded by count.

It answers "did my consumer get this message, and what did it do with it": the part of the story
the replicated state cannot tell (the committed offset says acked, never when or how often it was
delivered before). Master-local: a failover starts a new trace (the replicated state still says
acked / redelivery counts; `PopService.deliveries` shows both). Plain state, no I/O.
Callers: `PopService` (`record`, on every hand-out and settle), `PopService.deliveries` (`events`).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

# Messages traced at most (oldest forgotten first): ~200 bytes each with a few events.
MAX_TRACED_MESSAGES = 50_000


class DeliveryEvent(enum.StrEnum):
    RECEIVED = "RECEIVED"  # handed out for the first time
    REDELIVERED = "REDELIVERED"  # handed out again (invisible time passed, or nacked)
    ACKED = "ACKED"
    NACKED = "NACKED"
    DEAD_LETTERED = "DEAD_LETTERED"  # out of retries (or forwarded): now in %DLQ%{group}


class TraceRecord(NamedTuple):
    """One event of one message for one group; `reconsume_times` as of the event."""

    at_ms: int
    group: str
    event: DeliveryEvent
    reconsume_times: int


_Key = tuple[str, int, int]  # topic, queue id, queue offset
# An event as stored: (at_ms, group, its index in _EVENTS, reconsume_times): ints and a str only.
_Stored = tuple[int, str, int, int]
_EVENTS = tuple(DeliveryEvent)
_EVENT_INDEX = {e: i for i, e in enumerate(_EVENTS)}
_tuple_new = tuple.__new__


class DeliveryTrace:
    """(topic, queue, offset) → the events of that message, for the last `max_messages` messages.

    Kept as tuples of ints and strings only (an event as its index in `DeliveryEvent`, a message's
    events as one tuple replaced on each event): the cyclic collector stops tracking such tuples
    while they are young, so the traced messages never pile up in the old generation, where each
    full collection would walk every one of them again."""

    def __init__(self, clock_ms: Callable[[], int], max_messages: int = MAX_TRACED_MESSAGES) -> None:
        self.clock_ms = clock_ms
        self.max_messages = max_messages
        self._events: OrderedDict[_Key, tuple[_Stored, ...]] = OrderedDict()

    def record(
        self, key: _Key, group: str, event: DeliveryEvent, reconsume_times: int, at_ms: int | None = None
    ) -> None:
        """Note that `event` happened to message `key` = (topic, queue id, queue offset) at `at_ms`
        (now when None: a caller recording many events at once reads the clock once)."""
        stored = (self.clock_ms() if at_ms is None else at_ms, group, _EVENT_INDEX[event], reconsume_times)
        events = self._events
        before = events.get(key)
        if before is None:
            events[key] = (stored,)
            if len(events) > self.max_messages:
                events.popitem(last=False)
        else:
            events[key] = (*before, stored)

    def events(self, topic: str, queue_id: int, offset: int) -> list[TraceRecord]:
        """The message's events in the order they happened (empty when never traced here)."""
        # tuple.__new__: a NamedTuple's own constructor is Python code, twice the cost here.
        return [
            _tuple_new(TraceRecord, (at, group, _EVENTS[event], times))
            for at, group, event, times in self._events.get((topic, queue_id, offset), ())
        ]

    def drop_topic(self, topic: str) -> None:
        """Forget a deleted topic's messages (a re-created topic reuses their offsets)."""
        for key in [k for k in self._events if k[0] == topic]:
            del self._events[key]

    def __len__(self) -> int:
        return len(self._events)
