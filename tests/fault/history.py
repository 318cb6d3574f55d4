"""Jepsen-style operation history: every client operation is an `invoke` followed by exactly one of
`ok`, `fail` or `info`.

- `ok`: the operation definitely happened (a produce was acked: committed on a majority).
- `fail`: it definitely did not happen (a 4xx, a refused connection before anything was sent, a
  definite broker error such as NOT_MASTER or DISK_FULL raised before the append).
- `info`: the outcome is unknown (a timeout or a dropped connection after the request was sent, an
  HTTP 504 whose problem body says `"outcome": "unknown"`, any other 5xx). Never counted as `fail`:
  the checkers accept an `info` value being read back or not ("recovered").

Nemesis actions (kill, pause, partition...) are recorded in the same history with process
`"nemesis"`, so a history file tells the whole story of a run. Histories persist as JSON lines,
one event per line, and load back into the same `Event` objects for the offline checkers.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
EVENT_TYPES = frozenset((INVOKE, OK, FAIL, INFO))
COMPLETIONS = frozenset((OK, FAIL, INFO))

# Broker problem codes that promise nothing was appended: the broker refuses before touching the log.
DEFINITE_FAILURE_CODES = frozenset({
    "NOT_MASTER", "TOPIC_NOT_EXIST", "INVALID_TOPIC", "MESSAGE_TOO_LARGE", "QUEUE_NOT_EXIST",
    "DISK_FULL", "INVALID_REQUEST", "UNAUTHORIZED", "FORBIDDEN", "OFFSET_OUT_OF_RANGE",
})


@dataclass(slots=True)
class Event:
    """One history event. `op_id` ties a completion to its invoke; `time_ns` is monotonic."""

    type: str
    f: str
    process: str
    op_id: int
    time_ns: int
    value: Any = None
    node: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """One JSON line (no trailing newline)."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Event:
        """Parse one JSON line; raises ValueError naming the problem for a malformed line."""
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError(f"history line is not an object: {line[:80]!r}")
        if raw.get("type") not in EVENT_TYPES:
            raise ValueError(f"history event type {raw.get('type')!r} not in {sorted(EVENT_TYPES)}")
        return cls(**raw)


class History:
    """An append-only, in-memory history, optionally mirrored to a JSON-lines file as it grows.

    Used from one event loop (the test's); every method is synchronous and cheap.
    """

    def __init__(self, path: str | Path | None = None, first_op_id: int = 0) -> None:
        # Histories written by other processes (a consumer worker) start their op ids elsewhere
        # so merged histories keep op ids unique.
        self.events: list[Event] = []
        self._ids = itertools.count(first_op_id)
        self._open: dict[int, Event] = {}
        self._file = open(path, "w", encoding="utf-8") if path else None  # closed in close()
        self.path = Path(path) if path else None

    # -- recording -----------------------------------------------------------------------------
    def _add(self, event: Event) -> Event:
        self.events.append(event)
        if self._file is not None:
            self._file.write(event.to_json() + "\n")
            self._file.flush()
        return event

    def invoke(self, f: str, process: str, value: Any = None, node: str | None = None,
               **extra: Any) -> Event:
        """Record the start of an operation; returns the invoke event (pass it to ok/fail/info)."""
        ev = Event(INVOKE, f, process, next(self._ids), time.monotonic_ns(), value, node, None, extra)
        self._open[ev.op_id] = ev
        return self._add(ev)

    def _complete(self, kind: str, inv: Event, value: Any, error: str | None, extra: dict[str, Any]) -> Event:
        if self._open.pop(inv.op_id, None) is None:
            raise ValueError(f"operation {inv.op_id} ({inv.f} by {inv.process}) already completed")
        return self._add(Event(kind, inv.f, inv.process, inv.op_id, time.monotonic_ns(),
                               inv.value if value is None else value, inv.node, error, extra))

    def ok(self, inv: Event, value: Any = None, **extra: Any) -> Event:
        """The operation definitely took effect."""
        return self._complete(OK, inv, value, None, extra)

    def fail(self, inv: Event, error: str, value: Any = None, **extra: Any) -> Event:
        """The operation definitely did not take effect."""
        return self._complete(FAIL, inv, value, error, extra)

    def info(self, inv: Event, error: str, value: Any = None, **extra: Any) -> Event:
        """The outcome is unknown (timeout, connection lost after sending, 504 outcome unknown)."""
        return self._complete(INFO, inv, value, error, extra)

    def nemesis(self, f: str, value: Any = None, **extra: Any) -> Event:
        """Record a fault injection as a completed operation of process "nemesis"."""
        inv = self.invoke(f, "nemesis", value, **extra)
        return self.ok(inv, **extra)

    def close_open_as_info(self, reason: str = "history closed with the operation in flight",
                           processes: Iterable[str] | None = None) -> None:
        """Complete still-open operations as `info` (a worker cancelled mid-request): all of
        them, or only those of the given processes."""
        only = None if processes is None else set(processes)
        for inv in list(self._open.values()):
            if only is None or inv.process in only:
                self.info(inv, reason)

    def close(self) -> None:
        """Flush and close the mirror file (events stay readable in memory)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- reading -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def dump(self, path: str | Path) -> None:
        """Write the whole history as JSON lines."""
        with open(path, "w", encoding="utf-8") as fh:
            for ev in self.events:
                fh.write(ev.to_json() + "\n")


def load_history(path: str | Path) -> list[Event]:
    """Read a JSON-lines history; raises ValueError with the line number for a malformed line."""
    events: list[Event] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                events.append(Event.from_json(line))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from exc
    return events


def pair_operations(events: Iterable[Event]) -> list[tuple[Event, Event | None]]:
    """(invoke, completion) pairs in invoke order; completion None if the op never completed
    (which the checkers treat exactly like `info`)."""
    invokes: dict[int, Event] = {}
    done: dict[int, Event] = {}
    for ev in events:
        if ev.type == INVOKE:
            invokes[ev.op_id] = ev
        elif ev.type in COMPLETIONS:
            done[ev.op_id] = ev
    return [(inv, done.get(op_id)) for op_id, inv in invokes.items()]


def classify_http_outcome(status: int | None, problem: dict[str, Any] | None,
                          sent: bool) -> str:
    """Map an HTTP exchange to ok / fail / info.

    `status` None means no response: if the request was (possibly) sent, the outcome is unknown.
    A 504 with `"outcome": "unknown"` is explicitly indeterminate; other 5xx are treated the same
    (conservative: a 500 after the append may still commit). 4xx and the definite broker codes are
    failures.
    """
    if status is None:
        return INFO if sent else FAIL
    if 200 <= status < 300:
        return OK
    code = (problem or {}).get("code")
    if status == 504 or (problem or {}).get("outcome") == "unknown":
        return INFO
    if 400 <= status < 500:
        return FAIL
    if code in DEFINITE_FAILURE_CODES:
        return FAIL  # e.g. 507 DISK_FULL: checked before the append
    return INFO
