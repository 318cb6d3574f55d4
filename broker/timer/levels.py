"""RocketMQ 4's delay levels (`messageDelayLevel`): parsed here, apart from the timer service, so
the broker config can check the key without importing the store the service runs on."""

from __future__ import annotations

import re

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ's `messageDelayLevel` ("1s 5s 10s ... 2h", units s/m/h/d) → delays in ms."""
    levels = []
    for part in text.split():
        m = re.fullmatch(r"(\d+)([smhd])", part)
        if not m:
            raise ValueError(f"bad delay level {part!r}: expected a number with a unit s, m, h or d")
        levels.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    if not levels:
        raise ValueError("messageDelayLevel names no level")
    return tuple(levels)
