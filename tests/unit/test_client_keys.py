"""The SDK's idempotency keys: a per-producer prefix and a counter, a batch's keys consecutive
(sent as one `firstIdempotencyKey`), never two alike from one producer."""

from __future__ import annotations

import threading

from broker.message import key_sequence
from client.message import KeyGenerator


def test_keys_are_sequenced_and_a_run_reserves_consecutive_counters():
    keys = KeyGenerator()
    one = keys()
    run = keys.run(4)
    after = keys()
    assert run is not None and len(run) == 4
    seqs = [key_sequence(k) for k in [one, *run, after]]
    assert all(s is not None for s in seqs)
    assert len({s[0] for s in seqs}) == 1  # one prefix
    assert [s[1] for s in seqs] == list(range(seqs[0][1], seqs[0][1] + 6))


def test_a_run_that_would_wrap_the_counter_is_refused_and_keys_go_one_by_one():
    keys = KeyGenerator()
    keys._next = 2**64 - 2
    assert keys.run(3) is None
    assert keys().endswith("f" * 15 + "e") and keys().endswith("f" * 16) and keys().endswith("0" * 16)


def test_threads_drawing_keys_and_runs_never_get_the_same_key():
    keys = KeyGenerator()
    got: list[list[str]] = []

    def draw() -> None:
        mine = []
        for _ in range(2_000):
            mine.append(keys())
            mine += keys.run(3) or []
        got.append(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [k for mine in got for k in mine]
    assert len(flat) == len(set(flat)) == 4 * 2_000 * 4
