"""The message model's routes (issue 15): transaction end and check-back, timer recall, consumer-group
settings. Each parses, calls the message-model services (`broker/message_model.py`) and renders."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.responses import Response

from broker.http.acl import account_of
from broker.http.codec import message_json
from broker.http.schemas import PROBLEM_RESPONSES, TOPIC_PATTERN, IntIn
from broker.service import BrokerServices
from broker.subscription import MAX_RETRY_TIMES

TopicPath = Annotated[str, Path(min_length=1, max_length=127, pattern=TOPIC_PATTERN)]
GroupPath = Annotated[str, Path(min_length=1, max_length=127, pattern=r"^[%|a-zA-Z0-9_-]{1,127}$")]
TxPath = Annotated[str, Path(min_length=1, max_length=128)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndTransactionIn(_In):
    producerGroup: str | None = Field(default=None, max_length=255)
    fromTransactionCheck: StrictBool = False


class TransactionOut(BaseModel):
    transactionId: str
    state: str


class RecallIn(_In):
    recallHandle: str = Field(min_length=1, max_length=1024)


class RecallOut(BaseModel):
    messageId: str
    status: str


class GroupConfigIn(_In):
    retryMaxTimes: IntIn(0, MAX_RETRY_TIMES) | None = None
    retryPolicy: dict[str, Any] | None = None
    consumeMessageOrderly: StrictBool | None = None


def _json(doc: Any) -> Response:
    return Response(orjson.dumps(doc), media_type="application/json")


def build_router(services: BrokerServices) -> APIRouter:
    """The message model's routes of one broker."""
    router = APIRouter()
    model = services.message_model

    async def end(
        topic: str, transaction_id: str, resolution: str, body: EndTransactionIn | None, request: Request
    ) -> Response:
        body = body or EndTransactionIn()
        state = await model.end_transaction(
            account_of(request),
            topic,
            transaction_id,
            resolution,
            producer_group=body.producerGroup,
            from_check=body.fromTransactionCheck,
        )
        return _json({"transactionId": transaction_id, "state": state.value})

    @router.post(
        "/topics/{topic}/transactions/{transaction_id}/commit",
        tags=["transactions"],
        response_model=TransactionOut,
        responses=PROBLEM_RESPONSES,
        summary="Commit a transactional message: it becomes visible (idempotent)",
    )
    async def commit(
        topic: TopicPath, transaction_id: TxPath, request: Request, body: EndTransactionIn | None = None
    ) -> Response:
        return await end(topic, transaction_id, "COMMIT", body, request)

    @router.post(
        "/topics/{topic}/transactions/{transaction_id}/rollback",
        tags=["transactions"],
        response_model=TransactionOut,
        responses=PROBLEM_RESPONSES,
        summary="Roll back a transactional message: it is never visible (idempotent)",
    )
    async def rollback(
        topic: TopicPath, transaction_id: TxPath, request: Request, body: EndTransactionIn | None = None
    ) -> Response:
        return await end(topic, transaction_id, "ROLLBACK", body, request)

    @router.get(
        "/topics/{topic}/transactions/{transaction_id}",
        tags=["transactions"],
        responses=PROBLEM_RESPONSES,
        summary="Where a transaction stands",
    )
    async def transaction(topic: TopicPath, transaction_id: TxPath, request: Request) -> Response:
        return _json(model.transaction(account_of(request), topic, transaction_id))

    @router.get(
        "/producers/{group}/transaction-checks",
        tags=["transactions"],
        responses=PROBLEM_RESPONSES,
        summary="Long-poll the check-backs of a producer group's open transactions",
    )
    async def checks(
        group: GroupPath,
        request: Request,
        waitMs: Annotated[int, Query(ge=0, le=60_000)] = 0,
        maxChecks: Annotated[int, Query(ge=1, le=1024)] = 32,
    ) -> Response:
        got = await model.transaction_checks(account_of(request), group, maxChecks, waitMs)
        return _json(
            {
                "checks": [
                    {
                        "transactionId": c.transaction_id,
                        "topic": c.topic,
                        "checkTimes": c.check_times,
                        "message": message_json(c.message),
                    }
                    for c in got
                ]
            }
        )

    @router.post(
        "/topics/{topic}/recall",
        tags=["messages"],
        response_model=RecallOut,
        responses=PROBLEM_RESPONSES,
        summary="Recall a delayed message before its delivery time",
    )
    async def recall(topic: TopicPath, body: RecallIn, request: Request) -> Response:
        uniq = await model.recall(account_of(request), topic, body.recallHandle)
        return _json({"messageId": uniq, "status": "RECALLED"})

    @router.get(
        "/consumers/{group}/config",
        tags=["consumers"],
        responses=PROBLEM_RESPONSES,
        summary="A consumer group's settings: retry policy, retryMaxTimes, orderly",
    )
    async def get_config(group: GroupPath, request: Request) -> Response:
        return _json(model.group_config(account_of(request), group))

    @router.put(
        "/consumers/{group}/config",
        tags=["consumers"],
        responses=PROBLEM_RESPONSES,
        summary="Change a consumer group's settings (replicated)",
    )
    async def put_config(group: GroupPath, body: GroupConfigIn, request: Request) -> Response:
        doc = body.model_dump(exclude_unset=True)
        return _json(await model.update_group_config(account_of(request), group, doc))

    return router
