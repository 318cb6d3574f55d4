"""`SystemRecords`: broker state replicated as JSON records in system topics of the commit log.

Topic configs (`RMQ_SYS_TOPIC_CONFIG`), consumer offsets (`RMQ_SYS_CONSUMER_OFFSETS`), the members'
HTTP addresses (`RMQ_SYS_BROKER_MEMBERS`) and whatever a layer above registers (group-consumption
receipt state) are written through the store like messages and applied here — by the dispatcher on
every member in log order, and by the replay at start. Plain state and a handler table; no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from broker.errors import BrokerError
from broker.message import decode_message
from broker.topics import validate_topic

log = logging.getLogger("broker.store.message_store")

RecordHandler = Callable[[dict[str, Any]], None]


class BrokerMembers:
    """DLedger selfId → the member's HTTP address, from `RMQ_SYS_BROKER_MEMBERS` records (each new
    master writes its own), so a slave can name the master in a NOT_MASTER answer."""

    def __init__(self) -> None:
        self.addrs: dict[str, str] = {}

    def apply_record(self, record: dict[str, Any]) -> None:
        sid, addr = record.get("selfId"), record.get("addr")
        if isinstance(sid, str) and isinstance(addr, str):
            self.addrs[sid] = addr


class SystemRecords:
    """System topic → its record handler. Callers: the store (`register`), the dispatcher and
    the replay at start (`apply`, `replaying`)."""

    def __init__(self) -> None:
        self.handlers: dict[str, RecordHandler] = {}
        self.record_phys = -1  # log position of the record being applied (topic deletes keep it)
        self.replaying = False  # applying records at start, not as they are dispatched

    def register(self, sys_topic: str, handler: RecordHandler) -> None:
        validate_topic(sys_topic, allow_system=True)
        self.handlers[sys_topic] = handler

    def __contains__(self, topic: str) -> bool:
        return topic in self.handlers

    def apply(self, topic: str, phys: int, message: bytes | memoryview) -> None:
        """Dispatcher: apply the record in the stored message at `phys` to its topic's state; an
        unreadable or refused record is logged and skipped (it never stops dispatch)."""
        try:
            self.apply_record(topic, phys, orjson.loads(decode_message(message, phys).body))
        except (BrokerError, orjson.JSONDecodeError) as exc:
            log.error("event=system_record_unreadable topic=%s phys=%d reason=%s", topic, phys, exc)

    def apply_record(self, topic: str, phys: int, record: Any) -> None:
        """Apply a decoded record stored at `phys`."""
        self.record_phys = phys
        self.handlers[topic](record)

    @staticmethod
    def read_record(topic: str, phys: int, message: bytes | memoryview) -> Any:
        """The record in a stored message, or None (logged) if it cannot be read."""
        try:
            return orjson.loads(decode_message(message, phys).body)
        except (BrokerError, orjson.JSONDecodeError) as exc:
            log.error("event=system_record_unreadable topic=%s phys=%d reason=%s", topic, phys, exc)
            return None
