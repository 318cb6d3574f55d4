"""Seeded random walk over a leader and a follower DLedgerMmapFileStore with tiny files, checked
against a plain list model after every step: appends (single and batch), follower catch-up,
divergent follower tails cut by truncate, commits, expiry, and restarts from the files."""

from __future__ import annotations

import random

import pytest

from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET, DLedgerEntry
from dledger.store.mmap_store import DLedgerMmapFileStore

pytestmark = pytest.mark.usefixtures("mmap_files_closed")


def open_store(base, self_id: str) -> DLedgerMmapFileStore:
    cfg = DLedgerConfig(store_base_dir=str(base), self_id=self_id, peers=f"{self_id}-127.0.0.1:1",
                        mapped_file_size_for_entry_data=2048, mapped_file_size_for_entry_index=32 * 32,
                        delete_when="99", file_reserved_hours=0)
    store = DLedgerMmapFileStore(cfg, disk_used_ratio=lambda: 0.0)
    store.recover()
    return store


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_walk_matches_the_model(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    leader, follower = open_store(tmp_path, "n0"), open_store(tmp_path, "n1")
    model: list[tuple[int, bytes]] = []  # (term, body) per index, the leader's log
    term = 1

    def body() -> bytes:
        return rng.randbytes(rng.choice((0, 1, 7, 40, 100, 200, 400)))

    for step in range(300):
        op = rng.random()
        if op < 0.30:
            e = leader.append_as_leader(DLedgerEntry(body=body()), term)
            model.append((term, e.body))
        elif op < 0.45:
            batch = [DLedgerEntry(body=body()) for _ in range(rng.randint(1, 12))]
            model += [(term, e.body) for e in leader.batch_append_as_leader(batch, term)]
        elif op < 0.65:
            for i in range(follower.ledger_end_index + 1, min(len(model), follower.ledger_end_index + 20)):
                follower.append_as_follower(leader.get(i), term, "n0")
        elif op < 0.72 and len(model) > follower.ledger_end_index + 1 > follower.committed_index + 1:
            # The follower grows a stale tail from a dead leader, then the leader truncates it at a
            # point where the logs still agree (what the COMPARE walk finds).
            first_stale = follower.ledger_end_index + 1
            for _ in range(rng.randint(1, 5)):
                stale = DLedgerEntry(body=b"stale" * rng.randint(0, 30), index=follower.ledger_end_index + 1,
                                     term=follower.ledger_end_term)
                stale.pos = follower.data_file_list.next_append_pos(BODY_OFFSET + len(stale.body))
                follower.append_as_follower(stale, term, "nX")
            cut = rng.randint(follower.committed_index + 1, min(len(model) - 1, first_stale))
            follower.truncate(leader.get(cut), term, "n0")
            assert follower.ledger_end_index == cut
        elif op < 0.80:
            target = rng.randint(leader.committed_index - 5, len(model))
            leader.update_committed_index(term, target)
            follower.update_committed_index(term, min(target, follower.ledger_end_index))
        elif op < 0.85:
            term += 1
        elif op < 0.90:
            for s in (leader, follower):
                s.check_disk_space()  # reserved hours 0 + deleteWhen never: only ratio-driven, which is 0
        else:
            which = rng.choice(("n0", "n1"))
            store = leader if which == "n0" else follower
            begin, end, committed = store.ledger_begin_index, store.ledger_end_index, store.committed_index
            store.flush()
            store.write_checkpoint()
            store.close_without_flush()
            store = open_store(tmp_path, which)
            assert (store.ledger_begin_index, store.ledger_end_index, store.committed_index) == (
                begin, end, committed), f"step {step}: restart of {which}"
            if which == "n0":
                leader = store
            else:
                follower = store
        assert leader.ledger_end_index == len(model) - 1
        assert leader.committed_index <= leader.ledger_end_index
        for i in range(max(0, len(model) - 5), len(model)):
            got = leader.get(i)
            assert (got.term, got.body) == model[i], f"step {step}: leader entry {i}"
        for i in range(max(0, follower.ledger_end_index - 5), follower.ledger_end_index + 1):
            assert follower.get(i).body == model[i][1], f"step {step}: follower entry {i}"
            assert follower.get(i).pos == leader.get(i).pos
    assert [leader.get(i).body for i in range(len(model))] == [b for _, b in model]
