"""TimerIndex: the pending-timer index every member derives from the log (no clock, no sockets)."""

from __future__ import annotations

import tracemalloc

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.timer.index import TimerIndex


def test_due_timers_come_out_in_slot_order_never_early():
    idx = TimerIndex(slot_ms=100, bucket_ms=1000, near_ms=2000)
    for off, due in enumerate([5_000, 1_050, 1_000, 90_000, 1_099]):
        idx.add(due, off)
    assert idx.take_due(999, 10) == []
    assert sorted(idx.take_due(1_060, 10)) == [(1_000, 2), (1_050, 1)]
    assert idx.take_due(1_060, 10) == []  # in flight now
    assert idx.next_due_ms(1_060) == 1_099
    assert idx.take_due(1_099, 10) == [(1_099, 4)]
    assert idx.next_due_ms(1_100) == 5_000
    assert len(idx) == 5  # pending until their markers are applied
    for off in (1, 2, 4):
        idx.remove(off)
    assert len(idx) == 2 and not idx.inflight


def test_marker_removes_before_the_slot_is_read_and_release_returns_in_flight():
    idx = TimerIndex(slot_ms=100, bucket_ms=1000, near_ms=1000)
    idx.add(500, 7)
    idx.add(600, 8)
    idx.remove(7)  # recalled before due
    assert idx.take_due(700, 10) == [(600, 8)]
    idx.release_all()  # lost mastership before the fire committed
    assert idx.take_due(700, 10) == [(600, 8)]
    idx.remove(8)
    assert len(idx) == 0 and idx.take_due(10_000, 10) == []


def test_reserve_keeps_a_timer_from_firing_while_it_is_recalled():
    idx = TimerIndex(slot_ms=100, bucket_ms=1000, near_ms=1000)
    idx.add(500, 1)
    assert idx.reserve(1, 500)
    assert idx.take_due(600, 10) == []
    assert not idx.reserve(1, 500)
    idx.release(1)  # the recall was not written
    assert idx.take_due(600, 10) == [(500, 1)]


def test_follower_compaction_keeps_unfired_and_drops_fired():
    idx = TimerIndex(slot_ms=100, bucket_ms=1000, near_ms=1000)
    for off in range(10):
        idx.add(100 * off, off)
    for off in range(0, 10, 2):
        idx.remove(off)
    idx.compact(now_ms=5_000, grace_ms=1_000)
    assert idx.stats()["near"] == 5 and len(idx) == 5
    assert sorted(o for _, o in idx.take_due(5_000, 100)) == [1, 3, 5, 7, 9]


def test_low_water_mark_and_floor():
    idx = TimerIndex(slot_ms=100, bucket_ms=1000, near_ms=1000)
    for off in range(100):
        idx.add(1_000_000 + off, off)
    for off in range(50):
        idx.remove(off)
    idx.compact(now_ms=0, grace_ms=0)
    lwm = idx.low_water_mark(next_offset=100)
    assert lwm <= 50
    idx.raise_floor(37)
    assert all(idx.is_removed(o) for o in range(50)) and not idx.is_removed(50)
    idx.remove(10)  # below the floor: ignored
    assert len(idx) == 50


def test_spilled_buckets_come_back(tmp_path):
    idx = TimerIndex(slot_ms=100, bucket_ms=1000, near_ms=1000, resident_limit=1000, spill_dir=str(tmp_path))
    n = 20_000
    for off in range(n):
        idx.add(10_000 + (off * 7919) % 100_000, off)
    st_ = idx.stats()
    assert st_["resident_far"] <= 1000 and st_["spilled"] > 10_000
    idx.remove(3)
    got = []
    now = 0
    while len(got) < n - 1:
        now += 500
        got += idx.take_due(now, 100_000)
        assert all(due <= now for due, _ in got)
    assert sorted(o for _, o in got) == [o for o in range(n) if o != 3]
    assert not any(p.name.endswith(".tmr") for p in tmp_path.iterdir())


def test_memory_per_pending_timer_is_about_16_bytes():
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    idx = TimerIndex()
    for off in range(100_000):
        idx.add(10_000_000 + off * 1_000, off)  # spread over ~2 days
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert used / 100_000 < 24, used / 100_000


class IndexModel(RuleBasedStateMachine):
    """Random adds, markers, takes, releases and compactions against a plain dict."""

    @initialize(spill=st.booleans())
    def setup(self, spill):
        import tempfile
        self.dir = tempfile.mkdtemp() if spill else None
        self.idx = TimerIndex(slot_ms=10, bucket_ms=100, near_ms=200, resident_limit=20, spill_dir=self.dir)
        self.pending: dict[int, int] = {}
        self.inflight: set[int] = set()
        self.next_off = 0
        self.now = 0

    @rule(delay=st.integers(-50, 2_000))
    def add(self, delay):
        due = max(0, self.now + delay)
        self.idx.add(due, self.next_off)
        self.pending[self.next_off] = due
        self.next_off += 1

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def marker(self, data):
        off = data.draw(st.sampled_from(sorted(self.pending)))
        self.idx.remove(off)
        del self.pending[off]
        self.inflight.discard(off)

    @rule(step=st.integers(0, 300), limit=st.integers(1, 20))
    def take(self, step, limit):
        self.now += step
        got = self.idx.take_due(self.now, limit)
        assert len(got) <= limit
        for due, off in got:
            assert off in self.pending and self.pending[off] == due and due <= self.now
            assert off not in self.inflight
            self.inflight.add(off)
        if len(got) < limit:  # nothing due is left behind
            left = {o for o, d in self.pending.items() if d <= self.now and o not in self.inflight}
            assert not left, left

    @rule()
    def release(self):
        self.idx.release_all()
        self.inflight.clear()

    @rule(grace=st.integers(0, 100))
    def compact(self, grace):
        self.idx.compact(self.now, grace)

    @invariant()
    def counts(self):
        if hasattr(self, "idx"):
            assert len(self.idx) == len(self.pending)
            assert self.idx.low_water_mark(self.next_off) <= min(self.pending, default=self.next_off)


TestIndexModel = IndexModel.TestCase
TestIndexModel.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)
