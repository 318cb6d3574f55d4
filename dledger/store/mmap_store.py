"""`DLedgerMmapFileStore`: DLedger's file store — data files, index files, checkpoint.

Layout under `{storeBaseDir}/dledger-{selfId}/`: `data/` (entries, `mappedFileSizeForEntryData`
per file), `index/` (32-byte records at `index * 32`), `checkpoint` (`endIndex`, `committedIndex`).

Appends encode straight into the mapped files on the event loop (hooks stamp the mapped bytes, the
body CRC is taken after them, and the entry counts only once its index record is written). The
parts with their own modules: recovery on `start()` (`mmap_recovery`), flushing, group commit and
checkpoints (`flush_service.FlushDataService`), disk-full and expiry (`clean_space.CleanSpaceService`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from zlib_ng.zlib_ng import crc32  # zlib's CRC-32, SIMD: ~15x faster on 100 KB entries

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import (
    BLANK,
    BLANK_MAGIC_CODE,
    BODY_OFFSET,
    HEADER,
    INDEX_RECORD,
    INDEX_UNIT_SIZE,
    MAX_BODY_SIZE,
    MIN_BLANK_LEN,
    VALID_MAGICS,
    DLedgerEntry,
    IndexRecord,
    body_crc32,
)
from dledger.store.base import DLedgerStore
from dledger.store.checkpoint import (
    CATCHUP_FILE,
    CHECKPOINT_FILE,
    Checkpoint,
    write_catchup_watermark,
    write_checkpoint,
)
from dledger.store.clean_space import CleanSpaceService
from dledger.store.file_list import WRITE_THROUGH_FD, MmapFile, MmapFileList
from dledger.store.flush_service import FlushDataService
from dledger.store.mmap_recovery import RecoveredLog, recover_files
from dledger.store.verify import verify_old_files

log = logging.getLogger(__name__)

_E = DLedgerResponseCode
_CRC_FIX = 0x80000000  # crc - ((crc & _CRC_FIX) << 1) turns zlib's unsigned CRC into a Java int
_BUFFER_TYPES = (bytes, bytearray, memoryview)


class _FollowerRun(NamedTuple):
    """A validated follower run: its index records and where it ends."""

    records: bytearray
    last_index: int
    last_term: int
    end_pos: int
    contiguous: bool  # every entry right after the one before it (else: the slow path)
    raw: bytes | memoryview | None  # the received encoding, when it is exactly what we store


class DLedgerMmapFileStore(DLedgerStore):
    """The mmap-backed DLedger log. See `DLedgerStore` for the contract of each method.

    `disk_used_ratio` (optional) replaces the disk-usage probe (`shutil.disk_usage` of the store
    dir) so tests can present a full disk; the decisions taken on the ratio are the real ones.
    """

    def __init__(self, config: DLedgerConfig, *, disk_used_ratio: Callable[[], float] | None = None) -> None:
        self.config = config
        self.append_hooks = []
        self.data_file_list = MmapFileList(config.data_store_path(), config.mapped_file_size_for_entry_data)
        self.index_file_list = MmapFileList(config.index_store_path(),
                                            config.mapped_file_size_for_entry_index)
        if config.mapped_file_size_for_entry_index % INDEX_UNIT_SIZE:
            raise ValueError("mapped_file_size_for_entry_index must be a multiple of 32")
        self.checkpoint_path = os.path.join(config.default_path(), CHECKPOINT_FILE)
        self.clean_space_service = CleanSpaceService(self, disk_used_ratio)
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.committed_pos = -1
        self._data_begin_pos = -1
        self._committed_term = -1
        self._flushed_index = -1
        self._truncate_epoch = 0
        self._disk_full = False
        # Set by recovery when it had to cut committed entries: the index to re-fetch up to before
        # this member votes or campaigns again (-1: none). Persisted in the `catchup` file.
        self.catchup_watermark = -1
        # Set by recovery when older data files were not scanned: the data position where its scan
        # began. `start` verifies everything before it in the background (`verify`); meanwhile
        # `verifying` is True and the member neither campaigns nor takes leadership.
        self.unverified_region: int | None = None
        self.verifying = False
        # Called (with the reason) right before a corrupt log found while running is cut.
        self.corrupt_cut_listeners: list[Callable[[str], None]] = []
        self._verify_task: asyncio.Task[bool] | None = None
        self._recovered = False
        self._closed = False
        self.flush_service = FlushDataService(self)
        self._flush_task: asyncio.Task[None] | None = None
        self._clean_task: asyncio.Task[None] | None = None
        self.log_ctx = f"group={config.group} selfId={config.self_id}"  # names this store in log lines

    # ---- lifecycle ------------------------------------------------------------------------------

    def recover(self) -> None:
        """Load the files and rebuild the ledger state (blocking; `start` runs it in a thread)."""
        if self._recovered:
            return
        os.makedirs(self.config.default_path(), exist_ok=True)
        self._set_recovered_state(recover_files(self.data_file_list, self.index_file_list,
                                                self.checkpoint_path, self.log_ctx))
        self._recovered = True
        log.info("event=store_recovered %s begin=%d end=%d endTerm=%d committed=%d dataEnd=%d", self.log_ctx,
                 self.ledger_begin_index, self.ledger_end_index, self.ledger_end_term,
                 self.committed_index, self.data_file_list.max_wrote_position)

    def _set_recovered_state(self, r: RecoveredLog) -> None:
        """Ledger state from what recovery found (step 5 of `mmap_recovery`)."""
        self.catchup_watermark = r.catchup_watermark
        self.ledger_end_index = r.end_index
        self.ledger_end_term = r.end_term
        self.revise_ledger_begin_index()
        if r.scan_start_pos is not None and self._data_begin_pos >= 0:
            # Files before the scan start were not scanned (only the first one's first entry was):
            # they are verified in the background after start (`verify`), and the member neither
            # campaigns nor takes leadership until that is done.
            self.unverified_region = r.scan_start_pos
            self.verifying = True
        self._flushed_index = r.end_index
        committed = min(r.checkpoint_committed, r.end_index)  # what is left below it is committed
        if committed >= 0 and self.ledger_begin_index <= committed:
            self.committed_index = committed
            p, s = self.get_entry_pos_and_size(committed)
            self.committed_pos = p + s
        elif 0 <= committed:
            # The committed entry's file was deleted as expired: everything kept is above it.
            self.committed_index = committed
            self.committed_pos = self._data_begin_pos

    def clear_catchup_watermark(self) -> None:
        """The log has reached the catch-up watermark again: forget it, durably (blocking, once)."""
        write_catchup_watermark(os.path.join(self.config.default_path(), CATCHUP_FILE), -1)
        self.catchup_watermark = -1

    async def start(self) -> None:
        """Recover, then start the flush/checkpoint and clean-space services."""
        if not self._recovered:
            await asyncio.to_thread(self.recover)
        self.check_disk_space()
        self._flush_task = self.flush_service.start()
        self._clean_task = asyncio.create_task(self.clean_space_service.run(),
                                               name=f"dledger-clean-{self.config.self_id}")
        if self.unverified_region is not None and self._verify_task is None:
            self._verify_task = asyncio.create_task(verify_old_files(self),
                                                    name=f"dledger-verify-{self.config.self_id}")

    async def wait_verified(self) -> bool:
        """Wait for the background verification of the older data files (True: nothing corrupt
        or nothing to verify; False: the log was cut)."""
        return True if self._verify_task is None else await asyncio.shield(self._verify_task)

    async def shutdown(self) -> None:
        """Stop the services, flush everything, write the checkpoint, unmap the files."""
        if self._closed:
            return
        self._closed = True
        await self.flush_service.stop(self._flush_task)
        for task in (self._clean_task, self._verify_task):
            if task is not None:
                task.cancel()
        if self._recovered:
            if self.flush_service.started:
                await self.flush_service.flush_round()
                await asyncio.to_thread(self.write_checkpoint)
            else:
                self.flush()
                self.write_checkpoint()
        self.flush_service.fail_waiters(DLedgerException(_E.INTERNAL_ERROR,
                                                         "store shut down before the flush"))
        self.data_file_list.close()
        self.index_file_list.close()
        log.info("event=store_shutdown %s end=%d committed=%d", self.log_ctx, self.ledger_end_index,
                 self.committed_index)

    def close_without_flush(self) -> None:
        """Drop the maps without flushing or checkpointing (what a crash leaves; for tests)."""
        self._closed = True
        for task in (self._flush_task, self._clean_task, self._verify_task):
            if task is not None:
                task.cancel()
        self.data_file_list.close()
        self.index_file_list.close()

    # ---- appending ------------------------------------------------------------------------------

    def _check_append(self, body_len: int) -> None:
        if self._closed or not self._recovered:
            raise DLedgerException(_E.DISK_ERROR, f"store {self.config.default_path()} is "
                                   f"{'shut down' if self._closed else 'not recovered yet (call start())'}")
        if self._disk_full:
            raise DLedgerException(_E.DISK_FULL, f"disk used ratio above {self.config.disk_full_ratio:.2f}; "
                                   f"store {self.config.default_path()} refuses appends")
        if body_len > MAX_BODY_SIZE:
            raise DLedgerException(_E.UNEXPECTED_ARGUMENT, f"body of {body_len} bytes > {MAX_BODY_SIZE}")

    def _check_entry(self, entry: DLedgerEntry, term: int) -> None:
        """Refuse what recovery would later take for corruption (and cut)."""
        self._check_encodable(entry)
        if term < 0 or term < self.ledger_end_term:
            raise DLedgerException(_E.INCONSISTENT_TERM, f"append in term {term} below the log's end term "
                                   f"{self.ledger_end_term}")

    @staticmethod
    def _check_encodable(entry: DLedgerEntry) -> None:
        if entry.magic not in VALID_MAGICS or not isinstance(entry.body, _BUFFER_TYPES):
            raise DLedgerException(_E.UNEXPECTED_ARGUMENT, f"entry magic {entry.magic!r} / body type "
                                   f"{type(entry.body).__name__}: expected magic 1-3 and bytes")
        if entry.channel or entry.chain_crc:
            raise DLedgerException(_E.UNEXPECTED_ARGUMENT, f"channel {entry.channel} / chainCrc "
                                   f"{entry.chain_crc}: reserved fields must be 0")

    def append_as_leader(self, entry: DLedgerEntry, term: int) -> DLedgerEntry:
        """Append `entry` as index end + 1 in `term`; hooks may stamp its body before it counts."""
        body = entry.body
        blen = len(body)
        self._check_append(blen)
        self._check_entry(entry, term)
        size = BODY_OFFSET + blen
        index = self.ledger_end_index + 1
        mf, off = self.data_file_list.reserve(size)
        pos = mf.file_from_offset + off
        entry.index = index
        entry.term = term
        entry.pos = pos
        entry.size = size
        try:
            if self.append_hooks:
                self._write_with_hooks(mf, off, entry)
            else:
                crc = crc32(body)
                crc -= (crc & _CRC_FIX) << 1
                entry.body_crc = crc
                self._write_entry(mf, off, entry, crc)
            self._append_index_records(INDEX_RECORD.pack(entry.magic, pos, size, index, term), index, pos)
        except BaseException:
            self.data_file_list.truncate_offset(pos)  # a claimed but unwritten gap would end recovery
            raise
        self.ledger_end_index = index
        self.ledger_end_term = term
        if self._data_begin_pos < 0:  # the first entry stored (the log may start after a snapshot)
            self.ledger_begin_index = index
            self._data_begin_pos = pos
        return entry

    @staticmethod
    def _write_entry(mf: MmapFile, off: int, entry: DLedgerEntry, crc: int) -> None:
        """Header and body at `off`: a small entry straight into the map (cheaper than a syscall),
        a large one with `MmapFile.write` (pwrite, no page-fault zero-fill)."""
        size = entry.size
        if size < WRITE_THROUGH_FD:
            mm = mf.mm
            HEADER.pack_into(mm, off, entry.magic, size, entry.index, entry.term, entry.pos, entry.channel,
                             entry.chain_crc, crc, size - BODY_OFFSET)
            mm[off + BODY_OFFSET:off + size] = entry.body
        else:
            mf.write(off, HEADER.pack(entry.magic, size, entry.index, entry.term, entry.pos, entry.channel,
                                      entry.chain_crc, crc, size - BODY_OFFSET), entry.body)

    def _write_with_hooks(self, mf, off: int, entry: DLedgerEntry) -> None:
        """Encode (into the map for a small entry, into a buffer for a large one: see
        `_write_entry`), let the hooks stamp it, CRC what they left, then write the header (and
        the buffer). The caller rolls the claim back if this raises."""
        size = entry.size
        small = size < WRITE_THROUGH_FD
        if small:
            buf, at = mf.mm, off
            view = mf.mv[off:off + size]
        else:
            buf, at = bytearray(size), 0
            view = memoryview(buf)
        HEADER.pack_into(buf, at, entry.magic, size, entry.index, entry.term, entry.pos, entry.channel,
                         entry.chain_crc, 0, size - BODY_OFFSET)
        buf[at + BODY_OFFSET:at + size] = entry.body
        try:
            for hook in self.append_hooks:
                hook(entry, view, BODY_OFFSET)
            body = bytes(view[BODY_OFFSET:])  # the stamped body: CRC it and hand it back
        finally:
            view.release()  # the store unmaps files only without views
        crc = crc32(body)
        crc -= (crc & _CRC_FIX) << 1
        # Re-write the header whole: hooks own the body, never the header.
        HEADER.pack_into(buf, at, entry.magic, size, entry.index, entry.term, entry.pos, entry.channel,
                         entry.chain_crc, crc, size - BODY_OFFSET)
        if not small:
            mf.write(off, buf)
        entry.body_crc = crc
        entry.body = body

    def _append_index_records(self, records: bytes | bytearray, first_index: int, first_pos: int) -> None:
        ipos = first_index * INDEX_UNIT_SIZE
        il = self.index_file_list
        if len(records) == INDEX_UNIT_SIZE:
            imf, ioff = il.reserve(INDEX_UNIT_SIZE, use_blank=False)
            landed = imf.file_from_offset + ioff
            if landed == ipos:
                imf.mm[ioff:ioff + INDEX_UNIT_SIZE] = records
                return
            imf.wrote_pos = ioff
        else:
            landed = il.next_append_pos(INDEX_UNIT_SIZE, use_blank=False) if il.files else 0
            if landed == ipos:
                il.append_spanning(records)
                return
        self.data_file_list.truncate_offset(first_pos)
        raise DLedgerException(_E.DISK_ERROR, f"index record of entry {first_index} would land at {landed}, "
                               f"expected {ipos}")

    def batch_append_as_leader(self, entries: Sequence[DLedgerEntry], term: int) -> list[DLedgerEntry]:
        """Append `entries` in order as one unit (all or none are appended)."""
        n = len(entries)
        if n == 0:
            return []
        self._check_append(max(len(e.body) for e in entries))
        self._check_entry(entries[0], term)  # the term check; magics are checked in the loop below
        hooks = self.append_hooks
        dl = self.data_file_list
        pack_header = HEADER.pack_into
        pack_index = INDEX_RECORD.pack_into
        records = bytearray(n * INDEX_UNIT_SIZE)
        first_index = index = self.ledger_end_index + 1
        first_pos = -1
        roff = 0
        # The current file's state lives in locals; `reserve` is called only to roll to a new file.
        mf = dl.files[-1] if dl.files else None
        wrote = mf.wrote_pos if mf else 0
        room = mf.file_size - MIN_BLANK_LEN if mf else -1
        try:
            for entry in entries:
                body = entry.body
                blen = len(body)
                size = BODY_OFFSET + blen
                magic = entry.magic
                if magic not in VALID_MAGICS:
                    raise DLedgerException(_E.UNEXPECTED_ARGUMENT, f"entry magic {magic!r}: expected 1-3")
                if wrote + size <= room:
                    off = wrote
                else:
                    if mf is not None:
                        mf.wrote_pos = wrote
                    mf, off = dl.reserve(size)
                    room = mf.file_size - MIN_BLANK_LEN
                wrote = off + size
                pos = mf.file_from_offset + off
                if first_pos < 0:
                    first_pos = pos
                entry.index = index
                entry.term = term
                entry.pos = pos
                entry.size = size
                if hooks:
                    mf.wrote_pos = wrote
                    self._write_with_hooks(mf, off, entry)
                else:
                    crc = crc32(body)
                    crc -= (crc & _CRC_FIX) << 1
                    entry.body_crc = crc
                    if size < WRITE_THROUGH_FD:  # _write_entry's small case, inlined for small batches
                        mm = mf.mm
                        pack_header(mm, off, magic, size, index, term, pos, entry.channel, entry.chain_crc,
                                    crc, blen)
                        mm[off + BODY_OFFSET:off + size] = body
                    else:
                        self._write_entry(mf, off, entry, crc)
                pack_index(records, roff, magic, pos, size, index, term)
                roff += INDEX_UNIT_SIZE
                index += 1
            if mf is not None:
                mf.wrote_pos = wrote
        except BaseException:
            if mf is not None and mf.wrote_pos < wrote:
                mf.wrote_pos = wrote  # so the cut below zeroes what this batch wrote
            if first_pos >= 0:
                dl.truncate_offset(first_pos)
            raise
        self._append_index_records(records, first_index, first_pos)
        self.ledger_end_index = index - 1
        self.ledger_end_term = term
        if self._data_begin_pos < 0:  # the first entry stored (the log may start after a snapshot)
            self.ledger_begin_index = first_index
            self._data_begin_pos = first_pos
        return list(entries)

    def append_as_follower(self, entry: DLedgerEntry, leader_term: int, leader_id: str) -> DLedgerEntry:
        """Append the leader's entry at its index and pos (INCONSISTENT_INDEX / DISK_ERROR otherwise)."""
        self._check_append(len(entry.body))
        if entry.index != self.ledger_end_index + 1:
            raise DLedgerException(_E.INCONSISTENT_INDEX, f"entry index {entry.index} from leader "
                                   f"{leader_id} (term {leader_term}) != local end index "
                                   f"{self.ledger_end_index} + 1")
        if entry.term < self.ledger_end_term:
            raise DLedgerException(_E.INCONSISTENT_TERM, f"entry {entry.index} term {entry.term} < local end "
                                   f"term {self.ledger_end_term} (leader {leader_id}, term {leader_term})")
        self._check_entry(entry, entry.term)
        self._write_follower_entry(entry, leader_id)
        return entry

    def batch_append_as_follower(self, entries: Sequence[DLedgerEntry], leader_term: int, leader_id: str,
                                 raw: bytes | memoryview | None = None) -> None:
        """Append the leader's contiguous run `entries` (index end + 1 onwards, each at the leader's
        pos) as one unit: everything is validated first (index continuity, terms, positions, sizes,
        body CRCs), so a refused run writes nothing. When the run fits the current data file it is
        one copy into the map — `raw`, the run's exact encoding as received, written as-is — and one
        slice of index records; a run crossing a file end goes entry by entry (each pos checked,
        rolled back whole on failure)."""
        if not entries:
            return
        self._check_append(0)  # closed / disk full; body sizes are checked in the loop
        run = self._validate_follower_run(entries, leader_term, leader_id, raw)
        total = run.end_pos - entries[0].pos
        dl = self.data_file_list
        mf = dl.files[-1] if dl.files else None
        if not run.contiguous or mf is None or mf.file_size - mf.wrote_pos < total + MIN_BLANK_LEN:
            self._append_follower_run_slowly(entries, leader_id)
            return
        self._write_follower_run(mf, entries, run, leader_id)

    def _validate_follower_run(self, entries: Sequence[DLedgerEntry], leader_term: int, leader_id: str,
                               raw: bytes | memoryview | None) -> _FollowerRun:
        """Check a follower run against our end and itself; stamp each entry's size and body CRC
        and build its index records (written only once the data is)."""
        index = self.ledger_end_index + 1
        term = self.ledger_end_term
        pos = entries[0].pos
        contiguous = True
        records = bytearray(len(entries) * INDEX_UNIT_SIZE)
        pack_index = INDEX_RECORD.pack_into
        roff = 0
        for e in entries:
            body = e.body
            eindex, eterm, epos, magic = e.index, e.term, e.pos, e.magic
            if eindex != index:
                raise DLedgerException(_E.INCONSISTENT_INDEX, f"entry index {eindex} from leader "
                                       f"{leader_id} (term {leader_term}) != expected {index} (local end "
                                       f"{self.ledger_end_index})")
            if eterm < term:
                raise DLedgerException(_E.INCONSISTENT_TERM, f"entry {eindex} term {eterm} < term {term} "
                                       f"before it (leader {leader_id}, term {leader_term})")
            if epos != pos:
                contiguous = False  # the leader rolled to a new data file (or pos is wrong): slow path
            blen = len(body)
            if magic not in VALID_MAGICS or blen > MAX_BODY_SIZE:
                self._check_append(blen)
                self._check_encodable(e)
            size = BODY_OFFSET + blen
            if e.size != size and e.size:
                raise DLedgerException(_E.DISK_ERROR, f"entry {eindex} from leader {leader_id}: size "
                                       f"{e.size} != {BODY_OFFSET} + body {blen}")
            crc = crc32(body)
            crc -= (crc & _CRC_FIX) << 1
            if e.body_crc != crc:
                if e.body_crc:
                    raise DLedgerException(_E.DISK_ERROR, f"entry {eindex} from leader {leader_id}: body "
                                           f"CRC {e.body_crc} != computed {crc}")
                raw = None  # an unset CRC is stamped here: the received bytes are not what we store
            e.size = size
            e.body_crc = crc
            pack_index(records, roff, magic, epos, size, eindex, eterm)
            roff += INDEX_UNIT_SIZE
            term = eterm
            index += 1
            pos = epos + size
        if raw is None:
            for e in entries:
                self._check_encodable(e)  # channel / chainCrc must fit the header's int32 fields
        return _FollowerRun(records, index - 1, term, pos, contiguous, raw)

    def _write_follower_run(self, mf: MmapFile, entries: Sequence[DLedgerEntry], run: _FollowerRun,
                            leader_id: str) -> None:
        """A validated run that fits the current data file: one copy, one slice of index records."""
        dl = self.data_file_list
        first_pos, first_index = entries[0].pos, entries[0].index
        total = run.end_pos - first_pos
        off = mf.wrote_pos
        if mf.file_from_offset + off != first_pos:
            raise DLedgerException(_E.DISK_ERROR, f"entry {first_index} from leader {leader_id} is at "
                                   f"pos {first_pos} but would land at local pos {mf.file_from_offset + off}")
        mf.wrote_pos = off + total
        try:
            if run.raw is not None and len(run.raw) == total:
                mf.write(off, run.raw)
            else:
                buf = bytearray(total)
                pack_header = HEADER.pack_into
                o = 0
                for e in entries:
                    size = e.size
                    pack_header(buf, o, e.magic, size, e.index, e.term, e.pos, e.channel, e.chain_crc,
                                e.body_crc, size - BODY_OFFSET)
                    buf[o + BODY_OFFSET:o + size] = e.body
                    o += size
                mf.write(off, buf)
            self._append_index_records(run.records, first_index, first_pos)
        except BaseException:
            dl.truncate_offset(first_pos)
            raise
        self.ledger_end_index = run.last_index
        self.ledger_end_term = run.last_term
        if self._data_begin_pos < 0:  # the first entry stored (the log may start after a snapshot)
            self.ledger_begin_index = first_index
            self._data_begin_pos = first_pos

    def _append_follower_run_slowly(self, entries: Sequence[DLedgerEntry], leader_id: str) -> None:
        """A validated run that crosses a data-file end: entry by entry, all or nothing."""
        end_index, end_term = self.ledger_end_index, self.ledger_end_term
        begin_index, data_begin = self.ledger_begin_index, self._data_begin_pos
        try:
            for e in entries:
                self._write_follower_entry(e, leader_id)
        except BaseException:
            if self.ledger_end_index != end_index:
                self.data_file_list.truncate_offset(entries[0].pos)
                self.index_file_list.truncate_offset(entries[0].index * INDEX_UNIT_SIZE)
                self.ledger_end_index, self.ledger_end_term = end_index, end_term
                self.ledger_begin_index, self._data_begin_pos = begin_index, data_begin
            raise

    def _write_follower_entry(self, entry: DLedgerEntry, leader_id: str) -> None:
        body = entry.body
        size = BODY_OFFSET + len(body)
        expected = self.data_file_list.next_append_pos(size)
        if expected != entry.pos:
            raise DLedgerException(_E.DISK_ERROR, f"entry {entry.index} from leader {leader_id} is at pos "
                                   f"{entry.pos} but would land at local pos {expected}")
        crc = body_crc32(body)
        if entry.body_crc and entry.body_crc != crc:
            raise DLedgerException(_E.DISK_ERROR, f"entry {entry.index} from leader {leader_id}: body CRC "
                                   f"{entry.body_crc} != computed {crc}")
        mf, off = self.data_file_list.reserve(size)
        entry.size = size
        entry.body_crc = crc
        try:
            mf.write(off, HEADER.pack(entry.magic, size, entry.index, entry.term, entry.pos, entry.channel,
                                      entry.chain_crc, crc, len(body)), body)
            self._append_index_records(INDEX_RECORD.pack(entry.magic, entry.pos, size, entry.index,
                                                         entry.term), entry.index, entry.pos)
        except BaseException:
            self.data_file_list.truncate_offset(entry.pos)
            raise
        self.ledger_end_index = entry.index
        self.ledger_end_term = entry.term
        if self._data_begin_pos < 0:  # the first entry stored (the log may start after a snapshot)
            self.ledger_begin_index = entry.index
            self._data_begin_pos = entry.pos

    # ---- reading --------------------------------------------------------------------------------

    def get_entry_pos_and_size(self, index: int) -> tuple[int, int]:
        """(pos, size) of entry `index` from its index record."""
        if not self.ledger_begin_index <= index <= self.ledger_end_index or index < 0:
            raise DLedgerException(_E.INDEX_OUT_OF_RANGE, f"index {index} outside "
                                   f"[{self.ledger_begin_index}, {self.ledger_end_index}]")
        ipos = index * INDEX_UNIT_SIZE
        imf = self.index_file_list.find_file(ipos)
        if imf is None:
            raise DLedgerException(_E.DISK_ERROR, f"no index file holds the record of index {index}")
        _, pos, size, rec_index, _ = INDEX_RECORD.unpack_from(imf.mm, ipos - imf.file_from_offset)
        if rec_index != index:
            raise DLedgerException(_E.DISK_ERROR,
                                   f"index record at {ipos} names index {rec_index}, not {index}")
        return pos, size

    def get(self, index: int) -> DLedgerEntry:
        """Entry `index`, checked against its index record and its body CRC."""
        # Hot path (replication and reads): the lookups of get_entry_pos_and_size, inlined.
        if index < self.ledger_begin_index or index > self.ledger_end_index or index < 0:
            raise DLedgerException(_E.INDEX_OUT_OF_RANGE, f"index {index} outside "
                                   f"[{self.ledger_begin_index}, {self.ledger_end_index}]")
        ipos = index * INDEX_UNIT_SIZE
        ifiles = self.index_file_list.files
        k = (ipos - ifiles[0].file_from_offset) // self.index_file_list.file_size if ifiles else -1
        if not 0 <= k < len(ifiles):
            raise DLedgerException(_E.DISK_ERROR, f"no index file holds the record of index {index}")
        imf = ifiles[k]
        local = ipos - imf.file_from_offset
        rec_magic, pos, size, rec_index, rec_term = INDEX_RECORD.unpack_from(imf.mm, local)
        dfiles = self.data_file_list.files
        k = (pos - dfiles[0].file_from_offset) // self.data_file_list.file_size if dfiles else -1
        if rec_index != index or not 0 <= k < len(dfiles):
            raise DLedgerException(_E.DISK_ERROR, f"index record of index {index} (index {rec_index}, "
                                   f"pos {pos}) does not point into the data files")
        mf = dfiles[k]
        off = pos - mf.file_from_offset
        mm = mf.mm
        if off + size > mf.wrote_pos or off < 0:
            raise DLedgerException(_E.DISK_ERROR,
                                   f"entry {index} at pos {pos} size {size} is not in the data files")
        magic, esize, eindex, term, epos, channel, chain_crc, crc, blen = HEADER.unpack_from(mm, off)
        if channel or chain_crc:
            raise DLedgerException(_E.DISK_ERROR, f"entry at pos {pos} (index {index}): reserved header "
                                   f"fields not zero (channel {channel}, chainCrc {chain_crc})")
        # The header is not covered by the body CRC: every field is checked against the record.
        if esize != size or eindex != index or epos != pos or blen + BODY_OFFSET != esize \
                or term != rec_term or magic != rec_magic:
            raise DLedgerException(_E.DISK_ERROR, f"entry at pos {pos} (index {eindex}, pos {epos}, "
                                   f"size {esize}, term {term}, magic {magic}) does not match index record "
                                   f"(index {index}, size {size}, term {rec_term}, magic {rec_magic})")
        body = mm[off + BODY_OFFSET:off + esize]
        actual = crc32(body)
        if actual - ((actual & _CRC_FIX) << 1) != crc:
            raise DLedgerException(_E.DISK_ERROR, f"body CRC mismatch at index {index} pos {pos}")
        return DLedgerEntry(body, magic, eindex, term, epos, channel, chain_crc, crc, esize)

    def get_range(self, first: int, last: int) -> list[DLedgerEntry]:
        """Entries `first`..`last` with the checks of `get` (index record, header, body CRC), reading
        each index file's records in one pass and looking a data file up only when the run leaves it."""
        if first > last:
            return []
        if first < self.ledger_begin_index or last > self.ledger_end_index or first < 0:
            raise DLedgerException(_E.INDEX_OUT_OF_RANGE, f"range {first}..{last} outside "
                                   f"[{self.ledger_begin_index}, {self.ledger_end_index}]")
        out: list[DLedgerEntry] = []
        ifl, dfl = self.index_file_list, self.data_file_list
        ifiles, dfiles = ifl.files, dfl.files
        unpack_header = HEADER.unpack_from
        mf = None
        lo = hi = 0
        i = first
        while i <= last:
            ipos = i * INDEX_UNIT_SIZE
            k = (ipos - ifiles[0].file_from_offset) // ifl.file_size if ifiles else -1
            if not 0 <= k < len(ifiles):
                raise DLedgerException(_E.DISK_ERROR, f"no index file holds the record of index {i}")
            imf = ifiles[k]
            local = ipos - imf.file_from_offset
            n = min(last - i + 1, (imf.file_size - local) // INDEX_UNIT_SIZE)
            records = imf.mm[local:local + n * INDEX_UNIT_SIZE]
            for rec_magic, pos, size, rec_index, rec_term in INDEX_RECORD.iter_unpack(records):
                if mf is None or not lo <= pos < hi:
                    kd = (pos - dfiles[0].file_from_offset) // dfl.file_size if dfiles else -1
                    if not 0 <= kd < len(dfiles):
                        raise DLedgerException(_E.DISK_ERROR, f"index record of index {i} (pos {pos}) does "
                                               f"not point into the data files")
                    mf = dfiles[kd]
                    lo, hi = mf.file_from_offset, mf.file_from_offset + mf.wrote_pos
                off = pos - lo
                if rec_index != i or pos + size > hi:
                    raise DLedgerException(_E.DISK_ERROR, f"index record of index {i} (index {rec_index}, "
                                           f"pos {pos}, size {size}) does not match the data files")
                mm = mf.mm
                magic, esize, eindex, term, epos, channel, chain_crc, crc, blen = unpack_header(mm, off)
                if channel or chain_crc or esize != size or eindex != i or epos != pos or term != rec_term \
                        or magic != rec_magic or blen + BODY_OFFSET != esize:
                    raise DLedgerException(_E.DISK_ERROR, f"entry at pos {pos} (index {eindex}, pos {epos}, "
                                           f"size {esize}) does not match index record (index {i})")
                body = mm[off + BODY_OFFSET:off + esize]
                actual = crc32(body)
                if actual - ((actual & _CRC_FIX) << 1) != crc:
                    raise DLedgerException(_E.DISK_ERROR, f"body CRC mismatch at index {i} pos {pos}")
                out.append(DLedgerEntry(body, magic, eindex, term, epos, channel, chain_crc, crc, esize))
                i += 1
        return out

    def get_data(self, pos: int, size: int) -> memoryview:
        """Zero-copy view of written data-file bytes (never across a file end)."""
        return self.data_file_list.get_data(pos, size)

    @property
    def data_begin_pos(self) -> int:
        """Position of the first entry still stored (-1 when empty)."""
        return self._data_begin_pos

    @property
    def data_end_pos(self) -> int:
        return self.data_file_list.max_wrote_position

    # ---- truncation and commit ------------------------------------------------------------------

    def truncate(self, entry: DLedgerEntry, leader_term: int, leader_id: str) -> int:
        """Make the leader's `entry` our last entry (DLedger's truncate). Refuses (INCONSISTENT_STATE)
        to cut a committed entry."""
        if self._closed or not self._recovered:
            raise DLedgerException(_E.DISK_ERROR, f"store {self.config.default_path()} is not open")
        self._check_encodable(entry)
        if entry.term < 0 or entry.index < 0:
            raise DLedgerException(_E.UNEXPECTED_ARGUMENT,
                                   f"truncate to index {entry.index} term {entry.term}")
        existed = False
        if self.ledger_begin_index <= entry.index <= self.ledger_end_index and entry.index >= 0:
            try:
                ours = self.get(entry.index)
                existed = (ours.pos == entry.pos and ours.term == entry.term and ours.magic == entry.magic
                           and ours.body == entry.body)
            except DLedgerException:
                existed = False
        cut_index = entry.index + 1 if existed else entry.index
        if cut_index <= self.committed_index and cut_index <= self.ledger_end_index:
            raise DLedgerException(_E.INCONSISTENT_STATE, f"truncate at index {cut_index} from leader "
                                   f"{leader_id} (term {leader_term}) would cut committed index "
                                   f"{self.committed_index}")
        truncate_pos = entry.pos + BODY_OFFSET + len(entry.body) if existed else entry.pos
        dl, il = self.data_file_list, self.index_file_list
        end = self.ledger_end_index
        if existed:
            in_place = True  # our identical copy sits at the leader's pos: cut right after it
        elif end >= 0 and self.ledger_begin_index <= cut_index <= end:
            # Our entry at cut_index must start where the leader's does, or the logs disagree earlier.
            in_place = self.get_entry_pos_and_size(cut_index)[0] == truncate_pos
        elif cut_index == end + 1:
            in_place = truncate_pos == dl.next_append_pos(BODY_OFFSET + len(entry.body))
        else:
            in_place = False
        if not in_place and cut_index <= end + 1 and self.committed_index >= self.ledger_begin_index >= 0:
            # The logs overlap but positions disagree: rebuilding would drop our committed entries.
            raise DLedgerException(_E.INCONSISTENT_STATE, f"leader {leader_id} (term {leader_term}) puts "
                                   f"index {entry.index} at pos {entry.pos}, which does not match the local "
                                   f"log (committed index {self.committed_index}); data file sizes differ?")
        self._truncate_epoch += 1
        if in_place:
            if dl.files and truncate_pos < dl.max_wrote_position:
                dl.truncate_offset(truncate_pos)
            if il.files and cut_index * INDEX_UNIT_SIZE < il.max_wrote_position:
                il.truncate_offset(cut_index * INDEX_UNIT_SIZE)
            self.ledger_end_index = cut_index - 1
            if self.ledger_end_index < max(self.ledger_begin_index, 0):
                self.ledger_begin_index = self.ledger_end_index = self.ledger_end_term = -1
                self._data_begin_pos = -1
            else:
                self.ledger_end_term = self.term_of(self.ledger_end_index)
        else:
            log.warning("event=store_rebuild %s index=%d pos=%d leader=%s term=%d", self.log_ctx, entry.index,
                        entry.pos, leader_id, leader_term)
            dl.rebuild_with_pos(entry.pos)
            il.rebuild_with_pos(entry.index * INDEX_UNIT_SIZE, use_blank=False)
            self.ledger_begin_index = self.ledger_end_term = -1
            self.ledger_end_index = entry.index - 1
            self._data_begin_pos = -1
            existed = False
        if not existed:
            self._write_follower_entry(entry, leader_id)
        self._flushed_index = min(self._flushed_index, cut_index - 1)
        self.flush_service.fail_waiters(
            DLedgerException(_E.INCONSISTENT_STATE, f"entry cut by truncate at {cut_index}"),
            above=self.ledger_end_index if existed else entry.index - 1)
        log.info("event=store_truncated %s index=%d existed=%s end=%d leader=%s term=%d", self.log_ctx,
                 entry.index, existed, self.ledger_end_index, leader_id, leader_term)
        return self.ledger_end_index

    def reset_to_snapshot(self, index: int, term: int, end_pos: int) -> None:
        """See `DLedgerStore.reset_to_snapshot`. The checkpoint is cleared first: with no entry
        stored, a committed index in it would make the next start take the store for a wiped one
        (the server re-applies the snapshot at start instead)."""
        if self._closed or not self._recovered:
            raise DLedgerException(_E.DISK_ERROR, f"store {self.config.default_path()} is not open")
        write_checkpoint(self.checkpoint_path, Checkpoint())
        self._truncate_epoch += 1
        self.flush_service.fail_waiters(DLedgerException(_E.INCONSISTENT_STATE, "log replaced by a snapshot"))
        self.data_file_list.rebuild_with_pos(end_pos)
        self.index_file_list.rebuild_with_pos((index + 1) * INDEX_UNIT_SIZE, use_blank=False)
        self.ledger_begin_index, self.ledger_end_index, self.ledger_end_term = index + 1, index, term
        self.ledger_before_begin_term = term
        self.committed_index, self.committed_pos = index, end_pos
        self._data_begin_pos = -1
        self._flushed_index = index
        if 0 <= self.catchup_watermark <= index:
            self.clear_catchup_watermark()
        log.warning("event=log_reset_to_snapshot %s index=%d term=%d nextPos=%d", self.log_ctx, index, term,
                    end_pos)

    def cut_corrupt_log(self, pos: int, last_index: int, reason: str) -> None:
        """Cut the log at data position `pos` (right after entry `last_index`, which is good)
        because the record at `pos` is corrupt (found by `verify` while running). Persists the
        catch-up watermark first, tells the `corrupt_cut_listeners` (synchronously: nothing else
        runs in between), then cuts."""
        dl, il = self.data_file_list, self.index_file_list
        old_end, committed = self.ledger_end_index, self.committed_index
        if last_index >= old_end:
            return  # nothing after the last good entry (the tail was cut meanwhile)
        watermark = max(old_end, committed, self.catchup_watermark)
        write_catchup_watermark(os.path.join(self.config.default_path(), CATCHUP_FILE), watermark)
        self.catchup_watermark = watermark
        for listener in list(self.corrupt_cut_listeners):
            try:
                listener(reason)
            except Exception:
                log.exception("event=corrupt_cut_listener_failed %s", self.log_ctx)
        dl.truncate_offset(pos)
        il.truncate_offset((last_index + 1) * INDEX_UNIT_SIZE if last_index >= 0 else -1)
        self._truncate_epoch += 1  # a flush round that overlapped the cut must not over-report
        if last_index < max(self.ledger_begin_index, 0):
            self.ledger_begin_index = self.ledger_end_index = self.ledger_end_term = -1
            self._data_begin_pos = -1
        else:
            self.ledger_end_index = last_index
            self.ledger_end_term = self.term_of(last_index)
        self._flushed_index = min(self._flushed_index, last_index)
        self.flush_service.fail_waiters(
            DLedgerException(_E.INCONSISTENT_STATE, f"entry cut as corrupt after {last_index}"),
            above=last_index)
        if committed > last_index:
            self.committed_index = last_index
            if last_index >= 0 and self.ledger_begin_index >= 0:
                p, s = self.get_entry_pos_and_size(last_index)
                self.committed_pos = p + s
            else:
                self.committed_pos = -1
        log.error("event=committed_entries_cut %s lastGoodIndex=%d committed=%d oldEnd=%d "
                  "catchUpWatermark=%d pos=%d detail=%s; re-fetching from the leader, not voting or "
                  "campaigning until the log reaches the watermark", self.log_ctx, last_index, committed,
                  old_end, watermark, pos, reason)

    def term_of(self, index: int) -> int:
        """Term of entry `index` from its index record (-1 when no index file holds it)."""
        ipos = index * INDEX_UNIT_SIZE
        imf = self.index_file_list.find_file(ipos)
        if imf is None:
            return -1
        return IndexRecord._make(INDEX_RECORD.unpack_from(imf.mm, ipos - imf.file_from_offset)).term

    def update_committed_index(self, term: int, committed_index: int) -> None:
        """DLedger's rules: ignore an older term, -1, a backwards move or one below begin; clamp to end."""
        if term < self._committed_term:
            return
        self._committed_term = term
        if committed_index == -1 or self.ledger_end_index == -1 or committed_index == self.committed_index:
            return
        if committed_index < self.committed_index or committed_index < self.ledger_begin_index:
            log.warning("event=committed_index_ignored %s term=%d new=%d committed=%d begin=%d", self.log_ctx,
                        term, committed_index, self.committed_index, self.ledger_begin_index)
            return
        committed_index = min(committed_index, self.ledger_end_index)
        pos, size = self.get_entry_pos_and_size(committed_index)
        self.committed_index = committed_index
        self.committed_pos = pos + size

    # ---- flushing -------------------------------------------------------------------------------

    @property
    def flushed_index(self) -> int:
        return self._flushed_index

    def set_flushed_index(self, index: int) -> None:
        self._flushed_index = index

    @property
    def truncate_epoch(self) -> int:
        """Bumped by every truncate, so a flush round that overlapped one does not over-report."""
        return self._truncate_epoch

    @property
    def flush_rounds(self) -> int:
        return self.flush_service.flush_rounds

    def flush(self) -> None:
        """fdatasync dirty data and index files now (blocking)."""
        self.flush_service.flush_now()

    async def wait_flushed(self, index: int) -> None:
        """Return once entries up to `index` are fsynced (group commit with concurrent callers)."""
        await self.flush_service.wait_flushed(index)

    def write_checkpoint(self) -> None:
        """Write the `checkpoint` file now (blocking)."""
        self.flush_service.write_checkpoint()

    # ---- disk space -----------------------------------------------------------------------------

    @property
    def is_disk_full(self) -> bool:
        return self._disk_full

    def check_disk_space(self, now: float | None = None) -> int:
        """One CleanSpaceService step (see `dledger.store.clean_space`); returns files deleted."""
        return self.clean_space_service.step(now)

    def set_disk_full(self, full: bool, ratio: float) -> None:
        if full != self._disk_full:
            log.warning("event=disk_full_changed %s full=%s usedRatio=%.3f diskFullRatio=%.3f", self.log_ctx,
                        full, ratio, self.config.disk_full_ratio)
            self._disk_full = full

    def retention_limit_pos(self) -> int:
        """Data files ending at or below this position may be deleted: the committed position, or
        the start of the entry `retention_floor()` names when that is lower (-1: none may go)."""
        limit = self.committed_pos
        floor = self.retention_floor() if self.retention_floor is not None else None
        if floor is not None and floor <= self.ledger_end_index:
            if floor < max(self.ledger_begin_index, 0):
                limit = min(limit, self._data_begin_pos)  # what it needs is gone already: keep the rest
            else:
                limit = min(limit, self.get_entry_pos_and_size(floor)[0])
        return limit

    def revise_ledger_begin_index(self) -> None:
        """Begin index/pos from the first data file's first entry; drop index files below it."""
        dl = self.data_file_list
        if self.ledger_end_index < 0 or not dl.files or dl.files[0].wrote_pos == 0:
            self.ledger_begin_index = -1 if self.ledger_end_index < 0 else self.ledger_end_index + 1
            self._data_begin_pos = -1
            return
        mf = dl.files[0]
        off = 0
        magic, length = BLANK.unpack_from(mf.mm, 0)
        if magic == BLANK_MAGIC_CODE:
            off = length
        _, _, self.ledger_begin_index, *_ = HEADER.unpack_from(mf.mm, off)
        self._data_begin_pos = mf.file_from_offset + off
        self.index_file_list.delete_files_before(self.ledger_begin_index * INDEX_UNIT_SIZE)
