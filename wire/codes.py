"""`ErrorCode`: every error a LedgerMQ server reports, with its HTTP status and problem title —
the one table. Servers render a code as problem+json (`wire.problem`), the gRPC endpoint maps it
to its own status, the SDK maps it back to a typed exception (`client.errors`). Clients switch on
the code, never on the detail text."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """A problem `code`: the value is the wire string; `.status` the HTTP status; `.title` the
    problem title."""

    status: int
    title: str

    def __new__(cls, value: str, status: int, title: str) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        member.title = title
        return member

    NOT_MASTER = "NOT_MASTER", 421, "This broker is not the master of its broker set"
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST", 404, "Topic does not exist"
    TOPIC_EXISTS = "TOPIC_EXISTS", 409, "Topic already exists"
    INVALID_TOPIC = "INVALID_TOPIC", 400, "Invalid topic name"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE", 413, "Message too large"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL", 400, "Illegal message"
    MESSAGE_NOT_FOUND = "MESSAGE_NOT_FOUND", 404, "Message not found"
    MESSAGE_CORRUPTED = "MESSAGE_CORRUPTED", 500, "Stored message is corrupted"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE", 400, "Offset out of range"
    QUEUE_NOT_EXIST = "QUEUE_NOT_EXIST", 404, "Queue does not exist"
    GROUP_NOT_EXIST = "GROUP_NOT_EXIST", 404, "Consumer group has no state"
    INVALID_RECEIPT_HANDLE = "INVALID_RECEIPT_HANDLE", 400, "Invalid receipt handle"
    NO_PERMISSION = "NO_PERMISSION", 403, "Operation not permitted on this topic"
    DISK_FULL = "DISK_FULL", 507, "Disk full"
    TIMEOUT = "TIMEOUT", 504, "Timed out; the outcome is unknown"
    INVALID_REQUEST = "INVALID_REQUEST", 400, "Invalid request"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE", 413, "Request body too large"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE", 415, "Unsupported media type"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED", 405, "Method not allowed"
    NOT_FOUND = "NOT_FOUND", 404, "Not found"
    UNAUTHORIZED = "UNAUTHORIZED", 401, "Unauthorized"
    FORBIDDEN = "FORBIDDEN", 403, "Forbidden"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE", 503, "Service unavailable"
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT", 408, "Request not received in time"
    INTERNAL_ERROR = "INTERNAL_ERROR", 500, "Internal error"
    # message model (#15); RocketMQ gRPC names in comments
    MESSAGE_TYPE_MISMATCH = (  # MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        "MESSAGE_TYPE_MISMATCH",
        400,
        "Message type does not match the topic's message.type",
    )
    ILLEGAL_FILTER_EXPRESSION = "ILLEGAL_FILTER_EXPRESSION", 400, "Illegal filter expression"
    FILTER_NOT_SUPPORTED = (  # SQL92 while enablePropertyFilter=false
        "FILTER_NOT_SUPPORTED",
        400,
        "Filter type not supported by this broker",
    )
    ILLEGAL_DELIVERY_TIME = "ILLEGAL_DELIVERY_TIME", 400, "Illegal delivery time"
    ILLEGAL_MESSAGE_GROUP = "ILLEGAL_MESSAGE_GROUP", 400, "Illegal message group"
    INVALID_TRANSACTION_ID = "INVALID_TRANSACTION_ID", 400, "Invalid transaction id"
    TRANSACTION_NOT_FOUND = "TRANSACTION_NOT_FOUND", 404, "Transaction not found"
    TRANSACTION_CONFLICT = (  # commit after rollback, or the reverse
        "TRANSACTION_CONFLICT",
        409,
        "Transaction already resolved the other way",
    )
    RECALL_FAILED = "RECALL_FAILED", 409, "Message cannot be recalled"

    @classmethod
    def of(cls, value: str) -> ErrorCode | None:
        """The member whose wire string is `value`, or None for a code this side does not know."""
        return cls._value2member_map_.get(value)  # type: ignore[return-value]

    @classmethod
    def for_status(cls, status: int) -> ErrorCode:
        """The generic code of an HTTP status that came without a code of ours (a framework's
        404/405/415, a proxy's 502): what it means to a client."""
        generic = _GENERIC_BY_STATUS.get(status)
        if generic is not None:
            return generic
        return cls.INVALID_REQUEST if 400 <= status < 500 else cls.INTERNAL_ERROR


# One code per status for answers without a code of ours (the rest of 4xx: INVALID_REQUEST,
# of 5xx: INTERNAL_ERROR).
_GENERIC_BY_STATUS: dict[int, ErrorCode] = {
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.REQUEST_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    421: ErrorCode.NOT_MASTER,
    503: ErrorCode.SERVICE_UNAVAILABLE,
    504: ErrorCode.TIMEOUT,
    507: ErrorCode.DISK_FULL,
}
