"""The simulator runs in a process that already holds more than 1,024 open descriptors (an xdist
worker that ran other test files first): its loop must not wait with select()."""

from __future__ import annotations

import asyncio
import os
import resource

import pytest

from dledger.rpc.memory import VirtualTimeLoop
from tests.sim.cluster import SimCluster


@pytest.mark.timeout(60)
def test_a_group_elects_and_appends_with_descriptors_past_1023_in_use() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"the hard descriptor limit ({hard}) is under 1,200")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]

    async def main() -> None:
        c = SimCluster(n=3, seed=5)
        await c.start()
        try:
            for _ in range(200):
                if len(c.leaders()) == 1:
                    break
                await asyncio.sleep(0.05)
            [leader] = c.leaders()
            assert leader.server is not None
            await leader.server.append([b"x" * 64] * 10)
            await asyncio.sleep(0.5)
            assert leader.store.ledger_end_index == 10
            c.final_check()
        finally:
            await c.stop()

    try:
        loop = VirtualTimeLoop()
        try:
            assert loop._ssock.fileno() > 1023  # the loop's own self-pipe is past select()'s range
            loop.run_until_complete(main())
        finally:
            loop.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
