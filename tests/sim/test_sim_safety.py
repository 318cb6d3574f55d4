"""Seeded whole-group simulations (3 and 5 members) checking Raft safety after every step.

Each seed mixes client appends with crashes/restarts (odd seeds run SYNC_FLUSH and lose
unflushed entries on a crash; even seeds run ASYNC_FLUSH where a crash is a process kill),
partitions, drop/duplicate/reorder and leadership transfers. `LEDGERMQ_SIM_SEEDS=N` runs N seeds
per group size instead of the default; a failure names the seed, and
`python -m tests.sim.scenario SEED MEMBERS STEPS` replays it exactly.
"""

from __future__ import annotations

import os

import pytest

from tests.sim.scenario import run_seed

SEEDS_3 = int(os.environ.get("LEDGERMQ_SIM_SEEDS", "130"))
SEEDS_5 = int(os.environ.get("LEDGERMQ_SIM_SEEDS", "70"))
STEPS = int(os.environ.get("LEDGERMQ_SIM_STEPS", "150"))


def _run_many(n: int, seeds: int) -> None:
    failures = []
    for seed in range(seeds):
        try:
            run_seed(seed, n, STEPS)
        except AssertionError as exc:  # InvariantViolation included
            failures.append(f"seed {seed} (replay: python -m tests.sim.scenario {seed} {n} {STEPS}): {exc}")
    assert not failures, "\n".join(failures)


def test_three_member_group_keeps_raft_safety_under_faults() -> None:
    _run_many(3, SEEDS_3)


def test_five_member_group_keeps_raft_safety_under_faults() -> None:
    _run_many(5, SEEDS_5)


@pytest.mark.parametrize("seed", [7, 8])
def test_a_seed_replays_exactly(seed: int) -> None:
    """Determinism: the same seed gives the same run (virtual time, acks, elections)."""
    assert run_seed(seed, 3, 150) == run_seed(seed, 3, 150)


def test_checkers_catch_acks_given_before_quorum() -> None:
    """The invariants can fail: acking before replication (test-only flag) must be caught on
    some seed once crashes lose unflushed data."""
    caught = 0
    for seed in range(1, 10, 2):
        try:
            run_seed(seed, 3, STEPS, sync_flush=True, unsafe_ack=True)
        except AssertionError:
            caught += 1
    assert caught > 0
