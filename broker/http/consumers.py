"""The group-consumption routes (`/consumers/{group}/receive`, `/ack`, `/nack`, `/invisible`)
over `PopService` (`simple_consumer.py`), which holds the state and the rules."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from broker.http.acl import Right
from broker.http.context import HttpContext
from broker.http.pop_state import SYS_POP_STATE, PopStateReplica
from broker.http.schemas import (
    PROBLEM_RESPONSES,
    AckIn,
    InvisibleIn,
    InvisibleOut,
    ReceiveIn,
    ReceiveOut,
    SettleOut,
)
from broker.http.simple_consumer import PopService
from broker.topics import validate_topic

GroupPath = Annotated[str, Path(min_length=1, max_length=120, pattern=r"^[%|a-zA-Z0-9_-]{1,120}$")]


def build_router(ctx: HttpContext) -> APIRouter:
    """The routes, with the pop state registered as a system-record handler of the store."""
    router = APIRouter()
    replica = PopStateReplica()
    # Registered before the store starts (BrokerRuntime builds the app first), so replay at
    # start rebuilds it; on every member, in log order.
    ctx.store.register_system_handler(SYS_POP_STATE, replica.apply_record)
    pop = PopService(ctx, replica)
    ctx.pop = pop  # type: ignore[attr-defined]  # exposed for metrics/tests
    # A topic delete is applied by the dispatcher on every member, in log order (and by the replay
    # at start, also in log order): chain onto the store's own hook so slaves and a later master
    # forget the state too.
    store_on_delete = ctx.store.topics.on_delete

    def on_topic_deleted(topic: str) -> None:
        if store_on_delete is not None:
            store_on_delete(topic)
        pop.drop_topic(topic)

    ctx.store.topics.on_delete = on_topic_deleted

    def check(group: str, topic: str, request: Request) -> None:
        validate_topic(topic)
        ctx.authorize(request.headers, topic=topic, group=group, right=Right.SUB)

    def _json(doc: Any) -> Response:
        return Response(orjson.dumps(doc), media_type="application/json")

    @router.post(
        "/consumers/{group}/receive",
        tags=["consumers"],
        response_model=ReceiveOut,
        responses=PROBLEM_RESPONSES,
        summary="Receive messages, invisible to the group until acked",
    )
    async def receive(group: GroupPath, body: ReceiveIn, request: Request) -> Response:
        check(group, body.topic, request)
        msgs = await pop.receive(group, body.topic, body.maxMessages, body.invisibleMs, body.waitMs)
        return _json({"messages": msgs})

    @router.post(
        "/consumers/{group}/ack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Acknowledge received messages",
    )
    async def ack(group: GroupPath, body: AckIn, request: Request) -> Response:
        check(group, body.topic, request)
        return _json({"results": await pop.ack(group, body.topic, body.receiptHandles)})

    @router.post(
        "/consumers/{group}/nack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Give messages back for redelivery now",
    )
    async def nack(group: GroupPath, body: AckIn, request: Request) -> Response:
        check(group, body.topic, request)
        return _json({"results": await pop.nack(group, body.topic, body.receiptHandles)})

    @router.post(
        "/consumers/{group}/invisible",
        tags=["consumers"],
        response_model=InvisibleOut,
        responses=PROBLEM_RESPONSES,
        summary="Change a received message's invisible time",
    )
    async def invisible(group: GroupPath, body: InvisibleIn, request: Request) -> Response:
        check(group, body.topic, request)
        handle = await pop.change_invisible(group, body.topic, body.receiptHandle, body.invisibleMs)
        return _json({"receiptHandle": handle})

    return router
