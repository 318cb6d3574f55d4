"""Crash tests of DLedgerMmapFileStore with real processes: a child appends and commits in a loop
and is SIGKILLed at a random moment, 50 times. After each kill the store must recover a gap-free
prefix of CRC-valid entries that keeps everything up to the checkpointed committed index."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from dledger.entry import BODY_OFFSET
from dledger.store.checkpoint import read_checkpoint
from dledger.store.mmap_store import DLedgerMmapFileStore
from tests.fault.store_crash_child import STAMP_AT, crash_config, expected_body

CHILD = os.path.join(os.path.dirname(__file__), "store_crash_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILLS = 50


@pytest.fixture
def children():
    """Processes started by the test; each is killed by PID at teardown."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def start_child(children: list, base: str, seed: int, log_path: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    with open(log_path, "ab") as log:  # a file, not a pipe nobody drains
        proc = subprocess.Popen([sys.executable, CHILD, base, str(seed)], stdout=subprocess.PIPE,
                                stderr=log, env=env, cwd=ROOT)
    children.append(proc)
    line = proc.stdout.readline()
    if not line.startswith(b"ready"):
        proc.wait(timeout=10)
        with open(log_path, "rb") as f:
            pytest.fail(f"child did not start: {line!r} {f.read().decode()[-2000:]}")
    return proc


def check_entry(store: DLedgerMmapFileStore, index: int) -> int:
    """get() checks the index record, pos and body CRC; here also the content. Returns the CRC."""
    e = store.get(index)
    body = e.body
    if len(body) >= STAMP_AT + 8:
        assert int.from_bytes(body[STAMP_AT:STAMP_AT + 8], "big") == e.pos + BODY_OFFSET
        body = body[:STAMP_AT] + expected_body(index, len(body))[STAMP_AT:STAMP_AT + 8] + body[STAMP_AT + 8:]
    assert body == expected_body(index, len(body)), f"entry {index} content"
    return e.body_crc


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_at_random_moments_never_loses_checkpointed_committed_entries(tmp_path, children) -> None:
    base = str(tmp_path / "store")
    seed = int(os.environ.get("STORE_CRASH_SEED", "20261122"))  # set it to replay or vary a run
    rng = random.Random(seed)
    crc_of: dict[int, int] = {}  # entries that were at or below a checkpointed committed index
    verified_to = -1
    ends = []
    for run in range(KILLS):
        proc = start_child(children, base, rng.randrange(1 << 30), str(tmp_path / "child.log"))
        time.sleep(rng.uniform(0.01, 0.12))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        committed = read_checkpoint(os.path.join(base, "dledger-n0", "checkpoint")).committed_index
        store = DLedgerMmapFileStore(crash_config(base))
        store.recover()
        try:
            end = store.ledger_end_index
            assert end >= committed, f"run {run}: recovered end {end} < checkpointed committed {committed}"
            assert store.ledger_begin_index == 0 and store.committed_index == committed
            # Gap-free, CRC-valid prefix; re-check what earlier rounds had not seen committed.
            for i in range(max(0, min(verified_to, committed) - 50), end + 1):
                crc = check_entry(store, i)
                if i in crc_of:
                    assert crc_of[i] == crc, f"run {run}: committed entry {i} changed"
                elif i <= committed:
                    crc_of[i] = crc
            for i in rng.sample(sorted(crc_of), min(50, len(crc_of))):
                assert check_entry(store, i) == crc_of[i]
            verified_to = end
            ends.append(end)
        finally:
            store.close_without_flush()
    assert ends[-1] > 1000, ends  # the children really wrote
