"""Statuses of the gRPC endpoint: the broker's one error vocabulary (`BrokerCode`) rendered as
rocketmq-apis `Code`s, as `problem()` renders it for HTTP.

RocketMQ clients act on the code's class (`messaging_result_checker`): 400xx is a bad request,
40100/40300 auth, 404xx not found (MESSAGE_NOT_FOUND is *success*, "nothing to receive", so no
error maps to it), 413xx too large, 42900 stops the producer's retries, 5xxxx are retried on
the next queue. Code 0 is never sent.
"""

from __future__ import annotations

from broker.errors import BrokerCode, BrokerError
from broker.grpc.protocol import Code, Status

# BrokerCode -> rocketmq-apis Code. Written once; every RPC renders its errors through it.
CODE_TABLE: dict[BrokerCode, int] = {
    # A slave that cannot forward (master unknown mid-election): a server-side condition the
    # clients retry on another queue, as for RocketMQ's SLAVE_NOT_AVAILABLE.
    BrokerCode.NOT_MASTER: Code.HA_NOT_AVAILABLE,
    BrokerCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    BrokerCode.TOPIC_EXISTS: Code.BAD_REQUEST,
    BrokerCode.INVALID_TOPIC: Code.ILLEGAL_TOPIC,
    BrokerCode.MESSAGE_TOO_LARGE: Code.MESSAGE_BODY_TOO_LARGE,
    BrokerCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    # Settling a handle no longer in flight: the only place the services raise it for a
    # client's input. MESSAGE_NOT_FOUND would read as success to the clients.
    BrokerCode.MESSAGE_NOT_FOUND: Code.INVALID_RECEIPT_HANDLE,
    BrokerCode.MESSAGE_CORRUPTED: Code.INTERNAL_SERVER_ERROR,
    BrokerCode.OFFSET_OUT_OF_RANGE: Code.ILLEGAL_OFFSET,
    BrokerCode.QUEUE_NOT_EXIST: Code.NOT_FOUND,
    BrokerCode.NO_PERMISSION: Code.FORBIDDEN,
    BrokerCode.DISK_FULL: Code.INTERNAL_SERVER_ERROR,
    # The append's outcome is unknown; the client's retry carries the same message id, which is
    # the idempotency key, so it is never stored twice.
    BrokerCode.TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    BrokerCode.INVALID_REQUEST: Code.BAD_REQUEST,
    BrokerCode.UNAUTHORIZED: Code.UNAUTHORIZED,
    BrokerCode.FORBIDDEN: Code.FORBIDDEN,
    BrokerCode.SERVICE_UNAVAILABLE: Code.TOO_MANY_REQUESTS,
    BrokerCode.INTERNAL_ERROR: Code.INTERNAL_SERVER_ERROR,
    # Codes of the shared table the HTTP front-ends answer on their own (a body over the request
    # limit, a framework's 404/405/415) or the SDK knows: never raised by a service today.
    BrokerCode.GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    BrokerCode.INVALID_RECEIPT_HANDLE: Code.INVALID_RECEIPT_HANDLE,
    BrokerCode.REQUEST_TOO_LARGE: Code.PAYLOAD_TOO_LARGE,
    BrokerCode.UNSUPPORTED_MEDIA_TYPE: Code.BAD_REQUEST,
    BrokerCode.METHOD_NOT_ALLOWED: Code.BAD_REQUEST,
    BrokerCode.NOT_FOUND: Code.NOT_FOUND,
    BrokerCode.REQUEST_TIMEOUT: Code.REQUEST_TIMEOUT,  # written by the HTTP listener (listener/guard.py)
    # The message model (#15): rocketmq-apis has a code for each.
    BrokerCode.MESSAGE_TYPE_MISMATCH: Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    BrokerCode.ILLEGAL_FILTER_EXPRESSION: Code.ILLEGAL_FILTER_EXPRESSION,
    BrokerCode.FILTER_NOT_SUPPORTED: Code.UNSUPPORTED,
    BrokerCode.ILLEGAL_DELIVERY_TIME: Code.ILLEGAL_DELIVERY_TIME,
    BrokerCode.ILLEGAL_MESSAGE_GROUP: Code.ILLEGAL_MESSAGE_GROUP,
    BrokerCode.INVALID_TRANSACTION_ID: Code.INVALID_TRANSACTION_ID,
    BrokerCode.TRANSACTION_NOT_FOUND: Code.NOT_FOUND,
    BrokerCode.TRANSACTION_CONFLICT: Code.PRECONDITION_FAILED,
    BrokerCode.RECALL_FAILED: Code.PRECONDITION_FAILED,
}

# A few INVALID_REQUEST fields have a precise code of their own.
_FIELD_CODES = {
    "receiptHandle": Code.INVALID_RECEIPT_HANDLE,
    "receiptHandles": Code.INVALID_RECEIPT_HANDLE,
    "invisibleMs": Code.ILLEGAL_INVISIBLE_TIME,
    "tags": Code.ILLEGAL_MESSAGE_TAG,
    "keys": Code.ILLEGAL_MESSAGE_KEY,
    "properties": Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
    "group": Code.ILLEGAL_CONSUMER_GROUP,
    "messageId": Code.ILLEGAL_MESSAGE_ID,
    "longPollingTimeout": Code.ILLEGAL_POLLING_TIME,
    "waitMs": Code.ILLEGAL_POLLING_TIME,
}

OK = Status(code=Code.OK, message="OK")


def status(code: int, message: str) -> Status:
    """A Status message (never code 0)."""
    return Status(code=code or Code.INTERNAL_SERVER_ERROR, message=message)


def code_for(exc: BrokerError) -> int:
    """The rocketmq-apis code of a broker error (a field-specific one for INVALID_REQUEST)."""
    if exc.code == BrokerCode.INVALID_REQUEST:
        name = str(exc.extra.get("field") or "")
        for key, code in _FIELD_CODES.items():
            if name == key or name.startswith(key + "[") or name.endswith("." + key) or f".{key}[" in name:
                return code
    return CODE_TABLE.get(exc.code, Code.INTERNAL_SERVER_ERROR)


def error_status(exc: BrokerError) -> Status:
    """The Status a response carries for `exc`: its code and its detail (or title)."""
    return status(code_for(exc), exc.detail or exc.title)
