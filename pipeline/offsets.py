"""Offset arithmetic for the ``ledgermq`` Spark source: pure functions, no I/O, no Spark.

Offsets are Spark-checkpointed JSON of the shape ``{topic: {"brokerName:queueId": nextOffset}}``:
string keys (JSON object keys are always strings, so a restart re-reads exactly what was written),
sorted at both levels (Spark compares offsets as JSON text), and each value the *exclusive* end of
what has been read, i.e. the next queue offset to read. A micro-batch covers ``[start, end)`` per
queue.

Everything here is deterministic so that planning the same batch twice gives the same partitions,
which is what makes a re-run batch produce the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Kafka-compatible sentinels inside a startingOffsets/endingOffsets JSON document.
EARLIEST = -2
LATEST = -1

Offsets = dict[str, dict[str, int]]


class OffsetSpecError(ValueError):
    """A startingOffsets/endingOffsets option that cannot be understood."""


class DataLossError(RuntimeError):
    """Offsets the query still needs are gone from the broker (retention, topic recreated)."""


def queue_key(broker_name: str, queue_id: int) -> str:
    """The offset-JSON key of one consume queue: ``"brokerName:queueId"``."""
    return f"{broker_name}:{queue_id}"


def parse_queue_key(key: str) -> tuple[str, int]:
    """Split ``"brokerName:queueId"`` (the broker name itself may contain ``:``)."""
    broker, sep, qid = key.rpartition(":")
    if not sep or not broker or not qid.isdigit():
        raise OffsetSpecError(f"bad queue key {key!r}: expected 'brokerName:queueId'")
    return broker, int(qid)


def sort_offsets(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    """Return a copy with topics and queue keys in a stable (sorted) order."""
    out: Offsets = {}
    for topic in sorted(offsets):
        queues = offsets[topic]
        out[topic] = {k: int(queues[k]) for k in sorted(queues, key=_queue_sort_key)}
    return out


def _queue_sort_key(key: str) -> tuple[str, int]:
    broker, qid = parse_queue_key(key)
    return broker, qid


def offsets_to_json(offsets: Mapping[str, Mapping[str, int]]) -> str:
    """Canonical JSON text of an offsets document (sorted keys, no spaces)."""
    return json.dumps(sort_offsets(offsets), separators=(",", ":"))


@dataclass(frozen=True)
class QueueState:
    """What the broker reports for one consume queue: readable range ``[min_offset, max_offset)``."""

    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int

    @property
    def key(self) -> str:
        """The offset-JSON key of this queue."""
        return queue_key(self.broker_name, self.queue_id)


def states_to_offsets(states: Iterable[QueueState], *, use: str) -> Offsets:
    """Offsets at every queue's ``min`` (``use="earliest"``) or ``max`` (``use="latest"``)."""
    if use not in ("earliest", "latest"):
        raise ValueError(f"use must be 'earliest' or 'latest', not {use!r}")
    out: dict[str, dict[str, int]] = {}
    for s in states:
        out.setdefault(s.topic, {})[s.key] = s.min_offset if use == "earliest" else s.max_offset
    return sort_offsets(out)


def parse_offsets_json(text: str, option: str) -> Offsets:
    """Parse a user-given offsets JSON document, checking its shape precisely.

    Values may be non-negative offsets or the sentinels -2 (earliest) / -1 (latest).
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffsetSpecError(f"{option}: not 'earliest', 'latest' or valid JSON ({exc.msg})") from exc
    except RecursionError as exc:  # json's scanner recurses per nesting level
        raise OffsetSpecError(f"{option}: JSON nested too deeply") from exc
    if not isinstance(doc, dict):
        raise OffsetSpecError(f"{option}: JSON must be an object {{topic: {{'broker:queueId': offset}}}}")
    out: Offsets = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OffsetSpecError(f"{option}: value for topic {topic!r} must be an object of queue offsets")
        for key, value in queues.items():
            try:
                parse_queue_key(key)
            except OffsetSpecError as exc:
                raise OffsetSpecError(f"{option}: {exc}") from exc
            if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
                raise OffsetSpecError(
                    f"{option}: offset for {topic}/{key} must be an integer >= 0, or -2 (earliest) "
                    f"or -1 (latest); got {value!r}"
                )
            out.setdefault(topic, {})[key] = value
    return sort_offsets(out)


def resolve_spec(spec: str, states: Iterable[QueueState], option: str, *, default_missing: str) -> Offsets:
    """Turn ``earliest`` | ``latest`` | JSON into concrete offsets for the queues in ``states``.

    Queues the JSON does not name get ``default_missing`` ("earliest" or "latest"); queues the JSON
    names but the broker does not know are kept as given (they may appear later).
    """
    states = list(states)
    word = spec.strip().lower()
    if word in ("earliest", "latest"):
        return states_to_offsets(states, use=word)
    given = parse_offsets_json(spec, option)
    by_key = {(s.topic, s.key): s for s in states}
    out: dict[str, dict[str, int]] = {}
    for s in states:
        value = given.get(s.topic, {}).get(s.key)
        if value is None:
            value = EARLIEST if default_missing == "earliest" else LATEST
        out.setdefault(s.topic, {})[s.key] = _concrete(value, s)
    for topic, queues in given.items():
        for key, value in queues.items():
            if (topic, key) not in by_key:
                out.setdefault(topic, {})[key] = max(value, 0)
    return sort_offsets(out)


def _concrete(value: int, state: QueueState) -> int:
    if value == EARLIEST:
        return state.min_offset
    if value == LATEST:
        return state.max_offset
    return value


def merge_latest(
    start: Mapping[str, Mapping[str, int]], available: Mapping[str, Mapping[str, int]]
) -> Offsets:
    """The furthest offsets a batch starting at ``start`` may reach, given what is ``available``.

    A queue in ``available`` but not in ``start`` is new since the last batch (a queue added to the
    topic, or a new topic matching the pattern): it is read from its beginning, 0 (queue offsets
    start at 0; if retention already removed the head, reading handles that as data loss).
    A queue that went missing from ``available`` (its broker is unreachable this round) keeps its
    start offset, so nothing is skipped. Offsets never move backwards.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, queues in start.items():
        for key, off in queues.items():
            out.setdefault(topic, {})[key] = int(off)
    for topic, queues in available.items():
        for key, avail in queues.items():
            begin = int(start.get(topic, {}).get(key, 0))
            out.setdefault(topic, {})[key] = max(begin, int(avail))
    return sort_offsets(out)


