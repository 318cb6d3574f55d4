"""The typed exceptions the SDK raises for the error codes of LedgerMQ servers.

The codes, their HTTP status and title are one table shared with the servers
(`wire.codes.ErrorCode`); servers render them as RFC 9457 problem+json (`wire.problem`), and
`error_from_problem` turns such an answer back into the most specific exception here: the class
named for its code, else the class of the code's (or the answer's) HTTP status.
"""

from __future__ import annotations

from typing import Any

from wire.codes import ErrorCode


class LedgerMQError(Exception):
    """Any failure reported by a LedgerMQ server (or reaching it). `problem` is the decoded body.

    What a caller may safely do after a failed send depends on the class (README, "When a send
    fails"): a refusal (4xx, `NotMasterError`, `DiskFullError`) or `BrokerUnreachableError` means
    nothing was stored; `SendOutcomeUnknownError` means it may have been, and says where."""

    code: str = ErrorCode.INTERNAL_ERROR
    retryable = False

    def __init__(self, detail: str, *, status: int | None = None, problem: dict[str, Any] | None = None):
        self.problem = problem or {}
        code = self.problem.get("code")
        if isinstance(code, str) and code:
            # The server's own code (e.g. RECALL_FAILED, a 409 this SDK has no class for), not
            # only its class's: callers branch on `code`.
            self.code = code
        super().__init__(f"{self.code}: {detail}")
        self.detail = detail
        self.status = status


class BadRequestError(LedgerMQError):
    """4xx caused by the request itself; nothing was stored. Retrying the same request will not
    help: fix it (`field` names the offending input)."""

    code = ErrorCode.INVALID_REQUEST

    @property
    def field(self) -> str | None:
        return self.problem.get("field")


class InvalidTopicError(BadRequestError):
    code = ErrorCode.INVALID_TOPIC


class OffsetOutOfRangeError(BadRequestError):
    """The asked offset is outside [minOffset, maxOffset]; both are attributes."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE

    @property
    def min_offset(self) -> int | None:
        return self.problem.get("minOffset")

    @property
    def max_offset(self) -> int | None:
        return self.problem.get("maxOffset")


class InvalidReceiptHandleError(BadRequestError):
    code = ErrorCode.INVALID_RECEIPT_HANDLE


class MessageTooLargeError(BadRequestError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class NotFoundError(LedgerMQError):
    """404: the topic, queue, group or message does not exist (a produce refused so stored nothing)."""

    code = ErrorCode.NOT_FOUND


class TopicNotExistError(NotFoundError):
    code = ErrorCode.TOPIC_NOT_EXIST


class QueueNotExistError(NotFoundError):
    code = ErrorCode.QUEUE_NOT_EXIST


class MessageNotFoundError(NotFoundError):
    code = ErrorCode.MESSAGE_NOT_FOUND


class UnauthorizedError(LedgerMQError):
    """401: no or an unknown token; refused before anything was read. Fix the token."""

    code = ErrorCode.UNAUTHORIZED


class ForbiddenError(LedgerMQError):
    """403: the token (or the topic's perm) does not allow this; refused, nothing stored."""

    code = ErrorCode.FORBIDDEN


class NotMasterError(LedgerMQError):
    """The broker is a slave (or candidate) and refused the write; `master_addr` names the master
    when known. Nothing was stored by the refused request. Raised by a producer only when no
    attempt of the send may have reached a broker: the message can be sent again anywhere."""

    code = ErrorCode.NOT_MASTER
    retryable = True

    @property
    def master_addr(self) -> str | None:
        return self.problem.get("masterAddr")


class ServerError(LedgerMQError):
    """5xx, or an answer the SDK could not read. For a write, the outcome is unknown (the
    producers report such a send as `SendOutcomeUnknownError`)."""

    code = ErrorCode.INTERNAL_ERROR


class ServiceUnavailableError(ServerError):
    """503: the broker is starting, stopping or overloaded. Retry later; for a write, with the same
    idempotency key at the same broker set (a member stopping may have committed it)."""

    code = ErrorCode.SERVICE_UNAVAILABLE
    retryable = True


class DiskFullError(ServerError):
    """507: the broker set's store refused the append before writing: nothing stored."""

    code = ErrorCode.DISK_FULL


class OutcomeUnknownError(ServerError):
    """The request may or may not have taken effect (Jepsen's `:info`): timed out after append,
    before commit, or the connection broke after the request was sent. Retry with the same
    idempotency key at the same broker set to learn the outcome without storing twice."""

    code = ErrorCode.TIMEOUT
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


class ProducerBufferFullError(LedgerMQError):
    """The producer's buffer (`buffer_max_bytes`) stayed full for `max_block_ms`: the message was
    not accepted, nothing of it was sent. Safe: send it again later (anywhere, any key); a full
    buffer means the brokers do not keep up or cannot be reached."""

    code = "BUFFER_FULL"
    retryable = True


class SendTimeoutError(LedgerMQError):
    """A message of the batching producer waited `send_timeout_s` without an attempt that may
    have reached a broker (queued behind a busy queue, or only refused): nothing was stored.
    Safe: send it again, anywhere."""

    code = "SEND_TIMEOUT"
    retryable = True


class ProducerClosedError(LedgerMQError):
    """The producer is closed, or was closed before this message could be sent. Raised by `send`
    after `close()` (nothing sent); given to the messages a `close(timeout)` gave up on (those
    that may have reached a broker get `SendOutcomeUnknownError` instead)."""

    code = "PRODUCER_CLOSED"


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


def _class_of(code: Any, status: int) -> type[LedgerMQError]:
    """The class named for `code`, else the class of its HTTP status (the answer's, for a code
    this SDK does not know): NO_PERMISSION is a 403 so ForbiddenError, TOPIC_EXISTS a 409 so
    BadRequestError, a bare 503 ServiceUnavailableError."""
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is not None:
        return cls
    known = ErrorCode.of(code) if isinstance(code, str) else None
    status = known.status if known is not None else status
    cls = _BY_CODE.get(ErrorCode.for_status(status))
    if cls is not None:
        return cls
    return BadRequestError if 400 <= status < 500 else ServerError


def error_from_problem(status: int, body: Any) -> LedgerMQError:
    """Map an HTTP error answer (ideally problem+json) to the most specific exception."""
    problem = body if isinstance(body, dict) else {}
    detail = str(problem.get("detail") or problem.get("title") or body or f"HTTP {status}")
    return _class_of(problem.get("code"), status)(detail, status=status, problem=problem)
