"""The hot routes — produce, pull, and a group's receive and ack — as plain functions over raw
inputs, plus `HotPath`, a pure ASGI dispatcher that serves them without the FastAPI/Starlette
middleware and dependency stack.

The FastAPI routes in `messages.py` and `consumers.py` call the same `HotHandlers` (they are what
the OpenAPI document describes, and they serve if the fast path is off); `BrokerApp.__call__`
hands these four paths to `HotPath` first. Both only decode, call `ProduceService`/`PullService`/
`PopService` and render; errors are the same problem+json either way, down to what FastAPI
answers to a body it cannot parse (`decode_model`).
"""

from __future__ import annotations

import asyncio
import email.message
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

from broker.errors import BrokerCode, BrokerError, from_dledger, invalid
from broker.http.acl import send_unauthorized
from broker.http.codec import (
    PULL_BINARY_CONTENT_TYPE,
    message_binary_view,
    message_json_view,
    parse_produce_json,
    parse_produce_raw,
    pull_binary_bytes,
)
from broker.http.consumers import ConsumerHandlers, GroupPath, HttpClient, client_of
from broker.http.problems import http_problem, unexpected, validation_problem
from broker.http.schemas import AckIn, ReceiveIn
from broker.message import KeyRun, Message, MessageHead
from broker.service import MAX_PULL_MESSAGES, Account, BrokerServices, ClientProtocol
from broker.service.pull import MessageBuilder
from dledger.codes import DLedgerException
from wire.limits import BodyIncomplete, BodyTooLarge, read_body
from wire.problem import PROBLEM_CONTENT_TYPE

log = logging.getLogger(__name__)

JSON = "application/json"
_HOT_HEADERS = {
    b"content-type": "content-type",
    b"content-length": "content-length",
    b"authorization": "authorization",
    b"accept": "accept",
    b"user-agent": "user-agent",
    b"x-client-id": "x-client-id",
    b"x-client-type": "x-client-type",
}
_CONSUMER_ROUTES = frozenset({"receive", "ack"})
_JSON_CTYPE = JSON.encode()
_PROBLEM_CTYPE = PROBLEM_CONTENT_TYPE.encode()
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
    """A non-negative integer query parameter in [lo, hi] (`default` when absent)."""
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


def _build_base64(view: memoryview, head: MessageHead, topic_at: int, props_at: int) -> dict[str, Any]:
    return message_json_view(view, head, topic_at, props_at, True)


def _decode_produce(
    services: BrokerServices, topic: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes
) -> tuple[list[Message], list[int | None], KeyRun | None]:
    """The produce body (JSON, or raw with query parameters) as messages, their queue ids and
    the key run that gives them their idempotency keys."""
    produce = services.produce
    mms, born = produce.max_message_size, produce.born_host
    ctype = (headers.get("content-type") or JSON).split(";", 1)[0].strip().lower()
    if ctype == JSON or ctype.endswith("+json"):
        if query:  # raw-form parameters: validated even when unused, never silently odd
            parse_produce_raw(b"", query, topic, mms, born)
        return parse_produce_json(body, topic, mms, born)
    if ctype == "application/octet-stream":
        msg, qid = parse_produce_raw(body, query, topic, mms, born)
        return [msg], [qid], None
    raise invalid("Content-Type", f"expected {JSON} or application/octet-stream, got {ctype!r}")