def start_of(start: Mapping[str, Mapping[str, int]], topic: str, key: str) -> int:
    """Start offset of a queue in a batch: its recorded value, or 0 for a queue new in this batch."""
    return int(start.get(topic, {}).get(key, 0))


def backlog(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> int:
    """Number of messages between ``start`` and ``end`` over all queues."""
    return sum(
        max(0, off - start_of(start, topic, key))
        for topic, queues in end.items()
        for key, off in queues.items()
    )


def rate_limit(
    start: Mapping[str, Mapping[str, int]], latest: Mapping[str, Mapping[str, int]], max_rows: int
) -> Offsets:
    """Cap a batch at ``max_rows`` messages, shared fairly (max-min fair) among the queues.

    Every queue with a backlog gets an equal share; a queue that needs less than its share hands
    the rest to the others, so a single hot queue cannot starve the rest and small queues drain
    first. Leftover single units go to queues in sorted key order, so the plan is deterministic.
    The batch holds exactly ``min(max_rows, backlog)`` messages.
    """
    if max_rows <= 0:
        raise ValueError(f"max_rows must be positive, got {max_rows}")
    demand: dict[tuple[str, str], int] = {}
    for topic, queues in latest.items():
        for key, off in queues.items():
            need = off - start_of(start, topic, key)
            if need > 0:
                demand[(topic, key)] = need
    grant = _water_fill(demand, max_rows)
    out: dict[str, dict[str, int]] = {}
    for topic, queues in latest.items():
        for key in queues:
            out.setdefault(topic, {})[key] = start_of(start, topic, key) + grant.get((topic, key), 0)
    for topic, queues in start.items():  # queues known only in start keep their offset
        for key, off in queues.items():
            out.setdefault(topic, {}).setdefault(key, int(off))
    return sort_offsets(out)


def _water_fill(demand: dict[tuple[str, str], int], budget: int) -> dict[tuple[str, str], int]:
    grant = {k: 0 for k in demand}
    open_keys = sorted(demand, key=lambda k: (k[0], _queue_sort_key(k[1])))
    while budget > 0 and open_keys:
        share = budget // len(open_keys)
        if share == 0:  # fewer units than queues: one each, in stable order
            for k in open_keys[:budget]:
                grant[k] += 1
            break
        still_open = []
        for k in open_keys:
            take = min(share, demand[k] - grant[k])
            grant[k] += take
            budget -= take
            if grant[k] < demand[k]:
                still_open.append(k)
        open_keys = still_open
    return grant


def cap_to(
    offsets: Mapping[str, Mapping[str, int]],
    limit: Mapping[str, Mapping[str, int]],
    start: Mapping[str, Mapping[str, int]],
) -> Offsets:
    """Per queue ``min(offsets, limit)``, never below ``start``; queues absent from ``limit`` stay at start.

    Used by Trigger.AvailableNow: the run must end at the offsets seen when it was prepared.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, queues in offsets.items():
        for key, off in queues.items():
            begin = start_of(start, topic, key)
            bound = limit.get(topic, {}).get(key)
            capped = begin if bound is None else min(int(off), int(bound))
            out.setdefault(topic, {})[key] = max(begin, capped)
    return sort_offsets(out)


@dataclass(frozen=True)
class QueueRange:
    """The slice ``[start, end)`` of one consume queue that one Spark partition reads."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int


def plan_ranges(
    start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]
) -> list[QueueRange]:
    """One range per queue that has something to read, in sorted (topic, broker, queue) order."""
    ranges = []
    for topic, queues in sort_offsets(end).items():
        for key, stop in queues.items():
            begin = start_of(start, topic, key)
            if stop > begin:
                broker, qid = parse_queue_key(key)
                ranges.append(QueueRange(topic, broker, qid, begin, stop))
    return ranges


def find_data_loss(start: Mapping[str, Mapping[str, int]], states: Iterable[QueueState]) -> list[str]:
    """Describe every queue whose next offset to read was already deleted (``start < min_offset``)."""
    problems = []
    for s in states:
        begin = start.get(s.topic, {}).get(s.key)
        if begin is not None and begin < s.min_offset:
            problems.append(
                f"{s.topic}/{s.key}: next offset {begin} < earliest available {s.min_offset} "
                f"({s.min_offset - begin} messages lost)"
            )
    return problems


def find_rewound(start: Mapping[str, Mapping[str, int]], states: Iterable[QueueState]) -> list[str]:
    """Queues whose end is below the next offset to read (``start > max_offset``).

    Either the topic was deleted and created again, or the member answering is still catching up
    (a new master replaying its log after a failover), so this is only ever a warning: the queue
    is simply not read until it grows past ``start`` again.
    """
    out = []
    for s in states:
        begin = start.get(s.topic, {}).get(s.key)
        if begin is not None and begin > s.max_offset:
            out.append(f"{s.topic}/{s.key}: next offset {begin} > latest available {s.max_offset}")
    return out
