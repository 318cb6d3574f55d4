"""Message routes: produce, pull (long polling), message lookup, search and delivery history.

Produce and pull are served by `hot.HotPath` before FastAPI sees them; these declarations carry
their OpenAPI description (`openapi_extra`: parameters and the ProduceRequest schema) and serve
them when the fast path is bypassed, through the same `HotHandlers`."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from starlette.responses import Response

from broker.http.acl import account_of
from broker.http.codec import PULL_BINARY_CONTENT_TYPE, message_json
from broker.http.consumers import client_of
from broker.http.hot import JSON, HotHandlers
from broker.http.schemas import PROBLEM_RESPONSES, MessageOut, ProduceResponse, PullResponse
from broker.message import MessageExt
from broker.service import MAX_PULL_MESSAGES, BrokerServices, GroupDelivery
from broker.service.query import MAX_SEARCH_RESULTS
from broker.service.validation import MAX_CLIENT_ID_LENGTH, MAX_IDEMPOTENCY_KEY_LENGTH, MAX_TAGS_LENGTH
from wire.names import TOPIC_PATTERN

log = logging.getLogger(__name__)


def _topic_param(name: str = "topic") -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": TOPIC_PATTERN},
    }


_PRODUCE_OPENAPI: dict[str, Any] = {
    "parameters": [
        _topic_param(),
        {
            "name": "tags",
            "in": "query",
            "schema": {"type": "string", "maxLength": MAX_TAGS_LENGTH, "pattern": "^[^\\x01\\x02]*$"},
            "description": "raw form only",
        },
        {
            "name": "keys",
            "in": "query",
            "schema": {"type": "string", "pattern": "^[^ \\x01\\x02]*$"},
            "description": "raw form only: comma-separated",
        },
        {
            "name": "queueId",
            "in": "query",
            "schema": {"type": "integer", "minimum": 0, "maximum": 65535},
        },
        {
            "name": "idempotencyKey",
            "in": "query",
            "schema": {
                "type": "string",
                "maxLength": MAX_IDEMPOTENCY_KEY_LENGTH,
                "pattern": "^[^\\x01\\x02]*$",
            },
        },
    ],
    "requestBody": {
        "required": True,
        "content": {
            JSON: {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
}


_PULL_OPENAPI: dict[str, Any] = {
    "parameters": [
        _topic_param(),
        {
            "name": "queueId",
            "in": "path",
            "required": True,
            "schema": {"type": "integer", "minimum": 0, "maximum": 65535},
        },
        {
            "name": "offset",
            "in": "query",
            "schema": {"type": "integer", "minimum": 0, "maximum": 2**62, "default": 0},
        },
        {
            "name": "maxMessages",
            "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PULL_MESSAGES, "default": 32},
        },
        {
            "name": "waitMs",
            "in": "query",
            "schema": {"type": "integer", "minimum": 0, "maximum": 2**31, "default": 0},
        },
        {
            "name": "bodyEncoding",
            "in": "query",
            "schema": {"type": "string", "enum": ["utf-8", "base64"]},
            "description": "JSON form only",
        },
        {
            "name": "filterType",
            "in": "query",
            "schema": {"type": "string", "enum": ["TAG", "SQL92"], "default": "TAG"},
        },
        {
            "name": "filterExpression",
            "in": "query",
            "schema": {"type": "string", "maxLength": 4096},
            "description": "TagA || TagB, or a SQL92 selector (enablePropertyFilter=true); "
            "messages that do not match are skipped: nextOffset moves past them",
        },
        {
            "name": "format",
            "in": "query",
            "schema": {"type": "string", "enum": ["json", "binary"]},
            "description": (
                "binary = the compact page (docs/INTERFACES.md, 'Binary pull format'); "
                f"the same as Accept: {PULL_BINARY_CONTENT_TYPE}. JSON is the default."
            ),
        },
    ],
    "responses": {
        "200": {
            "content": {
                PULL_BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}},
            }
        }
    },
}


_MESSAGE_ID_OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": "msgId",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_CLIENT_ID_LENGTH},
            "description": "an offset id (32 hex digits), or a message's messageId (its UNIQ_KEY: "
            "RocketMQ 5's client message id, or the messageId a produce answered) within "
            "idempotencyWindowMs — a delayed or transactional message's also before its delivery, "
            "then shown with its `state`",
        }
    ]
}


def build_router(services: BrokerServices, hot: HotHandlers) -> APIRouter:
    """Routes bound to one broker's services; produce and pull delegate to `hot`."""
    router = APIRouter()

    @router.post(
        "/topics/{topic}/messages",
        summary="Produce one message or a batch (answers after commit)",
        tags=["messages"],
        responses={200: {"model": ProduceResponse}, 413: PROBLEM_RESPONSES[400], **PROBLEM_RESPONSES},
        openapi_extra=_PRODUCE_OPENAPI,
    )
    async def produce(request: Request) -> Response:
        started = time.perf_counter()
        topic = request.path_params["topic"]
        services.produce.admit(account_of(request), topic)
        body = await request.body()  # within the request limit (BodyLimitMiddleware)
        client = client_of(request.headers, request.scope.get("client"))
        out = await hot.produce(topic, request.headers, request.query_params, body, started, client)
        return Response(out, media_type=JSON)

    @router.get(
        "/topics/{topic}/queues/{queueId}/messages",
        summary="Pull by offset; long-polls up to waitMs",
        tags=["messages"],
        responses={200: {"model": PullResponse}, **PROBLEM_RESPONSES},
        openapi_extra=_PULL_OPENAPI,
    )
    async def pull(request: Request) -> Response:
        p = request.path_params
        out, ctype = await hot.pull(
            account_of(request), p["topic"], p["queueId"], request.headers, request.query_params
        )
        return Response(out, media_type=ctype)

    @router.get(
        "/messages/{msgId}",
        summary="Look a message up by its id (store host + physical offset) or its messageId (UNIQ_KEY)",
        tags=["messages"],
        responses={200: {"model": MessageOut}, **PROBLEM_RESPONSES},
        openapi_extra=_MESSAGE_ID_OPENAPI,
    )
    async def message_by_id(request: Request) -> Response:
        found = await services.query.find(account_of(request), request.path_params["msgId"])
        doc = message_json(found.message)
        if found.state is not None:
            doc["state"] = found.state
        return Response(orjson.dumps(doc), media_type=JSON)

    @router.get(
        "/messages",
        summary="Messages of a topic by key and/or store time (bounded scan; per queue or all queues)",
        tags=["messages"],
        responses=PROBLEM_RESPONSES,
    )
    async def search(
        request: Request,
        topic: Annotated[str, Query(max_length=127, pattern=TOPIC_PATTERN)],
        key: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
        queueId: Annotated[int | None, Query(ge=0, le=65535)] = None,
        begin: Annotated[int, Query(ge=0, le=2**62, description="store time from (ms)")] = 0,
        end: Annotated[int | None, Query(ge=0, le=2**62, description="store time to (ms)")] = None,
        maxMessages: Annotated[int, Query(ge=1, le=MAX_SEARCH_RESULTS)] = 64,
    ) -> Response:
        found = await services.query.search(
            account_of(request),
            topic,
            key=key,
            queue_id=queueId,
            begin_ms=begin,
            end_ms=end,
            max_messages=maxMessages,
        )
        doc = {
            "messages": [message_json(m) for m in found.messages],
            "scanned": found.scanned,
            "truncated": found.truncated,
        }
        return Response(orjson.dumps(doc), media_type=JSON)

    @router.get(
        "/messages/{msgId}/deliveries",
        summary="A message's delivery state and history per consumer group (master only)",
        tags=["messages"],
        responses=PROBLEM_RESPONSES,
    )
    async def deliveries(
        request: Request, msgId: Annotated[str, PathParam(pattern=r"^[0-9A-Fa-f]{32}$")]
    ) -> Response:
        msg, groups = services.deliveries.deliveries(account_of(request), msgId)
        doc = deliveries_json(msg, groups)
        return Response(orjson.dumps(doc), media_type=JSON)

    return router


def deliveries_json(msg: MessageExt, groups: list[GroupDelivery]) -> dict[str, Any]:
    """A message's delivery state per group as the API shows it."""
    return {
        "msgId": msg.msg_id,
        "topic": msg.topic,
        "queueId": msg.queue_id,
        "queueOffset": msg.queue_offset,
        "groups": [
            {
                "group": g.group,
                "state": g.state,
                "reconsumeTimes": g.reconsume_times,
                "invisibleUntil": g.invisible_until_ms,
                "events": [
                    {"at": e.at_ms, "event": e.event, "reconsumeTimes": e.reconsume_times} for e in g.events
                ],
            }
            for g in groups
        ],
    }
