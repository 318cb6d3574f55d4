"""Start-up recovery of `DefaultMessageStore`, and the dispatch checkpoint.

Functions over explicit collaborators (the consume queues, a reader of committed bytes, the system
records, the idempotency table), called by the store: the replays at start, `flush_queues` in a
worker thread with the checkpoint after it.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

from broker.errors import BrokerError
from broker.message import DispatchInfo, decode_dispatch_info, decode_message
from broker.store.consume_queue import ConsumeQueue
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.system_state import SnapshotPart, SystemRecords, read_part
from broker.topics import SYS_STATE_SNAPSHOT, is_system_topic

ReadData = Callable[[int, int], memoryview]
"""read(commit-log offset, size): the bytes of a committed message (BrokerError if gone)."""

log = logging.getLogger("broker.store.message_store")


def flush_queues(queues: list[ConsumeQueue], checkpoint: tuple[str, int] | None = None) -> None:
    """fsync consume-queue files (worker thread); a queue deleted meanwhile is skipped. Then, if
    every flush succeeded, persist `checkpoint` = (path, reput offset taken before the flush): all
    units of messages below that offset are on disk."""
    ok = True
    for cq in queues:
        try:
            cq.flush()
        except ValueError as exc:  # its map was closed: the queue was deleted meanwhile
            log.debug("event=cq_flush_skipped topic=%s queueId=%d reason=%s", cq.topic, cq.queue_id, exc)
        except OSError as exc:
            ok = False
            log.error("event=cq_flush_failed topic=%s queueId=%d error=%s", cq.topic, cq.queue_id, exc)
    if ok and checkpoint is not None:
        write_dispatch_checkpoint(*checkpoint)


_CHECKPOINT = struct.Struct(">qI")  # reput offset, crc32 of those 8 bytes


def write_dispatch_checkpoint(path: str, reput_offset: int) -> None:
    """Atomically replace the dispatch checkpoint (worker thread)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(_CHECKPOINT.pack(reput_offset, zlib.crc32(reput_offset.to_bytes(8, "big", signed=True))))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # the next second tries again; restart then re-dispatches a little more
        log.error("event=dispatch_checkpoint_failed path=%s error=%s", path, exc)


def read_dispatch_checkpoint(path: str) -> int | None:
    """The checkpointed reput offset, or None if there is none or it does not check out."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("event=dispatch_checkpoint_unreadable path=%s error=%s", path, exc)
        return None
    if len(raw) != _CHECKPOINT.size:
        log.warning("event=dispatch_checkpoint_ignored path=%s reason=size %d", path, len(raw))
        return None
    offset, crc = _CHECKPOINT.unpack(raw)
    if zlib.crc32(raw[:8]) != crc or offset < 0:
        log.warning("event=dispatch_checkpoint_ignored path=%s reason=bad checksum", path)
        return None
    return offset


def replay_system_records(queues: ConsumeQueueStore, read: ReadData, system: SystemRecords) -> None:
    """Rebuild topics, offsets, members (and every registered state) from the system topics: the
    last complete state snapshot first, then the records after it. A record holding a "snapshot"
    key replaces its own topic's state, so each topic's replay starts at its last one too (found
    by reading the queue backwards). The records of all system topics are applied merged in log
    order, as the dispatcher applied them: a topic delete comes after the offsets committed before
    it and before those committed to a re-creation of the topic."""
    system.replaying = True
    try:
        snapshot = last_state_snapshot(queues, read)
        after = -1
        if snapshot is not None:
            system.restore(snapshot)
            after = snapshot[-1].phys
        merged: list[tuple[int, str, Any]] = []
        for (topic, _), cq in sorted(queues.items()):
            if topic not in system.handlers:
                continue
            records = []
            for off in range(cq.max_offset - 1, cq.min_offset - 1, -1):
                phys, size, _ = cq.get_unit(off)
                if size <= 0:
                    continue
                if phys < after:
                    break
                try:
                    data = read(phys, size)
                except BrokerError as exc:
                    log.error("event=system_record_unreadable topic=%s phys=%d reason=%s", topic, phys, exc)
                    continue
                record = system.read_record(topic, phys, data)
                if record is None:
                    continue
                records.append((phys, topic, record))
                if isinstance(record, dict) and "snapshot" in record:
                    break
            merged += records
            log.info("event=system_records_replayed topic=%s records=%d", topic, len(records))
        merged.sort(key=lambda r: r[0])
        for phys, topic, record in merged:
            system.apply_record(topic, phys, record)
    finally:
        system.replaying = False


def last_state_snapshot(queues: ConsumeQueueStore, read: ReadData) -> list[SnapshotPart] | None:
    """The parts of the last complete state snapshot still in the log (read backwards from the
    snapshot topic's end: a last part, then the ones before it), or None."""
    cq = queues.get((SYS_STATE_SNAPSHOT, 0))
    if cq is None:
        return None
    off = cq.max_offset - 1
    while off >= cq.min_offset:
        last = _part_at(cq, off, read)
        off -= 1
        if last is None or last.index != last.count - 1:
            continue
        parts = [last]
        while parts[0].index > 0 and off >= cq.min_offset:
            part = _part_at(cq, off, read)
            if part is None or part.snapshot_id != last.snapshot_id or part.index != parts[0].index - 1:
                break
            parts.insert(0, part)
            off -= 1
        if parts[0].index == 0:
            return parts
    return None


def _part_at(cq: ConsumeQueue, off: int, read: ReadData) -> SnapshotPart | None:
    phys, size, _ = cq.get_unit(off)
    if size <= 0:
        return None
    try:
        return read_part(decode_message(read(phys, size), phys))
    except BrokerError as exc:
        log.error("event=snapshot_part_unreadable phys=%d reason=%s", phys, exc)
        return None


def rebuild_idempotency(queues: ConsumeQueueStore, read: ReadData,
                        store_time_of: Callable[[int, int], int | None], window_ms: int,
                        remember: Callable[[DispatchInfo], None]) -> None:
    """Idempotency keys of messages stored within the last `window_ms`, from the consume queues."""
    if window_ms <= 0:
        return
    since = int(time.time() * 1000) - window_ms
    for (topic, _), cq in queues.items():
        if is_system_topic(topic):
            continue
        start = cq.offset_for_timestamp(since, store_time_of)
        for phys, size, _ in cq.get_units(start, cq.max_offset - start):
            try:
                info = decode_dispatch_info(read(phys, size), phys)
            except BrokerError:
                continue
            remember(info)
