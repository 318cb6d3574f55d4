"""Message routes: produce, pull (long polling) and message lookup, as FastAPI routes.

Produce and pull are served by `hot.HotPath` before FastAPI sees them; these declarations carry
their OpenAPI description (`openapi_extra`: parameters and the ProduceRequest schema) and serve
them when the fast path is bypassed, through the same `HotHandlers`."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from broker.errors import BrokerCode, BrokerError
from broker.http.acl import Right
from broker.http.codec import PULL_BINARY_CONTENT_TYPE, message_json, read_body
from broker.http.context import HttpContext
from broker.http.hot import JSON, MAX_PULL_MESSAGES, HotHandlers
from broker.http.schemas import PROBLEM_RESPONSES, MessageOut, ProduceResponse, PullResponse
from broker.message import decode_message_id
from broker.topics import is_system_topic

log = logging.getLogger(__name__)


def _topic_param(name: str = "topic") -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^[%|a-zA-Z0-9_-]{1,127}$"},
    }


def build_router(ctx: HttpContext, hot: HotHandlers) -> APIRouter:
    """Routes bound to one broker's context; produce and pull delegate to `hot`."""
    router = APIRouter()

    @router.post(
        "/topics/{topic}/messages",
        summary="Produce one message or a batch (answers after commit)",
        tags=["messages"],
        responses={200: {"model": ProduceResponse}, 413: PROBLEM_RESPONSES[400], **PROBLEM_RESPONSES},
        openapi_extra={
            "parameters": [
                _topic_param(),
                {
                    "name": "tags",
                    "in": "query",
                    "schema": {"type": "string", "maxLength": 255, "pattern": "^[^\\x01\\x02]*$"},
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
                    "schema": {"type": "string", "maxLength": 255, "pattern": "^[^\\x01\\x02]*$"},
                },
            ],
            "requestBody": {
                "required": True,
                "content": {
                    JSON: {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            },
        },
    )
    async def produce(request: Request) -> Response:
        body = await read_body(request, ctx.request_limit_bytes)
        out = await hot.produce(request.path_params["topic"], request.headers, request.query_params, body)
        return Response(out, media_type=JSON)

    @router.get(
        "/topics/{topic}/queues/{queueId}/messages",
        summary="Pull by offset; long-polls up to waitMs",
        tags=["messages"],
        responses={200: {"model": PullResponse}, **PROBLEM_RESPONSES},
        openapi_extra={
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
        },
    )
    async def pull(request: Request) -> Response:
        p = request.path_params
        out, ctype = await hot.pull(p["topic"], p["queueId"], request.headers, request.query_params)
        return Response(out, media_type=ctype)

    @router.get(
        "/messages/{msgId}",
        summary="Look a message up by its id (store host + physical offset)",
        tags=["messages"],
        responses={200: {"model": MessageOut}, **PROBLEM_RESPONSES},
        openapi_extra={
            "parameters": [
                {
                    "name": "msgId",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9A-Fa-f]{32}$"},
                }
            ]
        },
    )
    async def message_by_id(request: Request) -> Response:
        msg_id = request.path_params["msgId"]
        _, phys = decode_message_id(msg_id)
        try:
            msg = ctx.store.look_message_by_offset(phys)
        except BrokerError as exc:
            if exc.code in (BrokerCode.MESSAGE_CORRUPTED, BrokerCode.INTERNAL_ERROR):
                raise
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id} ({exc.detail})") from None
        except Exception as exc:  # a position that is not a message start must be a 404, not a 500
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id}: {exc}") from None
        # The id names its store host too: a message of another broker that happens to start at
        # the same offset here is not the one asked for.
        if msg is None or is_system_topic(msg.topic) or msg.msg_id != msg_id.upper():
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id}")
        ctx.authorize(request.headers, topic=msg.topic, right=Right.SUB)
        return Response(orjson.dumps(message_json(msg)), media_type=JSON)

    return router
