"""The SDK's table of LedgerMQ HTTP error codes (mirrors broker/errors.py ERROR_TABLE; the name
server renders from it too), and the typed exceptions the SDK raises for them.

Servers (broker HTTP app, name server) render a code as an RFC 9457 `application/problem+json` body
with `problem_body`; the SDK turns such a body back into an exception with `error_from_problem`.
Both sides read `PROBLEM_CODES`, so a code, its HTTP status and its exception class are written once.
"""

from __future__ import annotations

from typing import Any

PROBLEM_TYPE_BASE = "https://ledgermq.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"

# code -> (HTTP status, title). Stable: clients switch on `code`, never on `detail`.
PROBLEM_CODES: dict[str, tuple[int, str]] = {
    "NOT_MASTER": (421, "This broker is not the master"),
    "TOPIC_NOT_EXIST": (404, "Topic does not exist"),
    "QUEUE_NOT_EXIST": (404, "Queue does not exist"),
    "MESSAGE_NOT_FOUND": (404, "Message not found"),
    "GROUP_NOT_EXIST": (404, "Consumer group has no state"),
    "NOT_FOUND": (404, "Not found"),
    "INVALID_TOPIC": (400, "Invalid topic name"),
    "INVALID_REQUEST": (400, "Invalid request"),
    "INVALID_RECEIPT_HANDLE": (400, "Invalid receipt handle"),
    "OFFSET_OUT_OF_RANGE": (400, "Offset out of range"),
    "MESSAGE_TOO_LARGE": (413, "Message too large"),
    "REQUEST_TOO_LARGE": (413, "Request body too large"),
    "UNSUPPORTED_MEDIA_TYPE": (415, "Unsupported media type"),
    "METHOD_NOT_ALLOWED": (405, "Method not allowed"),
    "NO_PERMISSION": (403, "Topic permission forbids this operation"),
    "UNAUTHORIZED": (401, "Missing or unknown access token"),
    "FORBIDDEN": (403, "Access token does not allow this operation"),
    "DISK_FULL": (507, "Disk full"),
    "TIMEOUT": (504, "Timed out; outcome unknown"),
    "SERVICE_UNAVAILABLE": (503, "Service unavailable"),
    "INTERNAL_ERROR": (500, "Internal error"),
    "TOPIC_EXISTS": (409, "Topic already exists"),
    "MESSAGE_ILLEGAL": (400, "Illegal message"),
    "MESSAGE_CORRUPTED": (500, "Stored message is corrupted"),
}


def problem_body(code: str, detail: str, status: int | None = None, **extra: Any) -> dict[str, Any]:
    """The problem+json document for `code`; `extra` members (e.g. masterAddr, field) are added as-is."""
    default_status, title = PROBLEM_CODES.get(code, (500, code.replace("_", " ").capitalize()))
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": title,
        "status": status or default_status,
        "detail": detail,
        "code": code,
    }
    for key, value in extra.items():
        if value is not None:
            body[key] = value
    return body


class LedgerMQError(Exception):
    """Any failure reported by a LedgerMQ server (or reaching it). `problem` is the decoded body.

    What a caller may safely do after a failed send depends on the class (README, "When a send
    fails"): a refusal (4xx, `NotMasterError`, `DiskFullError`) or `BrokerUnreachableError` means
    nothing was stored; `SendOutcomeUnknownError` means it may have been, and says where."""

    code = "INTERNAL_ERROR"
    retryable = False

    def __init__(self, detail: str, *, status: int | None = None, problem: dict[str, Any] | None = None):
        super().__init__(f"{self.code}: {detail}")
        self.detail = detail
        self.status = status
        self.problem = problem or {}


class BadRequestError(LedgerMQError):
    """4xx caused by the request itself; nothing was stored. Retrying the same request will not
    help: fix it (`field` names the offending input)."""

    code = "INVALID_REQUEST"

    @property
    def field(self) -> str | None:
        return self.problem.get("field")


class InvalidTopicError(BadRequestError):
    code = "INVALID_TOPIC"


class OffsetOutOfRangeError(BadRequestError):
    """The asked offset is outside [minOffset, maxOffset]; both are attributes."""

    code = "OFFSET_OUT_OF_RANGE"

    @property
    def min_offset(self) -> int | None:
        return self.problem.get("minOffset")

    @property
    def max_offset(self) -> int | None:
        return self.problem.get("maxOffset")


class InvalidReceiptHandleError(BadRequestError):
    code = "INVALID_RECEIPT_HANDLE"


class MessageTooLargeError(BadRequestError):
    code = "MESSAGE_TOO_LARGE"


class NotFoundError(LedgerMQError):
    """404: the topic, queue, group or message does not exist (a produce refused so stored nothing)."""

    code = "NOT_FOUND"


class TopicNotExistError(NotFoundError):
    code = "TOPIC_NOT_EXIST"


class QueueNotExistError(NotFoundError):
    code = "QUEUE_NOT_EXIST"


class MessageNotFoundError(NotFoundError):
    code = "MESSAGE_NOT_FOUND"


class UnauthorizedError(LedgerMQError):
    """401: no or an unknown token; refused before anything was read. Fix the token."""

    code = "UNAUTHORIZED"


