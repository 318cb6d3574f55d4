"""The leader's entry cache keeps only what some follower still lacks: its size does not grow with
the number of entries stored, and while a follower is down it stays under its byte cap."""

from __future__ import annotations

import asyncio

import pytest

from dledger.pusher import _CACHE_MAX_BYTES
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
def test_cache_is_trimmed_to_what_followers_lack() -> None:
    async def main() -> None:
        c = SimCluster(n=3, seed=11)
        await c.start()
        try:
            leader = await _leader(c)
            server = leader.server
            assert server is not None
            body = b"x" * 1024
            for _ in range(30):
                await server.append([body] * 100)
            await asyncio.sleep(0.5)  # every follower acks the tail
            entries, nbytes = server.pusher.cache_usage
            assert leader.store.ledger_end_index == 3000
            assert entries == 0 and nbytes == 0, (entries, nbytes)
            # One follower down: the cache keeps its backlog, bounded by the byte cap.
            follower = next(m for m in c.live() if m is not leader)
            await c.crash(follower, lose_unflushed=False)
            for _ in range(20):
                await server.append([body] * 100)
            entries, nbytes = server.pusher.cache_usage
            assert 2000 <= entries and nbytes <= _CACHE_MAX_BYTES
            c.final_check()
        finally:
            await c.stop()

    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
