"""Pydantic models of the broker HTTP payloads: the OpenAPI description of every route.

Admin routes validate with these directly, and so do receive and ack on the fast path
(`hot.decode_model`); produce and pull decode with orjson in `codec.py` and enforce the same
constraints by hand, and are described here for the OpenAPI."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StringConstraints

from wire.limits import MAX_INVISIBLE_MS, MAX_RECEIVE_MESSAGES, MAX_RECEIVE_WAIT_MS, MIN_INVISIBLE_MS
from wire.names import MAX_TOPIC_LENGTH, TOPIC_PATTERN

# The API's string rules, stated as JSON-schema patterns so the OpenAPI document is exactly as
# strict as the server (fuzzers check both directions).
RECEIPT_HANDLE_PATTERN = r"^[0-9a-f]{8}\.[0-9]{1,5}\.[0-9]{1,19}\.[0-9]{1,19}$"
TopicName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TOPIC_LENGTH, pattern=TOPIC_PATTERN)
]
NoSep = Annotated[str, StringConstraints(pattern=r"^[^\x01\x02]*$")]
# The server also refuses the system names TAGS, KEYS, UNIQ_KEY and IDEMPOTENCY_KEY (pydantic's
# regex dialect has no look-ahead to say so here).
PropertyName = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^\x01\x02]+$")]
MessageKey = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^ \x01\x02]+$")]
QueueIdKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,5}$")]
ReceiptHandle = Annotated[str, StringConstraints(max_length=128, pattern=RECEIPT_HANDLE_PATTERN)]


def _json_int(value: Any) -> Any:
    """JSON-schema integers: 5 and 5.0 are integers; true and "5" are not."""
    if isinstance(value, bool | str):
        raise ValueError("expected an integer")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def IntIn(lo: int, hi: int) -> Any:
    """An integer field in [lo, hi] that takes 3 and 3.0 but not true or "3"."""
    # Constraints first, so they land in the schema as minimum/maximum on the integer itself.
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(_json_int)]


_CLOSED = {"additionalProperties": False}  # pattern-keyed objects admit no other keys


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class ProduceMessage(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"bodyEncoding": {"const": "base64"}}, "required": ["bodyEncoding"]},
            "then": {"properties": {"body": {"pattern": BASE64_PATTERN}}},
        },
    )
    body: str = Field(description="Text, or base64 when bodyEncoding is base64")
    bodyEncoding: Literal["utf-8", "base64"] = "utf-8"
    tags: NoSep | None = Field(default=None, max_length=255)
    keys: list[MessageKey] = Field(default_factory=list)
    properties: dict[PropertyName, NoSep] = Field(default_factory=dict, json_schema_extra=_CLOSED)
    queueId: IntIn(0, 65535) | None = None
    idempotencyKey: NoSep | None = Field(
        default=None,
        max_length=255,
        description="A repeat within idempotencyWindowMs returns the first result",
    )
    deliverAt: IntIn(0, 2**62) | None = Field(default=None, description="Deliver at this time (epoch ms)")
    delayMs: IntIn(0, 2**62) | None = Field(default=None, description="Deliver this many ms from now")
    delayTimeLevel: IntIn(0, 1000) | None = Field(
        default=None, description="RocketMQ 4 delay level (messageDelayLevel; 1-18 by default)"
    )
    messageGroup: NoSep | None = Field(
        default=None, max_length=64, description="FIFO: messages of a group are consumed in order"
    )
    transactional: StrictBool | None = Field(default=None, description="A half message: commit or roll back")
    producerGroup: NoSep | None = Field(default=None, max_length=255, description="Checked back on")


class ProduceRequest(_In):
    messages: list[ProduceMessage] = Field(min_length=1, max_length=10_000)
    firstIdempotencyKey: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")] | None = Field(
        default=None,
        description="The idempotency keys of the messages as one run: message i's key has the same 16 hex "
        "digits of prefix and the last 16 (the counter) plus i. No message may carry its own idempotencyKey",
    )


class PutResultOut(BaseModel):
    msgId: str
    queueId: int
    queueOffset: int
    commitLogOffset: int
    deliverAt: int | None = None
    recallHandle: str | None = None
    transactionId: str | None = None
    messageId: str | None = None


class ProduceResponse(BaseModel):
    results: list[PutResultOut]


class MessageOut(BaseModel):
    msgId: str
    topic: str
    queueId: int
    queueOffset: int
    commitLogOffset: int
    body: str
    bodyEncoding: Literal["utf-8", "base64"]
    tags: str | None = None
    keys: list[str]
    properties: dict[str, str]
    bornTimestamp: int
    storeTimestamp: int
    reconsumeTimes: int = 0
    messageId: str | None = Field(
        default=None, description="Its UNIQ_KEY: the id its producer was answered with (not in pull pages)"
    )
    state: str | None = Field(
        default=None,
        description="GET /messages/{id} of a delayed or transactional message not delivered: "
        "SCHEDULED, RECALLED, DELIVERED (not found in its topic any more), HALF, ROLLED_BACK, "
        "DISCARDED, COMMITTED (idem)",
    )


class ReceivedMessageOut(MessageOut):
    receiptHandle: str


class PullResponse(BaseModel):
    messages: list[MessageOut]
    nextOffset: int
    minOffset: int
    maxOffset: int


class Problem(BaseModel):
    """RFC 9457 problem details with LedgerMQ's stable `code`."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str | None = None
    code: str