class ForbiddenError(LedgerMQError):
    """403: the token (or the topic's perm) does not allow this; refused, nothing stored."""

    code = "FORBIDDEN"


class NotMasterError(LedgerMQError):
    """The broker is a slave (or candidate) and refused the write; `master_addr` names the master
    when known. Nothing was stored by the refused request. Raised by a producer only when no
    attempt of the send may have reached a broker: the message can be sent again anywhere."""

    code = "NOT_MASTER"
    retryable = True

    @property
    def master_addr(self) -> str | None:
        return self.problem.get("masterAddr")


class ServerError(LedgerMQError):
    """5xx, or an answer the SDK could not read. For a write, the outcome is unknown (the
    producers report such a send as `SendOutcomeUnknownError`)."""

    code = "INTERNAL_ERROR"


class ServiceUnavailableError(ServerError):
    """503: the broker is starting, stopping or overloaded. Retry later; for a write, with the same
    idempotency key at the same broker set (a member stopping may have committed it)."""

    code = "SERVICE_UNAVAILABLE"
    retryable = True


class DiskFullError(ServerError):
    """507: the broker set's store refused the append before writing: nothing stored."""

    code = "DISK_FULL"


class OutcomeUnknownError(ServerError):
    """The request may or may not have taken effect (Jepsen's `:info`): timed out after append,
    before commit, or the connection broke after the request was sent. Retry with the same
    idempotency key at the same broker set to learn the outcome without storing twice."""

    code = "TIMEOUT"
    retryable = True


class SendOutcomeUnknownError(OutcomeUnknownError):
    """A send failed after at least one attempt may have reached broker set `broker_name`
    (a timeout, a connection broken after the request was written, a 5xx), whatever the later
    attempts saw: the messages may be stored there, once.

    Safe: send them again to the same set with the same keys, before the broker's idempotency
    window (`idempotencyWindowMs`, 5 min) ends — `producer.send_batch(err.topic, err.messages,
    broker_name=err.broker_name)` — which answers the first results if they were stored and stores
    them once otherwise. Not safe: sending them to another set, or with new keys (a second
    copy if the first was stored). `messages` carry the keys and queue ids they were sent with;
    `cause` is the last attempt's error."""

    code = "SEND_OUTCOME_UNKNOWN"
    retryable = True

    def __init__(
        self,
        detail: str,
        *,
        topic: str,
        broker_name: str,
        messages: list[Any],
        cause: LedgerMQError,
    ) -> None:
        super().__init__(detail, status=cause.status, problem=cause.problem)
        self.topic = topic
        self.broker_name = broker_name
        self.messages = messages
        self.cause = cause

    @property
    def idempotency_keys(self) -> list[str]:
        """The keys of the send's messages, in order."""
        return [m.idempotency_key for m in self.messages]

    @property
    def idempotency_key(self) -> str:
        """The key of the first (for `send`: the only) message."""
        return self.messages[0].idempotency_key


class BrokerUnreachableError(LedgerMQError):
    """No broker or name server answered: every connection failed before any byte of the request
    was sent (refused, reset or timed out while connecting, no address). Nothing reached a server.
    A producer raises it for a send only when no attempt of it may have reached a broker, so the
    message can be sent again anywhere, even to another broker set or with a new key."""

    code = "UNREACHABLE"
    retryable = True


_BY_CODE: dict[str, type[LedgerMQError]] = {
    cls.code: cls
    for cls in (
        BadRequestError,
        InvalidTopicError,
        OffsetOutOfRangeError,
        InvalidReceiptHandleError,
        MessageTooLargeError,
        NotFoundError,
        TopicNotExistError,
        QueueNotExistError,
        MessageNotFoundError,
        UnauthorizedError,
        ForbiddenError,
        NotMasterError,
        ServerError,
        ServiceUnavailableError,
        DiskFullError,
        OutcomeUnknownError,
    )
}
_BY_CODE["GROUP_NOT_EXIST"] = NotFoundError
_BY_CODE["NO_PERMISSION"] = ForbiddenError
_BY_CODE["UNSUPPORTED_MEDIA_TYPE"] = BadRequestError
_BY_CODE["METHOD_NOT_ALLOWED"] = BadRequestError
_BY_CODE["TOPIC_EXISTS"] = BadRequestError
_BY_CODE["MESSAGE_ILLEGAL"] = BadRequestError


def error_from_problem(status: int, body: Any) -> LedgerMQError:
    """Map an HTTP error answer (ideally problem+json) to the most specific exception."""
    problem = body if isinstance(body, dict) else {}
    code = problem.get("code")
    detail = str(problem.get("detail") or problem.get("title") or body or f"HTTP {status}")
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        if status == 421:
            cls = NotMasterError
        elif status == 404:
            cls = NotFoundError
        elif status == 401:
            cls = UnauthorizedError
        elif status == 403:
            cls = ForbiddenError
        elif status == 504:
            cls = OutcomeUnknownError
        elif status == 503:
            cls = ServiceUnavailableError
        elif 400 <= status < 500:
            cls = BadRequestError
        else:
            cls = ServerError
    return cls(detail, status=status, problem=problem)
