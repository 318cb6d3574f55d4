"""Produce and consume rates per topic, from the brokers' Prometheus counters, sampled whenever
the throughput page is viewed (its live refresh samples every second while it is open; nothing
is polled in the background).

Counters are per member (produces count on the master that stored them, pulls and receives on
the member that served them) and restart at 0 with the process, so a rate is the sum over members
of each counter's increase between two samples, a decrease counting as a restart from 0.
Plain state, no I/O. Callers: `console.views.throughput_view`."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PUT = "ledgermq_put_messages_total"
GET = "ledgermq_get_messages_total"
# Samples kept: two minutes at the page's one-second refresh.
MAX_SAMPLES = 120
# Two samples closer than this say nothing about a rate (two tabs refreshing at once).
MIN_INTERVAL_S = 0.5

_Counters = dict[tuple[str, str, str], float]  # (member addr, counter, topic) → value


def parse_counters(addr: str, text: str) -> _Counters:
    """The produce and consume counters per topic of one member's /metrics text."""
    out: _Counters = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (PUT, GET) and "topic" in sample.labels:
                out[(addr, sample.name, sample.labels["topic"])] = sample.value
    return out


@dataclass
class TopicRate:
    topic: str
    produce: float  # messages/s, last interval
    consume: float
    produce_history: list[float] = field(default_factory=list)
    consume_history: list[float] = field(default_factory=list)


class Throughput:
    """The last `MAX_SAMPLES` samples of every member's counters, and the rates between them."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, _Counters]] = deque(maxlen=MAX_SAMPLES + 1)

    def add(self, at_s: float, counters: _Counters) -> None:
        if self._samples and at_s - self._samples[-1][0] < MIN_INTERVAL_S:
            return
        self._samples.append((at_s, counters))

    def rates(self) -> list[TopicRate]:
        """Per topic (by name): the rates of the last interval and of each earlier one."""
        series: dict[str, TopicRate] = {}
        for (t0, before), (t1, after) in itertools.pairwise(self._samples):
            dt = t1 - t0
            per_topic: dict[tuple[str, str], float] = {}
            for key, value in after.items():
                _, counter, topic = key
                prev = before.get(key)
                if prev is None:
                    continue  # the member did not answer the sample before: no interval to measure
                delta = value - prev if value >= prev else value  # a restart counts from 0
                per_topic[(counter, topic)] = per_topic.get((counter, topic), 0.0) + delta
            for topic in {t for _, _, t in after}:
                rate = series.setdefault(topic, TopicRate(topic, 0.0, 0.0))
                rate.produce_history.append(per_topic.get((PUT, topic), 0.0) / dt)
                rate.consume_history.append(per_topic.get((GET, topic), 0.0) / dt)
        for rate in series.values():
            rate.produce = rate.produce_history[-1]
            rate.consume = rate.consume_history[-1]
        return [series[t] for t in sorted(series)]

    @property
    def window_s(self) -> float:
        return self._samples[-1][0] - self._samples[0][0] if len(self._samples) > 1 else 0.0


def sparkline(values: list[float], width: int = 160, height: int = 28) -> str:
    """An SVG polyline path of `values` scaled to the box (its `points` attribute)."""
    if len(values) < 2:
        return ""
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - v / top * (height - 2) - 1:.1f}" for i, v in enumerate(values))
