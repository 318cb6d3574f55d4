"""Scripted scenarios on the simulated network, named after the behaviour they pin down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import DLedgerEntry
from dledger.member_state import Role
from dledger.rpc.memory import VirtualTimeLoop
from dledger.rpc.protocol import HeartBeatRequest, LeadershipTransferRequest
from dledger.statemachine import StateMachine
from tests.sim.cluster import SimCluster, SimMember


def run(body: Callable[[SimCluster], Awaitable[None]], n: int = 3, seed: int = 1,
        machine_factory: Callable[[], StateMachine] | None = None) -> None:
    async def main() -> None:
        cluster = SimCluster(n=n, seed=seed, machine_factory=machine_factory)
        await cluster.start()
        try:
            await body(cluster)
            cluster.final_check()
        finally:
            await cluster.stop()

    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


async def wait_leader(cluster: SimCluster, timeout_s: float = 5.0) -> SimMember:
    for _ in range(int(timeout_s / 0.05)):
        leaders = cluster.leaders()
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no leader")


def test_first_leader_is_elected_and_appends_commit_on_all_members() -> None:
    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        results = await leader.server.append([b"a", b"b", b"c"])  # type: ignore[union-attr]
        assert [r.index for r in results] == [1, 2, 3]  # index 0 is the leader's no-op (Raft §8)
        await asyncio.sleep(1.0)
        for m in c.members.values():
            assert m.store.committed_index == 3
            assert m.store.get(0).magic == 2 and m.store.get(2).body == b"b"

    run(body)


def test_partitioned_member_rejoining_does_not_depose_leader() -> None:
    """Pre-vote (Raft thesis §9.6): the isolated member never raises its term."""

    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        term = leader.server.member_state.curr_term  # type: ignore[union-attr]
        follower = next(m for m in c.members.values() if m is not leader)
        others = [m.member_id for m in c.members.values() if m is not follower]
        c.network.partition([[follower.member_id], others])
        await asyncio.sleep(5.0)
        assert follower.server.member_state.curr_term == term  # type: ignore[union-attr]
        c.network.heal()
        await asyncio.sleep(3.0)
        assert leader.server.member_state.role == Role.LEADER  # type: ignore[union-attr]
        assert leader.server.member_state.curr_term == term  # type: ignore[union-attr]
        assert follower.server.member_state.leader_id == leader.member_id  # type: ignore[union-attr]

    run(body)


def test_isolated_leader_steps_down_and_majority_elects_new_one() -> None:
    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        others = [m.member_id for m in c.members.values() if m is not leader]
        c.network.partition([[leader.member_id], others])
        await asyncio.sleep(3.0)
        assert leader.server.member_state.role == Role.CANDIDATE  # type: ignore[union-attr]
        new = [m for m in c.leaders()]
        assert len(new) == 1 and new[0] is not leader

    run(body)


def test_old_leader_uncommitted_tail_is_truncated() -> None:
    """COMPARE/TRUNCATE: entries the old leader appended alone are replaced by the new leader's."""

    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        await leader.server.append([b"committed"])  # type: ignore[union-attr]
        others = [m.member_id for m in c.members.values() if m is not leader]
        c.network.partition([[leader.member_id], others])
        lost = asyncio.get_running_loop().create_task(leader.server.append([b"lost1", b"lost2"]))  # type: ignore[union-attr]
        await asyncio.sleep(3.0)
        with pytest.raises(DLedgerException) as exc:
            await lost
        assert exc.value.code in (
            DLedgerResponseCode.TERM_CHANGED,
            DLedgerResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
        )
        tail_index = leader.store.ledger_end_index
        assert leader.store.get(tail_index).body == b"lost2"
        new = await wait_leader(c)
        await new.server.append([b"n1", b"n2", b"n3"])  # type: ignore[union-attr]
        c.network.heal()
        await asyncio.sleep(3.0)
        end = new.store.ledger_end_index
        for m in c.members.values():
            assert m.store.committed_index == end
            bodies = [m.store.get(i).body for i in range(end + 1)]
            assert b"lost1" not in bodies and bodies[-3:] == [b"n1", b"n2", b"n3"]

    run(body)


