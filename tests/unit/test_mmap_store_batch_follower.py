"""`batch_append_as_follower` on the mmap store (real files) and the memory store: a leader's run
lands byte-identical (raw bytes written as-is, or entry by entry across file ends), and a run with
a wrong pos, a gap or a bad body CRC is refused with nothing written."""

from __future__ import annotations

import dataclasses
import os

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET, DLedgerEntry
from dledger.store.memory_store import DLedgerMemoryStore
from dledger.store.mmap_store import DLedgerMmapFileStore

pytestmark = pytest.mark.usefixtures("mmap_files_closed")


def open_store(base, self_id: str, **kw) -> DLedgerMmapFileStore:
    kw.setdefault("mapped_file_size_for_entry_data", 1024)
    kw.setdefault("mapped_file_size_for_entry_index", 32 * 16)
    store = DLedgerMmapFileStore(
        DLedgerConfig(store_base_dir=str(base), self_id=self_id, peers=f"{self_id}-127.0.0.1:1", **kw)
    )
    store.recover()
    return store


def body_for(i: int) -> bytes:
    return (f"{i}:".encode() * 60)[: (i * 37) % 300]


def _files(store) -> dict[str, bytes]:
    out = {}
    for sub in ("data", "index"):
        d = os.path.join(store.config.default_path(), sub)
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name), "rb") as f:
                out[f"{sub}/{name}"] = f.read()
    return out


def _run(leader, first: int, last: int) -> list[DLedgerEntry]:
    # Copies: the memory store hands out its own entry objects, which the tests then damage.
    return [dataclasses.replace(leader.get(i)) for i in range(first, last + 1)]


