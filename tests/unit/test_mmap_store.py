"""DLedgerMmapFileStore on real files: append/get across tiny files, hooks, follower appends,
truncate, committed-index rules, expiry, disk full, group commit, checkpoint."""

from __future__ import annotations

import asyncio
import os
import struct
import time

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET, DLedgerEntry, body_crc32
from dledger.store.checkpoint import read_checkpoint
from dledger.store.mmap_store import DLedgerMmapFileStore

pytestmark = pytest.mark.usefixtures("mmap_files_closed")

DATA_FILE = 1024
INDEX_FILE = 32 * 16


def make_config(base, self_id: str = "n0", **kw) -> DLedgerConfig:
    kw.setdefault("mapped_file_size_for_entry_data", DATA_FILE)
    kw.setdefault("mapped_file_size_for_entry_index", INDEX_FILE)
    return DLedgerConfig(store_base_dir=str(base), self_id=self_id, peers=f"{self_id}-127.0.0.1:1", **kw)


def open_store(base, self_id: str = "n0", **kw) -> DLedgerMmapFileStore:
    store = DLedgerMmapFileStore(make_config(base, self_id, **kw))
    store.recover()
    return store


def body_for(i: int) -> bytes:
    return (f"{i}:".encode() * 60)[: (i * 37) % 300]


def code_of(excinfo) -> DLedgerResponseCode:
    return excinfo.value.code


