"""Broker error codes: one table mapping each code to its HTTP status and problem title.

The HTTP layer turns a `BrokerError` into an RFC 9457 `application/problem+json` body
(`problem()`), and the SDK maps the `code` field back to the same `BrokerCode`, so the table below
is the single place a code, its status and its title are written.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from dledger.codes import DLedgerException, DLedgerResponseCode

PROBLEM_TYPE_BASE = "https://ledgermq.dev/problems/"


class BrokerCode(StrEnum):
    """Every error the broker reports. Values are the `code` field of a problem body."""

    NOT_MASTER = "NOT_MASTER"
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST"
    TOPIC_EXISTS = "TOPIC_EXISTS"
    INVALID_TOPIC = "INVALID_TOPIC"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    MESSAGE_NOT_FOUND = "MESSAGE_NOT_FOUND"
    MESSAGE_CORRUPTED = "MESSAGE_CORRUPTED"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
    QUEUE_NOT_EXIST = "QUEUE_NOT_EXIST"
    NO_PERMISSION = "NO_PERMISSION"
    DISK_FULL = "DISK_FULL"
    TIMEOUT = "TIMEOUT"
    INVALID_REQUEST = "INVALID_REQUEST"
    UNAUTHORIZED = "UNAUTHORIZED"
    FORBIDDEN = "FORBIDDEN"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"


# code -> (HTTP status, problem title). Written once; used by the HTTP app and the SDK.
ERROR_TABLE: dict[BrokerCode, tuple[int, str]] = {
    BrokerCode.NOT_MASTER: (421, "This broker is not the master of its broker set"),
    BrokerCode.TOPIC_NOT_EXIST: (404, "Topic does not exist"),
    BrokerCode.TOPIC_EXISTS: (409, "Topic already exists"),
    BrokerCode.INVALID_TOPIC: (400, "Invalid topic name"),
    BrokerCode.MESSAGE_TOO_LARGE: (413, "Message too large"),
    BrokerCode.MESSAGE_ILLEGAL: (400, "Illegal message"),
    BrokerCode.MESSAGE_NOT_FOUND: (404, "Message not found"),
    BrokerCode.MESSAGE_CORRUPTED: (500, "Stored message is corrupted"),
    BrokerCode.OFFSET_OUT_OF_RANGE: (400, "Offset out of range"),
    BrokerCode.QUEUE_NOT_EXIST: (404, "Queue does not exist"),
    BrokerCode.NO_PERMISSION: (403, "Operation not permitted on this topic"),
    BrokerCode.DISK_FULL: (507, "Disk full"),
    BrokerCode.TIMEOUT: (504, "Timed out; the outcome is unknown"),
    BrokerCode.INVALID_REQUEST: (400, "Invalid request"),
    BrokerCode.UNAUTHORIZED: (401, "Unauthorized"),
    BrokerCode.FORBIDDEN: (403, "Forbidden"),
    BrokerCode.SERVICE_UNAVAILABLE: (503, "Service unavailable"),
    BrokerCode.INTERNAL_ERROR: (500, "Internal error"),
}
assert set(ERROR_TABLE) == set(BrokerCode), "every BrokerCode needs a row in ERROR_TABLE"


class BrokerError(Exception):
    """A broker failure with a code, a human detail and optional extra problem fields
    (e.g. `masterAddr` for NOT_MASTER, `minOffset`/`maxOffset` for OFFSET_OUT_OF_RANGE)."""

    def __init__(self, code: BrokerCode | str, detail: str = "", **extra: Any) -> None:
        self.code = BrokerCode(code)
        self.detail = detail
        self.extra = extra
        super().__init__(f"{self.code.value}: {detail}" if detail else self.code.value)

    @property
    def status(self) -> int:
        """HTTP status of this error."""
        return ERROR_TABLE[self.code][0]

    @property
    def title(self) -> str:
        return ERROR_TABLE[self.code][1]

    def problem(self) -> dict[str, Any]:
        """The RFC 9457 problem body (extra fields merged at top level, None values dropped)."""
        body: dict[str, Any] = {
            "type": PROBLEM_TYPE_BASE + self.code.value,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code.value,
        }
        body.update({k: v for k, v in self.extra.items() if v is not None})
        return body


def invalid(field: str, detail: str) -> BrokerError:
    """BrokerError(INVALID_REQUEST) naming the offending field."""
    return BrokerError(BrokerCode.INVALID_REQUEST, f"{field}: {detail}", field=field)


# DLedger failures that can surface through the store on the produce path.
_DLEDGER_MAP: dict[DLedgerResponseCode, BrokerCode] = {
    DLedgerResponseCode.NOT_LEADER: BrokerCode.NOT_MASTER,
    DLedgerResponseCode.LEADER_TRANSFERRING: BrokerCode.NOT_MASTER,
    DLedgerResponseCode.LEADER_NOT_READY: BrokerCode.SERVICE_UNAVAILABLE,
    DLedgerResponseCode.LEADER_PENDING_FULL: BrokerCode.SERVICE_UNAVAILABLE,
    DLedgerResponseCode.DISK_FULL: BrokerCode.DISK_FULL,
    DLedgerResponseCode.WAIT_QUORUM_ACK_TIMEOUT: BrokerCode.TIMEOUT,
    DLedgerResponseCode.TERM_CHANGED: BrokerCode.TIMEOUT,
    DLedgerResponseCode.TIMEOUT: BrokerCode.TIMEOUT,
}


def from_dledger(exc: DLedgerException) -> BrokerError:
    """The BrokerError a front-end reports for a DLedger failure that reached it."""
    code = _DLEDGER_MAP.get(exc.code, BrokerCode.SERVICE_UNAVAILABLE)
    extra: dict[str, Any] = {}
    if code == BrokerCode.TIMEOUT:
        extra["outcome"] = "unknown"
    return BrokerError(code, f"dledger {exc.code.name}: {exc.detail}", **extra)
