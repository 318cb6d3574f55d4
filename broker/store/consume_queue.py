"""`ConsumeQueue`: the per-(topic, queueId) index into the commit log (RocketMQ's layout).

Each unit is 20 bytes, big-endian: commit-log offset 8, message size 4, tags hash code 8. Unit i
(the message with queue offset i) lives at byte i * 20 of the queue, which is a list of
`mappedFileSizeConsumeQueue`-byte files under `{storePathRootDir}/consumequeue/{topic}/{queueId}/`
named by their 20-digit start offset (a `dledger.store.file_list.MmapFileList` written densely).

An all-zero unit marks the end of written data (a real unit always has size > 0). A unit with size
0 and commit-log offset -1 is a filler, written only if the dispatcher ever met a gap (or before
the first unit of a queue that starts mid-file); readers skip it. Callers: the reput dispatcher
(`put_unit`), the pull path (`get_units`, `min_offset`, `max_offset`), offset reset by time
(`offset_for_timestamp`), and recovery (`recover`, `truncate_dirty`).
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from collections.abc import Callable

from dledger.store.file_list import MmapFileList

log = logging.getLogger(__name__)

CQ_STORE_UNIT_SIZE = 20
UNIT = struct.Struct(">qiq")  # commit-log offset, size, tags hash code
_ZERO_UNIT = bytes(CQ_STORE_UNIT_SIZE)
FILLER_PHYS = -1


class ConsumeQueue:
    """One consume queue. Offsets are unit numbers (queue offsets), not bytes."""

    def __init__(self, root_dir: str, topic: str, queue_id: int, file_size: int) -> None:
        if file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"consume queue file size {file_size} is not a multiple of 20")
        self.topic = topic
        self.queue_id = queue_id
        self.store_path = os.path.join(root_dir, topic, str(queue_id))
        self.files = MmapFileList(self.store_path, file_size)
        self.min_logic_offset = 0  # raised when old commit-log data is gone (correct_min_offset)
        self.max_phys_end = 0  # commit-log offset + size of the last unit: where dispatch resumes

    # ---- opening and recovery ----------------------------------------------------------------

    def load(self) -> None:
        self.files.load()

    def recover(self) -> None:
        """Find the real end (first all-zero unit) from the last files and cut there."""
        files = self.files.files
        if not files:
            return
        end = files[0].file_from_offset
        for mf in files[-3:] if len(files) > 3 else files:
            start_local = 0
            if mf.file_from_offset < end:
                start_local = end - mf.file_from_offset
            local = start_local
            while local + CQ_STORE_UNIT_SIZE <= mf.file_size:
                if mf.mm[local:local + CQ_STORE_UNIT_SIZE] == _ZERO_UNIT:
                    break
                local += CQ_STORE_UNIT_SIZE
            end = mf.file_from_offset + local
            if local < mf.file_size:
                break
        self.files.truncate_offset(end, stop_after_zeros=CQ_STORE_UNIT_SIZE * 1024)
        self._refresh_phys_end()
        self.min_logic_offset = self.files.min_offset // CQ_STORE_UNIT_SIZE

    def _refresh_phys_end(self) -> None:
        self.max_phys_end = 0
        off = self.max_offset - 1
        while off >= self.min_offset:
            phys, size, _ = self.get_unit(off)
            if size > 0:
                self.max_phys_end = phys + size
                return
            off -= 1

    def truncate_dirty(self, phys_limit: int) -> int:
        """Drop units whose message does not end at or before `phys_limit` (recovery: the commit
        log is shorter than what this queue indexes). Returns the number of units dropped."""
        max_off = self.max_offset
        keep = max_off
        while keep > self.min_offset:
            phys, size, _ = self.get_unit(keep - 1)
            if size == 0 or phys + size <= phys_limit:
                break
            keep -= 1
        if keep < max_off:
            self.files.truncate_offset(keep * CQ_STORE_UNIT_SIZE)
            self._refresh_phys_end()
            log.warning("event=cq_truncated topic=%s queueId=%d from=%d to=%d phys_limit=%d",
                        self.topic, self.queue_id, max_off, keep, phys_limit)
        return max_off - keep

    # ---- offsets ------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return max(self.min_logic_offset, self.files.min_offset // CQ_STORE_UNIT_SIZE)

    @property
    def max_offset(self) -> int:
        """Next queue offset to be written (number of units)."""
        return self.files.max_wrote_position // CQ_STORE_UNIT_SIZE

    # ---- writing ------------------------------------------------------------------------------

    def put_unit(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        """Write the unit of the message with `queue_offset`. A unit already present (replay after
        restart) is left alone; a gap is filled with filler units and logged. Returns True if written."""
        files = self.files.files
        if files:
            last = files[-1]
            wrote = last.wrote_pos
            if queue_offset * CQ_STORE_UNIT_SIZE == last.file_from_offset + wrote and wrote < last.file_size:
                # The common case, inline: the next unit, and room for it in the last file (file
                # sizes are multiples of 20). Same bytes as append_spanning, one pack_into.
                UNIT.pack_into(last.mm, wrote, phys, size, tags_code)
                last.wrote_pos = wrote + CQ_STORE_UNIT_SIZE
                self.max_phys_end = phys + size
                return True
        max_off = self.max_offset
        if queue_offset < max_off:
            return False
        if not files and queue_offset > 0:
            self._start_at(queue_offset)
        elif queue_offset > max_off:
            log.error("event=cq_gap topic=%s queueId=%d expected=%d got=%d phys=%d",
                      self.topic, self.queue_id, max_off, queue_offset, phys)
            filler = UNIT.pack(FILLER_PHYS, 0, 0)
            self.files.append_spanning(filler * (queue_offset - max_off))
        self.files.append_spanning(UNIT.pack(phys, size, tags_code))
        self.max_phys_end = phys + size
        return True

    def _start_at(self, queue_offset: int) -> None:
        """An empty queue whose first message has `queue_offset` > 0 (a member that joined after
        retention had moved the log's start): begin the files at the one holding that offset
        (fillers before it in that file) and serve from it."""
        pos = queue_offset * CQ_STORE_UNIT_SIZE
        start = pos - pos % self.files.file_size
        self.files.rebuild_with_pos(start, use_blank=False)
        if pos > start:
            self.files.append_spanning(UNIT.pack(FILLER_PHYS, 0, 0) * ((pos - start) // CQ_STORE_UNIT_SIZE))
        self.min_logic_offset = queue_offset
        log.info("event=cq_starts_at topic=%s queueId=%d offset=%d", self.topic, self.queue_id, queue_offset)

    def put_units(self, queue_offset: int, units: list[tuple[int, int]]) -> None:
        """`put_unit` for consecutive queue offsets from `queue_offset`, (phys, size) each, tags hash
        0: one write when they are the next units and fit in the last file."""
        files = self.files.files
        n = len(units)
        if files:
            last = files[-1]
            wrote = last.wrote_pos
            if queue_offset * CQ_STORE_UNIT_SIZE == last.file_from_offset + wrote \
                    and wrote + n * CQ_STORE_UNIT_SIZE <= last.file_size:
                pack_into, mm, at = UNIT.pack_into, last.mm, wrote
                for phys, size in units:
                    pack_into(mm, at, phys, size, 0)
                    at += CQ_STORE_UNIT_SIZE
                last.wrote_pos = at
                phys, size = units[-1]
                self.max_phys_end = phys + size
                return
        for i, (phys, size) in enumerate(units):
            self.put_unit(queue_offset + i, phys, size, 0)

    # ---- reading ------------------------------------------------------------------------------

    def get_unit(self, offset: int) -> tuple[int, int, int]:
        """(commit-log offset, size, tags hash code) of the unit at `offset`."""
        return UNIT.unpack(self.files.get_data(offset * CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE))

    def get_units(self, offset: int, max_units: int) -> list[tuple[int, int, int]]:
        """Up to `max_units` units from `offset` (within [min, max)); fillers included (size 0)."""
        end = min(self.max_offset, offset + max_units)
        out: list[tuple[int, int, int]] = []
        pos = offset
        fsize = self.files.file_size // CQ_STORE_UNIT_SIZE
        while pos < end:
            n = min(end - pos, fsize - pos % fsize)  # a read never crosses a file
            view = self.files.get_data(pos * CQ_STORE_UNIT_SIZE, n * CQ_STORE_UNIT_SIZE)
            out.extend(UNIT.iter_unpack(view))
            pos += n
        return out

    def offset_for_timestamp(self, ts_ms: int, store_time_of: Callable[[int, int], int | None]) -> int:
        """First queue offset whose message was stored at or after `ts_ms` (binary search over the
        store timestamps read from the commit log); max_offset when every message is older."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            phys, size, _ = self.get_unit(mid)
            st = store_time_of(phys, size) if size > 0 else None
            if st is None:  # filler or unreadable: search right of it
                lo = mid + 1
                continue
            if st < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def correct_min_offset(self, min_phys: int) -> None:
        """Units pointing below `min_phys` (deleted commit-log data) are no longer served."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self.get_unit(mid)[0] < min_phys:
                lo = mid + 1
            else:
                hi = mid
        if lo > self.min_logic_offset:
            self.min_logic_offset = lo

    # ---- lifecycle ----------------------------------------------------------------------------

    def flush(self) -> None:
        self.files.flush()

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.destroy()
        shutil.rmtree(self.store_path, ignore_errors=True)
