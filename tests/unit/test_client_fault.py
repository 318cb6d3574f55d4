"""Latency-fault tolerance (client/fault.py) on an injected clock: RocketMQ's latency table, a
failure isolates a set for a while, a success or the time passing makes it available again, and
the producer's choice of a set skips the avoided ones unless none is left."""

from __future__ import annotations

from client.fault import LatencyFaultTolerance, not_available_ms
from client.producer import AsyncProducer
from client.transport import PERM_READ, PERM_WRITE, BrokerSetRoute


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rocketmq_latency_table():
    assert [not_available_ms(x) for x in (0, 49, 50, 100, 549, 550, 999, 1000, 2999, 3000, 15000, 90000)] == [
        0,
        0,
        0,
        0,
        0,
        30000,
        30000,
        60000,
        120000,
        180000,
        600000,
        600000,
    ]


def test_a_failure_isolates_a_set_until_the_isolation_time_has_passed():
    clock = Clock()
    ft = LatencyFaultTolerance(isolation_ms=2000, clock=clock)
    ft.update("a", 3, failed=True)
    assert not ft.is_available("a") and ft.is_available("b")
    assert ft.available(["a", "b", "c"]) == ["b", "c"]
    clock.now += 1.999
    assert not ft.is_available("a")
    clock.now += 0.002
    assert ft.is_available("a")


def test_a_success_makes_a_set_available_again_and_slow_answers_count_only_when_enabled():
    clock = Clock()
    ft = LatencyFaultTolerance(isolation_ms=2000, clock=clock)
    ft.update("a", 1, failed=True)
    ft.update("a", 5000, failed=False)
    assert ft.is_available("a"), "latency-based avoidance is off by default"
    slow = LatencyFaultTolerance(isolation_ms=2000, latency_enabled=True, clock=clock)
    slow.update("a", 600, failed=False)
    assert not slow.is_available("a")
    clock.now += 30.0
    assert slow.is_available("a")
    slow.update("a", 20, failed=False)
    assert slow.is_available("a")


def test_least_recent_failure_is_the_one_available_soonest():
    clock = Clock()
    ft = LatencyFaultTolerance(isolation_ms=1000, clock=clock)
    ft.update("a", 0, failed=True)
    clock.now += 0.5
    ft.update("b", 0, failed=True)
    assert ft.least_recent_failure(["b", "a"]) == "a"
    assert ft.least_recent_failure([]) is None


def _route(name: str, queues: int = 2) -> BrokerSetRoute:
    return BrokerSetRoute(name, {0: f"{name}:1"}, queues, queues, PERM_READ | PERM_WRITE, f"{name}:1")


async def test_the_producer_picks_only_sets_not_being_avoided_unless_none_is_left():
    async with AsyncProducer(broker_addr="127.0.0.1:1") as p:
        clock = Clock()
        p.fault = LatencyFaultTolerance(isolation_ms=1000, clock=clock)
        routes = [_route("a"), _route("b")]
        picks = {p._select(routes, 0, "t")[0].broker_name for _ in range(8)}
        assert picks == {"a", "b"}
        p.fault.update("b", 0, failed=True)
        assert {p._select(routes, 0, "t")[0].broker_name for _ in range(8)} == {"a"}
        assert p._select(routes, 0, "t", exclude={"a"})[0].broker_name == "b", "an avoided set beats none"
        clock.now += 0.1
        p.fault.update("a", 0, failed=True)  # both avoided: the one available soonest
        assert {p._select(routes, 0, "t")[0].broker_name for _ in range(4)} == {"b"}
        clock.now += 2
        assert {p._select(routes, 0, "t")[0].broker_name for _ in range(8)} == {"a", "b"}
