"""`TransactionTable`: the transactional-message state every member derives from the log.

A transaction starts with a **half message** in `RMQ_SYS_TRANS_HALF_TOPIC` (invisible to consumers;
its properties name the real topic and queue, the producer group and the transaction id). It ends
with one **op record** in `RMQ_SYS_TRANS_OP_HALF_TOPIC`:

    {"op": "end", "txid", "outcome": "COMMIT"|"ROLLBACK"|"DISCARD", "fromCheck": bool, "atMs"}
        COMMIT is written in the same log entry as the real message, so a failover can never
        show the message without the commit or the commit without the message;
    {"op": "checks", "times": {txid: n, ...}, "atMs"}
        one check round: the master asked each transaction's producer group for the n-th time
        (so `transactionCheckMax` holds across failovers: a new master carries on counting).

State per transaction: OPEN → COMMITTED | ROLLED_BACK | DISCARDED, never back. The first end
record wins; a later one for the same id (a race across a failover, or a replayed record) changes
nothing, so EndTransaction is idempotent: a repeated commit answers with the first outcome, a
rollback after a commit (or the reverse) is a conflict. `atMs` is the master's clock when it wrote
the record; members never read their own clock here.

Plain state, no I/O. Callers: the dispatcher (`add_half` from the half queue, `apply_record` from
op records, on every member, log order), the transaction service on the master (`get`,
`due_checks`, `low_water_mark`, `prune`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)


class TransactionState(StrEnum):
    OPEN = "OPEN"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"


class Resolution(StrEnum):
    """What a producer (or the check service) decides: RocketMQ's commitOrRollback."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    DISCARD = "DISCARD"  # the broker gave up after transactionCheckMax checks


OUTCOME_STATE = {Resolution.COMMIT: TransactionState.COMMITTED,
                 Resolution.ROLLBACK: TransactionState.ROLLED_BACK,
                 Resolution.DISCARD: TransactionState.DISCARDED}


@dataclass(slots=True)
class HalfMessage:
    """One transaction as the log has it."""

    txid: str
    offset: int  # in the half queue
    phys: int
    size: int
    producer_group: str
    topic: str
    store_ms: int
    immunity_ms: int = 0  # CHECK_IMMUNITY_TIME_IN_SECONDS: no check before this age
    state: TransactionState = TransactionState.OPEN
    check_times: int = 0
    last_check_ms: int = 0
    resolved_ms: int = 0
    from_check: bool = False


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """One round of the check service: whom to ask, what to give up on."""

    check: list[HalfMessage]
    discard: list[HalfMessage]


class TransactionTable:
    """Transactions by id (open ones, and resolved ones until pruned)."""

    def __init__(self) -> None:
        self._by_id: dict[str, HalfMessage] = {}
        self._open: dict[str, HalfMessage] = {}  # the OPEN ones (what the check rounds walk)
        # Op records met before their half: at start the op records are replayed before the half
        # queue is scanned. Those whose half is never found (below the scan's start) are dropped.
        self._early: dict[str, list[dict[str, Any]]] = {}

    # ---- the log (every member, log order) ---------------------------------------------------

    def add_half(self, half: HalfMessage) -> None:
        """A half message was applied (or found in the half queue at start)."""
        if half.txid in self._by_id:
            return  # the same half seen by the start-up scan and the dispatcher
        self._by_id[half.txid] = half
        if half.state is TransactionState.OPEN:
            self._open[half.txid] = half
        for record in self._early.pop(half.txid, ()):
            self.apply_record(record)

    def drop_unmatched(self) -> int:
        """After the start-up scan: forget op records whose half was not found (resolved long
        ago, below the scan's start). Returns how many transactions that was."""
        n = len(self._early)
        self._early.clear()
        return n

    def apply_record(self, record: dict[str, Any]) -> None:
        """Apply one op record."""
        if record.get("op") == "checks":  # one round's checks: one record, many transactions
            times, at = record.get("times"), record.get("atMs", 0)
            if not isinstance(times, dict):
                log.error("event=bad_transaction_record record=%r", record)
                return
            for txid, n in times.items():
                self.apply_record({"op": "check", "txid": txid, "times": n, "atMs": at})
            return
        try:
            op, txid = record["op"], str(record["txid"])
            half = self._by_id.get(txid)
            if half is None:
                self._early.setdefault(txid, []).append(record)
                return
            if op == "check":
                if half.state is TransactionState.OPEN:
                    half.check_times = max(half.check_times, int(record["times"]))
                    half.last_check_ms = int(record["atMs"])
            elif op == "end":
                if half.state is not TransactionState.OPEN:
                    return  # the first end wins
                half.state = OUTCOME_STATE[Resolution(record["outcome"])]
                self._open.pop(txid, None)
                half.resolved_ms = int(record.get("atMs", 0))
                half.from_check = bool(record.get("fromCheck", False))
            else:
                log.error("event=bad_transaction_record reason=unknown_op record=%r", record)
        except (KeyError, TypeError, ValueError):
            log.error("event=bad_transaction_record record=%r", record)

    # ---- the master --------------------------------------------------------------------------

    def get(self, txid: str) -> HalfMessage | None:
        return self._by_id.get(txid)

    def open_count(self) -> int:
        return len(self._open)

    def due_checks(self, now_ms: int, timeout_ms: int, interval_ms: int, check_max: int) -> CheckPlan:
        """Open transactions to ask about now (older than `timeout_ms`, or their immunity, and not
        asked within `interval_ms`), and those asked `check_max` times already (to discard)."""
        check: list[HalfMessage] = []
        discard: list[HalfMessage] = []
        for half in self._open.values():
            if now_ms - half.store_ms < max(timeout_ms, half.immunity_ms):
                continue
            if half.last_check_ms and now_ms - half.last_check_ms < interval_ms:
                continue
            (discard if half.check_times >= check_max else check).append(half)
        return CheckPlan(check, discard)

    def low_water_mark(self, next_offset: int) -> int:
        """The lowest half-queue offset still open (`next_offset` if none is)."""
        return min((h.offset for h in self._open.values()), default=next_offset)

    def prune(self, before_offset: int, resolved_before_ms: int) -> int:
        """Forget resolved transactions below `before_offset` resolved before `resolved_before_ms`
        (a late repeated end for them then answers TRANSACTION_NOT_FOUND). Returns how many."""
        gone = [t for t, h in self._by_id.items() if h.state is not TransactionState.OPEN
                and h.offset < before_offset and h.resolved_ms < resolved_before_ms]
        for t in gone:
            del self._by_id[t]
        return len(gone)

    def __len__(self) -> int:
        return len(self._by_id)

    # ---- snapshot (the store's in-log state snapshots) ----------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Every transaction known (each half's place and the op records' outcome and counts):
        a snapshot replaces the op records before it, and the halves below the oldest open one
        are not read again at start."""
        return {"tx": {t: [h.state.value, h.check_times, h.last_check_ms, h.resolved_ms, h.from_check,
                           h.offset, h.phys, h.size, h.producer_group, h.topic, h.store_ms, h.immunity_ms]
                       for t, h in self._by_id.items()}}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Replace the whole state by a snapshot's."""
        self._early.clear()
        self._by_id.clear()
        self._open.clear()
        for txid, row in snapshot.get("tx", {}).items():
            state, times, last, resolved, from_check, offset, phys, size, group, topic, store_ms, immune = row
            half = HalfMessage(txid, offset, phys, size, group, topic, store_ms, immune,
                               TransactionState(state), times, last, resolved, from_check)
            self._by_id[txid] = half
            if half.state is TransactionState.OPEN:
                self._open[txid] = half
