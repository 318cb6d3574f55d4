"""The leader answers an append before its state machine applies the entry (the broker answers a
produce before dispatching it, and the dispatch still runs before the loop reads the next request).

Three `DLedgerServer`s on the simulated network; one caller appends one entry at a time, so each
commit is one event: the leader's state machine notes, for every entry it applies, whether the
append that wrote it had already returned to its caller.
"""

from __future__ import annotations

import asyncio

from dledger.entry import DLedgerEntry
from dledger.statemachine import StateMachine
from tests.sim.cluster import SimCluster
from tests.sim.test_sim_scenarios import run, wait_leader

APPENDS = 40


class OrderRecorder(StateMachine):
    """Notes, per applied entry, whether its append had returned (`returned_upto`)."""

    def __init__(self) -> None:
        self.applied = -1
        self.returned_upto = -1  # set by the test's caller as each append returns
        self.seen: dict[int, bool] = {}

    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        for e in entries:
            self.seen[e.index] = e.index <= self.returned_upto
        self.applied = entries[-1].index

    def last_applied_index(self) -> int:
        return self.applied


def test_an_append_returns_before_the_leader_applies_its_entry() -> None:
    async def body(cluster: SimCluster) -> None:
        leader = await wait_leader(cluster)
        assert leader.server is not None
        machine = leader.machine
        assert isinstance(machine, OrderRecorder)
        mine = []
        for i in range(APPENDS):
            (res,) = await leader.server.append([f"e{i}".encode()])
            machine.returned_upto = res.index
            mine.append(res.index)
            # The apply of this entry was queued with the answer: it has run by the time this
            # caller could send anything else (one loop pass later at the most).
            await asyncio.sleep(0)
            assert machine.applied >= res.index, (i, machine.applied, res.index)
        assert [i for i in mine if not machine.seen[i]] == []

    run(body, seed=11, machine_factory=OrderRecorder)
