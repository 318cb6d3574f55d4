"""`SystemRecords`: broker state replicated as records in system topics of the commit log, and the
state snapshots that let it outlive retention.

Topic configs (`RMQ_SYS_TOPIC_CONFIG`), consumer offsets (`RMQ_SYS_CONSUMER_OFFSETS`), the members'
HTTP addresses (`RMQ_SYS_BROKER_MEMBERS`) and whatever a layer above registers (group-consumption
receipt state …) are written through the store like messages (JSON bodies) and applied here — by
the dispatcher on every member in log order, and by the replay at start.

Retention deletes old commit-log files, and with them the records that built the state. So the
master re-writes the whole state ahead of them: a **state snapshot** in `RMQ_SYS_STATE_SNAPSHOT`,
one or more consecutive messages (parts) whose bodies, joined, are one JSON document
`{"version": 1, "states": {system topic: that state's snapshot()}}`. It is written with no other
system record in flight and only once everything before it is applied, so it holds exactly the
state at its place in the log. Applying it (dispatch, on every member; replay at start) replaces
every state by the snapshot's; records after it apply on top. Retention never deletes a file at or
after the first part of the last complete snapshot (`snapshot_first`), so the log always holds a
snapshot plus every record after it: a restart, a failover and a member that joins with an empty
disk all rebuild the same state from the log alone. Plain state and tables here; no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import orjson

from broker.errors import BrokerCode, BrokerError
from broker.message import Message, MessageExt, decode_message
from broker.topics import SYS_STATE_SNAPSHOT, validate_topic

log = logging.getLogger("broker.store.message_store")

RecordHandler = Callable[[dict[str, Any]], None]

PROPERTY_SNAPSHOT_ID = "SNAPSHOT_ID"
PROPERTY_SNAPSHOT_PART = "SNAPSHOT_PART"  # "i/n": part i (from 0) of n
SNAPSHOT_VERSION = 1


class ReplicatedState(Protocol):
    """A piece of broker state kept as records in one system topic."""

    def apply_record(self, record: dict[str, Any]) -> None:
        """Apply one record (every member, log order)."""
        ...

    def snapshot(self) -> Any:
        """The whole state as JSON-able data (called on the loop, between records)."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Replace the whole state by `snapshot()`'s output (None: empty state)."""
        ...


class SnapshotPart(NamedTuple):
    """One stored part of a state snapshot."""

    snapshot_id: str
    index: int
    count: int
    phys: int
    end: int
    body: bytes


def read_part(message: MessageExt) -> SnapshotPart | None:
    """The part a stored snapshot message holds; None if its properties are not a part's."""
    sid = message.properties.get(PROPERTY_SNAPSHOT_ID)
    index, _, count = message.properties.get(PROPERTY_SNAPSHOT_PART, "").partition("/")
    if not sid or not index.isdigit() or not count.isdigit() or not 0 <= int(index) < int(count):
        return None
    return SnapshotPart(sid, int(index), int(count), message.commit_log_offset,
                        message.commit_log_offset + message.store_size, message.body)


class BrokerMembers:
    """DLedger selfId → the member's HTTP address, from `RMQ_SYS_BROKER_MEMBERS` records (each new
    master writes its own), so a slave can name the master in a NOT_MASTER answer."""

    def __init__(self) -> None:
        self.addrs: dict[str, str] = {}

    def apply_record(self, record: dict[str, Any]) -> None:
        sid, addr = record.get("selfId"), record.get("addr")
        if isinstance(sid, str) and isinstance(addr, str):
            self.addrs[sid] = addr

    def snapshot(self) -> dict[str, str]:
        return dict(self.addrs)

    def restore(self, snapshot: Any) -> None:
        self.addrs = {str(k): str(v) for k, v in (snapshot or {}).items()}


