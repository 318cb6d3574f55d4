"""Consumer offset records and the idempotency table (plain objects, no I/O)."""

import time

import pytest

from broker.errors import BrokerCode, BrokerError
from broker.store.offsets import ConsumerOffsetManager, IdempotencyTable, PutResult


def _put(n: int, host: str = "0A000001") -> PutResult:
    """A result as the store makes it: msgId = host prefix (16 hex) + commit-log offset."""
    phys = 10**12 + n * 1_100
    return PutResult(f"{host}00002AAF{phys:016X}", n % 8, 2**40 + n, phys, 1_100)


def test_idempotency_window():
    t = IdempotencyTable(window_ms=1000)
    t.remember("T", "k", _put(1), store_ts_ms=10_000)
    t.remember("T", "k", _put(2), store_ts_ms=10_001)  # a later duplicate never replaces the first
    assert t.get("T", "k", now_ms=10_500) == _put(1)
    assert t.get("U", "k", now_ms=10_500) is None
    assert t.get("T", "k", now_ms=11_001) is None
    t.remember("T", "k2", _put(3), store_ts_ms=20_000)  # expires older keys
    assert len(t) == 1


def test_idempotency_results_and_keys_round_trip_exactly():
    t = IdempotencyTable(window_ms=60_000)
    hexkey = "0123456789abcdef0123456789abcdef"
    # Keys an int conversion must not merge: upper case, a 0x prefix, underscores, other lengths.
    keys = [hexkey, hexkey.upper(), "0x" + hexkey[2:], "0123_456789abcdef0123456789abcde", "k", "é" * 32]
    for i, k in enumerate(keys):
        t.remember("T", k, _put(i, host="0A00000" + str(i % 2)), store_ts_ms=1_000 + i)
    for i, k in enumerate(keys):
        assert t.get("T", k, now_ms=2_000) == _put(i, host="0A00000" + str(i % 2))
        assert t.get("U", k, now_ms=2_000) is None
    assert [e[1] for e in t.entries()] == sorted(keys) and len(t) == len(keys)


def test_idempotency_buckets_expire_whole_and_replay_out_of_order():
    t = IdempotencyTable(window_ms=8_000)  # buckets of 1 s
    # Recovery replays queue by queue, so timestamps arrive out of order.
    for ts in (5_500, 1_200, 3_100, 1_900):
        t.remember("T", f"k{ts}", _put(ts), store_ts_ms=ts)
    assert len(t) == 4 and t.get("T", "k1200", now_ms=9_000) == _put(1_200)
    assert t.get("T", "k1200", now_ms=9_201) is None  # older than the window: never answered
    t.remember("T", "late", _put(1), store_ts_ms=10_100)
    assert len(t) == 5  # their bucket holds a key of 5,500: kept until that one is past the window
    t.remember("T", "later", _put(2), store_ts_ms=13_600)  # now the whole bucket is
    assert sorted(e[1] for e in t.entries()) == ["late", "later"] and len(t) == 2


def test_idempotency_buckets_are_bounded_by_count_too():
    t = IdempotencyTable(window_ms=600_000, max_keys=40)  # buckets of at most 10 keys
    for n in range(35):
        t.remember("T", f"k{n}", _put(n), store_ts_ms=1_000)  # one instant: only the count splits
    assert [b.count for b in t._buckets] == [10, 10, 10, 5]


def test_idempotency_max_keys_evicts_the_oldest_first():
    t = IdempotencyTable(window_ms=600_000, max_keys=640)
    for n in range(1_000):
        t.remember("T", f"key-{n}", _put(n), store_ts_ms=1_000 + n * 10)
    assert len(t) <= 640 and t.evicted == 1_000 - len(t)
    held = {e[1] for e in t.entries()}
    assert held == {f"key-{n}" for n in range(1_000 - len(t), 1_000)}  # the newest survive
    assert t.get("T", "key-999", now_ms=20_000) == _put(999)
    assert t.get("T", "key-0", now_ms=20_000) is None


async def test_offset_records_applied_in_order():
    m = ConsumerOffsetManager()
    written = []

    async def writer(topic, record):
        written.append((topic, record))
        m.apply_record(record)

    m.set_writer(writer)
    await m.commit("g", "T", 1, 5)
    await m.commit_many("g", "T", {0: 2, 1: 6})
    assert m.query("g", "T", 1) == 6 and m.query("g", "T", 0) == 2 and m.query("g", "T", 3) == -1
    assert m.offsets_of("g") == {"T": {0: 2, 1: 6}} and m.groups() == ["g"]
    assert written[0] == ("RMQ_SYS_CONSUMER_OFFSETS", {"group": "g", "topic": "T", "offsets": {"1": 5}})
    m.apply_record({"bad": 1})  # a malformed record is logged, not fatal
    with pytest.raises(BrokerError) as ei:
        await m.commit("g", "T", 0, -1)
    assert ei.value.code == BrokerCode.INVALID_REQUEST