def test_leadership_transfer_to_named_member_then_appends_continue() -> None:
    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        await leader.server.append([b"x"] * 10)  # type: ignore[union-attr]
        target = next(m for m in c.members.values() if m is not leader)
        await leader.server.leadership_transfer(target.member_id)  # type: ignore[union-attr]
        assert target.server.member_state.role == Role.LEADER  # type: ignore[union-attr]
        with pytest.raises(DLedgerException) as exc:
            await leader.server.append([b"y"])  # type: ignore[union-attr]
        assert exc.value.code == DLedgerResponseCode.NOT_LEADER
        assert exc.value.leader_id == target.member_id  # type: ignore[attr-defined]
        results = await target.server.append([b"after"])  # type: ignore[union-attr]
        assert results[0].term == target.server.member_state.curr_term  # type: ignore[union-attr]

    run(body, n=5)


def test_transferee_takes_over_even_when_a_heartbeat_of_the_old_leader_arrives_first() -> None:
    """The leader's heartbeat can reach the transferee after it was told to campaign and before its
    campaign starts (same event loop, any order): it must not turn it back into a follower, or the
    transfer silently fails (seen in CI as TAKE_LEADERSHIP_FAILED "n0 did not take over")."""

    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        target = next(m for m in c.members.values() if m is not leader)
        server = target.server
        assert server is not None and leader.server is not None
        await leader.server.append([b"x"])
        await asyncio.sleep(0.5)  # every member has the log: the leader's catch-up step is done
        ms = server.member_state
        term = ms.curr_term
        group = ms.group
        req = LeadershipTransferRequest(
            group=group,
            remote_id=target.member_id,
            local_id=leader.member_id,
            leader_id=leader.member_id,
            term=term,
            transfer_id=leader.member_id,
            transferee_id=target.member_id,
            take_leadership_term=term + 1,
        )
        assert server.elector.handle_take_leadership(req) == DLedgerResponseCode.SUCCESS
        heartbeat = HeartBeatRequest(
            group=group, remote_id=target.member_id, local_id=leader.member_id, leader_id=leader.member_id,
            term=term,
        )
        await server.elector.handle_heartbeat(heartbeat)
        for _ in range(40):
            if ms.role == Role.LEADER:
                break
            await asyncio.sleep(0.05)
        assert ms.role == Role.LEADER and ms.curr_term == term + 1
        assert [m.member_id for m in c.leaders()] == [target.member_id]

    run(body)


def test_preferred_leader_takes_over_when_caught_up() -> None:
    async def body(c: SimCluster) -> None:
        await wait_leader(c)
        await asyncio.sleep(10.0)
        leaders = c.leaders()
        assert [m.member_id for m in leaders] == ["n2"]

    def with_preference(
        cluster_body: Callable[[SimCluster], Awaitable[None]],
    ) -> Callable[[SimCluster], Awaitable[None]]:
        async def wrapped(c: SimCluster) -> None:
            for m in c.members.values():
                m.config.preferred_leader_ids = "n2"
            await cluster_body(c)

        return wrapped

    # The preference is read by each member's elector at runtime (every 3 s while leader).
    run(with_preference(body))