@pytest.mark.parametrize("data_file", [1024, 1 << 20])
def test_batch_runs_land_byte_identical_to_the_leader(tmp_path, data_file) -> None:
    leader = open_store(tmp_path, "n0", mapped_file_size_for_entry_data=data_file)
    follower = open_store(tmp_path, "n1", mapped_file_size_for_entry_data=data_file)
    for i in range(120):
        leader.append_as_leader(DLedgerEntry(body=body_for(i)), 1 + i // 60)
    for first in range(0, 120, 10):
        run = _run(leader, first, first + 9)
        raw = None
        if data_file > 1024:  # one file: the leader's stored bytes, as the dispatcher sends them
            raw = bytes(leader.get_data(run[0].pos, run[-1].pos + run[-1].size - run[0].pos))
        follower.batch_append_as_follower(run, 2, "n0", raw)
    assert follower.ledger_end_index == 119 and follower.ledger_end_term == 2
    assert _files(follower) == _files(leader)
    assert [follower.get(i).body for i in range(120)] == [body_for(i) for i in range(120)]


@pytest.mark.parametrize("data_file", [1024, 1 << 20])
def test_wrong_pos_gap_or_bad_crc_is_refused_and_writes_nothing(tmp_path, data_file) -> None:
    leader = open_store(tmp_path, "n0", mapped_file_size_for_entry_data=data_file)
    follower = open_store(tmp_path, "n1", mapped_file_size_for_entry_data=data_file)
    for i in range(30):
        leader.append_as_leader(DLedgerEntry(body=body_for(i) + b"!"), 1)
    follower.batch_append_as_follower(_run(leader, 0, 4), 1, "n0")
    before = _files(follower)
    wrote = follower.data_file_list.max_wrote_position
    iwrote = follower.index_file_list.max_wrote_position

    def refused(run: list[DLedgerEntry], code: DLedgerResponseCode, raw: bytes | None = None) -> None:
        with pytest.raises(DLedgerException) as ex:
            follower.batch_append_as_follower(run, 1, "n0", raw)
        assert ex.value.code is code, ex.value
        assert follower.ledger_end_index == 4 and follower.ledger_end_term == 1
        assert follower.data_file_list.max_wrote_position == wrote
        assert follower.index_file_list.max_wrote_position == iwrote
        assert _files(follower) == before

    moved = _run(leader, 5, 12)
    for e in moved:
        e.pos += 8
    refused(moved, DLedgerResponseCode.DISK_ERROR)
    last_moved = _run(leader, 5, 12)
    last_moved[-1].pos += 8
    refused(last_moved, DLedgerResponseCode.DISK_ERROR)
    gap = _run(leader, 5, 12)
    del gap[3]
    refused(gap, DLedgerResponseCode.INCONSISTENT_INDEX)
    refused(_run(leader, 6, 12), DLedgerResponseCode.INCONSISTENT_INDEX)
    corrupt = _run(leader, 5, 12)
    raw = bytes(leader.get_data(corrupt[0].pos, corrupt[-1].pos + corrupt[-1].size - corrupt[0].pos)) \
        if data_file > 1024 else None
    corrupt[4].body = b"y" * len(corrupt[4].body)  # no longer matches the leader's CRC
    refused(corrupt, DLedgerResponseCode.DISK_ERROR, raw)
    older = _run(leader, 5, 12)
    older[2].term = 0
    refused(older, DLedgerResponseCode.INCONSISTENT_TERM)
    # The good run still goes in afterwards.
    follower.batch_append_as_follower(_run(leader, 5, 29), 1, "n0")
    assert _files(follower) == _files(leader)


def test_disk_full_refuses_a_batch(tmp_path) -> None:
    leader = open_store(tmp_path, "n0")
    for i in range(5):
        leader.append_as_leader(DLedgerEntry(body=body_for(i)), 1)
    follower = open_store(tmp_path, "n1", disk_space_ratio_to_force_clean=-0.05)
    follower.check_disk_space()
    with pytest.raises(DLedgerException) as ex:
        follower.batch_append_as_follower(_run(leader, 0, 4), 1, "n0")
    assert ex.value.code is DLedgerResponseCode.DISK_FULL and follower.ledger_end_index == -1


def test_memory_store_batch_refusals_append_nothing() -> None:
    cfg = DLedgerConfig(self_id="n0", peers="n0-127.0.0.1:1")
    leader, follower = DLedgerMemoryStore(cfg), DLedgerMemoryStore(cfg)
    for i in range(10):
        leader.append_as_leader(DLedgerEntry(body=body_for(i)), 1)
    run = _run(leader, 0, 9)
    bad_pos = _run(leader, 0, 9)
    bad_pos[5].pos += 1
    bad_crc = _run(leader, 0, 9)
    bad_crc[7].body = b"z" + bad_crc[7].body
    bad_crc[7].size = BODY_OFFSET + len(bad_crc[7].body)
    gap = run[:3] + run[4:]
    for bad, code in ((bad_pos, DLedgerResponseCode.DISK_ERROR), (bad_crc, DLedgerResponseCode.DISK_ERROR),
                      (gap, DLedgerResponseCode.INCONSISTENT_INDEX)):
        with pytest.raises(DLedgerException) as ex:
            follower.batch_append_as_follower(bad, 1, "n0")
        assert ex.value.code is code and follower.ledger_end_index == -1
    follower.batch_append_as_follower(run, 1, "n0")
    assert [follower.get(i).body for i in range(10)] == [body_for(i) for i in range(10)]


def test_get_range_matches_get_across_files_and_checks_crc(tmp_path) -> None:
    store = open_store(tmp_path, "n0")
    for i in range(100):
        store.append_as_leader(DLedgerEntry(body=body_for(i)), 1)
    assert store.get_range(0, 99) == [store.get(i) for i in range(100)]
    assert store.get_range(17, 63) == [store.get(i) for i in range(17, 64)]
    assert store.get_range(5, 4) == []
    with pytest.raises(DLedgerException) as ex:
        store.get_range(90, 100)
    assert ex.value.code is DLedgerResponseCode.INDEX_OUT_OF_RANGE
    e = store.get(40)
    mf = store.data_file_list.find_file(e.pos)
    off = e.pos - mf.file_from_offset + BODY_OFFSET
    mf.mm[off] ^= 0xFF  # a flipped body byte: the range read refuses it like get does
    with pytest.raises(DLedgerException) as ex:
        store.get_range(30, 50)
    assert ex.value.code is DLedgerResponseCode.DISK_ERROR and "CRC" in str(ex.value)
