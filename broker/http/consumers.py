"""The group-consumption routes (`/consumers/{group}/receive`, `/ack`, `/nack`, `/invisible`)
over `PopService` (`broker/service/pop.py`), which holds the state and the rules, and the
dead-letter resend over `DeadLetterService`."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from broker.http.acl import account_of
from broker.http.codec import message_json
from broker.http.schemas import (
    PROBLEM_RESPONSES,
    AckIn,
    DlqResendIn,
    InvisibleIn,
    InvisibleOut,
    ReceiveIn,
    ReceiveOut,
    SettleOut,
)
from broker.service import AckResult, BrokerServices, ClientProtocol, ReceivedMessage
from broker.service.pop import GROUP_NAME_RE, MAX_GROUP_LENGTH

GroupPath = Annotated[str, Path(min_length=1, max_length=MAX_GROUP_LENGTH, pattern=GROUP_NAME_RE.pattern)]


def _json(doc: Any) -> Response:
    return Response(orjson.dumps(doc), media_type="application/json")


def received_json(received: ReceivedMessage) -> dict[str, Any]:
    """A received message as the API shows it: the message, its receipt handle and redeliveries."""
    doc = message_json(received.message)
    doc["reconsumeTimes"] = received.reconsume_times
    doc["receiptHandle"] = received.receipt_handle
    return doc


def _client_of(request: Request) -> tuple[str, str]:
    """(client id, address) of an HTTP consumer: its `X-Client-Id` header when it sends one, else
    its address and user agent (one process, one id, whichever pooled connection it uses)."""
    host = request.client.host if request.client else "?"
    addr = f"{host}:{request.client.port}" if request.client else "?"
    agent = request.headers.get("user-agent", "")
    client_id = request.headers.get("x-client-id") or f"{host} {agent}".strip()
    return client_id[:128], addr


def settled_json(results: list[AckResult]) -> Response:
    return _json({"results": [{"receiptHandle": r.receipt_handle, "status": r.status} for r in results]})


def build_router(services: BrokerServices) -> APIRouter:
    """The routes of one broker's group consumption."""
    router = APIRouter()
    pop = services.pop

    @router.post(
        "/consumers/{group}/receive",
        tags=["consumers"],
        response_model=ReceiveOut,
        responses=PROBLEM_RESPONSES,
        summary="Receive messages, invisible to the group until acked",
    )
    async def receive(group: GroupPath, body: ReceiveIn, request: Request) -> Response:
        services.clients.seen(group, body.topic, ClientProtocol.HTTP, *_client_of(request))
        message_filter = None
        if body.filterType is not None or body.filterExpression is not None:
            message_filter = services.message_model.message_filter(body.filterType, body.filterExpression)
        got = await pop.receive(
            account_of(request),
            group,
            body.topic,
            body.maxMessages,
            body.invisibleMs,
            body.waitMs,
            message_filter,
        )
        return _json({"messages": [received_json(r) for r in got]})

    @router.post(
        "/consumers/{group}/ack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Acknowledge received messages",
    )
    async def ack(group: GroupPath, body: AckIn, request: Request) -> Response:
        return settled_json(await pop.ack(account_of(request), group, body.topic, body.receiptHandles))

    @router.post(
        "/consumers/{group}/nack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Give messages back for redelivery now",
    )
    async def nack(group: GroupPath, body: AckIn, request: Request) -> Response:
        return settled_json(await pop.nack(account_of(request), group, body.topic, body.receiptHandles))

    @router.post(
        "/consumers/{group}/invisible",
        tags=["consumers"],
        response_model=InvisibleOut,
        responses=PROBLEM_RESPONSES,
        summary="Change a received message's invisible time",
    )
    async def invisible(group: GroupPath, body: InvisibleIn, request: Request) -> Response:
        handle = await pop.change_invisible(
            account_of(request), group, body.topic, body.receiptHandle, body.invisibleMs
        )
        return _json({"receiptHandle": handle})

    @router.post(
        "/consumers/{group}/dlq/resend",
        tags=["consumers"],
        responses=PROBLEM_RESPONSES,
        summary="Store copies of dead letters of the group in their original topic (master only)",
    )
    async def resend_dead_letters(group: GroupPath, body: DlqResendIn, request: Request) -> Response:
        results = await services.dead_letters.resend(account_of(request), group, body.msgIds)
        return _json(
            {
                "results": [
                    {
                        "msgId": r.msg_id,
                        "newMsgId": r.new_msg_id,
                        "topic": r.topic,
                        "queueId": r.queue_id,
                        "queueOffset": r.queue_offset,
                    }
                    for r in results
                ]
            }
        )

    return router
