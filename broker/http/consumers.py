"""The group-consumption routes (`/consumers/{group}/receive`, `/ack`, `/nack`, `/invisible`)
over `PopService` (`broker/service/pop.py`), which holds the state and the rules, and the
dead-letter resend over `DeadLetterService`.

Receive and ack are most of a consumer's requests: `hot.HotPath` serves them before FastAPI sees
them, through `ConsumerHandlers`; these declarations carry their OpenAPI description and serve
them through the same handlers when the fast path is bypassed."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, NamedTuple

import orjson
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from broker.http.acl import account_of
from broker.http.codec import message_json, message_json_view
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
from broker.message import MessageHead
from broker.service import Account, AckResult, BrokerServices, ClientProtocol, ReceivedMessage
from broker.service.pop import GROUP_NAME_RE, MAX_GROUP_LENGTH, Rendering

GroupPath = Annotated[str, Path(min_length=1, max_length=MAX_GROUP_LENGTH, pattern=GROUP_NAME_RE.pattern)]


def _json(doc: Any) -> Response:
    return _raw_json(orjson.dumps(doc))


def _raw_json(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def _received_view(view: memoryview, head: MessageHead, topic_at: int, props_at: int) -> dict[str, Any]:
    return message_json_view(view, head, topic_at, props_at, message_id=True)


# A receive's messages rendered as `message_json` shows them, from the stored bytes where it can.
RECEIVED_JSON = Rendering(_received_view, message_json)


def received_json(received: ReceivedMessage) -> dict[str, Any]:
    """A received message as the API shows it: the message (as `RECEIVED_JSON` rendered it, or a
    `MessageExt`), its receipt handle and redeliveries."""
    m = received.message
    doc = m if isinstance(m, dict) else message_json(m)
    doc["reconsumeTimes"] = received.reconsume_times
    doc["receiptHandle"] = received.receipt_handle
    return doc


class HttpClient(NamedTuple):
    """An HTTP client as the client registry lists it (`ClientRegistry.seen`)."""

    client_id: str
    addr: str
    client_type: str = ""
    language: str = ""
    version: str = ""


# RocketMQ's client types an HTTP client may name itself by (`X-Client-Type`); anything else is
# shown as unknown rather than trusted into the list.
_CLIENT_TYPES = frozenset({"PRODUCER", "SIMPLE_CONSUMER", "PUSH_CONSUMER"})
# User agents of SDKs whose language and version the list shows: product token → language.
_SDK_AGENTS = {"ledgermq-python": "PYTHON"}


def _utf8(value: str) -> str:
    """A header value as the UTF-8 its bytes most likely are (ASGI hands them over as Latin-1, so
    a UTF-8 client id read as-is shows as mojibake); the Latin-1 reading when they are not UTF-8."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def client_of(headers: Mapping[str, str], peer: Sequence[Any] | None) -> HttpClient:
    """An HTTP client from its headers and the ASGI scope's `client` (host, port): its
    `X-Client-Id` header when it sends one, else its address and user agent (one process, one
    id, whichever pooled connection it uses); its `X-Client-Type`; and the language and version
    of a known SDK from its `User-Agent` (`ledgermq-python/0.1.0 (...)`)."""
    host = peer[0] if peer else "?"
    addr = f"{host}:{peer[1]}" if peer else "?"
    agent = headers.get("user-agent", "")
    client_id = _utf8(headers.get("x-client-id", "")) or f"{host} {agent}".strip()
    client_type = headers.get("x-client-type", "")
    product, _, rest = agent.partition("/")
    language = _SDK_AGENTS.get(product, "")
    version = rest.split(" ", 1)[0][:32] if language else ""
    return HttpClient(
        client_id[:128], addr, client_type if client_type in _CLIENT_TYPES else "", language, version
    )


def settled_json(results: list[AckResult]) -> dict[str, Any]:
    """The answer to an ack or nack: each receipt handle's outcome."""
    return {"results": [{"receiptHandle": r.receipt_handle, "status": r.status} for r in results]}


class ConsumerHandlers:
    """Receive and ack of one broker's groups over `PopService`, from decoded requests to the
    answer's bytes. Callers: `hot.HotPath` and the routes below."""

    def __init__(self, services: BrokerServices) -> None:
        self.services = services

    async def receive(
        self,
        account: Account,
        group: str,
        body: ReceiveIn,
        client: HttpClient,
        gone: asyncio.Event | None = None,
    ) -> bytes:
        """Messages for `group`, invisible to it until acked, as `{"messages": [...]}`; `client`
        (`client_of`) is recorded as the group's; `gone`: see `PopService.receive`."""
        services = self.services
        services.clients.seen(group, body.topic, ClientProtocol.HTTP, client.client_id, client.addr,
                              client_type=client.client_type, language=client.language,
                              version=client.version)
        message_filter = None
        if body.filterType is not None or body.filterExpression is not None:
            message_filter = services.message_model.message_filter(body.filterType, body.filterExpression)
        got = await services.pop.receive(
            account, group, body.topic, body.maxMessages, body.invisibleMs, body.waitMs, message_filter,
            RECEIVED_JSON, gone,
        )
        return orjson.dumps({"messages": [received_json(r) for r in got]})

    async def ack(self, account: Account, group: str, body: AckIn) -> bytes:
        """Settle received messages: `{"results": [...]}`, one per receipt handle."""
        results = await self.services.pop.ack(account, group, body.topic, body.receiptHandles)
        return orjson.dumps(settled_json(results))


def build_router(services: BrokerServices, handlers: ConsumerHandlers) -> APIRouter:
    """The routes of one broker's group consumption; receive and ack delegate to `handlers`."""
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
        client = client_of(request.headers, request.scope.get("client"))
        return _raw_json(await handlers.receive(account_of(request), group, body, client))

    @router.post(
        "/consumers/{group}/ack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Acknowledge received messages",
    )
    async def ack(group: GroupPath, body: AckIn, request: Request) -> Response:
        return _raw_json(await handlers.ack(account_of(request), group, body))

    @router.post(
        "/consumers/{group}/nack",
        tags=["consumers"],
        response_model=SettleOut,
        responses=PROBLEM_RESPONSES,
        summary="Give messages back for redelivery now",
    )
    async def nack(group: GroupPath, body: AckIn, request: Request) -> Response:
        results = await pop.nack(account_of(request), group, body.topic, body.receiptHandles)
        return _json(settled_json(results))

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
