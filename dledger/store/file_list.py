"""`MmapFileList`: a sequence of fixed-size, memory-mapped files addressed by a global position.

RocketMQ's `MappedFileQueue` / DLedger's `MmapFileList`. Each file is pre-sized to `file_size` and
named by its 20-digit, zero-padded start offset, so `position -> file` is arithmetic. Writes go
into the mmap (page cache) on the caller's thread; `flush` fdatasyncs the files that have dirty
bytes (the kernel writes only the dirty pages, i.e. the dirty range). Entries never span files: when
an entry (plus `MIN_BLANK_LEN`) does not fit, the rest of the file gets a blank record
(`BLANK_MAGIC_CODE`, blank length) and the entry goes to the next file. Lists created with
`use_blank=False` (the index) are written densely and may be appended across file boundaries.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import BLANK, BLANK_MAGIC_CODE, MIN_BLANK_LEN

log = logging.getLogger(__name__)

_INT = struct.Struct(">i")
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)
# MmapFile.write: from this size up with pwrite; smaller records (small entries, index records,
# consume-queue units) through the map, where a syscall would cost more than the rare page fault.
WRITE_THROUGH_FD = 4096
_PAGE = mmap.PAGESIZE


def _disk_error(message: str) -> DLedgerException:
    return DLedgerException(DLedgerResponseCode.DISK_ERROR, message)


class MmapFile:
    """One pre-sized file mapped shared into memory. Positions inside it are local (0..file_size)."""

    __slots__ = ("closed", "fd", "file_from_offset", "file_size", "flushed_pos", "mm", "mv", "path",
                 "random_from", "wrote_pos")

    def __init__(self, path: str, file_from_offset: int, file_size: int) -> None:
        self.path = path
        self.file_from_offset = file_from_offset
        self.file_size = file_size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            actual = os.fstat(fd).st_size
            if actual < file_size:
                # A new file, or the last file of a crash that happened while it was being sized.
                os.ftruncate(fd, file_size)
            elif actual > file_size:
                raise _disk_error(f"{path}: size {actual} > configured file size {file_size}")
            self.mm = mmap.mmap(fd, file_size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd  # kept open for fdatasync, which (unlike mmap.flush) releases the GIL
        self.mv = memoryview(self.mm)
        self.wrote_pos = 0
        self.flushed_pos = 0
        self.closed = False
        self.random_from = file_size  # the map is MADV_RANDOM from here (page-aligned) to the end

    def advise_random_from(self, off: int) -> None:
        """No readahead on faults from `off` to the end: where the file is being appended.

        A read through the map of bytes just written with pwrite (the append hook's stamps, the
        dispatch, the push to followers) faults the page in, and the fault's readahead runs into
        the file's unwritten, sparse rest, allocating large folios there and zero-filling them:
        measured (perf, one-member group, 64 x 1 KB produces) as a quarter of a master's CPU.
        Bytes written before the store opened keep normal readahead (cold reads after a
        restart), and so does the whole file once it is full (`advise_normal`)."""
        start = off - off % _PAGE
        if start < self.random_from and not self.closed:
            self._advise("MADV_RANDOM", start)
            self.random_from = start

    def advise_normal(self) -> None:
        """Readahead again over the whole file (it is full: from now on only read, maybe cold)."""
        if self.random_from < self.file_size and not self.closed:
            self._advise("MADV_NORMAL", 0)
            self.random_from = self.file_size

    def _advise(self, advice: str, start: int) -> None:
        # Advice only: a platform without it (or refusing it) costs speed, never a write.
        try:
            self.mm.madvise(getattr(mmap, advice), start, self.file_size - start)
        except (AttributeError, OSError) as exc:
            log.debug("event=madvise_refused file=%s advice=%s error=%s", self.path, advice, exc)

    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    def is_full(self) -> bool:
        return self.wrote_pos >= self.file_size

    def mtime(self) -> float:
        return os.stat(self.path).st_mtime

    def write(self, off: int, *parts: bytes | bytearray | memoryview) -> None:
        """Write `parts` back to back at local offset `off`: from 4 KB up through the file
        descriptor (one pwritev), smaller writes through the map. Bulk data avoids the map because
        a store into a new page of the (sparse) file faults it in, and the fault's readahead
        zero-fills whole folios first — measured here, 70-300 us of CPU per 100 KB through the map
        against ~40 with pwrite, and the largest kernel cost of a follower. Reads still use the
        map: Linux has one page cache for both."""
        total = sum(len(p) for p in parts)
        if off < 0 or off + total > self.file_size:
            raise _disk_error(f"{self.path}: write of {total} bytes at {off} outside the file")
        if off < self.random_from:
            self.advise_random_from(off)
        if total < WRITE_THROUGH_FD:  # a syscall per small entry would cost more than the copy
            mm = self.mm
            for p in parts:
                mm[off:off + len(p)] = p
                off += len(p)
            return
        try:
            written = os.pwritev(self.fd, parts, off) if len(parts) > 1 else os.pwrite(self.fd, parts[0], off)
        except OSError as exc:
            raise _disk_error(f"{self.path}: write of {total} bytes at {off} failed: {exc}") from None
        if written != total:
            raise _disk_error(f"{self.path}: short write at {off}: {written} of {total} bytes")

    def fsync(self) -> None:
        """fdatasync the file (blocking; call from a worker thread on the async path)."""
        if not self.closed:
            os.fdatasync(self.fd)

    def zero_range(self, start: int, end: int, stop_after_zeros: int = 0) -> None:
        """Zero bytes [start, end) so stale bytes past a cut never look like entries again.

        Works in 1 MiB chunks and writes only chunks that hold a non-zero byte (a sparse file stays
        sparse). With `stop_after_zeros` > 0 it stops after that many consecutive all-zero bytes
        (used on recovery, where the stale region's end is unknown).
        """
        zeros_seen = 0
        pos = start
        mm = self.mm
        while pos < end:
            n = min(_ZERO_CHUNK, end - pos)
            if mm[pos:pos + n].count(0) == n:
                zeros_seen += n
                if stop_after_zeros and zeros_seen >= stop_after_zeros:
                    return
            else:
                mm[pos:pos + n] = _ZEROS[:n]
                zeros_seen = 0
            pos += n

    def close(self) -> None:
        """Unmap (if no reader still holds a view; otherwise the map goes when the last view does)."""
        if self.closed:
            return
        self.closed = True
        os.close(self.fd)
        try:
            self.mv.release()
            self.mm.close()
        except BufferError:
            log.debug("event=mmap_close_deferred file=%s reason=views_exported", self.path)

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class MmapFileList:
    """Files of `file_size` bytes in `store_path`, covering one contiguous global range."""

    def __init__(self, store_path: str, file_size: int) -> None:
        if file_size < 2 * MIN_BLANK_LEN:
            raise ValueError(f"file size {file_size} too small")
        self.store_path = store_path
        self.file_size = file_size
        self.files: list[MmapFile] = []

    # ---- opening -----------------------------------------------------------------------------

    def load(self) -> None:
        """Open the existing files in order. Their write positions start at the file size; the
        store's recovery then cuts the list back to the real end with `truncate_offset`.

        Raises DISK_ERROR if the names are not contiguous multiples of the file size or a file
        other than the last has the wrong size.
        """
        os.makedirs(self.store_path, exist_ok=True)
        names = sorted(n for n in os.listdir(self.store_path) if n.isdigit() and len(n) == 20)
        expected = None
        for i, name in enumerate(names):
            path = os.path.join(self.store_path, name)
            start = int(name)
            size = os.path.getsize(path)
            last = i == len(names) - 1
            if start % self.file_size:
                raise _disk_error(f"{path}: start offset {start} is not a multiple of file size "
                                  f"{self.file_size}")
            if expected is not None and start != expected:
                raise _disk_error(f"{path}: expected a file starting at {expected:020d} "
                                  "(gap in the file list)")
            if size != self.file_size:
                if not last or size > self.file_size:
                    raise _disk_error(f"{path}: size {size} != configured file size {self.file_size}")
                log.warning("event=short_file_extended file=%s size=%d file_size=%d",
                            path, size, self.file_size)
            mf = MmapFile(path, start, self.file_size)
            mf.wrote_pos = mf.flushed_pos = self.file_size
            self.files.append(mf)
            expected = start + self.file_size
        log.info("event=file_list_loaded dir=%s files=%d", self.store_path, len(self.files))

    def _new_file(self, start: int) -> MmapFile:
        mf = MmapFile(os.path.join(self.store_path, f"{start:020d}"), start, self.file_size)
        if self.files:
            self.files[-1].advise_normal()
        self.files.append(mf)
        return mf

    # ---- positions ---------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    @property
    def max_wrote_position(self) -> int:
        if not self.files:
            return 0
        last = self.files[-1]
        return last.file_from_offset + last.wrote_pos

    @property
    def max_flushed_position(self) -> int:
        if not self.files:
            return 0
        for mf in reversed(self.files):
            if mf.flushed_pos:
                return mf.file_from_offset + mf.flushed_pos
        return self.files[0].file_from_offset

    def find_file(self, pos: int) -> MmapFile | None:
        """The file holding global position `pos`, or None."""
        files = self.files
        if not files:
            return None
        i = (pos - files[0].file_from_offset) // self.file_size
        if 0 <= i < len(files):
            return files[i]
        return None

    # ---- writing -----------------------------------------------------------------------------

    def next_append_pos(self, length: int, use_blank: bool = True) -> int:
        """Where an append of `length` bytes would land, without writing anything."""
        self._check_length(length, use_blank)
        if not self.files:
            return 0
        last = self.files[-1]
        need = length + MIN_BLANK_LEN if use_blank else length
        if last.file_size - last.wrote_pos >= need:
            return last.file_from_offset + last.wrote_pos
        return last.end_offset

    def _check_length(self, length: int, use_blank: bool) -> None:
        need = length + MIN_BLANK_LEN if use_blank else length
        if length <= 0 or need > self.file_size:
            raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT,
                                   f"record of {length} bytes cannot fit a file of {self.file_size} bytes")

    def reserve(self, length: int, use_blank: bool = True) -> tuple[MmapFile, int]:
        """Claim `length` bytes: blank-fill and roll to a new file if they (plus MIN_BLANK_LEN)
        do not fit. Returns (file, local offset); the caller writes the bytes into `file.mm`.
        The file's write position already covers the claim."""
        files = self.files
        if files:
            last = files[-1]
            wrote = last.wrote_pos
            if last.file_size - wrote >= (length + MIN_BLANK_LEN if use_blank else length) and length > 0:
                last.wrote_pos = wrote + length
                if wrote < last.random_from:  # the caller may write into the map itself
                    last.advise_random_from(wrote)
                return last, wrote
        self._check_length(length, use_blank)
        last = self._roll(use_blank)
        last.wrote_pos = length
        last.advise_random_from(0)
        return last, 0

    def _roll(self, use_blank: bool) -> MmapFile:
        """Close the current file with a blank record (if room is left) and open the next one."""
        if not self.files:
            return self._new_file(0)
        last = self.files[-1]
        remaining = last.file_size - last.wrote_pos
        if remaining > 0:
            if use_blank:
                if remaining < MIN_BLANK_LEN:
                    raise _disk_error(f"{last.path}: {remaining} bytes left, below MIN_BLANK_LEN")
                BLANK.pack_into(last.mm, last.wrote_pos, BLANK_MAGIC_CODE, remaining)
            last.wrote_pos = last.file_size
        return self._new_file(last.end_offset)

    def pre_append(self, length: int, use_blank: bool = True) -> int:
        """Make room for `length` bytes (blank fill + roll-over) and return the global position
        where they will start. Nothing is claimed: `append` of the same length lands there."""
        pos = self.next_append_pos(length, use_blank)
        if not self.files or pos == self.files[-1].end_offset:
            self._roll(use_blank)
        return pos

    def append(self, data: bytes | bytearray | memoryview, use_blank: bool = True) -> int:
        """Write `data` as one record (never split across files); returns its global position."""
        mf, off = self.reserve(len(data), use_blank)
        mf.write(off, data)
        return mf.file_from_offset + off

    def append_spanning(self, data: bytes | bytearray | memoryview) -> int:
        """Write `data` densely (no blanks), continuing in new files as needed; for the index,
        whose file size is a multiple of the record size. Returns the global start position."""
        view = memoryview(data)
        if not self.files:
            start = 0
        else:
            last = self.files[-1]
            start = last.file_from_offset + last.wrote_pos
        done = 0
        total = len(view)
        while done < total:
            last = self.files[-1] if self.files else None
            if last is None or last.is_full():
                last = self._new_file(last.end_offset if last else 0)
            n = min(total - done, last.file_size - last.wrote_pos)
            if last.wrote_pos < last.random_from:
                last.advise_random_from(last.wrote_pos)
            last.mm[last.wrote_pos:last.wrote_pos + n] = view[done:done + n]
            last.wrote_pos += n
            done += n
        return start

    # ---- reading -----------------------------------------------------------------------------

    def get_data(self, pos: int, size: int) -> memoryview:
        """A zero-copy view of `size` written bytes at global `pos` (never across files).

        The view aliases the mapped file: it is valid until the range is truncated or the file
        deleted. Raises INDEX_OUT_OF_RANGE for an unwritten range, DISK_ERROR across a file end."""
        mf = self.find_file(pos)
        if mf is None or size < 0:
            raise DLedgerException(DLedgerResponseCode.INDEX_OUT_OF_RANGE,
                                   f"pos {pos} size {size} outside "
                                   f"[{self.min_offset}, {self.max_wrote_position})")
        off = pos - mf.file_from_offset
        if off + size > mf.wrote_pos:
            if off + size > mf.file_size:
                raise _disk_error(f"read of {size} bytes at pos {pos} crosses the end of {mf.path}")
            raise DLedgerException(DLedgerResponseCode.INDEX_OUT_OF_RANGE,
                                   f"pos {pos} size {size} beyond written position {self.max_wrote_position}")
        return mf.mv[off:off + size]

    # ---- cutting -----------------------------------------------------------------------------

    def truncate_offset(self, offset: int, zero_stale: bool = True, stop_after_zeros: int = 0) -> None:
        """Cut the list at global `offset`: later files are deleted, the file holding `offset`
        is rewound to it and its bytes after it zeroed (`offset` < 0 deletes everything)."""
        if offset < 0:
            for mf in self.files:
                log.info("event=file_deleted reason=truncate file=%s", mf.path)
                mf.destroy()
            self.files = []
            return
        if self.files and offset < self.files[0].file_from_offset:
            raise _disk_error(f"cannot truncate {self.store_path} at {offset}, below its first file "
                              f"{self.files[0].file_from_offset}; rebuild the list instead")
        keep: list[MmapFile] = []
        for mf in self.files:
            if mf.end_offset <= offset:
                keep.append(mf)
            elif mf.file_from_offset < offset or not keep:
                self._rewind(mf, offset - mf.file_from_offset, zero_stale, stop_after_zeros)
                keep.append(mf)
            else:
                log.info("event=file_deleted reason=truncate offset=%d file=%s", offset, mf.path)
                mf.destroy()
        self.files = keep

    @staticmethod
    def _rewind(mf: MmapFile, local: int, zero_stale: bool, stop_after_zeros: int) -> None:
        old = mf.wrote_pos
        if zero_stale and old > local:
            mf.zero_range(local, old, stop_after_zeros)
        mf.wrote_pos = local
        mf.flushed_pos = min(mf.flushed_pos, local)

    def reset_offset(self, pos: int) -> None:
        """Mark [file start, pos) of the only file as skipped with a head blank record."""
        mf = self.files[0]
        gap = pos - mf.file_from_offset
        if gap <= 0:
            return
        if gap < MIN_BLANK_LEN:
            raise _disk_error(f"cannot start the list at pos {pos}: {gap} bytes is below MIN_BLANK_LEN")
        BLANK.pack_into(mf.mm, 0, BLANK_MAGIC_CODE, gap)

    def rebuild_with_pos(self, pos: int, use_blank: bool = True) -> None:
        """Delete every file and restart the list so that the next append lands at `pos`."""
        self.truncate_offset(-1)
        start = pos - pos % self.file_size
        mf = self._new_file(start)
        mf.wrote_pos = pos - start
        if use_blank:
            self.reset_offset(pos)
        log.info("event=file_list_rebuilt dir=%s pos=%d", self.store_path, pos)

    # ---- flushing and deletion -----------------------------------------------------------------

    def dirty_files(self) -> list[tuple[MmapFile, int]]:
        """(file, write position now) for every file with bytes not yet flushed."""
        out = []
        # Files are written in order: scanning back from the last, the first clean file ends it.
        for mf in reversed(self.files):
            if mf.flushed_pos >= mf.wrote_pos:
                break
            out.append((mf, mf.wrote_pos))
        return out

    @staticmethod
    def fsync_files(targets: list[tuple[MmapFile, int]]) -> None:
        """fdatasync each target (blocking; safe in a worker thread)."""
        for mf, _ in targets:
            try:
                mf.fsync()
            except (OSError, ValueError):
                if not mf.closed:  # a file deleted meanwhile needs no flush
                    raise

    @staticmethod
    def mark_flushed(targets: list[tuple[MmapFile, int]]) -> None:
        for mf, wrote in targets:
            if wrote > mf.flushed_pos:
                mf.flushed_pos = min(wrote, mf.wrote_pos)

    def flush(self) -> int:
        """Flush every dirty file now (blocking). Returns the flushed position."""
        targets = self.dirty_files()
        self.fsync_files(targets)
        self.mark_flushed(targets)
        return self.max_flushed_position

    def delete_expired_files(self, expired_ms: int, now_ms: int | None = None, force: bool = False,
                             max_end_offset: int | None = None, max_files: int = 10) -> int:
        """Delete leading files older than `expired_ms` (by mtime), or regardless of age when
        `force`; never the last file and never a file reaching past `max_end_offset`. Returns the
        number deleted."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        deleted = 0
        while len(self.files) > 1 and deleted < max_files:
            mf = self.files[0]
            if max_end_offset is not None and mf.end_offset > max_end_offset:
                break
            if self.files[1].wrote_pos == 0:
                break  # keep a file that holds data, so the begin position stays known
            if not force and now_ms < int(mf.mtime() * 1000) + expired_ms:
                break
            log.info("event=file_deleted reason=%s file=%s", "force" if force else "expired", mf.path)
            mf.destroy()
            self.files.pop(0)
            deleted += 1
        return deleted

    def delete_files_before(self, offset: int) -> int:
        """Delete leading files that end at or before `offset` (keeping the last)."""
        deleted = 0
        while len(self.files) > 1 and self.files[0].end_offset <= offset:
            mf = self.files.pop(0)
            log.info("event=file_deleted reason=before_offset offset=%d file=%s", offset, mf.path)
            mf.destroy()
            deleted += 1
        return deleted

    def close(self) -> None:
        for mf in self.files:
            mf.close()

    def destroy(self) -> None:
        """Delete every file."""
        self.truncate_offset(-1)
