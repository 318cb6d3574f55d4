"""`TimerKeys`: a message id (UNIQ_KEY) → the timer-queue offsets that may hold its timer."""

import random

from broker.timer.keys import TimerKeys, key_code


def test_a_key_is_found_at_its_offsets_and_nowhere_else():
    keys = TimerKeys()
    for off in range(1000):
        keys.add(off, f"K{off}")
    keys.add(1500, "K7")  # a client that sent the same id again: both, lowest first
    assert keys.candidates("K7") == [7, 1500]
    assert keys.candidates("K999") == [999]
    assert keys.candidates("nope") == []


def test_every_key_finds_exactly_its_offsets():
    rng = random.Random(7)
    keys = TimerKeys(base=50)
    where: dict[str, list[int]] = {}
    for off in range(50, 5050):
        if rng.random() < 0.2:
            continue  # a marker: no key
        k = f"{rng.getrandbits(128):032X}"
        keys.add(off, k)
        where.setdefault(k, []).append(off)
    assert all(keys.candidates(k) == offs for k, offs in where.items())
    assert key_code("") != 0


def test_a_match_straddling_two_codes_does_not_count():
    target = key_code("target").to_bytes(4, "little")

    def first(prefix: str, ok) -> str:
        names = (f"{prefix}{i}" for i in range(1 << 22))
        return next(k for k in names if ok(key_code(k).to_bytes(4, "little")))

    a = first("a", lambda c: c[2:] == target[:2])
    b = first("b", lambda c: c[:2] == target[2:])
    keys = TimerKeys()
    keys.add(0, a)
    keys.add(1, b)  # the codes' bytes now hold target's code at byte 2
    assert keys.candidates("target") == [] and keys.candidates(a) == [0] and keys.candidates(b) == [1]


def test_cut_forgets_settled_units_and_reset_starts_over():
    keys = TimerKeys()
    for off in range(10):
        keys.add(off, f"K{off}")
    keys.cut(6)
    assert keys.base == 6 and keys.candidates("K3") == [] and keys.candidates("K8") == [8]
    keys.add(2, "K2")  # below the floor: ignored
    assert keys.candidates("K2") == []
    keys.reset(100)
    assert keys.candidates("K8") == [] and keys.nbytes() == 0
    keys.add(100, "K8")
    assert keys.candidates("K8") == [100]
