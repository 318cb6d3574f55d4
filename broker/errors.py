"""`BrokerError`: a broker failure as the services raise it — a code of the one shared table
(`wire.codes.ErrorCode`, here also named `BrokerCode`), a human detail and extra problem members.
Each front-end renders it its own way (problem+json over HTTP, a status over gRPC).

`from_dledger` is the one mapping of DLedger failures to broker errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dledger.codes import DLedgerException, DLedgerResponseCode
from wire.codes import ErrorCode
from wire.problem import problem_body

# The broker's name for the shared codes (one table: wire/codes.py).
BrokerCode = ErrorCode


class BrokerError(Exception):
    """A broker failure with a code, a human detail and optional extra problem fields
    (e.g. `masterAddr` for NOT_MASTER, `minOffset`/`maxOffset` for OFFSET_OUT_OF_RANGE)."""

    def __init__(self, code: ErrorCode | str, detail: str = "", **extra: Any) -> None:
        self.code = ErrorCode(code)
        self.detail = detail
        self.extra = extra
        super().__init__(f"{self.code.value}: {detail}" if detail else self.code.value)

    @property
    def status(self) -> int:
        """HTTP status of this error."""
        return self.code.status

    @property
    def title(self) -> str:
        return self.code.title

    def problem(self) -> dict[str, Any]:
        """The RFC 9457 problem body (extra fields merged at top level, None values dropped)."""
        return problem_body(self.code, self.detail, **self.extra)


def invalid(field: str, detail: str) -> BrokerError:
    """BrokerError(INVALID_REQUEST) naming the offending field."""
    return BrokerError(BrokerCode.INVALID_REQUEST, f"{field}: {detail}", field=field)


_E = DLedgerResponseCode
# The member is not (or no longer) the leader: send the write to the master.
_NOT_MASTER = frozenset({_E.NOT_LEADER, _E.LEADER_TRANSFERRING, _E.INCONSISTENT_LEADER})
# Refused before anything was appended: retry (here, shortly).
_REFUSED = frozenset({_E.LEADER_NOT_READY, _E.LEADER_PENDING_FULL})
# Appended, maybe replicated, not confirmed by a majority: the outcome is unknown.
_OUTCOME_UNKNOWN = frozenset({_E.WAIT_QUORUM_ACK_TIMEOUT, _E.TERM_CHANGED, _E.TIMEOUT, _E.NETWORK_ERROR})


def from_dledger(exc: DLedgerException, not_master: Callable[[], BrokerError] | None = None) -> BrokerError:
    """The broker error for a DLedger failure. `not_master()` makes the NOT_MASTER answer (naming
    the master, or DISK_FULL when the leader's disk is the cause); without it, a plain NOT_MASTER.

    LEADER_NOT_READY is a refusal, not a redirect: the member IS the leader (its no-op entry of
    the new term is not in yet), so NOT_MASTER would name this very broker and send the client
    round in a circle; 503 with outcome "refused" says: nothing stored, retry shortly.
    NETWORK_ERROR is an unknown outcome, not a refusal: an append may have reached a follower
    before the connection broke, so a retry must carry the same idempotency key."""
    code = exc.code
    if code in _NOT_MASTER:
        if not_master is None:
            return BrokerError(BrokerCode.NOT_MASTER, f"DLedger: {code.name}")
        err = not_master()
        err.detail = f"{err.detail} (DLedger: {code.name})"
        return err
    if code in _OUTCOME_UNKNOWN:
        return BrokerError(
            BrokerCode.TIMEOUT,
            f"not confirmed by a majority ({code.name}); the outcome is unknown: retry with the same "
            "idempotency key",
            outcome="unknown",
        )
    if code == _E.DISK_FULL:
        return BrokerError(BrokerCode.DISK_FULL, f"DLedger store refused the append: {exc.detail}")
    if code == _E.LEADER_PENDING_FULL:
        return BrokerError(
            BrokerCode.SERVICE_UNAVAILABLE, "too many appends pending; retry later", outcome="refused"
        )
    if code in _REFUSED:
        return BrokerError(
            BrokerCode.SERVICE_UNAVAILABLE,
            f"the leader is not ready for appends yet ({code.name}); retry shortly",
            outcome="refused",
        )
    return BrokerError(BrokerCode.INTERNAL_ERROR, f"DLedger append failed: {exc}")
