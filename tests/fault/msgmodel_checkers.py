"""Offline checkers of the message model's promises, over a fault-run history (issue 15).

- `timers`: every acked delayed message is delivered exactly once (a timer never fires twice,
  never gets lost, whatever fails over), never before its due time (the delivered copy's store
  timestamp, set by the master that fired it, is at or after `deliverAt`), and a recalled one
  never; lateness figures for the report.
- `transactions`: a rolled-back (or discarded) transaction's message is never visible; a committed
  one is visible exactly once; no transaction is both committed and rolled back.
- `fifo_order`: within each message group, message n+1 is never handed out before message n was
  acked (an ack of it was at least sent before the receive that brought n+1 returned) — across
  failovers and redeliveries.

Event conventions (values are JSON): `send_delayed` (ok extra: deliverAt, recallHandle), `recall`
(value: body), `timer_read` ({"queue", "messages": [[offset, body, storeTimestamp, deliverAt]]});
`tx_half` (ok extra: txid), `tx_end` (value {"body", "resolution"}), `tx_read` ({"queue",
"messages": [[offset, body]]}); `fifo_send` (value {"group", "seq", "body"}), `fifo_receive` (ok
value {"messages": [[group, seq]]}), `fifo_ack` (value [group, seq]; a failed one, e.g. EXPIRED
after a failover, settled nothing and does not count).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from tests.fault.history import FAIL, INFO, OK, Event, pair_operations

MAX_REPORTED = 20


def _short(items: Any) -> list[Any]:
    return sorted(items, key=repr)[:MAX_REPORTED]


def _positions(events: Sequence[Event], f: str) -> dict[Any, dict[tuple[str, int], list[Any]]]:
    """body -> {(queue, offset): the rest of the read row} over every read `f` of every member."""
    out: dict[Any, dict[tuple[str, int], list[Any]]] = defaultdict(dict)
    for ev in events:
        if ev.type == OK and ev.f == f and isinstance(ev.value, dict):
            for row in ev.value["messages"]:
                out[row[1]][(ev.value["queue"], row[0])] = row[2:]
    return out


def _percentile(sorted_values: list[int], p: float) -> int | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def timers(events: Sequence[Event]) -> dict[str, Any]:
    outcome: dict[Any, str] = {}
    due: dict[Any, int] = {}
    for inv, done in pair_operations(e for e in events if e.f == "send_delayed"):
        kind = done.type if done is not None else INFO
        if outcome.get(inv.value) != OK:
            outcome[inv.value] = kind
        if done is not None and done.type == OK:
            # the broker's due time; a message whose time had passed when it arrived was stored
            # at once (no deliverAt in the answer): the time it asked for still applies
            at = done.extra.get("deliverAt", inv.extra.get("deliverAt"))
            if at is not None:
                due[inv.value] = int(at)
    recalled = {
        inv.value
        for inv, done in pair_operations(e for e in events if e.f == "recall")
        if done is not None and done.type == OK
    }
    seen = _positions(events, "timer_read")
    acked = {v for v, o in outcome.items() if o == OK}
    lost = {v for v in acked - recalled if v not in seen}
    twice = {v for v, pos in seen.items() if len(pos) > 1}
    recalled_delivered = recalled & set(seen)
    never_sent = set(seen) - set(outcome)
    early: list[Any] = []
    lateness: list[int] = []
    for body, pos in seen.items():
        for store_ts, deliver_at in pos.values():
            expected = due.get(body, deliver_at)
            if store_ts < expected:
                early.append((body, expected - store_ts))
            lateness.append(store_ts - expected)
    lateness.sort()
    return {
        "valid": not (lost or twice or recalled_delivered or never_sent or early),
        "acked": len(acked),
        "recalled": len(recalled),
        "delivered": len(seen),
        "lost_count": len(lost),
        "lost": _short(lost),
        "fired_twice_count": len(twice),
        "fired_twice": _short(twice),
        "recalled_but_delivered": _short(recalled_delivered),
        "early_count": len(early),
        "early": _short(early),
        "unexpected": _short(never_sent),
        "lateness_ms_p50": _percentile(lateness, 0.5),
        "lateness_ms_p99": _percentile(lateness, 0.99),
        "lateness_ms_max": lateness[-1] if lateness else None,
    }


def transactions(events: Sequence[Event]) -> dict[str, Any]:
    halves = {inv.value: done for inv, done in pair_operations(e for e in events if e.f == "tx_half")}
    resolved: dict[Any, set[str]] = defaultdict(set)  # body -> resolutions acked
    tried: dict[Any, set[str]] = defaultdict(set)  # body -> resolutions attempted (any outcome)
    for inv, done in pair_operations(e for e in events if e.f == "tx_end"):
        body, resolution = inv.value["body"], inv.value["resolution"]
        tried[body].add(resolution)
        if done is not None and done.type == OK:
            resolved[body].add(resolution)
    seen = _positions(events, "tx_read")
    visible = set(seen)
    half_acked = {b for b, d in halves.items() if d is not None and d.type == OK}
    committed = {b for b, r in resolved.items() if "COMMIT" in r}
    rolled_back = {b for b, r in resolved.items() if "ROLLBACK" in r}
    both = committed & rolled_back
    rolled_back_visible = rolled_back & visible
    never_committed_visible = {b for b in visible if "COMMIT" not in tried[b]}
    committed_lost = (committed & half_acked) - visible
    twice = {b for b, pos in seen.items() if len(pos) > 1}
    return {
        "valid": not (both or rolled_back_visible or never_committed_visible or committed_lost or twice),
        "halves": len(half_acked),
        "committed": len(committed),
        "rolled_back": len(rolled_back),
        "visible": len(visible),
        "committed_and_rolled_back": _short(both),
        "rolled_back_visible": _short(rolled_back_visible),
        "visible_without_commit": _short(never_committed_visible),
        "committed_lost": _short(committed_lost),
        "visible_twice": _short(twice),
    }


def fifo_order(events: Sequence[Event]) -> dict[str, Any]:
    sent: dict[str, set[int]] = defaultdict(set)
    for inv, done in pair_operations(e for e in events if e.f == "fifo_send"):
        if done is not None and done.type == OK:
            sent[inv.value["group"]].add(int(inv.value["seq"]))
    first_ack_invoke: dict[tuple[str, int], int] = {}  # of an ack that did not definitely fail
    for inv, done in pair_operations(e for e in events if e.f == "fifo_ack"):
        if done is None or done.type != FAIL:
            key = (inv.value[0], int(inv.value[1]))
            first_ack_invoke[key] = min(first_ack_invoke.get(key, inv.time_ns), inv.time_ns)
    violations = []
    delivered: dict[str, set[int]] = defaultdict(set)
    for ev in events:
        if ev.f != "fifo_receive" or ev.type != OK:
            continue
        for group, seq in ev.value["messages"]:
            seq = int(seq)
            delivered[group].add(seq)
            for earlier in (s for s in sent[group] if s < seq):
                acked_at = first_ack_invoke.get((group, earlier))
                if acked_at is None or acked_at > ev.time_ns:
                    violations.append((group, earlier, seq))
    undelivered = {(g, s) for g, seqs in sent.items() for s in seqs if s not in delivered[g]}
    return {
        "valid": not violations,
        "groups": len(sent),
        "sent": sum(map(len, sent.values())),
        "violations_count": len(violations),
        "violations": _short(set(violations)),
        "undelivered_count": len(undelivered),
        "undelivered": _short(undelivered),
    }
