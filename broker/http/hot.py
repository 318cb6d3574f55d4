"""The hot routes — produce and pull — as plain functions over raw inputs, plus `HotPath`, a pure
ASGI dispatcher that serves them without the FastAPI/Starlette middleware and dependency stack.

The FastAPI routes in `messages.py` call the same `HotHandlers` (they are what the OpenAPI
document describes, and they serve if the fast path is off); `BrokerApp.__call__` hands these two
paths to `HotPath` first. Errors are the same problem+json either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

import orjson

from broker.errors import BrokerCode, BrokerError
from broker.http.acl import Right
from broker.http.codec import (
    PULL_BINARY_CONTENT_TYPE,
    message_binary_view,
    message_json_view,
    parse_produce_json,
    parse_produce_raw,
    pull_binary_bytes,
)
from broker.http.context import HttpContext
from broker.http.problems import PROBLEM_CONTENT_TYPE, from_dledger, invalid
from broker.message import Message
from broker.topics import validate_topic
from dledger.codes import DLedgerException

log = logging.getLogger(__name__)

MAX_PULL_MESSAGES = 1024
DEFAULT_PULL_BYTES = 4 * 1024 * 1024  # = the store's default byte budget of one pull
JSON = "application/json"
_HOT_HEADERS = {
    b"content-type": "content-type",
    b"content-length": "content-length",
    b"authorization": "authorization",
    b"accept": "accept",
}
_JSON_HEADERS = [(b"content-type", b"application/json")]
_JSON_CTYPE = JSON.encode()
_BINARY_CTYPE = PULL_BINARY_CONTENT_TYPE.encode()


def wants_binary(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
    """Whether a pull asks for the binary page: `?format=binary|json` wins, else the Accept header
    naming `application/x-ledgermq-messages`. JSON stays the default."""
    fmt = query.get("format")
    if fmt not in (None, ""):
        if fmt == "binary":
            return True
        if fmt == "json":
            return False
        raise invalid("format", f"expected json or binary, got {fmt[:40]!r}")
    accept = headers.get("accept")
    if not accept or PULL_BINARY_CONTENT_TYPE not in accept:
        return False
    return any(
        part.split(";", 1)[0].strip().lower() == PULL_BINARY_CONTENT_TYPE for part in accept.split(",")
    )


def int_param(params: Mapping[str, str], name: str, default: int | None, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise invalid(name, "required")
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        raise invalid(name, f"expected a non-negative integer, got {raw[:40]!r}")
    value = int(raw)
    if not lo <= value <= hi:
        raise invalid(name, f"must be in {lo}..{hi}, got {value}")
    return value


def _build_base64(view: memoryview, head: tuple, topic_at: int, props_at: int) -> dict[str, Any]:
    return message_json_view(view, head, topic_at, props_at, True)


class _TopicMetrics:
    """Per-topic metric children, looked up once (label lookups cost more than the increments)."""

    __slots__ = ("get_latency", "get_messages", "put_bytes", "put_latency", "put_messages")

    def __init__(self, m: Any, topic: str) -> None:
        self.put_messages = m.put_messages.labels(topic=topic)
        self.put_bytes = m.put_bytes.labels(topic=topic)
        self.put_latency = m.put_latency.labels(topic=topic)
        self.get_messages = m.get_messages.labels(topic=topic)
        self.get_latency = m.get_latency.labels(topic=topic)


class HotHandlers:
    """Produce and pull for one broker. Callers: `HotPath` and the FastAPI routes."""

    def __init__(self, ctx: HttpContext) -> None:
        self.ctx = ctx
        self._metrics: dict[str, _TopicMetrics] = {}

    def metrics(self, topic: str) -> _TopicMetrics:
        tm = self._metrics.get(topic)
        if tm is None:
            tm = self._metrics[topic] = _TopicMetrics(self.ctx.metrics, topic)
        return tm

    async def produce(
        self, topic: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
    ) -> bytes:
        """Validate, store (after commit) and answer `{"results": [...]}` as JSON bytes."""
        t0 = time.perf_counter()
        ctx = self.ctx
        try:
            ctx.authorize(headers, topic=topic, right=Right.PUB)
            validate_topic(topic)
            ctx.require_master()
            ctype = (headers.get("content-type") or JSON).split(";", 1)[0].strip().lower()
            if ctype == JSON or ctype.endswith("+json"):
                if query:  # raw-form parameters: validated even when unused, never silently odd
                    parse_produce_raw(b"", query, topic, ctx.config.max_message_size, ctx.born_host)
                msgs, qids = parse_produce_json(body, topic, ctx.config.max_message_size, ctx.born_host)
            elif ctype == "application/octet-stream":
                msg, qid = parse_produce_raw(body, query, topic, ctx.config.max_message_size, ctx.born_host)
                msgs, qids = [msg], [qid]
            else:
                raise invalid("Content-Type", f"expected {JSON} or application/octet-stream, got {ctype!r}")
            results = await self._put(topic, msgs, qids)
        except BrokerError as exc:
            # Label only topics that exist: arbitrary names must not grow the metric without bound.
            label = topic if ctx.store.topics.get(topic) is not None else "_other"
            ctx.metrics.put_errors.labels(topic=label, code=exc.code.value).inc()
            raise
        tm = self.metrics(topic)
        tm.put_messages.inc(len(results))
        tm.put_bytes.inc(sum(len(x.body) for x in msgs))
        tm.put_latency.observe(time.perf_counter() - t0)
        return orjson.dumps({"results": results})

    async def _put(
        self, topic: str, msgs: list[Message], queue_ids: list[int | None]
    ) -> list[dict[str, Any]]:
        store = self.ctx.store
        cfg = store.topics.get(topic)
        if cfg is None:
            cfg = await store.topics.auto_create(topic)
            self.ctx.topics_changed()
        if not cfg.is_writeable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not writable (perm={cfg.perm})")
        for i, q in enumerate(queue_ids):
            if q is not None and q >= cfg.write_queue_nums:
                raise BrokerError(
                    BrokerCode.QUEUE_NOT_EXIST,
                    f"messages[{i}].queueId {q}: topic {topic!r} has "
                    f"write queues 0..{cfg.write_queue_nums - 1}",
                    field=f"messages[{i}].queueId",
                )
        results: list[dict[str, Any]] = []
        # One store call per run of messages bound for the same queue, in request order. The store
        # answers a commit timeout itself (TIMEOUT, outcome unknown), so no extra timer here.
        start, n = 0, len(msgs)
        while start < n:
            end = start + 1
            while end < n and queue_ids[end] == queue_ids[start]:
                end += 1
            batch = msgs if start == 0 and end == n else msgs[start:end]
            for msg_id, qid, qoff, phys, _ in await store.put_messages(topic, batch, queue_ids[start]):
                results.append(
                    {"msgId": msg_id, "queueId": qid, "queueOffset": qoff, "commitLogOffset": phys}
                )
            start = end
        return results

    async def pull(
        self, topic: str, queue_raw: str, headers: Mapping[str, str], query: Mapping[str, str]
    ) -> tuple[bytes, str]:
        """Messages from `offset`, holding the request (long poll) when there are none yet.

        Returns (body, content type): JSON, or the binary page (codec.PULL_HEADER) when
        `wants_binary`. Errors are BrokerErrors (problem+json) in both forms."""
        t0 = time.perf_counter()
        ctx = self.ctx
        ctx.authorize(headers, topic=topic, right=Right.SUB)
        binary = wants_binary(headers, query)
        validate_topic(topic)
        if not (queue_raw.isascii() and queue_raw.isdigit()) or len(queue_raw) > 5 or int(queue_raw) > 65535:
            raise invalid("queueId", f"expected an integer in 0..65535, got {queue_raw[:40]!r}")
        queue_id = int(queue_raw)
        offset = int_param(query, "offset", 0, 0, 2**62)
        max_messages = int_param(query, "maxMessages", 32, 1, MAX_PULL_MESSAGES)
        wait_ms = int_param(query, "waitMs", 0, 0, 2**31)
        enc = query.get("bodyEncoding")
        if enc not in (None, "", "utf-8", "base64"):
            raise invalid("bodyEncoding", f"expected utf-8 or base64, got {enc[:40]!r}")
        store = ctx.store
        cfg = store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if not cfg.is_readable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not readable (perm={cfg.perm})")
        if queue_id >= cfg.queue_nums:
            raise BrokerError(
                BrokerCode.QUEUE_NOT_EXIST,
                f"topic {topic!r} has queues 0..{cfg.queue_nums - 1}",
                field="queueId",
            )
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
            # Held until the dispatcher signals a new message for this queue (no polling loop).
            wait_s = min(wait_ms, ctx.config.broker_suspend_max_time_millis) / 1000
            ctx.metrics.long_poll_waiters.inc()
            try:
                await store.wait_for_message(topic, queue_id, offset, wait_s)
            finally:
                ctx.metrics.long_poll_waiters.dec()
        if binary:
            result = store.read_messages(
                topic, queue_id, offset, max_messages, DEFAULT_PULL_BYTES, None, message_binary_view
            )
            body = pull_binary_bytes(
                result.messages, result.next_offset, result.min_offset, result.max_offset
            )
            ctype = PULL_BINARY_CONTENT_TYPE
        else:
            build = _build_base64 if enc == "base64" else message_json_view
            result = store.read_messages(
                topic, queue_id, offset, max_messages, DEFAULT_PULL_BYTES, None, build
            )
            body = orjson.dumps(
                {
                    "messages": result.messages,
                    "nextOffset": result.next_offset,
                    "minOffset": result.min_offset,
                    "maxOffset": result.max_offset,
                }
            )
            ctype = JSON
        tm = self.metrics(topic)
        if result.messages:
            tm.get_messages.inc(len(result.messages))
        tm.get_latency.observe(time.perf_counter() - t0)
        return body, ctype


class HotPath:
    """Pure ASGI serving of `POST /topics/{t}/messages` and `GET /topics/{t}/queues/{q}/messages`."""

    def __init__(self, ctx: HttpContext, handlers: HotHandlers) -> None:
        self.ctx = ctx
        self.h = handlers

    def match(self, scope: dict[str, Any]) -> tuple[str, list[str]] | None:
        path: str = scope["path"]
        if not path.startswith("/topics/"):
            return None
        parts = path[8:].split("/")
        method = scope["method"]
        if method == "POST" and len(parts) == 2 and parts[1] == "messages":
            return "produce", parts
        if method == "GET" and len(parts) == 4 and parts[1] == "queues" and parts[3] == "messages":
            return "pull", parts
        return None

    async def __call__(
        self, kind: str, parts: list[str], scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        # Only the headers the hot routes read (decoding all of them cost ~1% of a produce).
        headers = {}
        for k, v in scope["headers"]:
            name = _HOT_HEADERS.get(k) or _HOT_HEADERS.get(k.lower())
            if name is not None:
                headers[name] = v.decode("latin-1")
        # The server has percent-decoded `path` once already: decoding again would turn the
        # '%DL' of '%DLQ%default' into a byte.
        topic = parts[0]
        try:
            qs = scope.get("query_string") or b""
            query = dict(parse_qsl(qs.decode("latin-1"), keep_blank_values=True)) if qs else {}
            ctype = _JSON_CTYPE
            if kind == "produce":
                # A request without the right is refused before its body is read.
                self.ctx.authorize(headers, topic=topic, right=Right.PUB)
                body = await self._read_body(headers, receive)
                out = await self.h.produce(topic, headers, query, body)
            else:
                out, ct = await self.h.pull(topic, parts[2], headers, query)
                if ct != JSON:
                    ctype = _BINARY_CTYPE
            await _send(send, 200, out, ctype)
        except BrokerError as exc:
            await _send_error(send, exc)
        except DLedgerException as exc:
            await _send_error(send, from_dledger(exc))
        except Exception:
            log.exception("event=http_unhandled method=%s path=%s", scope["method"], scope["path"])
            await _send_error(send, BrokerError(BrokerCode.INTERNAL_ERROR, "internal error; see broker log"))

    async def _read_body(self, headers: Mapping[str, str], receive: Any) -> bytes:
        """The request body, refused (413) over the limit before it is all in memory."""
        limit = self.ctx.request_limit_bytes
        declared = headers.get("content-length")
        if declared is not None:
            if not (declared.isascii() and declared.isdigit()):
                raise invalid("Content-Length", f"not a number: {declared[:40]!r}")
            if int(declared) > limit:
                raise BrokerError(
                    BrokerCode.MESSAGE_TOO_LARGE,
                    f"request body is {declared} bytes, limit {limit}",
                    limit=limit,
                )
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise invalid("body", "client disconnected while sending the body")
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise BrokerError(
                        BrokerCode.MESSAGE_TOO_LARGE, f"request body exceeds limit {limit} bytes", limit=limit
                    )
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send: Any, status: int, body: bytes, ctype: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Any, exc: BrokerError) -> None:
    if exc.code == BrokerCode.TIMEOUT:
        exc.extra.setdefault("outcome", "unknown")
    await _send(send, exc.status, orjson.dumps(exc.problem()), PROBLEM_CONTENT_TYPE.encode())
