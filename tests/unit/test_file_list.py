"""MmapFileList (RocketMQ MappedFileQueue / DLedger MmapFileList) on real files in tmp dirs."""

from __future__ import annotations

import os
import struct
import time

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.store.file_list import MmapFileList

pytestmark = pytest.mark.usefixtures("mmap_files_closed")

FILE_SIZE = 256


def _names(path: str) -> list[str]:
    return sorted(os.listdir(path))


def test_files_are_named_by_20_digit_start_offset_and_roll_with_a_blank_record(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    fl.load()
    assert fl.append(b"a" * 100) == 0
    assert fl.append(b"b" * 100) == 100
    # 56 bytes left: 100 + MIN_BLANK_LEN does not fit, so the rest becomes a blank record.
    assert fl.append(b"c" * 100) == 256
    assert _names(str(tmp_path)) == ["00000000000000000000", "00000000000000000256"]
    first = (tmp_path / "00000000000000000000").read_bytes()
    assert len(first) == FILE_SIZE
    assert struct.unpack(">ii", first[200:208]) == (-1, 56)
    assert fl.max_wrote_position == 356
    assert bytes(fl.get_data(256, 100)) == b"c" * 100


def test_an_entry_that_leaves_exactly_min_blank_len_stays_in_the_file(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    assert fl.append(b"x" * (FILE_SIZE - 8)) == 0
    assert fl.append(b"y" * 8) == FILE_SIZE
    assert struct.unpack(">ii", (tmp_path / f"{0:020d}").read_bytes()[248:256]) == (-1, 8)


def test_pre_append_returns_where_the_next_append_lands(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    fl.append(b"a" * 200)
    assert fl.pre_append(100) == 256
    assert fl.max_wrote_position == 256  # nothing claimed yet, only the blank + roll
    assert fl.append(b"b" * 100) == 256


def test_record_that_cannot_fit_any_file_is_refused(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    with pytest.raises(DLedgerException) as e:
        fl.append(b"x" * (FILE_SIZE - 7))
    assert e.value.code is DLedgerResponseCode.UNEXPECTED_ARGUMENT
    assert fl.max_wrote_position == 0


def test_get_data_is_a_zero_copy_view_and_never_spans_files(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    fl.append(b"a" * 200)
    fl.append(b"b" * 100)
    view = fl.get_data(10, 20)
    assert isinstance(view, memoryview) and bytes(view) == b"a" * 20
    fl.files[0].mm[10:12] = b"zz"  # the view aliases the mapped file
    assert bytes(view[:2]) == b"zz"
    view.release()
    with pytest.raises(DLedgerException) as e:
        fl.get_data(250, 10)
    assert e.value.code is DLedgerResponseCode.DISK_ERROR
    with pytest.raises(DLedgerException) as e:
        fl.get_data(300, 100)  # beyond what is written
    assert e.value.code is DLedgerResponseCode.INDEX_OUT_OF_RANGE


def test_truncate_offset_deletes_later_files_and_zeroes_stale_bytes(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    for _ in range(6):
        fl.append(b"q" * 100)
    assert len(fl.files) == 3
    fl.truncate_offset(100)
    assert _names(str(tmp_path)) == [f"{0:020d}"]
    assert fl.max_wrote_position == 100
    data = (tmp_path / f"{0:020d}").read_bytes()
    assert data[:100] == b"q" * 100 and data[100:] == bytes(FILE_SIZE - 100)
    assert fl.append(b"r" * 10) == 100


def test_truncate_at_a_file_start_drops_that_file(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    for _ in range(4):
        fl.append(b"q" * 100)
    fl.truncate_offset(256)
    assert len(fl.files) == 1 and fl.files[0].is_full()
    assert fl.append(b"z" * 100) == 256


def test_rebuild_with_pos_restarts_the_list_with_a_head_blank(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    fl.append(b"a" * 100)
    fl.rebuild_with_pos(1000)
    assert _names(str(tmp_path)) == [f"{768:020d}"]
    assert fl.min_offset == 768 and fl.max_wrote_position == 1000
    assert struct.unpack(">ii", (tmp_path / f"{768:020d}").read_bytes()[:8]) == (-1, 232)
    assert fl.append(b"b" * 10) == 1000


def test_append_spanning_writes_densely_across_files(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), 64)
    assert fl.append_spanning(bytes(range(100))) == 0
    assert fl.append_spanning(bytes(range(100, 150))) == 100
    assert len(fl.files) == 3
    assert bytes(fl.get_data(60, 4)) == bytes(range(60, 64))
    assert bytes(fl.get_data(64, 36)) + bytes(fl.get_data(100, 28)) == bytes(range(64, 128))


def test_load_reopens_files_and_refuses_a_gap(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    for _ in range(6):
        fl.append(b"q" * 100)
    fl.flush()
    fl.close()
    again = MmapFileList(str(tmp_path), FILE_SIZE)
    again.load()
    assert [f.file_from_offset for f in again.files] == [0, 256, 512]
    assert bytes(again.get_data(512, 5)) == b"qqqqq"
    again.close()
    os.unlink(tmp_path / f"{256:020d}")
    broken = MmapFileList(str(tmp_path), FILE_SIZE)
    with pytest.raises(DLedgerException) as e:
        broken.load()
    assert e.value.code is DLedgerResponseCode.DISK_ERROR and f"{256:020d}" in str(e.value)


def test_load_refuses_a_wrong_sized_middle_file_and_extends_a_short_last_one(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    for _ in range(6):
        fl.append(b"q" * 100)
    fl.close()
    os.truncate(tmp_path / f"{512:020d}", 30)
    short = MmapFileList(str(tmp_path), FILE_SIZE)
    short.load()
    assert os.path.getsize(tmp_path / f"{512:020d}") == FILE_SIZE
    short.close()
    os.truncate(tmp_path / f"{0:020d}", 30)
    with pytest.raises(DLedgerException) as e:
        MmapFileList(str(tmp_path), FILE_SIZE).load()
    assert "size 30" in str(e.value)


def test_flush_moves_the_flushed_position(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    fl.append(b"a" * 200)
    fl.append(b"b" * 100)
    assert fl.max_flushed_position == 0
    assert fl.dirty_files()
    assert fl.flush() == 356
    assert not fl.dirty_files()


def test_delete_expired_files_by_mtime_keeps_the_last_and_respects_a_bound(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    for _ in range(8):
        fl.append(b"q" * 100)
    assert len(fl.files) == 4
    old = time.time() - 3 * 3600
    for mf in fl.files:
        os.utime(mf.path, (old, old))
    now_ms = int(time.time() * 1000)
    assert fl.delete_expired_files(3600 * 1000 * 4, now_ms) == 0  # not old enough
    assert fl.delete_expired_files(3600 * 1000, now_ms, max_end_offset=512) == 2
    assert fl.min_offset == 512
    assert fl.delete_expired_files(3600 * 1000, now_ms) == 1
    assert len(fl.files) == 1  # the last file stays
    assert _names(str(tmp_path)) == [f"{768:020d}"]


def test_a_file_deleted_while_a_reader_holds_a_view_is_unmapped_when_the_view_goes(tmp_path) -> None:
    fl = MmapFileList(str(tmp_path), FILE_SIZE)
    for _ in range(4):
        fl.append(b"v" * 100)
    view = fl.get_data(256, 100)
    fl.truncate_offset(200)  # deletes the file the view points into
    assert _names(str(tmp_path)) == [f"{0:020d}"]
    assert bytes(view) == b"v" * 100  # the mapping outlives the file until the view is released
    view.release()
    assert fl.append(b"w" * 100) == 256


def _random_read_ranges(path: str) -> list[tuple[int, int]]:
    """(file offset, length) of this process's mappings of `path` that the kernel reads without
    readahead (`rr` in /proc/self/smaps: MADV_RANDOM)."""
    out: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 6 and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                current = (int(head[2], 16), hi - lo) if head[-1] == path else None
            elif head[0] == "VmFlags:" and current is not None and "rr" in head[1:]:
                out.append(current)
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_the_file_being_appended_reads_without_readahead_and_a_full_one_with_it(tmp_path) -> None:
    # A fault on freshly written bytes must not read ahead into the unwritten, sparse rest of
    # the file (it zero-fills large folios there); bytes a restart finds keep readahead.
    page = 4096
    size = 16 * page
    fl = MmapFileList(str(tmp_path), size)
    fl.load()
    fl.append(b"a" * 100)
    first = str(tmp_path / f"{0:020d}")
    assert _random_read_ranges(first) == [(0, size)]
    fl.close()

    fl = MmapFileList(str(tmp_path), size)  # a restart: recovery finds 3 pages and a bit written
    fl.load()
    fl.truncate_offset(3 * page + 100, zero_stale=False)
    assert _random_read_ranges(first) == []
    assert fl.append(b"b" * 100) == 3 * page + 100
    assert _random_read_ranges(first) == [(3 * page, size - 3 * page)]
    assert bytes(fl.get_data(3 * page + 100, 100)) == b"b" * 100
    fl.append(b"c" * (size - 3 * page))  # does not fit: the file is closed and the next begun
    second = str(tmp_path / f"{size:020d}")
    assert _random_read_ranges(first) == []
    assert _random_read_ranges(second) == [(0, size)]
    assert bytes(fl.get_data(size, 10)) == b"c" * 10
    fl.close()
