"""Latency-fault tolerance for broker sets: which sets a producer should avoid for a while.

RocketMQ's producer keeps a `LatencyFaultTolerance` (`MQFaultStrategy`): after a send it records
the broker's latency, and a broker that failed or answered slowly is "not available" until a time
that grows with the latency; queue selection skips unavailable brokers unless none is left
(`pickOneAtLeast`). This is the same for LedgerMQ's broker sets, state only (no I/O): the producer
calls `update` after every attempt and `available` when it picks a set.

Latency-based avoidance uses RocketMQ's tables and is off by default (as `sendLatencyFaultEnable`
is in RocketMQ 4): on a loaded machine a slow answer says little about a set. A failed attempt
(no connection, no master, a refusal to write, an unknown outcome) always isolates the set for
`isolation_ms`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

# RocketMQ MQFaultStrategy: a latency >= LATENCY_MAX_MS[i] makes a broker unavailable for
# NOT_AVAILABLE_MS[i] (the largest i that matches).
LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS: tuple[int, ...] = (0, 0, 30000, 60000, 120000, 180000, 600000)


def not_available_ms(latency_ms: float) -> int:
    """How long a set that answered in `latency_ms` is avoided (RocketMQ's table)."""
    for max_ms, duration in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_MS), strict=True):
        if latency_ms >= max_ms:
            return duration
    return 0


class LatencyFaultTolerance:
    """Per broker set, the time until which it is avoided.

    Callers: the producer, after each attempt (`update`) and when choosing a set (`available`).
    `clock` returns seconds (monotonic)."""

    def __init__(
        self,
        isolation_ms: int = 10_000,
        latency_enabled: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.isolation_ms = isolation_ms
        self.latency_enabled = latency_enabled
        self.clock = clock
        self._until: dict[str, float] = {}

    def update(self, broker_name: str, latency_ms: float, *, failed: bool) -> None:
        """Record an attempt on `broker_name`: a failure isolates it for `isolation_ms`; a success
        makes it available again, unless latency-based avoidance is on and it was slow."""
        if failed:
            duration_ms: float = self.isolation_ms
        elif self.latency_enabled:
            duration_ms = not_available_ms(latency_ms)
        else:
            duration_ms = 0
        if duration_ms > 0:
            self._until[broker_name] = self.clock() + duration_ms / 1000.0
        else:
            self._until.pop(broker_name, None)

    def is_available(self, broker_name: str) -> bool:
        """Whether `broker_name` is not being avoided now."""
        until = self._until.get(broker_name)
        if until is None:
            return True
        if self.clock() >= until:
            self._until.pop(broker_name, None)  # another thread (Producer.send's) may have just done so
            return True
        return False

    def available(self, broker_names: Iterable[str]) -> list[str]:
        """The names that are not avoided, in the order given."""
        return [n for n in broker_names if self.is_available(n)]

    def least_recent_failure(self, broker_names: Sequence[str]) -> str | None:
        """Among avoided names, the one available soonest (RocketMQ's pickOneAtLeast)."""
        if not broker_names:
            return None
        return min(broker_names, key=lambda n: self._until.get(n, 0.0))
