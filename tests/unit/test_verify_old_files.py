"""Background verification of the data files recovery does not scan (`dledger.store.verify`).

Recovery scans only the last three data files, so damage in an older file is invisible on start.
These tests write a log over 12+ small (64 KB) data files, damage an entry of the first file
(a body bit, a header term bit the body CRC cannot see, a zeroed sector), and reopen: recovery
passes, the member reports `verifying` and does not campaign or take leadership (it still votes),
then the verification finds the damage and cuts the log before it with a catch-up watermark at
the old end, after which the recovering rules hold votes too. A clean log verifies and the member
campaigns normally. The in-process TCP group cases are in `test_corrupt_rejoin.py`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET, DLedgerEntry
from dledger.rpc.protocol import LeadershipTransferRequest, VoteRequest, VoteResult
from dledger.server import DLedgerServer
from dledger.store.mmap_store import DLedgerMmapFileStore
from tests.ports import free_ports

GROUP = "verify"
DATA_FILE = 64 * 1024
INDEX_FILE = 32 * 1024
MIN_FILES = 12
TERM = 3



def config(base: Path, members: int) -> DLedgerConfig:
    ids = [f"n{i}" for i in range(members)]
    peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in zip(ids, free_ports(members), strict=True))
    return DLedgerConfig(group=GROUP, self_id="n0", peers=peers, store_base_dir=str(base),
                         heart_beat_time_interval_ms=100, max_heart_beat_leak=3, min_vote_interval_ms=50,
                         max_vote_interval_ms=150, check_point_interval_ms=100,
                         mapped_file_size_for_entry_data=DATA_FILE,
                         mapped_file_size_for_entry_index=INDEX_FILE)  # fmt: skip


def body(i: int) -> bytes:
    return f"entry-{i:05d}-".encode() * (10 + i % 30)


def write_log(cfg: DLedgerConfig) -> int:
    """Append committed entries in term TERM until there are MIN_FILES data files; clean shutdown
    (checkpoint written). Returns the end index."""
    store = DLedgerMmapFileStore(cfg)
    store.recover()
    i = 0
    while len(store.data_file_list.files) < MIN_FILES:
        store.append_as_leader(DLedgerEntry(body=body(i)), TERM)
        i += 1
    store.update_committed_index(TERM, store.ledger_end_index)
    store.flush()
    store.write_checkpoint()
    end = store.ledger_end_index
    store.data_file_list.close()
    store.index_file_list.close()
    (Path(cfg.default_path()) / "currterm").write_text(f"currTerm={TERM}\nvoteLeader=n0\n")
    return end


def where(cfg: DLedgerConfig, index: int) -> tuple[str, int, int]:
    """(data file path, local offset, size) of entry `index`, read through a fresh store."""
    store = DLedgerMmapFileStore(cfg)
    store.recover()
    e = store.get(index)
    mf = store.data_file_list.find_file(e.pos)
    out = (mf.path, e.pos - mf.file_from_offset, e.size)
    assert mf is store.data_file_list.files[0], "the damaged entry must be in the first data file"
    store.data_file_list.close()
    store.index_file_list.close()
    return out


def damage(path: str, local: int, kind: str) -> None:
    with open(path, "r+b") as f:
        if kind == "body_bit":
            off, data = local + BODY_OFFSET + 5, None
        elif kind == "term_bit":
            off, data = local + 23, None  # lowest byte of the header's term: the body CRC misses it
        else:  # a lost sector: 512 zero bytes from the entry's start
            off, data = local, bytes(512)
        f.seek(off)
        if data is None:
            data = bytes([f.read(1)[0] ^ 0x10])
            f.seek(off)
        f.write(data)


def messages(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"event={event}" in r.getMessage()]


@pytest.mark.parametrize("kind", ["body_bit", "term_bit", "zero_sector"])
async def test_damage_in_the_first_data_file_is_found_after_start_and_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    caplog.set_level(logging.INFO)
    cfg = config(tmp_path, 3)
    end = write_log(cfg)
    target = 10  # inside the first data file, not its first entry
    path, local, _ = where(cfg, target)
    damage(path, local, kind)

    # Not started: the store is recovered, the verification has not run yet.
    server = DLedgerServer(cfg)
    store, ms, elector = server.store, server.member_state, server.elector
    await asyncio.to_thread(store.recover)
    assert store.ledger_end_index == end, "recovery scans only the last files: it cannot see the damage"
    assert server.metadata()["verifying"] is True and server.metadata()["recovering"] is False
    for read in (lambda: store.get(target), lambda: store.get_range(target - 2, target + 2)):
        with pytest.raises(DLedgerException) as ex:
            read()  # reads check the header against the index record and the body CRC: never served
        assert ex.value.code is DLedgerResponseCode.DISK_ERROR
    # No leadership transfer while verifying.
    code = elector.handle_take_leadership(LeadershipTransferRequest(
        group=GROUP, remote_id="n0", local_id="n1", leader_id="n1", term=ms.curr_term, transfer_id="n1",
        transferee_id="n0", take_leadership_term=ms.curr_term + 1))  # fmt: skip
    assert code is DLedgerResponseCode.TAKE_LEADERSHIP_FAILED
    assert messages(caplog, "take_leadership_refused_verifying")
    # No campaign while verifying: the candidate step returns without raising its term.
    term = ms.curr_term
    elector.next_time_to_request_vote = 0.0
    await elector._maintain_as_candidate()
    assert ms.curr_term == term and not ms.is_leader()
    assert messages(caplog, "campaign_held_verifying")
    # Votes are still granted: our verified tail is what the vote compares.
    resp = await elector.handle_vote(VoteRequest(
        group=GROUP, remote_id="n0", local_id="n1", term=term + 1, ledger_end_index=end,
        ledger_end_term=TERM))  # fmt: skip
    assert resp.vote_result == VoteResult.ACCEPT

    await store.start()
    try:
        assert await store.wait_verified() is False
        assert store.verifying is False and server.metadata()["verifying"] is False
        assert store.ledger_end_index == target - 1 and store.committed_index == target - 1
        assert store.catchup_watermark == end
        catchup = Path(cfg.default_path()) / "catchup"
        assert catchup.read_text() == f"catchUpIndex={end}\n"
        with pytest.raises(DLedgerException) as ex:
            store.get(target)
        assert ex.value.code is DLedgerResponseCode.INDEX_OUT_OF_RANGE
        assert store.get(target - 1).body == body(target - 1)
        assert server.metadata()["recovering"] is True
        (start_line,) = messages(caplog, "old_files_verify_start")
        assert "selfId=n0" in start_line and f"group={GROUP}" in start_line and "files=" in start_line
        (end_line,) = messages(caplog, "old_files_verify_end")
        assert "result=corrupt" in end_line and "seconds=" in end_line and "bytes=" in end_line
        (cut,) = messages(caplog, "committed_entries_cut")
        assert f"lastGoodIndex={target - 1}" in cut and f"catchUpWatermark={end}" in cut
        # Now recovering: no vote either, no campaign.
        resp = await elector.handle_vote(VoteRequest(
            group=GROUP, remote_id="n0", local_id="n2", term=ms.curr_term + 1, ledger_end_index=end + 5,
            ledger_end_term=TERM + 1))  # fmt: skip
        assert resp.vote_result == VoteResult.REJECT_TERM_NOT_READY
        elector.next_time_to_request_vote = 0.0
        term = ms.curr_term
        await elector._maintain_as_candidate()
        assert ms.curr_term == term and messages(caplog, "campaign_held_recovering")
    finally:
        await store.shutdown()
    # The cut is durable: a restart recovers to the same end and keeps the watermark.
    again = DLedgerMmapFileStore(cfg)
    await again.start()
    try:
        assert again.ledger_end_index == target - 1 and again.catchup_watermark == end
        assert await again.wait_verified() is True
    finally:
        await again.shutdown()


async def test_a_clean_log_verifies_and_the_member_campaigns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cfg = config(tmp_path, 1)  # a one-member group elects itself as soon as it campaigns
    end = write_log(cfg)
    server = DLedgerServer(cfg)
    await server.start()
    try:
        assert await server.store.wait_verified() is True
        deadline = asyncio.get_running_loop().time() + 5
        while not server.member_state.is_leader():
            assert asyncio.get_running_loop().time() < deadline, "no leader within 5 s"
            await asyncio.sleep(0.02)
        lines = [r.getMessage() for r in caplog.records]
        done = next(i for i, m in enumerate(lines) if "event=old_files_verify_end" in m)
        elected = next(i for i, m in enumerate(lines) if m.startswith(f"elected group={GROUP}"))
        assert done < elected, "the member campaigned before its older files were verified"
        assert "result=ok" in lines[done]
        meta = server.metadata()
        assert meta["verifying"] is False and meta["recovering"] is False
        assert server.store.ledger_end_index > end  # the new leader's no-op follows the old log
        assert not (Path(cfg.default_path()) / "catchup").exists()
        assert server.store.get(10).body == body(10)
    finally:
        await server.shutdown()
