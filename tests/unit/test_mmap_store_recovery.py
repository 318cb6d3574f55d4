"""Recovery of DLedgerMmapFileStore from damaged files: each damage recovers to the last good entry.
Damage at or below the checkpointed committed index is cut too, with a persisted catch-up watermark
(the member re-fetches from the leader, see tests/unit/test_corrupt_rejoin.py); only a store whose
begin index is unknown or whose data files are all gone refuses to start."""

from __future__ import annotations

import os

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET, INDEX_UNIT_SIZE, DLedgerEntry
from dledger.store.mmap_store import DLedgerMmapFileStore

pytestmark = pytest.mark.usefixtures("mmap_files_closed")

DATA_FILE = 1024
INDEX_FILE = 32 * 16


def open_store(base) -> DLedgerMmapFileStore:
    cfg = DLedgerConfig(store_base_dir=str(base), mapped_file_size_for_entry_data=DATA_FILE,
                        mapped_file_size_for_entry_index=INDEX_FILE)
    store = DLedgerMmapFileStore(cfg)
    store.recover()
    return store


def body_for(i: int) -> bytes:
    return (f"{i}:".encode() * 60)[: 20 + (i * 37) % 250]


def crashed_store(base, n: int = 60, committed: int = 30, term_of=lambda i: 1 + i // 25):
    """A store with `n` entries, committed index checkpointed, then dropped without a clean shutdown.
    Returns [(pos, size, path, local offset)] per entry."""
    store = open_store(base)
    for i in range(n):
        store.append_as_leader(DLedgerEntry(body=body_for(i)), term_of(i))
    store.update_committed_index(term_of(n - 1), committed)
    store.flush()
    store.write_checkpoint()
    where = []
    for i in range(n):
        e = store.get(i)
        mf = store.data_file_list.find_file(e.pos)
        where.append((e.pos, e.size, mf.path, e.pos - mf.file_from_offset))
    store.close_without_flush()
    return where


def index_path(base, index: int) -> tuple[str, int]:
    ipos = index * INDEX_UNIT_SIZE
    start = ipos - ipos % INDEX_FILE
    return os.path.join(str(base), "dledger-n0", "index", f"{start:020d}"), ipos - start


def patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def assert_recovered_to(base, last: int) -> DLedgerMmapFileStore:
    store = open_store(base)
    assert store.ledger_end_index == last
    assert [store.get(i).body for i in range(last + 1)] == [body_for(i) for i in range(last + 1)]
    assert store.index_file_list.max_wrote_position == (last + 1) * INDEX_UNIT_SIZE
    with pytest.raises(DLedgerException):
        store.get(last + 1)
    # The log continues right after the last good entry.
    e = store.append_as_leader(DLedgerEntry(body=b"after recovery"), 9)
    assert e.index == last + 1 and store.get(e.index).body == b"after recovery"
    return store


def test_clean_restart_recovers_everything(tmp_path) -> None:
    crashed_store(tmp_path)
    store = assert_recovered_to(tmp_path, 59)
    assert store.committed_index == 30 and store.ledger_end_term == 9


def test_data_file_truncated_mid_entry_recovers_to_the_previous_entry(tmp_path) -> None:
    where = crashed_store(tmp_path)
    _pos, size, path, off = where[59]
    os.truncate(path, off + size // 2)
    assert_recovered_to(tmp_path, 58)


def test_torn_tail_bytes_after_the_cut_are_zeroed(tmp_path) -> None:
    where = crashed_store(tmp_path)
    _pos, size, path, off = where[59]
    patch(path, off + 10, b"\x7f" * (size - 10))  # a half-overwritten last entry
    assert_recovered_to(tmp_path, 58).close_without_flush()
    with open(path, "rb") as f:
        f.seek(off)
        stale = f.read(size)
    assert stale[:len(b"after recovery") + BODY_OFFSET].endswith(b"after recovery")
    assert b"\x7f" not in stale


def test_flipped_byte_in_the_last_entry_body_recovers_to_the_previous_entry(tmp_path) -> None:
    where = crashed_store(tmp_path)
    _pos, _size, path, off = where[59]
    with open(path, "r+b") as f:
        f.seek(off + BODY_OFFSET + 5)
        b = f.read(1)
        f.seek(off + BODY_OFFSET + 5)
        f.write(bytes([b[0] ^ 0x01]))
    assert_recovered_to(tmp_path, 58)


def test_zeroed_index_tail_recovers_to_the_last_entry_with_a_good_index_record(tmp_path) -> None:
    crashed_store(tmp_path)
    for i in (57, 58, 59):
        path, off = index_path(tmp_path, i)
        patch(path, off, bytes(INDEX_UNIT_SIZE))
    assert_recovered_to(tmp_path, 56)


def test_lost_last_files_recover_to_the_end_of_the_remaining_ones(tmp_path) -> None:
    where = crashed_store(tmp_path, n=120, committed=20)
    paths = sorted({w[2] for w in where})
    for p in paths[-2:]:
        os.unlink(p)
    last = max(i for i, w in enumerate(where) if w[2] in paths[:-2])
    assert_recovered_to(tmp_path, last)


def test_term_going_backwards_in_the_tail_is_cut(tmp_path) -> None:
    where = crashed_store(tmp_path, n=60, committed=10)
    _, _, path, off = where[59]
    patch(path, off + 16, (0).to_bytes(8, "big"))  # the entry's term field: below entry 58's
    ipath, ioff = index_path(tmp_path, 59)
    patch(ipath, ioff + 24, (0).to_bytes(8, "big"))  # and its index record agrees
    assert_recovered_to(tmp_path, 58)


def catchup_path(base) -> str:
    return os.path.join(str(base), "dledger-n0", "catchup")


def test_damage_at_or_below_the_committed_index_cuts_and_persists_a_catch_up_watermark(tmp_path) -> None:
    where = crashed_store(tmp_path, n=60, committed=50)
    _pos, _size, path, off = where[50]  # the checkpointed committed entry itself
    patch(path, off + BODY_OFFSET, b"\x00\xff")
    store = open_store(tmp_path)
    # Cut right before the corrupt entry; what is left below the old committed index is committed.
    assert store.ledger_end_index == 49 and store.committed_index == 49
    # The watermark is the old end (the index records 50..59 still name consecutive entries).
    assert store.catchup_watermark == 59
    with open(catchup_path(tmp_path)) as f:
        assert f.read() == "catchUpIndex=59\n"
    # The corrupt entry is never served: out of range until re-fetched.
    with pytest.raises(DLedgerException) as ex:
        store.get(50)
    assert ex.value.code is DLedgerResponseCode.INDEX_OUT_OF_RANGE
    store.close_without_flush()
    # A crash during catch-up keeps the watermark (the files now end cleanly at 49).
    store = assert_recovered_to(tmp_path, 49)
    assert store.catchup_watermark == 59
    store.clear_catchup_watermark()
    assert store.catchup_watermark == -1 and not os.path.exists(catchup_path(tmp_path))


def test_a_malformed_catch_up_file_refuses_to_start(tmp_path) -> None:
    crashed_store(tmp_path, n=10, committed=5)
    with open(catchup_path(tmp_path), "w") as f:
        f.write("catchUpIndex=x\n")
    with pytest.raises(DLedgerException) as ex:
        open_store(tmp_path)
    assert ex.value.code is DLedgerResponseCode.DISK_ERROR and "catchup" in str(ex.value)


def test_watermark_is_at_least_the_checkpointed_committed_index(tmp_path) -> None:
    where = crashed_store(tmp_path, n=60, committed=50)
    _pos, _size, path, off = where[20]
    patch(path, off + BODY_OFFSET + 1, b"\xee")
    for i in range(21, 60):  # the index records after the cut are gone too
        ipath, ioff = index_path(tmp_path, i)
        patch(ipath, ioff, bytes(INDEX_UNIT_SIZE))
    store = open_store(tmp_path)
    assert store.ledger_end_index == 19 and store.catchup_watermark == 50


def test_a_bad_index_record_of_a_committed_entry_is_rewritten_from_the_data(tmp_path) -> None:
    crashed_store(tmp_path, n=60, committed=55)
    path, off = index_path(tmp_path, 53)  # recovery scans from the committed entry's region
    patch(path, off, bytes(INDEX_UNIT_SIZE))
    store = assert_recovered_to(tmp_path, 59)
    assert store.committed_index == 55


def test_missing_data_with_a_committed_checkpoint_refuses_to_start(tmp_path) -> None:
    crashed_store(tmp_path, n=20, committed=10)
    data_dir = os.path.join(str(tmp_path), "dledger-n0", "data")
    for name in os.listdir(data_dir):
        os.unlink(os.path.join(data_dir, name))
    with pytest.raises(DLedgerException) as ex:
        open_store(tmp_path)
    assert ex.value.code is DLedgerResponseCode.DISK_ERROR and "committedIndex=10" in str(ex.value)


def test_lost_index_files_are_rebuilt_for_committed_entries_and_the_rest_cut(tmp_path) -> None:
    crashed_store(tmp_path, n=60, committed=50)
    index_dir = os.path.join(str(tmp_path), "dledger-n0", "index")
    for name in os.listdir(index_dir):
        os.unlink(os.path.join(index_dir, name))
    store = assert_recovered_to(tmp_path, 50)
    assert store.committed_index == 50 and store.ledger_begin_index == 0


def test_a_corrupt_first_entry_outside_the_scanned_region_refuses_to_start(tmp_path) -> None:
    where = crashed_store(tmp_path, n=120, committed=110)
    _, _, path, off = where[0]
    patch(path, off, bytes(BODY_OFFSET))  # entry 0's header zeroed; recovery scans only the last files
    with pytest.raises(DLedgerException) as ex:
        open_store(tmp_path)
    assert ex.value.code is DLedgerResponseCode.DISK_ERROR
    assert os.path.basename(path) in str(ex.value) and "begin index" in str(ex.value)


@pytest.mark.parametrize("field_offset", [32, 36], ids=["channel", "chainCrc"])
def test_flipped_bit_in_a_reserved_header_field_is_corruption(tmp_path, field_offset: int) -> None:
    """Finding 10 of docs/RELIABILITY.md: the header has no CRC of its own, so the reserved fields
    (always written as 0) are checked; a flip there is cut from an uncommitted tail like any
    corruption, and a committed entry with one refuses to start."""
    where = crashed_store(tmp_path, n=60, committed=30)
    _pos, _size, path, off = where[59]
    patch(path, off + field_offset + 3, b"\x01")
    assert_recovered_to(tmp_path, 58).close_without_flush()

    where = crashed_store(tmp_path / "committed", n=60, committed=50)
    _pos, _size, path, off = where[50]
    patch(path, off + field_offset + 3, b"\x01")
    store = open_store(tmp_path / "committed")
    assert store.ledger_end_index == 49 and store.catchup_watermark == 59


def test_a_flipped_term_in_a_committed_header_is_cut_not_trusted(tmp_path) -> None:
    """The body CRC cannot see the header: a committed entry whose term disagrees with its
    (non-zero) index record is corruption, cut with a watermark, not re-indexed from the header."""
    where = crashed_store(tmp_path, n=60, committed=55)
    _pos, _size, path, off = where[50]  # inside the scanned region (the last three data files)
    with open(path, "r+b") as f:
        f.seek(off + 16 + 7)  # lowest byte of the term field
        b = f.read(1)[0]
        f.seek(off + 16 + 7)
        f.write(bytes([b ^ 0x04]))  # a higher term: later entries' terms would not go backwards
    store = open_store(tmp_path)
    assert store.ledger_end_index == 49 and store.catchup_watermark == 59
    assert store.committed_index == 49


def test_a_corrupt_first_entry_of_a_single_file_log_cuts_everything_with_a_watermark(tmp_path) -> None:
    """No data file starts with a valid entry: the whole log is re-fetched (begin index unknown is
    refused only when files before the scanned region exist)."""
    cfg = DLedgerConfig(store_base_dir=str(tmp_path), mapped_file_size_for_entry_data=64 * 1024,
                        mapped_file_size_for_entry_index=INDEX_FILE)
    store = DLedgerMmapFileStore(cfg)
    store.recover()
    for i in range(10):
        store.append_as_leader(DLedgerEntry(body=body_for(i)), 1)
    store.update_committed_index(1, 8)
    store.flush()
    store.write_checkpoint()
    path = store.data_file_list.files[0].path
    store.close_without_flush()
    patch(path, BODY_OFFSET + 2, b"\xee")  # entry 0's body
    store = DLedgerMmapFileStore(cfg)
    store.recover()
    assert (store.ledger_begin_index, store.ledger_end_index, store.committed_index) == (-1, -1, -1)
    assert store.catchup_watermark == 9
    # The leader's entries go back in at their positions.
    store.append_as_leader(DLedgerEntry(body=body_for(0)), 1)
    assert store.get(0).pos == 0 and store.get(0).body == body_for(0)
    store.close_without_flush()
