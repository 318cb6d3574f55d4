"""Prometheus metrics of one broker (its own registry, so a container can host several).

Counters and histograms are updated on the request path; gauges that describe state (consumer
lag, DLedger role/term/commit index/peer watermarks, disk use, queue offsets) are computed at
scrape time by `BrokerStateCollector`, so the hot path pays nothing for them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# `_created` series double every counter's output and nobody alerts on them.
disable_created_metrics()

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0)


class BrokerMetrics:
    """The request-path instruments; label values are bounded by topics/groups that exist."""

    def __init__(self, broker_name: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.put_messages = Counter(
            "ledgermq_put_messages", "Messages stored (acknowledged produces)", ["topic"], registry=r
        )
        self.put_bytes = Counter("ledgermq_put_bytes", "Body bytes stored", ["topic"], registry=r)
        self.put_latency = Histogram(
            "ledgermq_put_latency_seconds",
            "Produce request latency until commit",
            ["topic"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.put_errors = Counter(
            "ledgermq_put_errors", "Failed produce requests by code", ["topic", "code"], registry=r
        )
        self.get_messages = Counter(
            "ledgermq_get_messages", "Messages returned by pull and receive", ["topic"], registry=r
        )
        self.get_latency = Histogram(
            "ledgermq_get_latency_seconds",
            "Pull request latency (includes long poll)",
            ["topic"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.long_poll_waiters = Gauge(
            "ledgermq_long_poll_waiters", "Requests held by long polling", registry=r
        )
        self.dlq_messages = Counter(
            "ledgermq_send_to_dlq_messages", "Messages moved to %DLQ%{group}", ["group"], registry=r
        )
        self.acked = Counter(
            "ledgermq_ack_messages", "Messages acknowledged by group consumers", ["group"], registry=r
        )
        self._topics: dict[str, TopicMetrics] = {}

    def topic(self, topic: str) -> TopicMetrics:
        """The per-topic children of `topic` (cached)."""
        tm = self._topics.get(topic)
        if tm is None:
            tm = self._topics[topic] = TopicMetrics(self, topic)
        return tm


class TopicMetrics:
    """Per-topic metric children, looked up once (label lookups cost more than the increments)."""

    __slots__ = ("get_latency", "get_messages", "put_bytes", "put_latency", "put_messages")

    def __init__(self, m: BrokerMetrics, topic: str) -> None:
        self.put_messages = m.put_messages.labels(topic=topic)
        self.put_bytes = m.put_bytes.labels(topic=topic)
        self.put_latency = m.put_latency.labels(topic=topic)
        self.get_messages = m.get_messages.labels(topic=topic)
        self.get_latency = m.get_latency.labels(topic=topic)


class BrokerStateCollector(Collector):
    """Scrape-time gauges. `state` returns the pieces (role, dledger metadata, lag rows)."""

    def __init__(self, broker_name: str, state: Callable[[], dict[str, Any]]) -> None:
        self.broker_name = broker_name
        self.state = state

    def collect(self) -> Iterable[Metric]:
        try:
            s = self.state()
        except Exception:  # a scrape must never take the broker down; log and report what we can
            log.exception("event=metrics_state_failed broker=%s", self.broker_name)
            return []
        b = self.broker_name
        out: list[Metric] = []
        role = GaugeMetricFamily(
            "ledgermq_broker_is_master", "1 if this broker is the master", labels=["broker"]
        )
        role.add_metric([b], 1.0 if s.get("role") == "MASTER" else 0.0)
        out.append(role)
        dl = s.get("dledger")
        if dl:
            labels = ["group", "self_id"]
            key = [str(dl.get("group")), str(dl.get("selfId"))]
            for name, field, doc in (
                ("dledger_current_term", "term", "Current DLedger term"),
                ("dledger_committed_index", "committedIndex", "Committed index"),
                ("dledger_applied_index", "appliedIndex", "Applied index"),
                ("dledger_ledger_end_index", "ledgerEndIndex", "Last index in the local log"),
            ):
                g = GaugeMetricFamily(name, doc, labels=labels)
                g.add_metric(key, float(dl.get(field) or 0))
                out.append(g)
            state = GaugeMetricFamily(
                "dledger_role", "1 for the member's current role", labels=[*labels, "role"]
            )
            for r in ("LEADER", "FOLLOWER", "CANDIDATE"):
                state.add_metric([*key, r], 1.0 if str(dl.get("role", "")).upper().endswith(r) else 0.0)
            out.append(state)
            wm = GaugeMetricFamily(
                "dledger_peer_water_mark",
                "Highest index each peer acknowledged (leader view)",
                labels=[*labels, "remote_id"],
            )
            for peer, idx in (dl.get("peerWaterMarks") or {}).items():
                wm.add_metric([*key, str(peer)], float(idx))
            out.append(wm)
        lag = GaugeMetricFamily(
            "ledgermq_consumer_lag", "Max offset minus committed offset", labels=["group", "topic", "queueid"]
        )
        for group, topic, qid, value in s.get("lag", ()):
            lag.add_metric([group, topic, str(qid)], float(value))
        out.append(lag)
        maxo = GaugeMetricFamily(
            "ledgermq_queue_max_offset", "Max offset of each queue", labels=["topic", "queueid"]
        )
        for topic, qid, value in s.get("queues", ()):
            maxo.add_metric([topic, str(qid)], float(value))
        out.append(maxo)
        idem = s.get("idempotency")
        if idem:
            keys = GaugeMetricFamily(
                "ledgermq_idempotency_keys",
                "Idempotency keys held (window and idempotencyMaxKeys)",
                labels=["broker"],
            )
            keys.add_metric([b], float(idem[0]))
            out.append(keys)
            evicted = CounterMetricFamily(
                "ledgermq_idempotency_evicted_keys",
                "Keys dropped before their window ended because idempotencyMaxKeys was reached",
                labels=["broker"],
            )
            evicted.add_metric([b], float(idem[1]))
            out.append(evicted)
        ratio = s.get("disk_used_ratio")
        if ratio is not None:
            disk = GaugeMetricFamily(
                "ledgermq_disk_used_ratio", "Used fraction of the store's disk", labels=["broker"]
            )
            disk.add_metric([b], ratio)
            out.append(disk)
        return out