async def test_snapshot_replaces_table():
    m = ConsumerOffsetManager(snapshot_every_records=3)
    log = []

    async def writer(topic, record):
        log.append(record)
        m.apply_record(record)

    m.set_writer(writer)
    for i in range(3):
        await m.commit("g", "T", 0, i)
    assert "snapshot" in log[-1] and len(log) == 4
    fresh = ConsumerOffsetManager()
    fresh.apply_record({"group": "x", "topic": "T", "offsets": {"0": 99}})  # older state is replaced
    fresh.apply_record(log[-1])
    assert fresh.offsets_of("g") == {"T": {0: 2}} and fresh.query("x", "T", 0) == -1


async def test_snapshot_waits_for_commits_in_flight():
    import asyncio

    m = ConsumerOffsetManager(snapshot_every_records=1000)
    log = []

    async def writer(topic, record):  # a record is applied some time after it is written
        log.append(record)
        await asyncio.sleep(0.01 if "snapshot" not in record else 0)
        m.apply_record(record)

    m.set_writer(writer)
    commits = [asyncio.create_task(m.commit("g", "T", q, 10 + q)) for q in range(5)]
    await asyncio.sleep(0)
    await m.write_snapshot()
    await asyncio.gather(*commits)
    snap = next(r for r in log if "snapshot" in r)
    fresh = ConsumerOffsetManager()
    fresh.apply_record(snap)
    for r in log[log.index(snap) + 1:]:
        fresh.apply_record(r)
    assert fresh.offsets_of("g") == m.offsets_of("g") == {"T": {q: 10 + q for q in range(5)}}


def test_idempotency_run_of_keys_fills_buckets_in_order_and_keeps_first_results():
    """A dispatched run (`remember_run`): keys already held (in an older bucket, or earlier in the
    run) keep their first result; the others fill the newest bucket and open new ones as it fills."""
    t = IdempotencyTable(window_ms=600_000, max_keys=40)  # buckets of at most 10 keys
    host = bytes.fromhex("0A00000100002AAF")
    t.remember("T", "old", _put(0), store_ts_ms=1_000)
    keys = [b"old"] + [b"k%d" % n for n in range(20)] + [b"k3"]
    units = [(10**12 + n * 1_100, 1_100) for n in range(len(keys))]
    t.remember_run("T", 0, 2_000, host, keys, 2**40, units, list(range(len(keys))))
    assert [b.count for b in t._buckets] == [10, 10, 1] and len(t) == 21
    assert t.get("T", "old", now_ms=3_000) == _put(0)
    first_k3 = t.get("T", "k3", now_ms=3_000)
    assert first_k3 is not None and first_k3.commit_log_offset == units[4][0]
    assert first_k3.queue_offset == 2**40 + 4 and first_k3.msg_id == f"0A00000100002AAF{units[4][0]:016X}"


def test_idempotency_run_of_new_keys_keeps_the_first_of_a_key_twice_in_the_run():
    """The common case — every key of the run new, fitting the bucket — is taken in bulk: a key
    twice in the run still keeps its first result, and counts once."""
    t = IdempotencyTable(window_ms=600_000, max_keys=400)  # buckets of at most 100 keys
    host = bytes.fromhex("0A00000100002AAF")
    keys = [b"k%d" % n for n in range(5)] + [b"k2"]
    units = [(10**12 + n * 1_100, 1_100) for n in range(len(keys))]
    now = int(time.time() * 1000)  # `first_results` reads the clock
    t.remember_run("T", 3, now, host, keys, 2**40, units, list(range(len(keys))))
    assert len(t) == 5 and [b.count for b in t._buckets] == [5]
    k2 = t.get("T", "k2", now_ms=now)
    assert k2 == PutResult(f"0A00000100002AAF{units[2][0]:016X}", 3, 2**40 + 2, units[2][0], 1_100)
    assert t.first_results("T", ["x", "k2", "k4"]) == {1: k2, 2: t.get("T", "k4", now_ms=now)}
    assert t.first_results("T", ["x", "y"]) is None


def test_idempotency_run_with_unkeyed_messages_maps_each_key_to_its_own_message():
    """A run where only some messages carry a key: `at` says which unit each key belongs to."""
    t = IdempotencyTable(window_ms=600_000)
    host = bytes.fromhex("0A00000100002AAF")
    units = [(10**12 + n * 1_100, 1_000 + n) for n in range(6)]
    t.remember_run("T", 1, 2_000, host, [b"a", b"b"], 500, units, [1, 4])
    a, b = t.get("T", "a", now_ms=2_500), t.get("T", "b", now_ms=2_500)
    assert (a.queue_offset, a.commit_log_offset, a.store_size) == (501, units[1][0], 1_001)
    assert (b.queue_offset, b.commit_log_offset, b.store_size) == (504, units[4][0], 1_004)