class SystemRecords:
    """System topic → its state. Callers: the store (`register_state`, `capture`), the dispatcher
    and the replay at start (`apply`, `apply_record`, `restore`, `replaying`), retention
    (`snapshot_first`)."""

    def __init__(self) -> None:
        self.handlers: dict[str, RecordHandler] = {}
        self.states: dict[str, ReplicatedState] = {}
        self.topics: set[str] = {SYS_STATE_SNAPSHOT}  # every topic applied here (the dispatcher asks)
        self.record_phys = -1  # log position of the record being applied (topic deletes keep it)
        self.replaying = False  # applying records at start, not as they are dispatched
        self.snapshot_first = -1  # first part of the last complete snapshot applied (-1: none)
        self.snapshot_end = 0  # end of its last part
        self.records_since_snapshot = 0
        self._parts: list[SnapshotPart] = []  # the snapshot being dispatched, part by part

    def register_state(self, sys_topic: str, state: ReplicatedState,
                       apply: RecordHandler | None = None) -> None:
        """Records of `sys_topic` go to `apply` (default `state.apply_record`); `state` is in
        every snapshot. Register before the store starts."""
        validate_topic(sys_topic, allow_system=True)
        self.handlers[sys_topic] = apply or state.apply_record
        self.states[sys_topic] = state
        self.topics.add(sys_topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self.topics

    # ---- records --------------------------------------------------------------------------------

    def apply(self, topic: str, phys: int, message: bytes | memoryview) -> None:
        """Dispatcher: apply the record (or snapshot part) in the stored message at `phys`; an
        unreadable or refused one is logged and skipped (it never stops dispatch)."""
        try:
            ext = decode_message(message, phys)
            if topic == SYS_STATE_SNAPSHOT:
                self._apply_part(ext)
            else:
                self.apply_record(topic, phys, orjson.loads(ext.body))
        except (BrokerError, orjson.JSONDecodeError) as exc:
            log.error("event=system_record_unreadable topic=%s phys=%d reason=%s", topic, phys, exc)

    def apply_record(self, topic: str, phys: int, record: Any) -> None:
        """Apply a decoded record stored at `phys`."""
        self.record_phys = phys
        self.records_since_snapshot += 1
        self.handlers[topic](record)

    @staticmethod
    def read_record(topic: str, phys: int, message: bytes | memoryview) -> Any:
        """The record in a stored message, or None (logged) if it cannot be read."""
        try:
            return orjson.loads(decode_message(message, phys).body)
        except (BrokerError, orjson.JSONDecodeError) as exc:
            log.error("event=system_record_unreadable topic=%s phys=%d reason=%s", topic, phys, exc)
            return None

    # ---- snapshots ------------------------------------------------------------------------------

    def capture(self) -> bytes:
        """Every registered state, as one snapshot document."""
        return orjson.dumps({"version": SNAPSHOT_VERSION,
                             "states": {topic: state.snapshot() for topic, state in self.states.items()}})

    @staticmethod
    def snapshot_messages(document: bytes, snapshot_id: str, part_bytes: int) -> list[Message]:
        """`document` cut into parts of at most `part_bytes`, as messages of the snapshot topic."""
        chunks = [document[i:i + part_bytes] for i in range(0, len(document), part_bytes)] or [b""]
        return [Message(SYS_STATE_SNAPSHOT, chunk, properties={PROPERTY_SNAPSHOT_ID: snapshot_id,
                                                                PROPERTY_SNAPSHOT_PART: f"{i}/{len(chunks)}"})
                for i, chunk in enumerate(chunks)]

    def _apply_part(self, message: MessageExt) -> None:
        part = read_part(message)
        if part is None:
            log.error("event=snapshot_part_unreadable phys=%d", message.commit_log_offset)
            return
        parts = self._parts
        if part.index == 0:
            parts.clear()
        elif not parts or parts[-1].snapshot_id != part.snapshot_id or parts[-1].index != part.index - 1:
            parts.clear()  # the first parts were before this member's log began: not this one
            return
        parts.append(part)
        if part.index == part.count - 1:
            self.restore(parts)
            parts.clear()

    def restore(self, parts: list[SnapshotPart]) -> None:
        """Replace every state by the snapshot made of `parts` (consecutive, complete)."""
        doc = orjson.loads(b"".join(p.body for p in parts))
        if not isinstance(doc, dict) or doc.get("version") != SNAPSHOT_VERSION:
            raise BrokerError(BrokerCode.MESSAGE_CORRUPTED,
                              f"state snapshot at {parts[0].phys}: not a version {SNAPSHOT_VERSION} document")
        states = doc.get("states") or {}
        for topic, state in self.states.items():
            try:
                state.restore(states.get(topic))
            except (TypeError, ValueError, AttributeError, KeyError) as exc:
                log.error("event=state_snapshot_unreadable topic=%s first=%d reason=%r", topic,
                          parts[0].phys, exc)
        self.snapshot_first, self.snapshot_end = parts[0].phys, parts[-1].end
        self.records_since_snapshot = 0
        log.info("event=state_snapshot_applied first=%d end=%d parts=%d states=%d replaying=%s",
                 self.snapshot_first, self.snapshot_end, len(parts), len(states), self.replaying)
