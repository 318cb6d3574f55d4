"""Per-group redelivery backoff, RocketMQ 5's `GroupRetryPolicy` with its defaults.

`CUSTOMIZED` (RocketMQ's default): the delay after a failed delivery is `next[reconsumeTimes + 2]`
of the 18-level list `1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h`, capped at the
last — 10 s after the first failure, then 30 s, 1 m … 2 h (RocketMQ 4's "delay level 3 +
reconsumeTimes"). `EXPONENTIAL`: `min(max, initial * multiplier^reconsumeTimes)`, RocketMQ's
defaults 5 s, 2 h, 2. `reconsumeTimes` is how many times the message was already redelivered
(0 after its first delivery failed). The gRPC endpoint sends the same policy to clients as their
backoff settings (`max_attempts = retryMaxTimes + 1`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

DEFAULT_LEVELS_MS = (1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
                     420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)
MAX_DELAY_MS = 24 * 3_600_000


class RetryPolicyType(StrEnum):
    CUSTOMIZED = "CUSTOMIZED"
    EXPONENTIAL = "EXPONENTIAL"


class RetryPolicyError(ValueError):
    """A policy that cannot be used; `field` names the bad input."""

    def __init__(self, field_name: str, reason: str) -> None:
        self.field = field_name
        super().__init__(f"{field_name}: {reason}")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a failed message stays invisible before it is delivered again."""

    type: RetryPolicyType = RetryPolicyType.CUSTOMIZED
    next_ms: tuple[int, ...] = DEFAULT_LEVELS_MS
    initial_ms: int = 5_000
    max_ms: int = 7_200_000
    multiplier: float = 2.0

    def delay_ms(self, reconsume_times: int) -> int:
        """The backoff after a delivery failed that had been redelivered `reconsume_times` times."""
        n = max(0, reconsume_times)
        if self.type is RetryPolicyType.CUSTOMIZED:
            return self.next_ms[min(n + 2, len(self.next_ms) - 1)]
        return int(min(self.max_ms, self.initial_ms * self.multiplier ** min(n, 32)))

    def to_dict(self) -> dict[str, Any]:
        """The wire form (admin API, replicated record)."""
        if self.type is RetryPolicyType.CUSTOMIZED:
            return {"type": self.type.value, "nextMs": list(self.next_ms)}
        return {"type": self.type.value, "initialMs": self.initial_ms, "maxMs": self.max_ms,
                "multiplier": self.multiplier}

    @classmethod
    def from_dict(cls, doc: Any) -> RetryPolicy:
        """Parse and validate the wire form; RetryPolicyError naming the bad field."""
        if not isinstance(doc, dict):
            raise RetryPolicyError("retryPolicy", "expected an object")
        unknown = set(doc) - {"type", "nextMs", "initialMs", "maxMs", "multiplier"}
        if unknown:
            raise RetryPolicyError(f"retryPolicy.{sorted(unknown)[0]}", "unknown field")
        try:
            kind = RetryPolicyType(str(doc.get("type", "CUSTOMIZED")).upper())
        except ValueError:
            raise RetryPolicyError("retryPolicy.type", "expected CUSTOMIZED or EXPONENTIAL") from None
        if kind is RetryPolicyType.CUSTOMIZED:
            levels = doc.get("nextMs", list(DEFAULT_LEVELS_MS))
            if (not isinstance(levels, list) or not 1 <= len(levels) <= 64
                    or not all(_ms(v) for v in levels)):
                raise RetryPolicyError("retryPolicy.nextMs",
                                       f"expected 1-64 delays in ms, each 0..{MAX_DELAY_MS}")
            return cls(kind, tuple(levels))
        initial, maximum = doc.get("initialMs", 5_000), doc.get("maxMs", 7_200_000)
        multiplier = doc.get("multiplier", 2.0)
        if not _ms(initial):
            raise RetryPolicyError("retryPolicy.initialMs", f"expected 0..{MAX_DELAY_MS}")
        if not _ms(maximum) or maximum < initial:
            raise RetryPolicyError("retryPolicy.maxMs", f"expected initialMs..{MAX_DELAY_MS}")
        if (isinstance(multiplier, bool) or not isinstance(multiplier, int | float)
                or not 1 <= multiplier <= 100):
            raise RetryPolicyError("retryPolicy.multiplier", "expected a number in 1..100")
        return cls(kind, DEFAULT_LEVELS_MS, initial, maximum, float(multiplier))


def _ms(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DELAY_MS


DEFAULT_RETRY_POLICY = RetryPolicy()
