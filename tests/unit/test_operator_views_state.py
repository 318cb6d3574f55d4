"""Plain state behind the operators' views, with injected clocks: the broker's delivery trace and
client registry, the console's throughput rates."""

from __future__ import annotations

import pytest

from broker.service.clients import ClientProtocol, ClientRegistry
from broker.service.trace import DeliveryEvent, DeliveryTrace
from console.throughput import GET, PUT, Throughput, sparkline


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


def test_trace_keeps_events_in_order_and_forgets_the_oldest_messages() -> None:
    clock = Clock()
    trace = DeliveryTrace(clock, max_messages=2)
    trace.record(("t", 0, 5), "g", DeliveryEvent.RECEIVED, 0)
    clock.now_ms += 10
    trace.record(("t", 0, 5), "g", DeliveryEvent.NACKED, 0)
    trace.record(("t", 0, 5), "g", DeliveryEvent.REDELIVERED, 1)
    assert [(e.event, e.reconsume_times, e.at_ms) for e in trace.events("t", 0, 5)] == [
        ("RECEIVED", 0, 1_000),
        ("NACKED", 0, 1_010),
        ("REDELIVERED", 1, 1_010),
    ]
    trace.record(("t", 0, 6), "g", DeliveryEvent.RECEIVED, 0)
    trace.record(("u", 1, 0), "g", DeliveryEvent.RECEIVED, 0)  # third message: the first goes
    assert trace.events("t", 0, 5) == [] and len(trace) == 2
    trace.drop_topic("t")
    assert trace.events("t", 0, 6) == [] and len(trace.events("u", 1, 0)) == 1


def test_clients_are_connected_until_silent_for_the_expiry() -> None:
    clock = Clock()
    reg = ClientRegistry(clock, expire_ms=60_000, max_clients=3)
    reg.seen("billing", "orders", ClientProtocol.HTTP, "w1", "10.0.0.1:5000")
    reg.seen("billing", "orders", ClientProtocol.GRPC, "w2", "10.0.0.2:6000")
    reg.seen("audit", "orders", ClientProtocol.HTTP, "a1", "10.0.0.3:7000")
    assert [c.client_id for c in reg.clients("billing")] == ["w1", "w2"]
    clock.now_ms += 59_000
    reg.seen("billing", "orders", ClientProtocol.HTTP, "w1", "10.0.0.1:5001")  # seen again
    clock.now_ms += 2_000
    assert [(c.client_id, c.addr) for c in reg.clients()] == [("w1", "10.0.0.1:5001")]
    for i in range(5):
        reg.seen("g", "t", ClientProtocol.HTTP, f"c{i}", "h")
    assert len(reg.clients()) == 3  # bounded: the oldest are forgotten


def test_rates_sum_members_and_survive_restarts_and_silent_members() -> None:
    tp = Throughput()
    tp.add(0.0, {("m1", PUT, "t"): 100.0, ("m2", GET, "t"): 10.0})
    tp.add(1.0, {("m1", PUT, "t"): 150.0, ("m2", GET, "t"): 30.0})  # +50 put, +20 get
    tp.add(2.0, {("m1", PUT, "t"): 5.0})  # m1 restarted (5 since); m2 silent: no get interval
    tp.add(2.1, {("m1", PUT, "t"): 999.0})  # too close to the last sample: ignored
    tp.add(3.0, {("m1", PUT, "t"): 25.0, ("m2", GET, "t"): 40.0})  # m2 back: no interval yet
    (rate,) = tp.rates()
    assert rate.produce_history == [50.0, 5.0, 20.0]
    assert rate.consume_history == [20.0, 0.0, 0.0]
    assert (rate.produce, rate.consume, tp.window_s) == (20.0, 0.0, 3.0)


@pytest.mark.parametrize("values", [[], [3.0]])
def test_a_line_needs_two_points(values: list[float]) -> None:
    assert sparkline(values) == ""


def test_a_line_spans_its_box() -> None:
    line = sparkline([0.0, 5.0, 10.0], width=100, height=22)
    points = [tuple(map(float, p.split(","))) for p in line.split()]
    assert [x for x, _ in points] == [0.0, 50.0, 100.0]
    assert points[0][1] == 21.0 and points[2][1] == 1.0  # bottom for 0, top for the peak
