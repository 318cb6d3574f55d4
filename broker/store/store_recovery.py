"""Start-up recovery and housekeeping of `DefaultMessageStore` (kept apart: one idea per module).

Called by the store: `load_consume_queues` and the replays at start, `clean_expired` from the
store's housekeeping loop, `flush_queues` in a worker thread.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from typing import TYPE_CHECKING

import orjson

from broker.errors import BrokerError
from broker.message import decode_dispatch_info, decode_message
from broker.store.consume_queue import ConsumeQueue
from broker.topics import TOPIC_NAME_RE, is_system_topic

if TYPE_CHECKING:
    from broker.store.message_store import DefaultMessageStore

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


def clean_expired(store: DefaultMessageStore) -> None:
    """Local mode: delete expired commit-log files (DLedger cleans its own data files). Both
    modes: consume-queue units pointing below the log's first byte are no longer served and
    whole consume-queue files below it are deleted."""
    cfg = store.config
    if not store.dledger:
        store.commit_log.delete_expired(cfg.delete_when, cfg.file_reserved_time,
                                       cfg.disk_max_used_space_ratio / 100, store.reput_offset)
    correct_min_offsets(store)


def correct_min_offsets(store: DefaultMessageStore) -> None:
    """Units pointing below the commit log's first byte (deleted files) are no longer served."""
    min_phys = store.commit_log.min_offset
    for cq in store.consume_queues.values():
        if cq.max_offset > cq.min_offset and cq.get_unit(cq.min_offset)[0] < min_phys:
            cq.correct_min_offset(min_phys)
            cq.files.delete_files_before(cq.min_logic_offset * 20)


def load_consume_queues(store: DefaultMessageStore) -> None:
    """Open and recover every consume queue under `{storePathRootDir}/consumequeue/`."""
    os.makedirs(store.cq_root, exist_ok=True)
    for topic in sorted(os.listdir(store.cq_root)):
        tdir = os.path.join(store.cq_root, topic)
        if not TOPIC_NAME_RE.match(topic) or not os.path.isdir(tdir):
            log.warning("event=cq_dir_ignored path=%s reason=not a topic name", tdir)
            continue
        for qname in sorted(os.listdir(tdir)):
            if not qname.isdigit():
                continue
            cq = ConsumeQueue(store.cq_root, topic, int(qname),
                              store.config.mapped_file_size_consume_queue)
            cq.load()
            cq.recover()
            store.consume_queues[(topic, int(qname))] = cq
            store.topics.ensure_from_data(topic, int(qname))


def replay_system_records(store: DefaultMessageStore) -> None:
    """Rebuild topics, offsets, members (and any registered state) from the system topics. A
    record holding a "snapshot" key replaces its state, so each topic's replay starts at its last
    one (found by reading the queue backwards). The records of all system topics are then applied
    merged in log order, as the dispatcher applied them: a topic delete comes after the offsets
    committed before it and before those committed to a re-creation of the topic."""
    store._replaying = True
    try:
        merged: list[tuple[int, str, object]] = []
        for (topic, _), cq in sorted(store.consume_queues.items()):
            if topic not in store._system_handlers:
                continue
            records = []
            for off in range(cq.max_offset - 1, cq.min_offset - 1, -1):
                phys, size, _ = cq.get_unit(off)
                if size <= 0:
                    continue
                try:
                    record = orjson.loads(decode_message(store.commit_log.get_data(phys, size), phys).body)
                except (BrokerError, orjson.JSONDecodeError) as exc:
                    log.error("event=system_record_unreadable topic=%s phys=%d reason=%s", topic, phys, exc)
                    continue
                records.append((phys, topic, record))
                if isinstance(record, dict) and "snapshot" in record:
                    break
            merged += records
            log.info("event=system_records_replayed topic=%s records=%d", topic, len(records))
        merged.sort(key=lambda r: r[0])
        for phys, topic, record in merged:
            store.record_phys = phys
            store._system_handlers[topic](record)
    finally:
        store._replaying = False


def rebuild_idempotency(store: DefaultMessageStore) -> None:
    """Idempotency keys of messages stored within the window, from the consume queues."""
    if store.config.idempotency_window_ms <= 0:
        return
    since = int(time.time() * 1000) - store.config.idempotency_window_ms
    for (topic, _), cq in store.consume_queues.items():
        if is_system_topic(topic):
            continue
        start = cq.offset_for_timestamp(since, store.store_time_of)
        for phys, size, _ in cq.get_units(start, cq.max_offset - start):
            try:
                info = decode_dispatch_info(store.commit_log.get_data(phys, size), phys)
            except BrokerError:
                continue
            store.remember_idempotency(info)
