"""`client.loop.LightFuture`: a concurrent.futures.Future whose condition (and waiter and
callback lists) are made only when a thread needs them. Every way of looking at it still works,
across threads: result() and exception() waiting, done callbacks added before and after it
resolves, concurrent.futures.wait/as_completed, and a resolution racing a waiter."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from client.loop import LightFuture


def test_a_future_resolved_before_anyone_looks_never_makes_a_condition():
    f = LightFuture()
    assert not f.done()
    f.set_result(7)
    assert f.done() and not f.cancelled()
    assert f._cond is None
    assert f._waiter_list is None and f._callback_list is None  # no lists either: fewer objects for the GC
    assert f.result(0) == 7 and f.exception(0) is None
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(8)


def test_result_waits_for_a_result_set_from_another_thread():
    f = LightFuture()
    threading.Timer(0.05, f.set_result, ("late",)).start()
    assert f.result(5) == "late"
    with pytest.raises(concurrent.futures.TimeoutError):
        LightFuture().result(0.01)


def test_exceptions_and_callbacks_before_and_after_resolution():
    seen: list[object] = []
    f = LightFuture()
    f.add_done_callback(lambda fut: seen.append(("before", fut.exception())))
    err = ValueError("boom")
    f.set_exception(err)
    f.add_done_callback(lambda fut: seen.append(("after", fut.exception())))
    assert seen == [("before", err), ("after", err)]
    with pytest.raises(ValueError):
        f.result(0)
    g = LightFuture()
    g.set_exception(err)  # nobody looked yet: the condition-free path
    assert g._cond is None and g.exception(0) is err


def test_concurrent_futures_wait_and_as_completed_see_light_futures():
    fs = [LightFuture() for _ in range(4)]
    for i, f in enumerate(fs[:2]):
        f.set_result(i)
    timers = [threading.Timer(0.02 * (i + 1), f.set_result, (i + 2,)) for i, f in enumerate(fs[2:])]
    for t in timers:
        t.start()
    done, not_done = concurrent.futures.wait(fs, timeout=5)
    assert len(done) == 4 and not not_done
    assert sorted(f.result() for f in concurrent.futures.as_completed(fs, timeout=5)) == [0, 1, 2, 3]


def test_a_resolution_racing_waiters_never_loses_a_wakeup():
    for _ in range(300):
        f = LightFuture()
        got: list[object] = []
        waiters = [threading.Thread(target=lambda f=f, got=got: got.append(f.result(5))) for _ in range(3)]
        for w in waiters:
            w.start()
        f.set_result("x")
        for w in waiters:
            w.join(5)
        assert got == ["x", "x", "x"]
