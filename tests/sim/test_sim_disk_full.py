"""Finding 9: a new leader whose no-op append fails because every member's disk is full stays
leader, refuses appends with DISK_FULL (never NOT_LEADER), retries the no-op with backoff and takes
appends once the space is freed."""

from __future__ import annotations

import asyncio

import pytest

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.member_state import Role
from dledger.rpc.memory import VirtualTimeLoop
from tests.sim.cluster import SimCluster


async def _leader(c: SimCluster):
    for _ in range(200):
        leaders = c.leaders()
        if len(leaders) == 1:
            return leaders[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no leader")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_leader_without_noop_answers_disk_full_and_recovers_when_space_frees(seed: int) -> None:
    async def main() -> None:
        c = SimCluster(n=3, seed=seed)
        for m in c.members.values():
            m.store.disk_full = True
        await c.start()
        try:
            leader = await _leader(c)
            server = leader.server
            assert server is not None
            term = server.member_state.curr_term
            assert leader.store.ledger_end_index == -1  # the no-op could not go in
            assert server.write_refusal() is DLedgerResponseCode.DISK_FULL
            for _ in range(3):
                with pytest.raises(DLedgerException) as ex:
                    await server.append([b"x"])
                assert ex.value.code is DLedgerResponseCode.DISK_FULL
                await asyncio.sleep(1.0)
            # Still the leader of the same term: no churn while full, nothing written anywhere.
            assert server.member_state.role is Role.LEADER and server.member_state.curr_term == term
            assert all(m.store.ledger_end_index == -1 for m in c.members.values())
            for m in c.members.values():
                m.store.disk_full = False
            await asyncio.sleep(1.5)  # > the retry backoff cap
            assert server.write_refusal() is None
            assert leader.store.get(0).magic == 2  # the retried no-op, in this term
            assert leader.store.get(0).term == term
            results = await server.append([b"a", b"b"])
            assert [r.index for r in results] == [1, 2]
            await asyncio.sleep(1.0)
            for m in c.members.values():
                assert m.store.committed_index == 2 and m.store.get(2).body == b"b"
            c.final_check()
        finally:
            await c.stop()

    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.timeout(60)
def test_failover_while_every_disk_is_full_then_space_frees() -> None:
    async def main() -> None:
        c = SimCluster(n=3, seed=7)
        await c.start()
        try:
            old = await _leader(c)
            assert old.server is not None
            await old.server.append([b"before"])
            await asyncio.sleep(0.5)
            for m in c.members.values():
                m.store.disk_full = True
            await c.crash(old, lose_unflushed=False)
            await asyncio.sleep(0.5)
            new = await _leader(c)
            assert new is not old and new.server is not None
            end = new.store.ledger_end_index
            assert new.store.get(end).term < new.server.member_state.curr_term  # no no-op of this term
            with pytest.raises(DLedgerException) as ex:
                await new.server.append([b"x"])
            assert ex.value.code is DLedgerResponseCode.DISK_FULL
            for m in c.members.values():
                m.store.disk_full = False
            await asyncio.sleep(1.5)
            results = await new.server.append([b"after"])
            assert results[0].index == end + 2  # after the retried no-op
            c.final_check()
        finally:
            await c.stop()

    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
