"""Snapshots and InstallSnapshot on the simulated network (DLedger 0.3's snapshot package, Raft
§7): a member whose disk was wiped after the leader's log stopped starting at index 0 gets the
leader's snapshot, loads it into its state machine, and continues with entries; it ends with the
same state as the others and can lead."""

from __future__ import annotations

import asyncio

from dledger.digest import DigestStateMachine
from dledger.rpc.memory import VirtualTimeLoop
from tests.sim.cluster import SimCluster, SimMember

THRESHOLD = 20


def run_snapshot_cluster(body, seed: int = 3) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        cluster = SimCluster(n=3, seed=seed, machine_factory=DigestStateMachine,
                             dledger_overrides={"enable_snapshot": True, "snapshot_threshold": THRESHOLD})
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


async def wait_leader(c: SimCluster) -> SimMember:
    for _ in range(200):
        leaders = c.leaders()
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no leader")


async def append_many(leader: SimMember, start: int, n: int) -> None:
    assert leader.server is not None
    for i in range(start, start + n, 5):
        await leader.server.append([f"v{j}".encode() for j in range(i, i + 5)])


async def settled(c: SimCluster, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        live = c.live()
        ends = {m.store.ledger_end_index for m in live}
        caught_up = all(m.store.committed_index == m.store.ledger_end_index for m in live)
        applied = all(m.machine is not None and m.machine.last_applied_index() == m.store.committed_index
                      for m in live)
        if len(ends) == 1 and caught_up and applied:
            return
        await asyncio.sleep(0.05)
    raise AssertionError({m.member_id: (m.store.ledger_end_index, m.store.committed_index) for m in c.live()})


def states(c: SimCluster) -> dict[str, tuple[int, bytes]]:
    return {m.member_id: (m.machine.count, m.machine.digest) for m in c.live()}  # type: ignore[union-attr]


def test_wiped_member_gets_the_snapshot_then_entries_and_ends_with_the_same_state() -> None:
    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        await append_many(leader, 0, 200)
        await settled(c)
        assert all(m.snapshots.latest_index() >= 200 - THRESHOLD for m in c.members.values())
        victim = next(m for m in c.members.values() if m is not leader)
        await c.crash(victim, lose_unflushed=False)
        c.wipe(victim)
        await append_many(leader, 200, 100)
        for m in c.live():  # retention on every live member, bounded by its newest snapshot
            assert m.store.delete_prefix(10**9) > 0
        begin = leader.store.ledger_begin_index
        snapshot = leader.snapshots.latest_index()
        assert begin > 0 and begin <= snapshot + 1
        await c.start_member(victim)
        await append_many(leader, 300, 20)
        await settled(c)
        st = states(c)
        assert len(set(st.values())) == 1, st  # same (count, digest) everywhere
        assert st[victim.member_id][0] == 320
        installed = victim.snapshots.latest_index()
        assert installed >= begin - 1  # it started from a snapshot, not from the leader's begin
        assert victim.store.ledger_begin_index <= installed + 1 + THRESHOLD
        # The restored member can lead: hand it leadership and keep appending.
        assert leader.server is not None
        await leader.server.leadership_transfer(victim.member_id)
        new_leader = await wait_leader(c)
        assert new_leader is victim
        await append_many(victim, 320, 10)
        await settled(c)
        assert len(set(states(c).values())) == 1

    run_snapshot_cluster(body)


def test_a_restarted_member_loads_its_newest_snapshot_then_replays_only_the_entries_after_it() -> None:
    async def body(c: SimCluster) -> None:
        leader = await wait_leader(c)
        await append_many(leader, 0, 100)
        await settled(c)
        victim = next(m for m in c.members.values() if m is not leader)
        await c.crash(victim, lose_unflushed=False)
        for m in c.members.values():
            m.store.delete_prefix(10**9)  # its machine is in memory: only the snapshot can rebuild it
        assert victim.store.ledger_begin_index > 0
        await c.start_member(victim)
        await settled(c)
        assert len(set(states(c).values())) == 1 and states(c)[victim.member_id][0] == 100

    run_snapshot_cluster(body)
