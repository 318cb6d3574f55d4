"""ConsumeQueue: 20-byte units in files named by 20-digit start offsets; recovery; lookups."""

import os

from broker.store.consume_queue import CQ_STORE_UNIT_SIZE, UNIT, ConsumeQueue


def _cq(tmp_path, file_units=4):
    cq = ConsumeQueue(str(tmp_path), "T", 3, file_units * CQ_STORE_UNIT_SIZE)
    cq.load()
    cq.recover()
    return cq


def test_units_roll_over_files_named_by_start_offset(tmp_path):
    cq = _cq(tmp_path)
    for i in range(10):
        assert cq.put_unit(i, 1000 + i * 100, 100, i)
    assert (cq.min_offset, cq.max_offset, cq.max_phys_end) == (0, 10, 1000 + 9 * 100 + 100)
    names = sorted(os.listdir(tmp_path / "T" / "3"))
    assert names == [f"{n:020d}" for n in (0, 80, 160)]
    assert cq.get_units(2, 5) == [(1000 + i * 100, 100, i) for i in range(2, 7)]
    assert cq.get_unit(9) == (1900, 100, 9)
    raw = open(tmp_path / "T" / "3" / names[0], "rb").read()
    assert UNIT.unpack_from(raw, 20) == (1100, 100, 1)


def test_replayed_unit_ignored_gap_filled(tmp_path):
    cq = _cq(tmp_path)
    cq.put_unit(0, 0, 10, 0)
    assert cq.put_unit(0, 999, 10, 0) is False and cq.get_unit(0) == (0, 10, 0)
    cq.put_unit(3, 50, 10, 0)  # offsets 1, 2 missing: fillers keep unit numbers = queue offsets
    assert cq.max_offset == 4 and cq.get_unit(1)[1] == 0 and cq.get_unit(3) == (50, 10, 0)


def test_recover_finds_end_and_truncate_dirty(tmp_path):
    cq = _cq(tmp_path)
    for i in range(6):
        cq.put_unit(i, i * 100, 100, 0)
    cq.close()
    cq = _cq(tmp_path)
    assert cq.max_offset == 6 and cq.max_phys_end == 600
    assert cq.truncate_dirty(450) == 2  # units for messages ending past the log's end go
    assert cq.max_offset == 4 and cq.max_phys_end == 400
    cq.close()
    cq = _cq(tmp_path)
    assert cq.max_offset == 4
    cq.put_unit(4, 400, 100, 0)
    assert cq.max_offset == 5


def test_offset_for_timestamp_binary_search(tmp_path):
    cq = _cq(tmp_path)
    times = {i * 100: 1000 + i * 10 for i in range(9)}
    for i in range(9):
        cq.put_unit(i, i * 100, 100, 0)
    def lookup(phys, size):
        return times[phys]
    assert cq.offset_for_timestamp(0, lookup) == 0
    assert cq.offset_for_timestamp(1035, lookup) == 4
    assert cq.offset_for_timestamp(1040, lookup) == 4
    assert cq.offset_for_timestamp(5000, lookup) == 9


def test_correct_min_offset(tmp_path):
    cq = _cq(tmp_path)
    for i in range(8):
        cq.put_unit(i, i * 100, 100, 0)
    cq.correct_min_offset(350)
    assert cq.min_offset == 4


def test_queue_that_starts_after_retention_begins_at_its_first_offset(tmp_path):
    """A member that joins after retention moved the log's start meets a queue's first message at
    offset 1234: the queue starts in the file holding it (no filler file for 0..1199), serves from
    1234, and reopens the same way."""
    cq = ConsumeQueue(str(tmp_path), "T", 0, 20 * 50)
    cq.load()
    assert cq.put_unit(1234, 9000, 100, 0)
    assert cq.put_unit(1235, 9100, 100, 0)
    assert (cq.min_offset, cq.max_offset) == (1234, 1236)
    assert sorted(os.listdir(tmp_path / "T" / "0")) == [f"{1200 * 20:020d}"]
    assert cq.get_units(1234, 10) == [(9000, 100, 0), (9100, 100, 0)]
    cq.close()
    again = ConsumeQueue(str(tmp_path), "T", 0, 20 * 50)
    again.load()
    again.recover()
    again.correct_min_offset(9000)  # what the store does at start: fillers point below the log
    assert (again.min_offset, again.max_offset, again.max_phys_end) == (1234, 1236, 9200)
    again.close()