_GROUP = TypeAdapter(GroupPath)
_NO_BODY = object()
_Model = TypeVar("_Model", bound=BaseModel)


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI would decode a body of this Content-Type as JSON (none: it would not)."""
    if not content_type:
        return False
    if content_type == JSON:
        return True
    parsed = email.message.Message()
    parsed["content-type"] = content_type
    subtype = parsed.get_content_subtype()
    return parsed.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def decode_model(model: type[_Model], group: str, headers: Mapping[str, str], body: bytes) -> _Model:
    """A consumer route's group and body as its FastAPI declaration would take them, refused the
    same way: JSON only under a JSON Content-Type (else the bytes fail as a non-object), a body
    that is no JSON before anything else (400 naming the position, as FastAPI does), then the
    group's rule, then the model's (each error as `problems.validation_problem` names it)."""
    doc: Any = _NO_BODY
    if body:
        if _is_json(headers.get("content-type")):
            try:
                doc = json.loads(body)
            except json.JSONDecodeError as exc:
                raise validation_problem([{"loc": ("body", exc.pos), "msg": "JSON decode error"}]) from None
            except Exception as exc:  # not UTF-8/16/32, nested past the recursion limit
                raise HTTPException(400, "There was an error parsing the body") from exc
        else:
            doc = body
    try:
        _GROUP.validate_python(group)
    except ValidationError as exc:
        raise validation_problem([{**e, "loc": ("path", "group")} for e in exc.errors()]) from None
    if doc is _NO_BODY:
        raise validation_problem([{"loc": ("body",), "msg": "Field required"}])
    try:
        return model.model_validate(doc, from_attributes=True)
    except ValidationError as exc:
        raise validation_problem(exc.errors()) from None


_TYPED_RESULT_FIELDS = ("deliverAt", "recallHandle", "transactionId", "messageId")


def result_json(r: tuple) -> dict[str, Any]:
    """One send result as the API shows it (a typed message's adds when it is due, its recall
    handle, its transaction id, and its messageId: the UNIQ_KEY it is found and delivered by,
    while `msgId` names where its copy is stored until then)."""
    doc = {"msgId": r[0], "queueId": r[1], "queueOffset": r[2], "commitLogOffset": r[3]}
    if len(r) > 5:
        for name, value in zip(_TYPED_RESULT_FIELDS, r[5:9], strict=True):
            if value is not None:
                doc[name] = value
    return doc


class HotHandlers(ConsumerHandlers):
    """Produce and pull (here), receive and ack (`ConsumerHandlers`) of one broker over its
    services. Callers: `HotPath` and the FastAPI routes."""

    async def produce(
        self,
        topic: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        body: bytes,
        started: float,
        client: HttpClient,
    ) -> bytes:
        """Decode, store (after commit; the caller admitted it) and answer `{"results": [...]}`.
        `client` is listed as a producer of `topic` (its group, as for RocketMQ 5 producers) once
        the put is stored: a refused one (no such topic, a bad name, bad input) lists nothing."""
        produce = self.services.produce
        try:
            msgs, qids, key_run = _decode_produce(self.services, topic, headers, query, body)
        except BrokerError as exc:
            produce.refused(topic, exc)
            raise
        results = await produce.put(topic, msgs, qids, started, key_run)
        self.services.clients.seen(topic, topic, ClientProtocol.HTTP, client.client_id, client.addr,
                                   client_type=client.client_type or "PRODUCER",
                                   language=client.language, version=client.version)
        return orjson.dumps({"results": [result_json(r) for r in results]})

    async def pull(
        self,
        account: Account,
        topic: str,
        queue_raw: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
    ) -> tuple[bytes, str]:
        """Messages from `offset`, holding the request (long poll) when there are none yet.

        Returns (body, content type): JSON, or the binary page (wire.pullpage) when
        `wants_binary`. Errors are BrokerErrors (problem+json) in both forms."""
        binary = wants_binary(headers, query)
        if not (queue_raw.isascii() and queue_raw.isdigit()) or len(queue_raw) > 5 or int(queue_raw) > 65535:
            raise invalid("queueId", f"expected an integer in 0..65535, got {queue_raw[:40]!r}")
        offset = int_param(query, "offset", 0, 0, 2**62)
        max_messages = int_param(query, "maxMessages", 32, 1, MAX_PULL_MESSAGES)
        wait_ms = int_param(query, "waitMs", 0, 0, 2**31)
        enc = query.get("bodyEncoding")
        if enc not in (None, "", "utf-8", "base64"):
            raise invalid("bodyEncoding", f"expected utf-8 or base64, got {enc[:40]!r}")
        if binary:
            build: MessageBuilder = message_binary_view
        else:
            build = _build_base64 if enc == "base64" else message_json_view
        message_filter = None
        if "filterType" in query or "filterExpression" in query:
            message_filter = self.services.message_model.message_filter(
                query.get("filterType"), query.get("filterExpression")
            )
        result = await self.services.pull.pull(
            account, topic, int(queue_raw), offset, max_messages, wait_ms, build, message_filter
        )
        if binary:
            body = pull_binary_bytes(
                result.messages, result.next_offset, result.min_offset, result.max_offset
            )
            return body, PULL_BINARY_CONTENT_TYPE
        body = orjson.dumps(
            {
                "messages": result.messages,
                "nextOffset": result.next_offset,
                "minOffset": result.min_offset,
                "maxOffset": result.max_offset,
            }
        )
        return body, JSON


class HotPath:
    """Pure ASGI serving of `POST /topics/{t}/messages`, `GET /topics/{t}/queues/{q}/messages`,
    `POST /consumers/{g}/receive` and `POST /consumers/{g}/ack`."""

    def __init__(self, services: BrokerServices, handlers: HotHandlers, request_limit_bytes: int) -> None:
        self.services = services
        self.h = handlers
        self.request_limit_bytes = request_limit_bytes

    def match(self, scope: dict[str, Any]) -> tuple[str, list[str]] | None:
        """("produce" | "pull" | "receive" | "ack", path parts) when `scope` is a hot route."""
        path: str = scope["path"]
        method = scope["method"]
        if path.startswith("/topics/"):
            parts = path[8:].split("/")
            if method == "POST" and len(parts) == 2 and parts[1] == "messages":
                return "produce", parts
            if method == "GET" and len(parts) == 4 and parts[1] == "queues" and parts[3] == "messages":
                return "pull", parts
        elif method == "POST" and path.startswith("/consumers/"):
            parts = path[11:].split("/")
            # An empty group is no route at all (FastAPI's 404).
            if len(parts) == 2 and parts[0] and parts[1] in _CONSUMER_ROUTES:
                return parts[1], parts
        return None

    async def __call__(
        self, kind: str, parts: list[str], scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        started = time.perf_counter()
        # Only the headers the hot routes read (decoding all of them cost ~1% of a produce); the
        # first of a repeated one, as Starlette's `headers.get` and `AuthMiddleware` take it.
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            key = _HOT_HEADERS.get(k) or _HOT_HEADERS.get(k.lower())
            if key is not None and key not in headers:
                headers[key] = v.decode("latin-1")
        try:
            account = self.services.acl.authenticate(headers.get("authorization"))
        except BrokerError as exc:
            await send_unauthorized(send, exc)
            return
        # The topic, or the group. The server has percent-decoded `path` once already: decoding
        # again would turn the '%DL' of '%DLQ%default' into a byte.
        name = parts[0]
        try:
            ctype = _JSON_CTYPE
            if kind == "pull":
                out, ct = await self.h.pull(account, name, parts[2], headers, _query(scope))
                if ct != JSON:
                    ctype = _BINARY_CTYPE
            else:
                if kind == "produce":
                    # A request without the right is refused before its body is read.
                    self.services.produce.admit(account, name)
                limit = self.request_limit_bytes
                body = await read_body(scope, receive, limit, headers.get("content-length"))
                if kind == "produce":
                    out = await self.h.produce(
                        name, headers, _query(scope), body, started, client_of(headers, scope.get("client"))
                    )
                elif kind == "receive":
                    got = decode_model(ReceiveIn, name, headers, body)
                    consume = functools.partial(self.h.receive, account, name, got,
                                                client_of(headers, scope.get("client")))
                    # Only a long poll can outlive its client; the watch costs a task.
                    out = await (_unless_gone(receive, consume) if got.waitMs > 0 else consume())
                else:
                    out = await self.h.ack(account, name, decode_model(AckIn, name, headers, body))
            await _send(send, 200, out, ctype)
        except BrokerError as exc:
            await _send_error(send, exc)
        except BodyTooLarge as exc:
            await _send(send, 413, orjson.dumps(exc.problem()), _PROBLEM_CTYPE, close=True)
        except BodyIncomplete as exc:
            await _send_error(send, invalid(exc.field, exc.detail), close=True)
        except HTTPException as exc:
            await _send(send, exc.status_code, orjson.dumps(http_problem(exc, scope["path"])), _PROBLEM_CTYPE)
        except DLedgerException as exc:
            await _send_error(send, from_dledger(exc))
        except Exception as exc:
            log.exception("event=http_unhandled method=%s path=%s", scope["method"], scope["path"])
            await _send_error(send, unexpected(exc))


async def _unless_gone(receive: Any, run: Callable[[asyncio.Event], Awaitable[bytes]]) -> bytes:
    """`run(gone)`, with `gone` set if the client hangs up meanwhile. A long-polling receive whose
    consumer went away (shut down, killed) would otherwise still take the next messages, and they
    would wait out their invisible time unseen."""
    gone = asyncio.Event()

    async def watch() -> None:
        # The body is read: the server's next event for this request is its disconnect.
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    try:
        return await run(gone)
    finally:
        watcher.cancel()


def _query(scope: dict[str, Any]) -> dict[str, str]:
    qs = scope.get("query_string") or b""
    return dict(parse_qsl(qs.decode("latin-1"), keep_blank_values=True)) if qs else {}


async def _send(send: Any, status: int, body: bytes, ctype: bytes, *, close: bool = False) -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    if close:  # a body refused unread (or cut off): the connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Any, exc: BrokerError, *, close: bool = False) -> None:
    if exc.code == BrokerCode.TIMEOUT:
        exc.extra.setdefault("outcome", "unknown")
    await _send(send, exc.status, orjson.dumps(exc.problem()), _PROBLEM_CTYPE, close=close)