class RecordingMachine(StateMachine):
    """Remembers what it applied (its "disk" survives the member's restart)."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes]] = []

    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        for e in entries:
            assert not self.applied or e.index == self.applied[-1][0] + 1, "gap or repeat in applied entries"
            self.applied.append((e.index, e.body))

    def last_applied_index(self) -> int:
        return self.applied[-1][0] if self.applied else -1


def test_state_machines_apply_committed_entries_in_order_on_every_member_and_resume_after_restart() -> None:
    machines = {m: RecordingMachine() for m in ("n0", "n1", "n2")}

    async def body(c: SimCluster) -> None:
        for m in c.members.values():
            m.server.set_state_machine(machines[m.member_id])  # type: ignore[union-attr]
        leader = await wait_leader(c)
        await leader.server.append([b"a", b"b"])  # type: ignore[union-attr]
        follower = next(m for m in c.members.values() if m is not leader)
        await c.crash(follower, lose_unflushed=False)
        await leader.server.append([b"c"])  # type: ignore[union-attr]
        await c.start_member(follower)
        follower.server.set_state_machine(machines[follower.member_id])  # type: ignore[union-attr]
        await leader.server.append([b"d"])  # type: ignore[union-attr]
        await asyncio.sleep(2.0)
        expected = [(i, leader.store.get(i).body) for i in range(leader.store.committed_index + 1)]
        for m in machines.values():
            assert m.applied == expected
        assert [b for _, b in expected if b] == [b"a", b"b", b"c", b"d"]

    run(body)


def test_leader_backs_off_from_a_cut_off_follower_and_resumes_at_once_when_it_returns() -> None:
    """A follower unreachable for 10 s costs the leader at most the push window it had in flight
    plus one-entry probes with exponential backoff (etcd raft's probe state), not a resend of the
    window every push timeout; once the follower answers heartbeats again it is caught up within a
    heartbeat interval and a push round trip."""

    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        follower = next(m for m in c.members.values() if m is not leader)
        others = [m.member_id for m in c.members.values() if m is not follower]
        cfg = leader.config
        link = (leader.member_id, follower.member_id)

        async def load(seconds: float) -> None:
            for _ in range(int(seconds / 0.02)):
                c.client_append(8)
                await asyncio.sleep(0.02)

        await load(1.0)
        c.network.partition([others, [follower.member_id]])
        before = c.network.sent_bytes[link]
        await load(10.0)
        cut_bytes = c.network.sent_bytes[link] - before
        # One window: every batch in flight at once, each as full as this load makes it.
        largest = max(len(leader.store.get(i).body) for i in range(1, leader.store.ledger_end_index + 1))
        window = cfg.max_pending_push_batches * cfg.max_batch_push_count * (largest + 48 + 64)
        assert cut_bytes < 2 * window, (cut_bytes, window)
        c.network.heal()
        healed = asyncio.get_running_loop().time()
        end = leader.store.ledger_end_index
        for _ in range(40):  # 2 s: a heartbeat interval (300 ms), a probe and a full pipeline
            await asyncio.sleep(0.05)
            if follower.store.ledger_end_index >= end:
                break
        took = asyncio.get_running_loop().time() - healed
        assert follower.store.ledger_end_index >= end, (follower.store.ledger_end_index, end, took)

    run(body)


def test_leader_refuses_appends_past_max_pending_entries_counted_in_entries() -> None:
    """LEADER_PENDING_FULL (DLedger's maxPendingRequestsNum) counts entries waiting for a quorum,
    not append calls: one pending batch of 15 leaves room for 5 more entries under a limit of 20."""

    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        server = leader.server
        assert server is not None
        server.config.max_pending_requests_num = 20
        await server.append([b"warm-up"])  # the leader's no-op and this are committed: none pending
        others = [m.member_id for m in c.members.values() if m is not leader]
        c.network.partition([[leader.member_id], others])  # nothing commits while cut off
        first = asyncio.get_running_loop().create_task(server.append([b"a"] * 15))
        await asyncio.sleep(0)  # appended, waiting for a quorum: 15 entries pending, one call
        with pytest.raises(DLedgerException) as refused:
            await server.append([b"b"] * 10)
        assert refused.value.code == DLedgerResponseCode.LEADER_PENDING_FULL
        second = asyncio.get_running_loop().create_task(server.append([b"c"] * 5))  # 20: fits
        await asyncio.sleep(0)
        with pytest.raises(DLedgerException) as refused:
            await server.append([b"d"])
        assert refused.value.code == DLedgerResponseCode.LEADER_PENDING_FULL
        c.network.heal()  # within the election timeout: the leader keeps leading
        assert len(await first) == 15 and len(await second) == 5
        big = await server.append([b"e"] * 30)  # larger than the whole limit, nothing pending: admitted
        assert len(big) == 30

    run(body)


def test_idle_leader_resyncs_a_follower_that_came_back_with_an_empty_log() -> None:
    """DLedger #61: a follower whose store was wiped and that restarted before the leader saw any
    push fail answers the leader's periodic COMMIT with an end index below what it acknowledged;
    the leader goes back to COMPARE and re-sends its log although nothing new is appended."""

    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        assert leader.server is not None
        for i in range(0, 40, 5):
            await leader.server.append([f"v{j}".encode() for j in range(i, i + 5)])
        await asyncio.sleep(1.0)
        end = leader.store.ledger_end_index
        victim = next(m for m in c.members.values() if m is not leader)
        assert victim.store.ledger_end_index == end
        await c.crash(victim, lose_unflushed=False)
        c.wipe(victim)
        await c.start_member(victim)  # back at once: no push to it has failed meanwhile
        for _ in range(60):  # 3 s with nothing appended
            await asyncio.sleep(0.05)
            if victim.store.ledger_end_index == end:
                break
        assert victim.store.ledger_end_index == end
        assert victim.store.get(end).body == leader.store.get(end).body

    run(body)
