"""The hot routes — produce and pull — as plain functions over raw inputs, plus `HotPath`, a pure
ASGI dispatcher that serves them without the FastAPI/Starlette middleware and dependency stack.

The FastAPI routes in `messages.py` call the same `HotHandlers` (they are what the OpenAPI
document describes, and they serve if the fast path is off); `BrokerApp.__call__` hands these two
paths to `HotPath` first. Both only decode, call `ProduceService`/`PullService` and render; errors
are the same problem+json either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

import orjson

from broker.errors import BrokerCode, BrokerError, from_dledger, invalid
from broker.http.codec import (
    PULL_BINARY_CONTENT_TYPE,
    message_binary_view,
    message_json_view,
    parse_produce_json,
    parse_produce_raw,
    pull_binary_bytes,
)
from broker.message import Message, MessageHead
from broker.service import MAX_PULL_MESSAGES, Account, BrokerServices
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
}
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
) -> tuple[list[Message], list[int | None]]:
    """The produce body (JSON, or raw with query parameters) as messages and their queue ids."""
    produce = services.produce
    mms, born = produce.max_message_size, produce.born_host
    ctype = (headers.get("content-type") or JSON).split(";", 1)[0].strip().lower()
    if ctype == JSON or ctype.endswith("+json"):
        if query:  # raw-form parameters: validated even when unused, never silently odd
            parse_produce_raw(b"", query, topic, mms, born)
        return parse_produce_json(body, topic, mms, born)
    if ctype == "application/octet-stream":
        msg, qid = parse_produce_raw(body, query, topic, mms, born)
        return [msg], [qid]
    raise invalid("Content-Type", f"expected {JSON} or application/octet-stream, got {ctype!r}")


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


class HotHandlers:
    """Produce and pull of one broker over its services. Callers: `HotPath` and the FastAPI routes."""

    def __init__(self, services: BrokerServices) -> None:
        self.services = services

    async def produce(
        self, topic: str, headers: Mapping[str, str], query: Mapping[str, str], body: bytes, started: float
    ) -> bytes:
        """Decode, store (after commit; the caller admitted it) and answer `{"results": [...]}`."""
        produce = self.services.produce
        try:
            msgs, qids = _decode_produce(self.services, topic, headers, query, body)
        except BrokerError as exc:
            produce.refused(topic, exc)
            raise
        results = await produce.put(topic, msgs, qids, started)
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

        Returns (body, content type): JSON, or the binary page (codec.PULL_HEADER) when
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
    """Pure ASGI serving of `POST /topics/{t}/messages` and `GET /topics/{t}/queues/{q}/messages`."""

    def __init__(self, services: BrokerServices, handlers: HotHandlers, request_limit_bytes: int) -> None:
        self.services = services
        self.h = handlers
        self.request_limit_bytes = request_limit_bytes

    def match(self, scope: dict[str, Any]) -> tuple[str, list[str]] | None:
        """("produce" | "pull", path parts) when `scope` is one of the two hot routes."""
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
        started = time.perf_counter()
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
            account = self.services.acl.authenticate(headers.get("authorization"))
            qs = scope.get("query_string") or b""
            query = dict(parse_qsl(qs.decode("latin-1"), keep_blank_values=True)) if qs else {}
            ctype = _JSON_CTYPE
            if kind == "produce":
                # A request without the right is refused before its body is read.
                self.services.produce.admit(account, topic)
                body = await read_body(
                    scope, receive, self.request_limit_bytes, headers.get("content-length")
                )
                out = await self.h.produce(topic, headers, query, body, started)
            else:
                out, ct = await self.h.pull(account, topic, parts[2], headers, query)
                if ct != JSON:
                    ctype = _BINARY_CTYPE
            await _send(send, 200, out, ctype)
        except BrokerError as exc:
            await _send_error(send, exc)
        except BodyTooLarge as exc:
            await _send(send, 413, orjson.dumps(exc.problem()), _PROBLEM_CTYPE)
        except BodyIncomplete as exc:
            await _send_error(send, invalid(exc.field, exc.detail))
        except DLedgerException as exc:
            await _send_error(send, from_dledger(exc))
        except Exception:
            log.exception("event=http_unhandled method=%s path=%s", scope["method"], scope["path"])
            await _send_error(send, BrokerError(BrokerCode.INTERNAL_ERROR, "internal error; see broker log"))


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
    await _send(send, exc.status, orjson.dumps(exc.problem()), _PROBLEM_CTYPE)
