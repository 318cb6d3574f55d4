"""`DLedgerLeaderElector`: elections, heartbeats, role-change handlers, leadership transfer.

One task (`_maintain_state`) plays the role the member has: a LEADER sends heartbeats every
`heart_beat_time_interval_ms` and steps down when it has not heard from a quorum for an election
timeout; a FOLLOWER turns CANDIDATE when no leader message arrives for
`heart_beat_time_interval_ms * max_heart_beat_leak` (+ a random part so followers do not all wake
together); a CANDIDATE first runs a pre-vote (Raft thesis §9.6: "would you vote for me in term
T+1?", answered no while the voter hears from a live leader), and only then raises its term and
asks for real votes. Pre-vote is why a member that was partitioned away and comes back cannot
depose a healthy leader: it never raised its term.

Vote rules (Raft §5.2, §5.4.1): one vote per term, persisted before answering; a vote only for a
candidate whose log is at least as up to date (higher ledgerEndTerm, or equal and ledgerEndIndex
at least ours). Any message with a higher term makes the receiver adopt it and step down.

A member that is recovering from a corrupt log (`MemberState.check_recovering`: its store cut
committed entries and has not re-fetched them yet) neither campaigns nor grants votes, pre-votes
included: having lost entries it acknowledged, its "my log is at least as up to date" answer would
be wrong. It still follows the leader, whose pushes bring it back.

A member whose store is still *verifying* the data files its recovery did not scan
(`MemberState.check_verifying`, `dledger.store.verify`) neither campaigns nor accepts a leadership
transfer: a flipped bit in such a file is not known yet, and a leader holding a corrupt committed
entry could not replicate it (reads check the CRC, so it is never served, but the group would
stall on it). It still grants votes, on purpose: a vote compares only the candidate's last
(term, index) with ours, and our tail was fully checked by recovery's scan, so that answer is
right whatever an older file holds. A corrupt older entry does not make us forget that we
acknowledged it — the entries we acknowledged are exactly those up to our (verified) end — and
the candidate's copy of it is its own, so a candidate at least as up to date as our end holds
every entry we helped commit. Refusing votes as well would make a whole-group restart wait for
the slowest member's verification before any leader could be elected. If verification then
finds a corrupt entry, the log is cut with a catch-up watermark at the old end, and from then on
the recovering rules above hold votes too (`cut_corrupt_log` also makes a leader step down first).

Time comes from the running loop, so under the simulator's virtual-time loop all of this runs in
virtual time; randomness comes from the injected `rng`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Protocol

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.member_state import MemberState, Role
from dledger.rpc.protocol import (
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    RpcService,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from dledger.taskset import TaskSet

log = logging.getLogger("dledger.elector")

RoleChangeHandler = Callable[[int, Role], None]


class ReplicationProgress(Protocol):
    """What a leadership transfer needs to know of replication (`DLedgerEntryPusher`)."""

    def peer_water_mark(self, peer: str) -> int: ...
    async def wait_peer_caught_up(self, peer: str, index: int, timeout_s: float) -> None: ...

_PREFERRED_CHECK_INTERVAL_S = 3.0
_MIN_WAIT_S = 0.001


class DLedgerLeaderElector:
    """Owns every role transition of one member (via `MemberState.change_to_*`)."""

    def __init__(
        self,
        config: DLedgerConfig,
        member_state: MemberState,
        rpc: RpcService,
        replication: ReplicationProgress,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.ms = member_state
        self.rpc = rpc
        self.replication = replication
        self.rng = rng
        self.clock = clock
        self.hb_interval_s = config.heart_beat_time_interval_ms / 1000
        self.election_timeout_s = self.hb_interval_s * config.max_heart_beat_leak
        self.role_change_handlers: list[RoleChangeHandler] = []
        # Called synchronously before the handlers (server: append the no-op, reset the pusher).
        self.internal_handlers: list[RoleChangeHandler] = []
        self.last_leader_heartbeat_time = 0.0
        self.follower_deadline = 0.0
        self.next_time_to_request_vote = 0.0
        self.leader_since = 0.0
        self.next_heartbeat_time = 0.0
        self.peer_last_ack: dict[str, float] = {}
        # peer answered one of our heartbeats (the server lets a backing-off dispatcher know).
        self.heartbeat_ack_listeners: list[Callable[[str], None]] = []
        self.next_preferred_check = 0.0
        self._transfer_from: str | None = None  # the leader that last told us to take over
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._side_tasks = TaskSet()
        self._role_event = asyncio.Event()
        self._campaign_held_logged = False  # logged that a recovering member holds its campaign
        self._verify_held = False  # logged that a member verifying its older files holds its campaign

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        now = self.clock()
        self.last_leader_heartbeat_time = now
        self.next_time_to_request_vote = now + self._random_vote_interval()
        if self.config.enable_leader_elector:
            self._task = asyncio.get_running_loop().create_task(self._maintain_state())
        self._fire(self.ms.curr_term, self.ms.role)

    async def shutdown(self) -> None:
        tasks = [t for t in (self._task, *self._side_tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._task = None

    def register_role_change_handler(self, handler: RoleChangeHandler) -> None:
        self.role_change_handlers.append(handler)

    def _spawn(self, coro: object) -> None:
        task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # -- transitions (the only place roles change) ----------------------------------------
    def _fire(self, term: int, role: Role) -> None:
        for h in (*self.internal_handlers, *self.role_change_handlers):
            try:
                h(term, role)
            except Exception:
                log.exception(
                    "role change handler failed group=%s selfId=%s term=%d role=%s",
                    self.ms.group,
                    self.ms.self_id,
                    term,
                    role.value,
                )
        self._role_event.set()
        self._role_event = asyncio.Event()
        self._wake.set()

    def _become_leader(self, term: int) -> None:
        now = self.clock()
        self.ms.change_to_leader(term)
        self.leader_since = now
        self.next_heartbeat_time = now
        self.peer_last_ack = {p: now for p in self.ms.peers_without_self()}
        self.next_preferred_check = now + _PREFERRED_CHECK_INTERVAL_S
        self._fire(term, Role.LEADER)

    def _become_follower(self, term: int, leader_id: str) -> None:
        changed = self.ms.role != Role.FOLLOWER or self.ms.leader_id != leader_id or term != self.ms.curr_term
        self.ms.change_to_follower(term, leader_id)
        self._touch_leader()
        if changed:
            self._fire(term, Role.FOLLOWER)

    def _become_candidate(self, term: int, reason: str) -> None:
        """Step down or start campaigning; `term` is the highest term seen (persisted if higher)."""
        if term > self.ms.curr_term:
            self.ms.persist_term(term, None)
        was = self.ms.role
        self.ms.change_to_candidate(term)
        self.next_time_to_request_vote = self.clock() + self._random_vote_interval()
        if was != Role.CANDIDATE:
            log.info(
                "to candidate group=%s selfId=%s term=%d reason=%s",
                self.ms.group,
                self.ms.self_id,
                self.ms.curr_term,
                reason,
            )
            self._fire(self.ms.curr_term, Role.CANDIDATE)

    def on_corrupt_cut(self, reason: str) -> None:
        """The store is about to cut a corrupt log (found while running): a leader steps down
        first, so it stops replicating and appending before its log end moves back."""
        if self.ms.is_leader():
            self._become_candidate(self.ms.curr_term, f"corrupt log cut: {reason}")

    def on_higher_term(self, term: int, source: str) -> None:
        """Any response carrying a higher term: adopt it and stop leading/campaigning."""
        if term > self.ms.curr_term:
            self._become_candidate(term, f"higher term {term} from {source}")

    def _touch_leader(self) -> None:
        now = self.clock()
        self.last_leader_heartbeat_time = now
        self.follower_deadline = (
            now + self.election_timeout_s + self.rng.uniform(0, self.config.max_vote_interval_ms / 1000)
        )

    def _random_vote_interval(self) -> float:
        return self.rng.uniform(self.config.min_vote_interval_ms, self.config.max_vote_interval_ms) / 1000

    def on_peer_ack(self, peer_id: str) -> None:
        """The pusher saw a successful answer from a peer: it is alive and follows us."""
        self.peer_last_ack[peer_id] = self.clock()

    # -- incoming leader messages ---------------------------------------------------------
    def accept_leader_message(self, term: int, leader_id: str) -> DLedgerResponseCode:
        """Heartbeats and pushes: follow `leader_id` in `term` if that is consistent with our state."""
        code = self._accept_leader_message(term, leader_id)
        if code == DLedgerResponseCode.SUCCESS:
            self.ms.check_recovering()  # clears the catch-up watermark once the pushes reached it
        return code

    def _accept_leader_message(self, term: int, leader_id: str) -> DLedgerResponseCode:
        ms = self.ms
        if term < ms.curr_term:
            return DLedgerResponseCode.EXPIRED_TERM
        if term > ms.curr_term:
            self._become_follower(term, leader_id)
            return DLedgerResponseCode.SUCCESS
        if ms.role == Role.LEADER:
            log.error("two leaders in term %d: %s and self %s", term, leader_id, ms.self_id)
            return DLedgerResponseCode.INCONSISTENT_LEADER
        transferring = ms.term_to_take_leadership > term and leader_id == self._transfer_from
        if ms.role == Role.CANDIDATE and transferring:
            # This leader told us to take over; its heartbeats and pushes sent before it knew may
            # still arrive ahead of our campaign, and following it again would drop the transfer.
            return DLedgerResponseCode.SUCCESS
        if ms.leader_id is None or ms.leader_id == leader_id:
            if ms.role != Role.FOLLOWER or ms.leader_id is None:
                self._become_follower(term, leader_id)
            else:
                self._touch_leader()
            return DLedgerResponseCode.SUCCESS
        return DLedgerResponseCode.INCONSISTENT_LEADER

    async def handle_heartbeat(self, req: HeartBeatRequest) -> HeartBeatResponse:
        code = self.accept_leader_message(req.term, req.leader_id)
        return HeartBeatResponse(
            group=self.ms.group,
            remote_id=req.local_id,
            local_id=self.ms.self_id,
            leader_id=self.ms.leader_id or "",
            term=self.ms.curr_term,
            code=int(code),
        )

    # -- votes ----------------------------------------------------------------------------
    def _log_check(self, req: VoteRequest) -> VoteResult | None:
        my_term, my_index = self.ms.ledger_end_term, self.ms.ledger_end_index
        if req.ledger_end_term < my_term:
            return VoteResult.REJECT_EXPIRED_LEDGER_TERM
        if req.ledger_end_term == my_term and req.ledger_end_index < my_index:
            return VoteResult.REJECT_SMALL_LEDGER_END_INDEX
        return None

    def _pre_vote_result(self, req: VoteRequest) -> VoteResult:
        ms = self.ms
        if req.term < ms.curr_term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if not req.take_leadership:
            if ms.role == Role.LEADER:
                return VoteResult.REJECT_ALREADY_HAS_LEADER
            if (
                ms.role == Role.FOLLOWER
                and self.clock() - self.last_leader_heartbeat_time < self.election_timeout_s
            ):
                return VoteResult.REJECT_ALREADY_HAS_LEADER
        if req.term == ms.curr_term and ms.vote_for not in (None, req.local_id):
            return VoteResult.REJECT_ALREADY_VOTED
        return self._log_check(req) or VoteResult.ACCEPT

    def _vote_result(self, req: VoteRequest) -> VoteResult:
        ms = self.ms
        if req.term < ms.curr_term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if req.term > ms.curr_term:
            self._become_candidate(req.term, f"vote request of {req.local_id} in term {req.term}")
        if ms.vote_for not in (None, req.local_id):
            return VoteResult.REJECT_ALREADY_VOTED
        if ms.leader_id is not None and ms.leader_id != req.local_id:
            return VoteResult.REJECT_ALREADY_HAS_LEADER
        bad_log = self._log_check(req)
        if bad_log is not None:
            return bad_log
        ms.persist_term(req.term, req.local_id)  # durable before the answer leaves
        self.next_time_to_request_vote = self.clock() + self.election_timeout_s + self._random_vote_interval()
        self._touch_leader()
        return VoteResult.ACCEPT

    def _recovering_vote_result(self, req: VoteRequest) -> VoteResult:
        """No vote from a member missing entries it acknowledged; a higher term is still adopted."""
        ms = self.ms
        if req.term < ms.curr_term:
            return VoteResult.REJECT_EXPIRED_VOTE_TERM
        if not req.pre_vote and req.term > ms.curr_term:
            self._become_candidate(req.term, f"vote request of {req.local_id} in term {req.term}")
        log.info(
            "event=vote_refused_recovering group=%s selfId=%s term=%d candidate=%s preVote=%s end=%d "
            "catchUpWatermark=%d",
            ms.group, ms.self_id, ms.curr_term, req.local_id, req.pre_vote, ms.ledger_end_index,
            ms.store.catchup_watermark,
        )
        return VoteResult.REJECT_TERM_NOT_READY

    async def handle_vote(self, req: VoteRequest) -> VoteResponse:
        if not self.ms.is_peer_member(req.local_id):
            result, code = VoteResult.REJECT_UNKNOWN_LEADER, DLedgerResponseCode.UNKNOWN_MEMBER
        elif self.ms.check_recovering():
            result, code = self._recovering_vote_result(req), DLedgerResponseCode.SUCCESS
        else:
            result = self._pre_vote_result(req) if req.pre_vote else self._vote_result(req)
            code = DLedgerResponseCode.SUCCESS
        return VoteResponse(
            group=self.ms.group,
            remote_id=req.local_id,
            local_id=self.ms.self_id,
            leader_id=self.ms.leader_id or "",
            term=self.ms.curr_term,
            code=int(code),
            vote_result=int(result),
        )

    # -- the state loop -------------------------------------------------------------------
    async def _sleep(self, delay_s: float) -> None:
        """Wait `delay_s` or until something relevant happens (role change, transfer order).
        A positive wait is at least _MIN_WAIT_S: timers may fire up to the clock resolution early,
        and a loop re-arming a sub-resolution timer would spin without time passing."""
        if delay_s > 0:
            handle = asyncio.get_running_loop().call_later(max(delay_s, _MIN_WAIT_S), self._wake.set)
            await self._wake.wait()
            handle.cancel()
        self._wake.clear()

    async def _maintain_state(self) -> None:
        while True:
            try:
                role = self.ms.role
                if role == Role.LEADER:
                    await self._maintain_as_leader()
                elif role == Role.FOLLOWER:
                    await self._maintain_as_follower()
                else:
                    await self._maintain_as_candidate()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("elector loop error group=%s selfId=%s", self.ms.group, self.ms.self_id)
                await asyncio.sleep(self.hb_interval_s)

    async def _maintain_as_follower(self) -> None:
        now = self.clock()
        if now >= self.follower_deadline:
            self._become_candidate(
                self.ms.curr_term,
                f"no heartbeat from {self.ms.leader_id} for {now - self.last_leader_heartbeat_time:.3f}s",
            )
            self.next_time_to_request_vote = now
            return
        await self._sleep(self.follower_deadline - now)

    async def _maintain_as_leader(self) -> None:
        now = self.clock()
        term = self.ms.curr_term
        if now >= self.next_heartbeat_time:
            self.next_heartbeat_time = now + self.hb_interval_s
            for peer in self.ms.peers_without_self():
                self._spawn(self._send_heartbeat(peer, term))
        alive = 1 + sum(1 for t in self.peer_last_ack.values() if now - t < self.election_timeout_s)
        if not self.ms.is_quorum(alive) and now - self.leader_since > self.election_timeout_s:
            self._become_candidate(term, f"only {alive} of {len(self.ms.peer_map)} members reachable")
            return
        if self.config.preferred_leader_ids and now >= self.next_preferred_check:
            self.next_preferred_check = now + _PREFERRED_CHECK_INTERVAL_S
            self._check_preferred_leader()
        await self._sleep(self.next_heartbeat_time - now)

    async def _send_heartbeat(self, peer: str, term: int) -> None:
        req = HeartBeatRequest(
            group=self.ms.group,
            remote_id=peer,
            local_id=self.ms.self_id,
            leader_id=self.ms.self_id,
            term=term,
        )
        try:
            resp = await self.rpc.heartbeat(peer, req, self.election_timeout_s)
        except DLedgerException:
            return
        if resp.code == DLedgerResponseCode.SUCCESS:
            self.on_peer_ack(peer)
            for listener in self.heartbeat_ack_listeners:
                listener(peer)
        elif resp.term > self.ms.curr_term:
            self.on_higher_term(resp.term, f"heartbeat answer of {peer}")
        elif resp.code == DLedgerResponseCode.INCONSISTENT_LEADER and self.ms.curr_term == term:
            self._become_candidate(term, f"{peer} follows another leader in term {term}")

    async def _collect_votes(self, req_for: Callable[[str], VoteRequest]) -> tuple[int, int]:
        """Ask every peer; return (accepts incl. self, highest term seen) as soon as a quorum has
        accepted or every peer answered/timed out."""
        loop = asyncio.get_running_loop()
        peers = self.ms.peers_without_self()
        accepts, answered, max_term = 1, 0, self.ms.curr_term
        done = loop.create_future()
        if self.ms.is_quorum(accepts) or not peers:
            return accepts, max_term

        def on_done(t: asyncio.Task[VoteResponse]) -> None:
            nonlocal accepts, answered, max_term
            answered += 1
            if not t.cancelled() and t.exception() is None:
                resp = t.result()
                max_term = max(max_term, resp.term)
                if resp.vote_result == VoteResult.ACCEPT:
                    accepts += 1
            if not done.done() and (self.ms.is_quorum(accepts) or answered == len(peers)):
                done.set_result(None)

        timeout = max(self.hb_interval_s, 0.05)
        for p in peers:
            t = loop.create_task(self.rpc.vote(p, req_for(p), timeout))
            t.add_done_callback(on_done)
            self._side_tasks.add(t)
            t.add_done_callback(self._side_tasks.discard)
        await done
        return accepts, max_term

    async def _maintain_as_candidate(self) -> None:
        now = self.clock()
        ms = self.ms
        take = ms.term_to_take_leadership
        if now < self.next_time_to_request_vote and take < 0:
            await self._sleep(self.next_time_to_request_vote - now)
            return
        if self._campaign_held(now):
            return
        ms.term_to_take_leadership = -1
        start_term = ms.curr_term
        if take < 0 and not await self._pre_vote(start_term):
            return
        await self._campaign(max(start_term + 1, take), take >= 0)

    def _campaign_held(self, now: float) -> bool:
        """A recovering member (lost acknowledged entries) or one still verifying its older data
        files does not campaign (see the module docstring); each reason is logged once."""
        ms = self.ms
        if ms.check_recovering():
            # Lost acknowledged entries: wait for a leader's pushes instead of asking for votes.
            ms.term_to_take_leadership = -1
            if not self._campaign_held_logged:
                self._campaign_held_logged = True
                log.warning(
                    "event=campaign_held_recovering group=%s selfId=%s term=%d end=%d catchUpWatermark=%d",
                    ms.group, ms.self_id, ms.curr_term, ms.ledger_end_index, ms.store.catchup_watermark,
                )  # fmt: skip
            self.next_time_to_request_vote = now + self._random_vote_interval()
            return True
        self._campaign_held_logged = False
        if ms.check_verifying():
            # Older data files not verified yet: a corrupt entry there must not lead (see module doc).
            ms.term_to_take_leadership = -1
            if not self._verify_held:
                self._verify_held = True
                log.info("event=campaign_held_verifying group=%s selfId=%s term=%d end=%d",
                         ms.group, ms.self_id, ms.curr_term, ms.ledger_end_index)
            self.next_time_to_request_vote = now + self._random_vote_interval()
            return True
        self._verify_held = False
        return False

    def _vote_request(self, peer: str, term: int, *, pre_vote: bool = False,
                      take_leadership: bool = False) -> VoteRequest:
        ms = self.ms
        return VoteRequest(
            group=ms.group,
            remote_id=peer,
            local_id=ms.self_id,
            term=term,
            ledger_end_index=ms.ledger_end_index,
            ledger_end_term=ms.ledger_end_term,
            pre_vote=pre_vote,
            take_leadership=take_leadership,
        )

    async def _pre_vote(self, start_term: int) -> bool:
        """Raft thesis §9.6: would a quorum vote for us in term `start_term + 1`? Nobody changes
        term for it. False (and the next attempt scheduled) unless we may campaign now."""
        ms = self.ms
        accepts, max_term = await self._collect_votes(
            lambda p: self._vote_request(p, start_term + 1, pre_vote=True)
        )
        if max_term > ms.curr_term:
            self.on_higher_term(max_term, "pre-vote answers")
        if ms.role != Role.CANDIDATE or ms.curr_term != start_term:
            return False
        if not ms.is_quorum(accepts):
            self.next_time_to_request_vote = self.clock() + self._random_vote_interval()
            return False
        return True

    async def _campaign(self, new_term: int, transfer: bool) -> None:
        """Raise our term to `new_term`, vote for ourselves and ask every peer (Raft §5.2)."""
        ms = self.ms
        ms.persist_term(new_term, ms.self_id)
        log.info(
            "campaign group=%s selfId=%s term=%d ledgerEnd=%d/%d transfer=%s",
            ms.group,
            ms.self_id,
            new_term,
            ms.ledger_end_index,
            ms.ledger_end_term,
            transfer,
        )
        accepts, max_term = await self._collect_votes(
            lambda p: self._vote_request(p, new_term, take_leadership=transfer)
        )
        if ms.role != Role.CANDIDATE or ms.curr_term != new_term:
            return
        if max_term > new_term:
            self.on_higher_term(max_term, "vote answers")
            return
        if ms.is_quorum(accepts):
            log.info("elected group=%s selfId=%s term=%d votes=%d", ms.group, ms.self_id, new_term, accepts)
            self._become_leader(new_term)
        else:
            self.next_time_to_request_vote = self.clock() + self._random_vote_interval()

    # -- leadership transfer --------------------------------------------------------------
    def _check_preferred_leader(self) -> None:
        preferred = self.config.preferred_leader_id_list
        if self.ms.self_id in preferred or self.ms.transferee is not None:
            return
        low = self.ms.ledger_end_index - self.config.max_leadership_transfer_wait_index
        for p in preferred:
            if p in self.ms.peer_map and self.replication.peer_water_mark(p) >= low:
                log.info(
                    "preferred leader %s caught up: transferring group=%s selfId=%s term=%d",
                    p,
                    self.ms.group,
                    self.ms.self_id,
                    self.ms.curr_term,
                )
                self._spawn(self.handle_leadership_transfer(p))
                return

    async def wait_role_change(self, timeout_s: float) -> None:
        """Wait until the next role change (or `timeout_s`)."""
        ev = self._role_event
        try:
            await asyncio.wait_for(ev.wait(), timeout_s)
        except TimeoutError:
            pass

    async def handle_leadership_transfer(self, transferee: str) -> None:
        """Leader side: freeze appends, bring `transferee` up to date, tell it to campaign now,
        and wait (bounded) until it has taken over. Raises DLedgerException on failure."""
        ms = self.ms
        if not ms.is_leader():
            raise DLedgerException(DLedgerResponseCode.NOT_LEADER, f"{ms.self_id} is not leader")
        if transferee == ms.self_id:
            return
        if transferee not in ms.peer_map:
            raise DLedgerException(DLedgerResponseCode.UNKNOWN_MEMBER, f"{transferee} is not a peer")
        if ms.transferee is not None:
            raise DLedgerException(
                DLedgerResponseCode.LEADER_TRANSFERRING, f"already transferring to {ms.transferee}"
            )
        term = ms.curr_term
        ms.transferee = transferee
        timeout_s = self.config.leadership_transfer_wait_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 3 * self.election_timeout_s)
        try:
            await self.replication.wait_peer_caught_up(transferee, ms.ledger_end_index, timeout_s)
            if not ms.is_leader() or ms.curr_term != term:
                raise DLedgerException(DLedgerResponseCode.TERM_CHANGED, "leadership changed during transfer")
            if self.replication.peer_water_mark(transferee) < ms.ledger_end_index:
                raise DLedgerException(
                    DLedgerResponseCode.TAKE_LEADERSHIP_FAILED,
                    f"{transferee} did not catch up within {timeout_s}s",
                )
            req = LeadershipTransferRequest(
                group=ms.group,
                remote_id=transferee,
                local_id=ms.self_id,
                leader_id=ms.self_id,
                term=term,
                transfer_id=ms.self_id,
                transferee_id=transferee,
                take_leadership_term=term + 1,
            )
            resp = await self.rpc.leadership_transfer(transferee, req, timeout_s)
            if resp.code != DLedgerResponseCode.SUCCESS:
                raise DLedgerException(DLedgerResponseCode.value_of(resp.code), f"{transferee} refused")
            while ms.leader_id != transferee and loop.time() < deadline:
                await self.wait_role_change(max(deadline - loop.time(), _MIN_WAIT_S))
            if ms.leader_id != transferee:
                raise DLedgerException(
                    DLedgerResponseCode.TAKE_LEADERSHIP_FAILED, f"{transferee} did not take over"
                )
        finally:
            if ms.curr_term == term and ms.is_leader():
                ms.transferee = None

    def handle_take_leadership(self, req: LeadershipTransferRequest) -> DLedgerResponseCode:
        """Transferee side: the leader says "campaign now in term `take_leadership_term`"."""
        ms = self.ms
        if ms.check_recovering():
            log.warning("event=take_leadership_refused_recovering group=%s selfId=%s term=%d from=%s",
                        ms.group, ms.self_id, ms.curr_term, req.local_id)
            return DLedgerResponseCode.TAKE_LEADERSHIP_FAILED
        if ms.check_verifying():
            log.warning("event=take_leadership_refused_verifying group=%s selfId=%s term=%d from=%s",
                        ms.group, ms.self_id, ms.curr_term, req.local_id)
            return DLedgerResponseCode.TAKE_LEADERSHIP_FAILED
        if req.term != ms.curr_term or req.local_id != ms.leader_id:
            return (
                DLedgerResponseCode.INCONSISTENT_LEADER
                if req.term == ms.curr_term
                else DLedgerResponseCode.EXPIRED_TERM
            )
        log.info(
            "taking leadership group=%s selfId=%s from %s term=%d",
            ms.group,
            ms.self_id,
            req.local_id,
            req.take_leadership_term,
        )
        ms.term_to_take_leadership = req.take_leadership_term
        self._transfer_from = req.local_id
        self._become_candidate(ms.curr_term, f"leadership transfer from {req.local_id}")
        self._wake.set()
        return DLedgerResponseCode.SUCCESS