class TopicIn(_In):
    readQueueNums: IntIn(1, 1024) | None = None
    writeQueueNums: IntIn(1, 1024) | None = None
    perm: IntIn(0, 15) = 6
    attributes: dict[str, str | None] | None = Field(
        default=None,
        description="RocketMQ 5 topic attributes, merged into the topic's (null removes one): "
        "message.type = NORMAL | FIFO | DELAY | TRANSACTION | MIXED, fixed once the topic exists",
    )


class QueueOut(BaseModel):
    queueId: int
    minOffset: int
    maxOffset: int


class TopicOut(BaseModel):
    topic: str
    attributes: dict[str, str] = Field(default_factory=dict)
    readQueueNums: int
    writeQueueNums: int
    perm: int
    queues: list[QueueOut]


class TopicsOut(BaseModel):
    topics: list[str]


class OffsetRow(BaseModel):
    topic: str
    queueId: int
    offset: int
    maxOffset: int
    lag: int


class GroupOffsetsOut(BaseModel):
    group: str
    offsets: list[OffsetRow]


class OffsetsIn(_In):
    topic: TopicName
    offsets: dict[QueueIdKey, IntIn(0, 2**62)] = Field(
        description="queueId -> offset", json_schema_extra=_CLOSED
    )


class ReceiveIn(_In):
    topic: TopicName
    maxMessages: IntIn(1, MAX_RECEIVE_MESSAGES) = 16
    invisibleMs: IntIn(MIN_INVISIBLE_MS, MAX_INVISIBLE_MS) = 30_000
    waitMs: IntIn(0, MAX_RECEIVE_WAIT_MS) = 0
    filterType: Literal["TAG", "SQL92"] | None = None
    filterExpression: str | None = Field(default=None, max_length=4096)


class ReceiveOut(BaseModel):
    messages: list[ReceivedMessageOut]


class AckIn(_In):
    topic: TopicName
    receiptHandles: list[ReceiptHandle] = Field(min_length=1, max_length=4096)


class SettleResult(BaseModel):
    receiptHandle: str
    status: Literal["OK", "EXPIRED"]


class SettleOut(BaseModel):
    results: list[SettleResult]


class InvisibleIn(_In):
    topic: TopicName
    receiptHandle: ReceiptHandle
    invisibleMs: IntIn(0, MAX_INVISIBLE_MS)


class InvisibleOut(BaseModel):
    receiptHandle: str


class LeadershipTransferIn(_In):
    transfereeId: str = Field(min_length=1, max_length=64)


class StatusOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    clusterName: str
    brokerName: str
    brokerId: int
    brokerAddr: str
    role: Literal["MASTER", "SLAVE"]
    masterAddr: str | None
    diskUsedRatio: float | None = Field(default=None, description="used fraction of the store's disk")
    dledger: dict[str, Any] | None = Field(
        description="DLedger metadata in DLedger mode: role, term, leaderId, committedIndex, "
        "peerWaterMarks and followerLag (entries each follower is behind, on the leader)"
    )


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    s: {"model": Problem, "content": {"application/problem+json": {}}, "description": d}
    for s, d in (
        (400, "Invalid request (code names the problem, field names the input)"),
        (401, "UNAUTHORIZED"),
        (403, "FORBIDDEN / NO_PERMISSION"),
        (404, "TOPIC_NOT_EXIST / QUEUE_NOT_EXIST / MESSAGE_NOT_FOUND"),
        (421, "NOT_MASTER (masterAddr names the master)"),
        (503, "SERVICE_UNAVAILABLE"),
        (504, "TIMEOUT, outcome unknown"),
    )
}


class DlqResendIn(_In):
    """`POST /consumers/{group}/dlq/resend`: dead letters of the group, by message id."""

    msgIds: list[Annotated[str, Field(pattern=r"^[0-9A-Fa-f]{32}$")]] = Field(min_length=1, max_length=100)
