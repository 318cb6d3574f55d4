"""`MemberState`: this member's role, term and vote, and the peer table.

currTerm and voteLeader are persisted before any vote or term change is answered (Raft §5.1
"persistent state"): for a FILE store in `{storeBaseDir}/dledger-{selfId}/currterm`, written
atomically (temp file, fsync, rename, fsync of the directory); for a MEMORY store in the store
object's `term_state`, which the simulator keeps across a simulated crash.

A member whose store recovery had to cut committed entries (a corrupt log) is *recovering* until
its log reaches the store's catch-up watermark again: `check_recovering` tells the elector not to
vote or campaign meanwhile; it still follows a leader and re-fetches from it. A member whose store
is still *verifying* the older data files after recovery (`check_verifying`) does not campaign
or take leadership until that is done (it may vote: see `elector`).

State transitions live in `change_to_leader` / `change_to_follower` / `change_to_candidate`, each
logged with the old and new role and term. The elector calls them; nothing else changes the role.
"""

from __future__ import annotations

import logging
import os
from enum import StrEnum

from dledger.config import DLedgerConfig
from dledger.store.base import DLedgerStore

log = logging.getLogger("dledger.member_state")

CURRTERM_FILE = "currterm"


class Role(StrEnum):
    """A member's role. Every member starts as CANDIDATE. The values are the contract of the
    metadata JSON (`"role": "LEADER"`)."""

    CANDIDATE = "CANDIDATE"
    FOLLOWER = "FOLLOWER"
    LEADER = "LEADER"


class TermStore:
    """Where currTerm/voteLeader live: a dict (memory store) or the atomic `currterm` file."""

    def __init__(self, path: str | None, memory: dict[str, str] | None = None) -> None:
        self.path = path
        self.memory = memory if memory is not None else {}

    def load(self) -> dict[str, str]:
        if self.path is None:
            return dict(self.memory)
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return {}
        out = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key.strip()] = value.strip()
        return out

    def save(self, values: dict[str, str]) -> None:
        """Persist durably before returning. Runs on the loop on purpose: terms change a few
        times per failover, and answering a vote before the fsync would break election safety."""
        if self.path is None:
            self.memory.clear()
            self.memory.update(values)
            return
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = self.path + ".tmp"
        data = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class MemberState:
    """Role, term, vote and leader of this member, plus its view of the log end (from the store)."""

    def __init__(self, config: DLedgerConfig, store: DLedgerStore) -> None:
        self.config = config
        self.group = config.group
        self.self_id = config.self_id
        self.peer_map: dict[str, str] = config.peer_map
        self.store = store
        self.role = Role.CANDIDATE
        self.curr_term = 0
        self.vote_for: str | None = None
        self.leader_id: str | None = None
        self.known_max_term_in_group = 0
        self.transferee: str | None = None
        self.term_to_take_leadership = -1
        if store.term_state is not None:
            self.term_store = TermStore(None, store.term_state)
        else:
            self.term_store = TermStore(os.path.join(config.default_path(), CURRTERM_FILE))
        self.load()

    # -- persistence ----------------------------------------------------------------------
    def load(self) -> None:
        """Read currTerm/voteLeader (a fresh member starts at term 0 with no vote)."""
        values = self.term_store.load()
        try:
            self.curr_term = int(values.get("currTerm", "0"))
        except ValueError as exc:
            raise ValueError(
                f"currterm file {self.term_store.path}: bad currTerm {values.get('currTerm')!r}"
            ) from exc
        self.vote_for = values.get("voteLeader") or None
        self.known_max_term_in_group = self.curr_term

    def persist_term(self, term: int, vote_for: str | None) -> None:
        """Set and persist term and vote together (never one without the other)."""
        if term < self.curr_term:
            raise ValueError(f"term may not go backwards: {self.curr_term} -> {term}")
        if term == self.curr_term and vote_for == self.vote_for:
            return
        self.term_store.save({"currTerm": str(term), "voteLeader": vote_for or ""})
        if term != self.curr_term:
            log.info(
                "term change group=%s selfId=%s term %d -> %d", self.group, self.self_id, self.curr_term, term
            )
        self.curr_term = term
        self.vote_for = vote_for
        self.known_max_term_in_group = max(self.known_max_term_in_group, term)

    # -- transitions ----------------------------------------------------------------------
    def _log_change(self, new_role: Role, term: int, leader: str | None) -> None:
        log.info(
            "role change group=%s selfId=%s %s -> %s term=%d leader=%s",
            self.group,
            self.self_id,
            self.role.value,
            new_role.value,
            term,
            leader,
        )

    def change_to_leader(self, term: int) -> None:
        """Called by the elector after winning term `term` (already persisted)."""
        assert term == self.curr_term, (term, self.curr_term)
        self._log_change(Role.LEADER, term, self.self_id)
        self.role = Role.LEADER
        self.leader_id = self.self_id
        self.transferee = None

    def change_to_follower(self, term: int, leader_id: str) -> None:
        """Follow `leader_id` in `term` (persisting the term first if it is new)."""
        if term > self.curr_term:
            self.persist_term(term, leader_id)
        if self.role != Role.FOLLOWER or self.leader_id != leader_id:
            self._log_change(Role.FOLLOWER, term, leader_id)
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.transferee = None

    def change_to_candidate(self, term: int) -> None:
        """Step down / start campaigning. `term` only raises `known_max_term_in_group`."""
        self.known_max_term_in_group = max(self.known_max_term_in_group, term)
        if self.role != Role.CANDIDATE:
            self._log_change(Role.CANDIDATE, max(term, self.curr_term), None)
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.transferee = None

    # -- recovery after a corrupt log -----------------------------------------------------
    def check_recovering(self) -> bool:
        """True while the store's catch-up watermark is above the log end. Clears (durably) and
        logs once the log has reached it. Stores without a watermark are never recovering."""
        watermark = self.store.catchup_watermark
        if watermark < 0:
            return False
        end = self.store.ledger_end_index
        if end < watermark:
            return True
        self.store.clear_catchup_watermark()
        log.warning(
            "event=catch_up_complete group=%s selfId=%s term=%d end=%d catchUpWatermark=%d: "
            "voting and campaigning again",
            self.group, self.self_id, self.curr_term, end, watermark,
        )
        return False

    def check_verifying(self) -> bool:
        """True while the store still verifies the older data files its recovery did not scan
        (`dledger.store.verify`): no campaign and no leadership transfer until it is done."""
        return self.store.verifying

    # -- queries --------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    def is_quorum(self, num: int) -> bool:
        """True when `num` members (self included) are a majority of the group."""
        return num >= len(self.peer_map) // 2 + 1

    @property
    def quorum(self) -> int:
        return len(self.peer_map) // 2 + 1

    def peers_without_self(self) -> list[str]:
        return [p for p in self.peer_map if p != self.self_id]

    def is_peer_member(self, member_id: str) -> bool:
        return member_id in self.peer_map

    @property
    def leader_addr(self) -> str | None:
        return self.peer_map.get(self.leader_id) if self.leader_id else None

    @property
    def ledger_end_index(self) -> int:
        return self.store.ledger_end_index

    @property
    def ledger_end_term(self) -> int:
        return self.store.ledger_end_term
