"""The seeded random scenario: client appends mixed with crashes/restarts, partitions, message
drop/duplication/reordering and leadership transfers; invariants checked after every step.

Replay a failing seed with `python -m tests.sim.scenario SEED [members] [steps] [sync]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass

from dledger.codes import DLedgerException
from dledger.rpc.memory import VirtualTimeLoop
from tests.sim.cluster import SimCluster

STEP_S = 0.05


@dataclass
class SimResult:
    seed: int
    steps: int
    virtual_s: float
    acked: int
    committed: int
    elections: int
    transfers: int
    crashes: int


async def _transfer(cluster: SimCluster, target: str) -> bool:
    leaders = cluster.leaders()
    if not leaders or leaders[0].member_id == target:
        return False
    with contextlib.suppress(DLedgerException):
        await leaders[0].server.leadership_transfer(target)  # type: ignore[union-attr]
        return True
    return False


async def run_scenario(
    seed: int, n: int = 3, steps: int = 300, sync_flush: bool | None = None, unsafe_ack: bool = False
) -> SimResult:
    """Run one seeded scenario; raises InvariantViolation (or AssertionError) on a failure."""
    sync = bool(seed % 2) if sync_flush is None else sync_flush
    cluster = SimCluster(n=n, seed=seed, sync_flush=sync, unsafe_ack=unsafe_ack)
    rng = cluster.rng
    net = cluster.network
    loop = asyncio.get_running_loop()
    await cluster.start()
    f = (n - 1) // 2
    down_until: dict[str, int] = {}
    partition_until = -1
    crashes = transfers = 0
    transfer_tasks: set[asyncio.Task[bool]] = set()
    try:
        for step in range(steps):
            r = rng.random()
            if r < 0.45:
                for _ in range(rng.randint(1, 3)):
                    cluster.client_append(rng.randint(1, 4))
            elif r < 0.52 and len(down_until) < f + (1 if rng.random() < 0.1 else 0):
                victim = rng.choice([m for m in cluster.members.values() if m.server is not None])
                # Losing unflushed data is only survivable when acks wait for fsync (SYNC_FLUSH);
                # with ASYNC_FLUSH a crash is a process kill (page cache survives).
                await cluster.crash(victim, lose_unflushed=cluster.sync_flush)
                down_until[victim.member_id] = step + rng.randint(5, 40)
                crashes += 1
            elif r < 0.57 and partition_until < step:
                ids = list(cluster.members)
                rng.shuffle(ids)
                cut = rng.randint(1, n - 1)
                net.partition([ids[:cut], ids[cut:]])
                partition_until = step + rng.randint(5, 40)
            elif r < 0.60:
                net.drop_rate = rng.choice([0.0, 0.0, 0.02, 0.1])
                net.dup_rate = rng.choice([0.0, 0.02, 0.1])
                net.max_delay_s = rng.choice([0.003, 0.01, 0.05])
            elif r < 0.62:
                task = loop.create_task(_transfer(cluster, rng.choice(list(cluster.members))))
                transfer_tasks.add(task)
                task.add_done_callback(transfer_tasks.discard)
                transfers += 1
            for mid, until in list(down_until.items()):
                if until <= step:
                    del down_until[mid]
                    await cluster.start_member(cluster.members[mid])
            if partition_until == step:
                net.heal()
            await asyncio.sleep(STEP_S * rng.random() * 2)
            cluster.check()
        # Heal everything and let the group settle: one leader, everyone caught up.
        net.heal()
        net.drop_rate = net.dup_rate = 0.0
        for mid in list(down_until):
            await cluster.start_member(cluster.members[mid])
        for _ in range(3):
            cluster.client_append(2)
        settled = False
        for _ in range(400):
            await asyncio.sleep(STEP_S)
            cluster.check()
            leaders = cluster.leaders()
            if len(leaders) == 1 and not cluster.client_tasks:
                end = leaders[0].store.ledger_end_index
                if all(m.store.committed_index == end for m in cluster.members.values()):
                    settled = True
                    break
        cluster.final_check()
        assert settled, (
            f"seed {seed}: group did not settle (leaders={[m.member_id for m in cluster.leaders()]})"
        )
        elections = len(cluster.leaders_by_term)
        committed = max(m.store.committed_index for m in cluster.members.values())
        return SimResult(
            seed, steps, loop.time(), len(cluster.acked), committed, elections, transfers, crashes
        )
    finally:
        for t in list(transfer_tasks):
            t.cancel()
        await cluster.stop()


def run_seed(
    seed: int, n: int = 3, steps: int = 300, sync_flush: bool | None = None, unsafe_ack: bool = False
) -> SimResult:
    """Run a scenario on a fresh virtual-time loop (deterministic)."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(run_scenario(seed, n, steps, sync_flush, unsafe_ack))
    finally:
        loop.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = sys.argv[1:]
    res = run_seed(
        int(args[0]),
        int(args[1]) if len(args) > 1 else 3,
        int(args[2]) if len(args) > 2 else 300,
        None if len(args) < 4 else args[3] == "sync",
    )
    logging.getLogger("sim").info("%s", res)