def test_append_and_get_across_many_small_files_with_blank_records(tmp_path) -> None:
    store = open_store(tmp_path)
    for i in range(200):
        e = store.append_as_leader(DLedgerEntry(body=body_for(i)), term=1 + i // 100)
        assert (e.index, e.term, e.size) == (i, 1 + i // 100, BODY_OFFSET + len(body_for(i)))
    assert store.ledger_begin_index == 0 and store.ledger_end_index == 199 and store.ledger_end_term == 2
    files = sorted(os.listdir(store.config.data_store_path()))
    assert len(files) > 20 and all(int(n) % DATA_FILE == 0 and len(n) == 20 for n in files)
    blanks = sum(1 for n in files[:-1]
                 if b"\xff\xff\xff\xff" in open(os.path.join(store.config.data_store_path(), n), "rb").read())
    assert blanks > 10
    for i in range(200):
        e = store.get(i)
        assert e.body == body_for(i) and e.index == i and e.body_crc == body_crc32(body_for(i))
        assert bytes(store.get_data(e.pos + BODY_OFFSET, len(e.body))) == body_for(i)
    for bad in (-1, 200):
        with pytest.raises(DLedgerException) as ex:
            store.get(bad)
        assert code_of(ex) is DLedgerResponseCode.INDEX_OUT_OF_RANGE


def test_batch_append_writes_the_same_bytes_as_single_appends(tmp_path) -> None:
    single = open_store(tmp_path / "a")
    batch = open_store(tmp_path / "b")
    for i in range(120):
        single.append_as_leader(DLedgerEntry(body=body_for(i)), 3)
    out = batch.batch_append_as_leader([DLedgerEntry(body=body_for(i)) for i in range(60)], 3)
    out += batch.batch_append_as_leader([DLedgerEntry(body=body_for(i)) for i in range(60, 120)], 3)
    assert [e.index for e in out] == list(range(120))
    for sub in ("data", "index"):
        da, db = (os.path.join(s.config.default_path(), sub) for s in (single, batch))
        assert sorted(os.listdir(da)) == sorted(os.listdir(db))
        for name in os.listdir(da):
            assert open(os.path.join(da, name), "rb").read() == open(os.path.join(db, name), "rb").read()


def test_hooks_see_the_final_pos_and_stamped_bytes_are_what_get_returns(tmp_path) -> None:
    store = open_store(tmp_path)
    seen = []

    def stamp_physical_offset(entry: DLedgerEntry, view: memoryview, body_offset: int) -> None:
        # What the broker's DLedgerCommitLog does: write pos + BODY_OFFSET at PHY_POS_POSITION (28).
        seen.append((entry.index, entry.pos, bytes(view[:4])))
        struct.pack_into(">q", view, body_offset + 28, entry.pos + body_offset)

    store.add_append_hook(stamp_physical_offset)
    body = bytes(100)
    singles = [store.append_as_leader(DLedgerEntry(body=body), 1) for _ in range(10)]
    batched = store.batch_append_as_leader([DLedgerEntry(body=body) for _ in range(10)], 1)
    for e in singles + batched:
        got = store.get(e.index)
        assert struct.unpack_from(">q", got.body, 28)[0] == e.pos + BODY_OFFSET
        assert got.body == e.body and got.body_crc == body_crc32(got.body) == e.body_crc
    assert [s[:2] for s in seen] == [(e.index, e.pos) for e in singles + batched]
    assert all(s[2] == b"\x00\x00\x00\x01" for s in seen)  # header already encoded when hooks run


def test_a_failing_hook_writes_nothing(tmp_path) -> None:
    store = open_store(tmp_path)
    store.append_as_leader(DLedgerEntry(body=b"ok"), 1)
    wrote = store.data_file_list.max_wrote_position

    def boom(entry: DLedgerEntry, view: memoryview, body_offset: int) -> None:
        raise RuntimeError("hook failed")

    store.add_append_hook(boom)
    with pytest.raises(RuntimeError):
        store.append_as_leader(DLedgerEntry(body=b"x" * 50), 1)
    with pytest.raises(RuntimeError):
        store.batch_append_as_leader([DLedgerEntry(body=b"y" * 50) for _ in range(3)], 1)
    assert store.ledger_end_index == 0 and store.data_file_list.max_wrote_position == wrote
    store.append_hooks.clear()
    assert store.append_as_leader(DLedgerEntry(body=b"z"), 1).pos == wrote


def test_follower_appends_land_at_the_leaders_pos_and_files_are_identical(tmp_path) -> None:
    leader = open_store(tmp_path, "n0")
    follower = open_store(tmp_path, "n1")
    for i in range(150):
        leader.append_as_leader(DLedgerEntry(body=body_for(i), magic=2 if i == 0 else 1), 1 + i // 50)
    for i in range(150):
        follower.append_as_follower(leader.get(i), 3, "n0")
    assert follower.ledger_end_index == 149 and follower.ledger_end_term == 3
    for sub in ("data", "index"):
        a, b = (os.path.join(s.config.default_path(), sub) for s in (leader, follower))
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        for name in os.listdir(a):
            assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name), "rb").read()


def test_follower_append_at_a_wrong_pos_or_index_is_refused_and_writes_nothing(tmp_path) -> None:
    leader = open_store(tmp_path, "n0")
    follower = open_store(tmp_path, "n1")
    for _ in range(3):
        leader.append_as_leader(DLedgerEntry(body=b"x" * 10), 1)
    follower.append_as_follower(leader.get(0), 1, "n0")
    wrote = follower.data_file_list.max_wrote_position
    moved = leader.get(1)
    moved.pos += 8
    with pytest.raises(DLedgerException) as ex:
        follower.append_as_follower(moved, 1, "n0")
    assert code_of(ex) is DLedgerResponseCode.DISK_ERROR and "pos" in str(ex.value)
    with pytest.raises(DLedgerException) as ex:
        follower.append_as_follower(leader.get(2), 1, "n0")
    assert code_of(ex) is DLedgerResponseCode.INCONSISTENT_INDEX
    corrupt = leader.get(1)
    corrupt.body = b"y" * 10  # body no longer matches the leader's CRC
    with pytest.raises(DLedgerException) as ex:
        follower.append_as_follower(corrupt, 1, "n0")
    assert code_of(ex) is DLedgerResponseCode.DISK_ERROR and "CRC" in str(ex.value)
    assert follower.ledger_end_index == 0 and follower.data_file_list.max_wrote_position == wrote


def test_truncate_replaces_a_divergent_tail_and_reappends(tmp_path) -> None:
    leader = open_store(tmp_path, "n0")
    follower = open_store(tmp_path, "n1")
    for i in range(40):
        leader.append_as_leader(DLedgerEntry(body=body_for(i)), 1)
    for i in range(40):
        follower.append_as_follower(leader.get(i), 1, "n0")
    # The follower got entries 40..59 from an old leader (term 1) that never committed them.
    for i in range(40, 60):
        e = DLedgerEntry(body=b"stale" * 20, index=i, term=1)
        e.pos = follower.data_file_list.next_append_pos(BODY_OFFSET + len(e.body))
        follower.append_as_follower(e, 1, "nX")
    follower.update_committed_index(1, 39)
    # New leader (term 2) has different entries from 40 on.
    for i in range(40, 70):
        leader.append_as_leader(DLedgerEntry(body=body_for(i)), 2)
    assert follower.truncate(leader.get(40), 2, "n0") == 40
    assert follower.get(40).body == body_for(40) and follower.ledger_end_term == 2
    for i in range(41, 70):
        follower.append_as_follower(leader.get(i), 2, "n0")
    assert [follower.get(i).body for i in range(70)] == [leader.get(i).body for i in range(70)]
    # An identical entry: cut after it.
    assert follower.truncate(leader.get(65), 2, "n0") == 65
    assert follower.ledger_end_index == 65 and follower.get(65).body == body_for(65)
    with pytest.raises(DLedgerException):
        follower.get(66)
    # Cutting a committed entry is refused.
    follower.update_committed_index(2, 60)
    with pytest.raises(DLedgerException) as ex:
        follower.truncate(DLedgerEntry(body=b"other", index=50, term=2, pos=leader.get(50).pos), 2, "n0")
    assert code_of(ex) is DLedgerResponseCode.INCONSISTENT_STATE
    assert follower.ledger_end_index == 65
    # State survives a restart.
    follower.flush()
    follower.close_without_flush()
    again = open_store(tmp_path, "n1")
    assert again.ledger_end_index == 65 and again.get(65).body == body_for(65)


def test_truncate_on_an_empty_follower_rebuilds_at_the_leaders_pos(tmp_path) -> None:
    leader = open_store(tmp_path, "n0")
    for i in range(100):
        leader.append_as_leader(DLedgerEntry(body=body_for(i)), 1)
    follower = open_store(tmp_path, "n1")
    first = leader.get(80)
    assert follower.truncate(first, 1, "n0") == 80
    assert follower.ledger_begin_index == 80 and follower.data_begin_pos == first.pos
    for i in range(81, 100):
        follower.append_as_follower(leader.get(i), 1, "n0")
    assert follower.get(99).body == body_for(99)
    follower.flush()
    follower.close_without_flush()
    again = open_store(tmp_path, "n1")
    assert (again.ledger_begin_index, again.ledger_end_index) == (80, 99)
    assert again.get(80).body == body_for(80)


def test_truncate_refuses_to_rebuild_over_committed_entries_when_positions_disagree(tmp_path) -> None:
    leader = open_store(tmp_path, "n0")
    follower = open_store(tmp_path, "n1")
    for i in range(20):
        leader.append_as_leader(DLedgerEntry(body=body_for(i)), 1)
        follower.append_as_follower(leader.get(i), 1, "n0")
    follower.update_committed_index(1, 10)
    other = leader.get(15)
    other.body = b"different"
    other.pos += 16  # where the leader says it is, our entry 15 is not
    with pytest.raises(DLedgerException) as ex:
        follower.truncate(other, 2, "n0")
    assert code_of(ex) is DLedgerResponseCode.INCONSISTENT_STATE and "pos" in str(ex.value)
    assert follower.ledger_end_index == 19 and follower.get(19).body == body_for(19)


def test_update_committed_index_follows_dledger_rules(tmp_path) -> None:
    store = open_store(tmp_path)
    store.update_committed_index(1, 5)  # empty log: ignored
    assert store.committed_index == -1
    for i in range(10):
        store.append_as_leader(DLedgerEntry(body=b"x" * i), 2)
    store.update_committed_index(2, 4)
    assert store.committed_index == 4
    e4 = store.get(4)
    assert store.committed_pos == e4.pos + e4.size
    store.update_committed_index(2, 3)  # backwards: ignored
    assert store.committed_index == 4
    store.update_committed_index(2, 100)  # clamped to the end
    assert store.committed_index == 9
    store.update_committed_index(1, 9)  # older term: ignored (nothing to change anyway)
    store.append_as_leader(DLedgerEntry(body=b"y"), 3)
    store.update_committed_index(3, 10)
    store.update_committed_index(2, 10)
    assert store.committed_index == 10
    store.append_as_leader(DLedgerEntry(body=b"z"), 3)
    store.update_committed_index(2, 11)  # older term than one already seen
    assert store.committed_index == 10
    store.update_committed_index(3, -1)
    assert store.committed_index == 10


def _fill(store: DLedgerMmapFileStore, n: int, term: int = 1) -> None:
    for i in range(n):
        store.append_as_leader(DLedgerEntry(body=body_for(i)), term)


def test_expired_files_are_deleted_and_begin_index_revised(tmp_path) -> None:
    ratio = [0.0]
    cfg = make_config(tmp_path, file_reserved_hours=1, delete_when="99")
    store = DLedgerMmapFileStore(cfg, disk_used_ratio=lambda: ratio[0])
    store.recover()
    _fill(store, 200)
    old = time.time() - 2 * 3600
    for mf in store.data_file_list.files:
        os.utime(mf.path, (old, old))
    store.update_committed_index(1, 120)
    assert store.check_disk_space() == 0  # below diskSpaceRatioToCheckExpired, not deleteWhen
    ratio[0] = 0.75
    deleted = 0
    while (n := store.check_disk_space()) > 0:
        deleted += n
    assert deleted > 5
    begin = store.ledger_begin_index
    assert 0 < begin <= 120 and store.data_begin_pos == store.get(begin).pos
    # Nothing above the committed index was deleted.
    first = store.data_file_list.files[0]
    assert first.file_from_offset <= store.committed_pos < first.end_offset
    with pytest.raises(DLedgerException) as ex:
        store.get(begin - 1)
    assert code_of(ex) is DLedgerResponseCode.INDEX_OUT_OF_RANGE
    assert all(store.get(i).body == body_for(i) for i in range(begin, 200))
    assert store.index_file_list.min_offset <= begin * 32
    store.flush()
    store.write_checkpoint()
    store.close_without_flush()
    again = open_store(tmp_path)
    assert (again.ledger_begin_index, again.ledger_end_index, again.committed_index) == (begin, 199, 120)


def test_force_clean_deletes_young_files_only_above_the_force_ratio(tmp_path) -> None:
    ratio = [0.80]
    store = DLedgerMmapFileStore(make_config(tmp_path, delete_when="99"), disk_used_ratio=lambda: ratio[0])
    store.recover()
    _fill(store, 100)
    store.update_committed_index(1, 99)
    assert store.check_disk_space() == 0  # files are young; 0.80 < force-clean 0.85
    ratio[0] = 0.86
    assert store.check_disk_space() > 0 and store.ledger_begin_index > 0
    assert not store.is_disk_full


def test_disk_full_refuses_appends_writes_nothing_and_reads_still_work(tmp_path) -> None:
    # diskFullRatio = min(forceClean + 0.05, 0.95): -0.05 puts it at 0, below any real disk's use.
    store = open_store(tmp_path, disk_space_ratio_to_force_clean=-0.05, delete_when="99")
    _fill(store, 30)
    follower = open_store(tmp_path, "n1", disk_space_ratio_to_force_clean=-0.05)
    store.check_disk_space()
    follower.check_disk_space()
    assert store.is_disk_full and follower.is_disk_full
    wrote = store.data_file_list.max_wrote_position
    iwrote = store.index_file_list.max_wrote_position
    for call in (lambda: store.append_as_leader(DLedgerEntry(body=b"x"), 1),
                 lambda: store.batch_append_as_leader([DLedgerEntry(body=b"x")], 1),
                 lambda: follower.append_as_follower(store.get(0), 1, "n0")):
        with pytest.raises(DLedgerException) as ex:
            call()
        assert code_of(ex) is DLedgerResponseCode.DISK_FULL
    assert store.ledger_end_index == 29 and follower.ledger_end_index == -1
    assert store.data_file_list.max_wrote_position == wrote
    assert store.index_file_list.max_wrote_position == iwrote
    assert [store.get(i).body for i in range(30)] == [body_for(i) for i in range(30)]


async def test_sync_flush_group_commit_shares_fsyncs_between_concurrent_appenders(tmp_path) -> None:
    store = DLedgerMmapFileStore(make_config(tmp_path, flush_disk_type="SYNC_FLUSH",
                                             flush_file_interval_ms=1000,
                                             mapped_file_size_for_entry_data=1 << 20,
                                             mapped_file_size_for_entry_index=32 * 4096))
    await store.start()
    try:
        async def appender(k: int) -> int:
            done = 0
            for _ in range(20):
                e = store.append_as_leader(DLedgerEntry(body=b"m" * 100), 1)
                await store.wait_flushed(e.index)
                assert store.flushed_index >= e.index
                done += 1
            return done

        results = await asyncio.gather(*(appender(k) for k in range(64)))
        assert sum(results) == 64 * 20
        assert store.flushed_index == store.ledger_end_index == 64 * 20 - 1
        # Concurrent waiters shared fsyncs: far fewer rounds than appends.
        assert 0 < store.flush_rounds < 64 * 20 / 4
        await store.wait_flushed(10)  # already covered: returns at once
    finally:
        await store.shutdown()


async def test_checkpoint_is_written_periodically_and_on_shutdown(tmp_path) -> None:
    store = DLedgerMmapFileStore(make_config(tmp_path, check_point_interval_ms=20, flush_file_interval_ms=5))
    await store.start()
    _fill(store, 10)
    store.update_committed_index(1, 6)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if read_checkpoint(store.checkpoint_path).committed_index == 6:
            break
    assert read_checkpoint(store.checkpoint_path).committed_index == 6
    store.update_committed_index(1, 9)
    _fill(store, 3)
    await store.shutdown()
    with open(store.checkpoint_path, "rb") as f:  # noqa: ASYNC230 - a tiny file, read once in a test
        assert f.read() == b"endIndex=12\ncommittedIndex=9\n"
    again = DLedgerMmapFileStore(make_config(tmp_path))
    await again.start()
    try:
        assert (again.ledger_end_index, again.committed_index) == (12, 9)
    finally:
        await again.shutdown()


def test_expired_files_are_deleted_at_the_delete_when_hour_even_with_a_free_disk(tmp_path) -> None:
    now = time.time()
    hour = time.strftime("%H", time.localtime(now))
    store = DLedgerMmapFileStore(make_config(tmp_path, file_reserved_hours=1, delete_when=f"{hour}"),
                                 disk_used_ratio=lambda: 0.01)
    store.recover()
    _fill(store, 100)
    store.update_committed_index(1, 99)
    old = now - 2 * 3600
    for mf in store.data_file_list.files[:3]:
        os.utime(mf.path, (old, old))
    assert store.check_disk_space(now=now + 3600) == 0  # everything is old by then, but not the hour
    assert store.check_disk_space(now=now) == 3  # the hour: only the three old files go
    assert store.ledger_begin_index == store.get(store.ledger_begin_index).index > 0


async def test_writes_are_refused_before_recovery_and_after_shutdown(tmp_path) -> None:
    store = DLedgerMmapFileStore(make_config(tmp_path))
    with pytest.raises(DLedgerException) as ex:
        store.append_as_leader(DLedgerEntry(body=b"early"), 1)
    assert code_of(ex) is DLedgerResponseCode.DISK_ERROR and "not recovered" in str(ex.value)
    await store.start()
    e = store.append_as_leader(DLedgerEntry(body=b"ok"), 1)
    await store.wait_flushed(e.index)
    assert store.flushed_index == 0
    await store.shutdown()
    with pytest.raises(DLedgerException) as ex:
        store.append_as_leader(DLedgerEntry(body=b"late"), 1)
    assert code_of(ex) is DLedgerResponseCode.DISK_ERROR and "shut down" in str(ex.value)


def test_wait_flushed_without_the_service_flushes_inline(tmp_path) -> None:
    store = open_store(tmp_path)
    _fill(store, 5)
    asyncio.run(store.wait_flushed(4))
    assert store.flushed_index == 4
    assert not store.data_file_list.dirty_files() and not store.index_file_list.dirty_files()


def test_bad_entries_are_refused_and_leave_no_gap_in_the_log(tmp_path) -> None:
    store = open_store(tmp_path)
    _fill(store, 5, term=2)
    wrote = store.data_file_list.max_wrote_position
    bad = [
        (lambda: store.append_as_leader(DLedgerEntry(body="text"), 2),
         DLedgerResponseCode.UNEXPECTED_ARGUMENT),
        (lambda: store.append_as_leader(DLedgerEntry(body=b"x", magic=7), 2),
         DLedgerResponseCode.UNEXPECTED_ARGUMENT),
        (lambda: store.append_as_leader(DLedgerEntry(body=b"x", channel=1 << 40), 2),
         DLedgerResponseCode.UNEXPECTED_ARGUMENT),
        (lambda: store.append_as_leader(DLedgerEntry(body=b"x"), 1), DLedgerResponseCode.INCONSISTENT_TERM),
        (lambda: store.batch_append_as_leader(
            [DLedgerEntry(body=b"a" * 300), DLedgerEntry(body=b"b" * 300), DLedgerEntry(body=b"c", magic=0)],
            2),
         DLedgerResponseCode.UNEXPECTED_ARGUMENT),
    ]
    for call, code in bad:
        with pytest.raises(DLedgerException) as ex:
            call()
        assert code_of(ex) is code
        assert store.ledger_end_index == 4 and store.data_file_list.max_wrote_position == wrote
    e = store.append_as_leader(DLedgerEntry(body=b"good"), 2)
    last = store.get(4)
    assert e.index == 5 and e.pos in (last.pos + last.size, last.pos - last.pos % DATA_FILE + DATA_FILE)
    store.flush()
    store.close_without_flush()
    again = open_store(tmp_path)
    assert again.ledger_end_index == 5 and again.get(5).body == b"good"
