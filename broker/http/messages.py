"""Hot routes: produce, pull (long polling) and message lookup.

They take the raw `Request` (no FastAPI body/param models on the hot path), decode with orjson
and answer `Response` bytes; `openapi_extra` documents the same parameters and schemas."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from broker.errors import BrokerCode, BrokerError
from broker.http.acl import Right
from broker.http.codec import message_json, parse_produce_json, parse_produce_raw, read_body
from broker.http.context import HttpContext
from broker.http.problems import invalid
from broker.http.schemas import PROBLEM_RESPONSES, MessageOut, ProduceResponse, PullResponse
from broker.message import Message, decode_message_id
from broker.topics import is_system_topic, validate_topic

log = logging.getLogger(__name__)

MAX_PULL_MESSAGES = 1024
# Safety net above DLedger's own ack timeout: answer 504 (outcome unknown) rather than hang.
PRODUCE_TIMEOUT_S = 10.0
JSON = "application/json"


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type=JSON)


def _int_param(params: Any, name: str, default: int | None, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise invalid(name, "required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(name, f"expected an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise invalid(name, f"must be in {lo}..{hi}, got {value}")
    return value


def _path_int(request: Request, name: str) -> int:
    raw = request.path_params[name]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise invalid(name, f"expected a non-negative integer, got {raw!r}")
    return int(raw)


def _topic_param(name: str = "topic") -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^[%|a-zA-Z0-9_-]{1,127}$"},
    }


def build_router(ctx: HttpContext) -> APIRouter:
    """Routes bound to one broker's context."""
    router = APIRouter()
    m = ctx.metrics

    def topic_config(topic: str, for_write: bool) -> Any:
        cfg = ctx.store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if for_write and not cfg.is_writeable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not writable (perm={cfg.perm})")
        if not for_write and not cfg.is_readable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not readable (perm={cfg.perm})")
        return cfg

    async def put(topic: str, msgs: list[Message], queue_ids: list[int | None]) -> list[dict[str, Any]]:
        cfg = ctx.store.topics.get(topic)
        if cfg is None:
            cfg = await ctx.store.topics.auto_create(topic)
            ctx.topics_changed()
        if not cfg.is_writeable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not writable (perm={cfg.perm})")
        for i, q in enumerate(queue_ids):
            if q is not None and q >= cfg.write_queue_nums:
                raise BrokerError(
                    BrokerCode.QUEUE_NOT_EXIST,
                    f"messages[{i}].queueId {q}: topic {topic!r} has write queues "
                    f"0..{cfg.write_queue_nums - 1}",
                    field=f"messages[{i}].queueId",
                )
        results: list[dict[str, Any]] = []
        # One store call per run of messages bound for the same queue, in request order.
        start = 0
        while start < len(msgs):
            end = start + 1
            while end < len(msgs) and queue_ids[end] == queue_ids[start]:
                end += 1
            put_task = ctx.store.put_messages(topic, msgs[start:end], queue_ids[start])
            try:
                res = await asyncio.wait_for(asyncio.shield(put_task), PRODUCE_TIMEOUT_S)
            except TimeoutError:
                raise BrokerError(
                    BrokerCode.TIMEOUT,
                    f"not committed within {PRODUCE_TIMEOUT_S}s; the outcome "
                    "is unknown (retry with the same idempotencyKey)",
                    outcome="unknown",
                    stored=len(results),
                ) from None
            results += [
                {
                    "msgId": r.msg_id,
                    "queueId": r.queue_id,
                    "queueOffset": r.queue_offset,
                    "commitLogOffset": r.commit_log_offset,
                }
                for r in res
            ]
            start = end
        return results

    @router.post(
        "/topics/{topic}/messages",
        summary="Produce one message or a batch (answers after commit)",
        tags=["messages"],
        responses={200: {"model": ProduceResponse}, 413: PROBLEM_RESPONSES[400], **PROBLEM_RESPONSES},
        openapi_extra={
            "parameters": [
                _topic_param(),
                {"name": "tags", "in": "query", "schema": {"type": "string"}, "description": "raw form only"},
                {
                    "name": "keys",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "raw form only: comma-separated",
                },
                {"name": "queueId", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                {"name": "idempotencyKey", "in": "query", "schema": {"type": "string"}},
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
        t0 = time.perf_counter()
        topic = request.path_params["topic"]
        try:
            validate_topic(topic)
            ctx.authorize(request.headers, topic=topic, right=Right.PUB)
            ctx.require_master()
            raw = await read_body(request, ctx.request_limit_bytes)
            ctype = request.headers.get("content-type", JSON).split(";", 1)[0].strip().lower()
            if ctype == "application/octet-stream":
                msg, qid = parse_produce_raw(
                    raw, request.query_params, topic, ctx.config.max_message_size, ctx.born_host
                )
                msgs, qids = [msg], [qid]
            elif ctype == JSON or ctype.endswith("+json"):
                msgs, qids = parse_produce_json(raw, topic, ctx.config.max_message_size, ctx.born_host)
            else:
                raise invalid("Content-Type", f"expected {JSON} or application/octet-stream, got {ctype!r}")
            results = await put(topic, msgs, qids)
        except BrokerError as exc:
            m.put_errors.labels(topic=topic[:127], code=exc.code.value).inc()
            raise
        m.put_messages.labels(topic=topic).inc(len(results))
        m.put_bytes.labels(topic=topic).inc(sum(len(x.body) for x in msgs))
        m.put_latency.labels(topic=topic).observe(time.perf_counter() - t0)
        return _json({"results": results})

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
                    "schema": {"type": "integer", "minimum": 0},
                },
                {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0}},
                {
                    "name": "maxMessages",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PULL_MESSAGES, "default": 32},
                },
                {"name": "waitMs", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0}},
                {
                    "name": "bodyEncoding",
                    "in": "query",
                    "schema": {"type": "string", "enum": ["utf-8", "base64"]},
                },
            ]
        },
    )
    async def pull(request: Request) -> Response:
        t0 = time.perf_counter()
        topic = validate_topic(request.path_params["topic"])
        queue_id = _path_int(request, "queueId")
        q = request.query_params
        offset = _int_param(q, "offset", 0, 0, 2**62)
        max_messages = _int_param(q, "maxMessages", 32, 1, MAX_PULL_MESSAGES)
        wait_ms = _int_param(q, "waitMs", 0, 0, 2**31)
        enc = q.get("bodyEncoding")
        if enc not in (None, "", "utf-8", "base64"):
            raise invalid("bodyEncoding", f"expected utf-8 or base64, got {enc!r}")
        ctx.authorize(request.headers, topic=topic, right=Right.SUB)
        cfg = topic_config(topic, for_write=False)
        if queue_id >= cfg.queue_nums:
            raise BrokerError(
                BrokerCode.QUEUE_NOT_EXIST,
                f"topic {topic!r} has queues 0..{cfg.queue_nums - 1}",
                field="queueId",
            )
        store = ctx.store
        lo, hi = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        if offset < lo or offset > hi:
            raise BrokerError(
                BrokerCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} is outside [{lo}, {hi}] for {topic}/{queue_id}",
                field="offset",
                minOffset=lo,
                maxOffset=hi,
            )
        if offset == hi and wait_ms > 0 and ctx.config.long_polling_enable:
            wait_s = min(wait_ms, ctx.config.broker_suspend_max_time_millis) / 1000
            m.long_poll_waiters.inc()
            try:
                await store.wait_for_message(topic, queue_id, offset, wait_s)
            finally:
                m.long_poll_waiters.dec()
        result = store.get_messages(topic, queue_id, offset, max_messages)
        force = enc == "base64"
        doc = {
            "messages": [message_json(x, force) for x in result.messages],
            "nextOffset": result.next_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
        }
        if result.messages:
            m.get_messages.labels(topic=topic).inc(len(result.messages))
        m.get_latency.labels(topic=topic).observe(time.perf_counter() - t0)
        return _json(doc)

    @router.get(
        "/messages/{msgId}",
        summary="Look a message up by its id (store host + physical offset)",
        tags=["messages"],
        responses={200: {"model": MessageOut}, **PROBLEM_RESPONSES},
        openapi_extra={
            "parameters": [{"name": "msgId", "in": "path", "required": True, "schema": {"type": "string"}}]
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
        if msg is None or is_system_topic(msg.topic):
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id}")
        ctx.authorize(request.headers, topic=msg.topic, right=Right.SUB)
        return _json(message_json(msg))

    return router
