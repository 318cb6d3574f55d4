"""Pydantic models of the broker HTTP payloads: the OpenAPI description of every route.

Admin routes validate with these directly; the hot routes (produce, pull) decode with orjson in
`codec.py` and enforce the same constraints by hand, and are described here for the OpenAPI."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProduceMessage(_In):
    body: str = Field(description="Text, or base64 when bodyEncoding is base64")
    bodyEncoding: Literal["utf-8", "base64"] = "utf-8"
    tags: str | None = Field(default=None, max_length=255)
    keys: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)
    queueId: int | None = Field(default=None, ge=0, le=65535)
    idempotencyKey: str | None = Field(
        default=None,
        max_length=255,
        description="A repeat within idempotencyWindowMs returns the first result",
    )


class ProduceRequest(_In):
    messages: list[ProduceMessage] = Field(min_length=1, max_length=10_000)


class PutResultOut(BaseModel):
    msgId: str
    queueId: int
    queueOffset: int
    commitLogOffset: int


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
    readQueueNums: int | None = Field(default=None, ge=1, le=1024)
    writeQueueNums: int | None = Field(default=None, ge=1, le=1024)
    perm: int = Field(default=6, ge=0, le=15)


class QueueOut(BaseModel):
    queueId: int
    minOffset: int
    maxOffset: int


class TopicOut(BaseModel):
    topic: str
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
    topic: str = Field(min_length=1, max_length=127)
    offsets: dict[str, int] = Field(description="queueId -> offset")


class ReceiveIn(_In):
    topic: str = Field(min_length=1, max_length=127)
    maxMessages: int = Field(default=16, ge=1, le=1024)
    invisibleMs: int = Field(default=30_000, ge=100, le=12 * 3600 * 1000)
    waitMs: int = Field(default=0, ge=0, le=3_600_000)


class ReceiveOut(BaseModel):
    messages: list[ReceivedMessageOut]


class AckIn(_In):
    topic: str = Field(min_length=1, max_length=127)
    receiptHandles: list[str] = Field(min_length=1, max_length=4096)


class SettleResult(BaseModel):
    receiptHandle: str
    status: Literal["OK", "EXPIRED"]


class SettleOut(BaseModel):
    results: list[SettleResult]


class InvisibleIn(_In):
    topic: str = Field(min_length=1, max_length=127)
    receiptHandle: str = Field(min_length=1, max_length=512)
    invisibleMs: int = Field(ge=0, le=12 * 3600 * 1000)


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
    dledger: dict[str, Any] | None


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