def test_idempotency_lookup_of_a_key_with_a_lone_surrogate():
    """JSON can carry a lone surrogate in a key: it is held and found, not refused."""
    t = IdempotencyTable(window_ms=600_000)
    t.remember("T", "k\ud800", _put(1), store_ts_ms=int(time.time() * 1000))
    assert t.first_results("T", ["new", "k\ud800"]) == {1: _put(1)}


_PREFIX = "00c0ffee00c0ffee"


def _units(first_phys: int, sizes: list[int]) -> list[tuple[int, int]]:
    out, phys = [], first_phys
    for size in sizes:
        out.append((phys, size))
        phys += size
    return out


def test_key_run_answers_each_key_with_its_own_message():
    t = IdempotencyTable(window_ms=60_000)
    host = bytes.fromhex("0A00000100002AAF")
    units = _units(5_000, [1_300, 1_100, 1_100, 1_200])
    now = int(time.time() * 1000)  # the put's lookups read the clock
    t.remember_key_run("T", 3, now, host, _PREFIX, 2**40, 70, units)
    for j, (phys, size) in enumerate(units):
        key = f"{_PREFIX}{2**40 + j:016x}"
        assert t.get("T", key) == PutResult(f"0A00000100002AAF{phys:016X}", 3, 70 + j, phys, size)
    assert t.get("T", f"{_PREFIX}{2**40 + 4:016x}") is None  # one past the run
    assert t.get("T", f"{_PREFIX}{2**40 - 1:016x}") is None
    assert t.get("T", f"{_PREFIX.upper()}{2**40:016x}") is None  # not the same key
    assert t.get("U", f"{_PREFIX}{2**40:016x}") is None
    assert len(t) == 4 and [e[1] for e in t.entries()] == [f"{_PREFIX}{2**40 + j:016x}" for j in range(4)]
    # A put's lookups: a run overlapping it, and keys one by one (a resend with explicit keys).
    hits = t.run_first_results("T", _PREFIX, 2**40 + 2, 5)
    assert hits is not None and sorted(hits) == [0, 1] and hits[0].queue_offset == 72
    assert t.run_first_results("T", _PREFIX, 2**40 + 4, 100) is None
    keys = ["other", f"{_PREFIX}{2**40 + 1:016x}", f"{_PREFIX}{2**40 + 9:016x}"]
    hits = t.first_results("T", keys)
    assert hits is not None and list(hits) == [1] and hits[1].queue_offset == 71
    assert t.get("T", f"{_PREFIX}{2**40:016x}", now_ms=now + 60_001) is None  # past the window


def test_key_run_keeps_the_first_result_of_keys_held_already():
    t = IdempotencyTable(window_ms=60_000)
    host = bytes.fromhex("0A00000100002AAF")
    t.remember("T", f"{_PREFIX}{12:016x}", _put(1), store_ts_ms=1_000)  # stored one by one first
    t.remember_key_run("T", 0, 1_000, host, _PREFIX, 14, 0, _units(100, [10] * 3))  # 14..16
    t.remember_key_run("T", 1, 1_001, host, _PREFIX, 10, 50, _units(900, [10] * 8))  # 10..17
    got = {e[1][-2:]: e[2] for e in t.entries()}
    assert len(t) == len(got) == 8
    assert got["0c"] == _put(1) and got["0e"].queue_offset == 0 and got["10"].queue_offset == 2
    assert [got[f"{c:02x}"].queue_offset for c in (10, 11, 13, 17)] == [50, 51, 53, 57]


def test_key_runs_fill_buckets_and_count_towards_max_keys():
    t = IdempotencyTable(window_ms=600_000, max_keys=40)  # buckets of at most 10 keys
    host = bytes.fromhex("0A00000100002AAF")
    t.remember_key_run("T", 0, 1_000, host, _PREFIX, 0, 0, _units(0, [10] * 25))
    assert [b.count for b in t._buckets] == [10, 10, 5] and len(t) == 25
    assert t.get("T", f"{_PREFIX}{24:016x}", now_ms=1_000).queue_offset == 24
    t.remember_key_run("T", 0, 1_000, host, _PREFIX, 25, 25, _units(250, [10] * 20))
    assert len(t) <= 40 and t.evicted == 10  # the oldest bucket went whole
    assert t.get("T", f"{_PREFIX}{0:016x}", now_ms=1_000) is None
    assert t.get("T", f"{_PREFIX}{44:016x}", now_ms=1_000).queue_offset == 44
