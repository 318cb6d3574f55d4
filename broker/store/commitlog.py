"""`LocalCommitLog`: the local, single-node commit log (RocketMQ's `CommitLog` on a `MappedFileQueue`).

Messages in RocketMQ's v1 layout (`broker.message`) are appended back to back into
`mappedFileSizeCommitLog`-byte files under `{storePathRootDir}/commitlog/`, named by their 20-digit
start offset; a message never spans files (the rest of a full file holds a blank record, magic -1
then its length, as `dledger.store.file_list.MmapFileList` writes it). A message's physical offset
is its global byte position, written into PHYSICALOFFSET when it is written.

Everything written is committed in this mode: a put assigns queue offsets from the topic-queue
table and physical offsets, writes, and feeds what it wrote to the dispatcher before it returns
(with `SYNC_FLUSH`, after the fsync). Recovery scans the last three files message by message
(sizes, magic and body CRC) and cuts the log at the first torn or garbage record, so a crash
mid-write loses only the unacknowledged tail.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import struct
import sys
import time

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError
from broker.message import (
    BODY_LENGTH_POSITION,
    QUEUE_ID_POSITION,
    QUEUE_OFFSET_POSITION,
    decode_message,
    topic_name,
)
from broker.store.base import Dispatcher, KeepFrom, Placed, TopicQueueTable
from dledger.codes import DLedgerException
from dledger.entry import BLANK_MAGIC_CODE
from dledger.store.file_list import MmapFileList

log = logging.getLogger(__name__)

_INT = struct.Struct(">i")
_STAMP = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET: adjacent in the message head
_ASYNC_FLUSH_INTERVAL_S = 0.5


class LocalCommitLog:
    """Local commit log (a `broker.store.base.CommitLog`). Caller: `DefaultMessageStore`."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.store_path = os.path.join(config.store_path_root_dir, "commitlog")
        self.files = MmapFileList(self.store_path, config.mapped_file_size_commit_log)
        self.sync_flush = config.flush_disk_type == "SYNC_FLUSH"
        self.topic_queue_table: TopicQueueTable = {}
        self._dispatcher: Dispatcher | None = None
        self._keep_from: KeepFrom | None = None
        self.disk_used_ratio = 0.0  # of the disk holding the store, measured by the flush loop
        self._disk_refusal: BrokerError | None = None  # DISK_FULL while the disk is over the ratio
        self._flush_task: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._stopping = asyncio.Event()

    # ---- lifecycle ----------------------------------------------------------------------------

    async def prepare(self, dispatcher: Dispatcher, keep_from: KeepFrom) -> None:
        """Load and recover the files (before consume queues are checked against `data_end`)."""
        self._dispatcher = dispatcher
        self._keep_from = keep_from
        await asyncio.to_thread(self._load_and_recover)

    def _load_and_recover(self) -> None:
        self.files.load()
        self.recover()

    async def start(self) -> None:
        """Dispatch what was written after the dispatcher's position (a restart after a crash),
        then start the background flush (ASYNC_FLUSH: every 500 ms) and disk checks."""
        self._check_disk()
        self._feed()
        self._flush_task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def shutdown(self) -> None:
        self._stopping.set()
        if self._flush_task is not None:
            await self._flush_task
        await asyncio.to_thread(self.files.flush)
        self.files.close()

    async def _flush_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), _ASYNC_FLUSH_INTERVAL_S)
            except TimeoutError:
                pass
            self._check_disk()
            if self.files.dirty_files():
                await self.flush()

    async def flush(self) -> None:
        """fsync dirty files in a worker thread; concurrent callers share one flush (group commit)."""
        async with self._flush_lock:
            targets = self.files.dirty_files()
            if targets:
                await asyncio.to_thread(MmapFileList.fsync_files, targets)
                MmapFileList.mark_flushed(targets)

    def recover(self) -> None:
        """Scan from the third-last file; cut at the first record that is not a whole, valid message."""
        files = self.files.files
        if not files:
            return
        pos = files[max(0, len(files) - 3)].file_from_offset
        end = pos
        while True:
            mf = self.files.find_file(pos)
            if mf is None:
                break
            local = pos - mf.file_from_offset
            if local + 8 > mf.file_size:
                pos = mf.end_offset
                continue
            first = _INT.unpack_from(mf.mm, local)[0]
            if first == BLANK_MAGIC_CODE:
                pos = mf.end_offset  # the rest of this file is a blank record
                end = pos
                continue
            if first <= 0:
                break
            try:
                decode_message(mf.mv[local:min(local + first, mf.file_size)], pos)
            except BrokerError as exc:
                log.warning("event=commitlog_torn_tail pos=%d reason=%s", pos, exc.detail)
                break
            pos += first
            end = pos
        self.files.truncate_offset(end, stop_after_zeros=1 << 20)
        log.info("event=commitlog_recovered dir=%s max_offset=%d", self.store_path, end)

    # ---- retention ----------------------------------------------------------------------------

    @property
    def disk_full_ratio(self) -> float:
        # From the config at each check: `updateBrokerConfig` may change it while the broker runs.
        return self.config.disk_full_ratio

    def delete_expired(self, now: float | None = None) -> int:
        """RocketMQ's clean-up: at a `deleteWhen` hour, or when the disk is fuller than
        `diskMaxUsedSpaceRatio`, delete files older than `fileReservedTime` hours; when it is fuller
        than `diskSpaceCleanForciblyRatio`, whatever their age. Never the last file, never one
        holding data at or after `keep_from()`. Returns the number deleted."""
        cfg = self.config
        assert self._keep_from is not None, "prepare() first"
        now = time.time() if now is None else now
        hour = time.localtime(now).tm_hour
        used = self._check_disk()
        due = hour in {int(h) for h in cfg.delete_when.split(";") if h.strip().isdigit()}
        force = used > cfg.disk_space_clean_forcibly_ratio / 100
        if not due and not force and used < cfg.disk_max_used_space_ratio / 100:
            return 0
        return self.files.delete_expired_files(cfg.file_reserved_time * 3600 * 1000, int(now * 1000),
                                               force=force, max_end_offset=self._keep_from())

    def _check_disk(self) -> float:
        """Measure the disk; past the disk-full ratio writes are refused (DISK_FULL), as DLedger does."""
        try:
            usage = shutil.disk_usage(self.store_path)
            used = usage.used / usage.total if usage.total else 0.0  # DLedger's (and RocketMQ's) measure
        except OSError:
            used = 0.0
        full = used > self.disk_full_ratio
        if full != (self._disk_refusal is not None):
            log.warning("event=disk_full_%s dir=%s usedRatio=%.3f diskFullRatio=%.2f",
                        "set" if full else "cleared", self.store_path, used, self.disk_full_ratio)
        self.disk_used_ratio = used
        self._disk_refusal = None if not full else BrokerError(
            BrokerCode.DISK_FULL, f"broker {self.config.broker_name}: the commit log's disk is {used:.0%} "
            f"used, over diskFullRatio {self.disk_full_ratio:.0%}; writes resume once space is freed")
        return used

    # ---- positions ----------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        """End of written (= committed, in local mode) data."""
        return self.files.max_wrote_position

    data_end = max_offset

    @property
    def leader_id(self) -> str | None:
        return None

    def dispatch_caught_up(self) -> bool:
        return True  # every write is dispatched before the put returns

    def write_refusal(self) -> BrokerError | None:
        return self._disk_refusal

    # ---- writing and reading ------------------------------------------------------------------

    pack_bytes = sys.maxsize  # a put is one write, dispatched by one feed

    async def put(self, topic: str, queue_id: int, bufs: list[bytearray],
                  entry_starts: list[int] | None = None) -> list[Placed]:
        """Assign queue offsets and physical offsets and write — no await in between, so
        concurrent puts cannot interleave — then dispatch what is now committed (in one feed,
        also when a write fails halfway: a key run never continues into another put's feed);
        with `SYNC_FLUSH`, return after the fsync. `entry_starts` changes nothing here."""
        if self._disk_refusal is not None:
            raise self._disk_refusal
        limit = self.files.file_size - 8
        for b in bufs:
            if len(b) > limit:
                raise BrokerError(BrokerCode.MESSAGE_TOO_LARGE,
                                  f"message of {len(b)} bytes exceeds a commit-log file ({limit} usable)")
        key = (topic, queue_id)
        table = self.topic_queue_table
        placed = []
        try:
            for b in bufs:
                placed.append(self._write(b, key, table))
        finally:
            self._feed()
        if self.sync_flush:
            await self.flush()
        return placed

    async def put_many(self, bufs: list[bytearray]) -> list[Placed]:
        """`put` for messages of several queues (topic and queue read from each one's bytes),
        written back to back with no await in between. A single log cannot make them atomic
        against a crash mid-write (a torn tail is cut at the last whole message); it has no
        failover to make that matter for."""
        limit = self.files.file_size - 8
        if any(len(b) > limit for b in bufs):
            raise BrokerError(BrokerCode.MESSAGE_TOO_LARGE,
                              f"a message exceeds a commit-log file ({limit} usable)")
        table = self.topic_queue_table
        placed = []
        for b in bufs:
            topic_at = BODY_LENGTH_POSITION + 4 + _INT.unpack_from(b, BODY_LENGTH_POSITION)[0]
            key = (topic_name(bytes(b[topic_at + 1:topic_at + 1 + b[topic_at]])),
                   _INT.unpack_from(b, QUEUE_ID_POSITION)[0])
            placed.append(self._write(b, key, table))
        self._feed()
        if self.sync_flush:
            await self.flush()
        return placed

    def _next_position(self, size: int) -> int:
        """Where a message of `size` bytes will land (after any roll-over)."""
        try:
            return self.files.next_append_pos(size)
        except DLedgerException as exc:
            raise BrokerError(BrokerCode.MESSAGE_TOO_LARGE,
                              f"message of {size} bytes does not fit a commit-log file: "
                              f"{exc.detail}") from None

    def _write(self, b: bytearray, key: tuple[str, int], table: TopicQueueTable) -> Placed:
        """Stamp the next queue offset of `key` and the position into message `b`; append it."""
        qoff = table.get(key, 0)
        table[key] = qoff + 1
        phys = self._next_position(len(b))
        _STAMP.pack_into(b, QUEUE_OFFSET_POSITION, qoff, phys)
        at = self.files.append(b)
        assert at == phys, (at, phys)
        return Placed(phys, len(b), key[1], qoff)

    def _feed(self) -> None:
        """Dispatch everything between the dispatcher's position and the end of the log."""
        dispatcher = self._dispatcher
        assert dispatcher is not None, "prepare() first"
        pos = dispatcher.reput_offset
        while True:
            pos, size = self._next_record(pos)
            if size <= 0:
                break
            dispatcher.dispatch(self.get_data(pos, size), pos)
            pos += size
        if pos > dispatcher.reput_offset:
            dispatcher.skip_to(pos)  # past blank records at a file's end
        dispatcher.dispatch_done()

    def get_data(self, phys: int, size: int) -> memoryview:
        """Bytes of a stored message; MESSAGE_NOT_FOUND outside the written range (the file list
        checks the range: one lookup per read, on the dispatch and pull paths)."""
        if size > 0:
            try:
                return self.files.get_data(phys, size)
            except DLedgerException as exc:
                detail = exc.detail
        if size <= 0 or phys < self.min_offset or phys + size > self.max_offset:
            detail = f"commit-log offset {phys} size {size} outside [{self.min_offset}, {self.max_offset})"
        raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, detail, commitLogOffset=phys)

    def _next_record(self, pos: int) -> tuple[int, int]:
        """(position of the next message at or after `pos`, its size), skipping blank records;
        (pos, 0) when nothing more is written."""
        while pos < self.max_offset:
            mf = self.files.find_file(pos)
            if mf is None:
                return pos, 0
            local = pos - mf.file_from_offset
            if local + 4 > mf.wrote_pos:
                pos = mf.end_offset
                continue
            first = _INT.unpack_from(mf.mm, local)[0]
            if first == BLANK_MAGIC_CODE:
                pos = mf.end_offset
                continue
            return pos, first
        return pos, 0
