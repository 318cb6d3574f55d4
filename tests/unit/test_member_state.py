"""MemberState: currterm persistence (atomic file), quorum arithmetic, transitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.config import DLedgerConfig
from dledger.member_state import CURRTERM_FILE, MemberState, Role
from dledger.store.memory_store import DLedgerMemoryStore

PEERS = "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3"


def make(tmp_path: Path, store_type: str = "FILE", peers: str = PEERS) -> MemberState:
    cfg = DLedgerConfig(
        group="g", self_id="n0", peers=peers, store_base_dir=str(tmp_path), store_type=store_type
    )
    return MemberState(cfg, DLedgerMemoryStore(cfg))


def test_fresh_member_starts_as_candidate_in_term_0(tmp_path: Path) -> None:
    ms = make(tmp_path)
    assert (ms.role, ms.curr_term, ms.vote_for, ms.leader_id) == (Role.CANDIDATE, 0, None, None)


def test_term_and_vote_survive_restart_in_currterm_file(tmp_path: Path) -> None:
    ms = make(tmp_path)
    ms.persist_term(7, "n2")
    path = tmp_path / "dledger-n0" / CURRTERM_FILE
    assert path.read_text() == "currTerm=7\nvoteLeader=n2\n"
    assert not (tmp_path / "dledger-n0" / (CURRTERM_FILE + ".tmp")).exists()
    again = make(tmp_path)
    assert (again.curr_term, again.vote_for) == (7, "n2")


def test_term_never_goes_backwards(tmp_path: Path) -> None:
    ms = make(tmp_path)
    ms.persist_term(5, None)
    with pytest.raises(ValueError, match="backwards"):
        ms.persist_term(4, "n1")
    assert make(tmp_path).curr_term == 5


def test_corrupt_currterm_is_refused_with_the_path(tmp_path: Path) -> None:
    (tmp_path / "dledger-n0").mkdir()
    (tmp_path / "dledger-n0" / CURRTERM_FILE).write_text("currTerm=abc\n")
    with pytest.raises(ValueError, match="currterm"):
        make(tmp_path)


def test_memory_store_keeps_term_in_the_store_object(tmp_path: Path) -> None:
    cfg = DLedgerConfig(
        group="g", self_id="n0", peers=PEERS, store_base_dir=str(tmp_path), store_type="MEMORY"
    )
    store = DLedgerMemoryStore(cfg)
    MemberState(cfg, store).persist_term(3, "n0")
    assert not (tmp_path / "dledger-n0").exists()
    assert MemberState(cfg, store).curr_term == 3  # a "restart" over the same simulated disk


@pytest.mark.parametrize(("members", "quorum"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_is_quorum_is_a_strict_majority(tmp_path: Path, members: int, quorum: int) -> None:
    peers = ";".join(f"n{i}-127.0.0.1:{i + 1}" for i in range(members))
    ms = make(tmp_path, peers=peers)
    assert ms.is_quorum(quorum) and not ms.is_quorum(quorum - 1)


def test_transitions_set_role_and_leader(tmp_path: Path) -> None:
    ms = make(tmp_path)
    ms.change_to_follower(2, "n1")
    assert (ms.role, ms.curr_term, ms.leader_id, ms.leader_addr) == (Role.FOLLOWER, 2, "n1", "127.0.0.1:2")
    ms.change_to_candidate(2)
    assert ms.role == Role.CANDIDATE and ms.leader_id is None
    ms.persist_term(3, "n0")
    ms.change_to_leader(3)
    assert ms.is_leader() and ms.leader_id == "n0" and ms.peers_without_self() == ["n1", "n2"]
