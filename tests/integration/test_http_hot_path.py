"""The HTTP fast path (`broker/http/hot.py`) against the FastAPI routes it stands in for, in one
process on a real store with ACL on: `HotPath` called on its own and the FastAPI stack called on
its own answer every malformed, oversized or unauthorized receive, ack, produce and pull with the
same status, problem body and headers — and `BrokerApp` hands receive and ack to `HotPath`, which
serves them (clients recorded, messages received and acked)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from fastapi import FastAPI

from broker.config import BrokerConfig
from tests.ports import free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

ACCOUNTS = {
    "accounts": [
        {"name": "ops", "token": "admin-tok", "admin": True},
        {
            "name": "orders-app",
            "token": "app-tok",
            "topicPerms": {"orders": "PUB|SUB", "*": "DENY"},
            "groupPerms": {"billing": "SUB"},
        },
    ]
}
ADMIN = (b"authorization", b"Bearer admin-tok")
JSON_CT = (b"content-type", b"application/json")
HANDLE = "0000abcd.1.2.3"  # well-formed, of no delivery: settles EXPIRED


class Answer(dict):
    """status, headers (name → value, sorted) and body of one ASGI response."""

    @property
    def problem(self) -> dict[str, Any]:
        return json.loads(self["body"])


async def call(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: tuple[tuple[bytes, bytes], ...] = (ADMIN, JSON_CT),
    *,
    client: tuple[str, int] | None = ("10.0.0.1", 5555),
    chunk_bytes: int = 1 << 20,
    disconnect: bool = False,
) -> Answer:
    """One request through an ASGI callable, its body in chunks as a server would hand it over."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": list(headers),
        "server": ("127.0.0.1", 8080),
        "client": client,
    }
    chunks = [body[i : i + chunk_bytes] for i in range(0, len(body), chunk_bytes)] or [b""]
    pending = list(chunks)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not pending:
            await asyncio.sleep(3600)  # nothing more ever comes: the app must not wait for it
        chunk = pending.pop(0)
        if disconnect and not pending:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 30)
    return Answer(
        status=sent[0]["status"],
        headers=dict(sorted((k.decode(), v.decode()) for k, v in sent[0]["headers"])),
        body=b"".join(m.get("body", b"") for m in sent[1:]),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def broker(tmp_path_factory) -> AsyncIterator[Any]:
    """A started local broker with ACL on, its services and app, with topic `orders`."""
    from broker.http.app import create_app
    from broker.role_change import wait_until_master
    from broker.runtime import build_controller
    from broker.service import BrokerServices

    tmp = tmp_path_factory.mktemp("hot-path")
    (tmp / "acl.json").write_text(json.dumps(ACCOUNTS))
    cfg = BrokerConfig(
        store_path_root_dir=str(tmp),
        default_topic_queue_nums=1,
        listen_port=free_port(),
        acl_enable=True,
        acl_config_file=str(tmp / "acl.json"),
    )
    ctl = build_controller(cfg)
    services = BrokerServices.create(ctl)
    app = create_app(services)
    await ctl.start()
    try:
        await wait_until_master(ctl.store, timeout_s=15)
        assert (await call(app, "PUT", "/topics/orders", b"{}")).get("status") == 200
        yield services, app
    finally:
        await ctl.shutdown()


def receive_body(**fields: Any) -> bytes:
    return json.dumps({"topic": "orders", **fields}).encode()


def ack_body(*handles: Any, **fields: Any) -> bytes:
    return json.dumps({"topic": "orders", "receiptHandles": list(handles), **fields}).encode()


R, A = "/consumers/g/receive", "/consumers/g/ack"
# (path, body, headers, options): requests both paths must refuse alike. Neither changes state.
REFUSED: list[tuple[str, bytes, tuple, dict]] = [
    # who: authentication before anything else, rights inside PopService
    (R, receive_body(), (JSON_CT,), {}),
    (A, ack_body(HANDLE), ((b"authorization", b"Bearer nope"), JSON_CT), {}),
    (R, b"{{{", ((b"authorization", b"Basic abc"), JSON_CT), {}),
    (A, ack_body(HANDLE), ((b"authorization", b"Bearer app-tok"), ADMIN, JSON_CT), {}),
    (R, receive_body(topic="other"), ((b"authorization", b"Bearer app-tok"), JSON_CT), {}),
    (A, ack_body(HANDLE), ((b"authorization", b"Bearer app-tok"), JSON_CT), {}),
    ("/topics/orders/messages", b'{"messages":[{"body":"x"}]}', (JSON_CT,), {}),
    # the body as FastAPI reads it
    (R, b"", (ADMIN, JSON_CT), {}),
    (A, b"", (ADMIN,), {}),
    (R, b"null", (ADMIN, JSON_CT), {}),
    (R, b'{"topic":"orders"', (ADMIN, JSON_CT), {}),
    (A, b"\xff\xfe\x00", (ADMIN, JSON_CT), {}),
    (R, b"[" * 100_000, (ADMIN, JSON_CT), {}),
    (R, receive_body(), (ADMIN,), {}),
    (R, receive_body(), (ADMIN, (b"content-type", b"text/plain")), {}),
    (A, ack_body(1), (ADMIN, (b"content-type", b"application/vnd.x+json; charset=utf-8")), {}),
    (R, b"[1]", (ADMIN, JSON_CT), {}),
    # the group's rule (before the body's), then the models' rules
    ("/consumers/" + "x" * 121 + "/receive", receive_body(maxMessages=0), (ADMIN, JSON_CT), {}),
    ("/consumers/a.b/ack", ack_body(), (ADMIN, JSON_CT), {}),
    ("/consumers/a.b/ack", b"{", (ADMIN, JSON_CT), {}),
    (R, receive_body(maxMessages=0), (ADMIN, JSON_CT), {}),
    (R, receive_body(maxMessages=True), (ADMIN, JSON_CT), {}),
    (R, receive_body(invisibleMs="5000"), (ADMIN, JSON_CT), {}),
    (R, receive_body(waitMs=1.5), (ADMIN, JSON_CT), {}),
    (R, receive_body(maxMessages=10**30), (ADMIN, JSON_CT), {}),
    (R, receive_body(filterType="XX"), (ADMIN, JSON_CT), {}),
    (R, receive_body(filterType="SQL92", filterExpression="a >"), (ADMIN, JSON_CT), {}),
    (R, receive_body(topic="a b"), (ADMIN, JSON_CT), {}),
    (R, receive_body(extra=1), (ADMIN, JSON_CT), {}),
    (A, ack_body(), (ADMIN, JSON_CT), {}),
    (A, ack_body(*[HANDLE] * 4097), (ADMIN, JSON_CT), {}),
    (A, ack_body(HANDLE, "bad"), (ADMIN, JSON_CT), {}),
    (A, ack_body(HANDLE, topic="nope"), (ADMIN, JSON_CT), {}),
    (A, json.dumps({"topic": "orders"}).encode(), (ADMIN, JSON_CT), {}),
    # the body limit, and a body that never arrives whole
    (A, ack_body(HANDLE), (ADMIN, JSON_CT, (b"content-length", b"99999999999")), {}),
    (R, receive_body(), (ADMIN, JSON_CT, (b"content-length", b"12x")), {}),
    (A, b"[" + b"0," * (5 << 20) + b"0]", (ADMIN, JSON_CT), {}),
    (R, receive_body(), (ADMIN, JSON_CT), {"chunk_bytes": 4, "disconnect": True}),
]


@pytest.mark.parametrize(("path", "body", "headers", "options"), REFUSED)
async def test_the_fast_path_refuses_as_the_fastapi_routes_do(broker, path, body, headers, options):
    _, app = broker
    scope = {"type": "http", "method": "POST", "path": path}
    matched = app.hot_path.match(scope)
    assert matched is not None, "BrokerApp would not hand this request to HotPath"

    async def hot_only(scope: dict, receive: Any, send: Any) -> None:
        await app.hot_path(*matched, scope, receive, send)

    async def fastapi_only(scope: dict, receive: Any, send: Any) -> None:
        await FastAPI.__call__(app, scope, receive, send)

    fast = await call(hot_only, "POST", path, body, headers, **options)
    slow = await call(fastapi_only, "POST", path, body, headers, **options)
    assert fast == slow
    assert fast["status"] >= 400 and fast["headers"]["content-type"] == "application/problem+json"


async def test_refusals_name_the_field_code_and_challenge_as_before(broker):
    """What clients rely on, pinned as the FastAPI routes answered before the fast path."""
    _, app = broker
    r = await call(app, "POST", R, receive_body(), (JSON_CT,))
    assert (r["status"], r.problem["code"]) == (401, "UNAUTHORIZED")
    assert r["headers"]["www-authenticate"] == 'Bearer realm="ledgermq"'
    r = await call(
        app, "POST", R, receive_body(topic="other"), ((b"authorization", b"Bearer app-tok"), JSON_CT)
    )
    assert (r["status"], r.problem["code"]) == (403, "FORBIDDEN")
    r = await call(app, "POST", R, receive_body(maxMessages=0))
    assert (r["status"], r.problem["code"], r.problem["field"]) == (400, "INVALID_REQUEST", "maxMessages")
    r = await call(app, "POST", A, ack_body(HANDLE, "bad"))
    assert r.problem["field"] == "receiptHandles.1"
    r = await call(app, "POST", R, receive_body(topic="a b"))
    assert (r.problem["code"], r.problem["field"]) == ("INVALID_TOPIC", "topic")
    r = await call(app, "POST", "/consumers/" + "x" * 121 + "/receive", receive_body(maxMessages=0))
    assert r.problem["field"] == "group" and "at most 120 characters" in r.problem["detail"]
    r = await call(app, "POST", R, b"", (ADMIN, JSON_CT))
    assert (r.problem["field"], r.problem["detail"]) == ("body", "body: Field required")
    r = await call(app, "POST", A, b"\xff", (ADMIN, JSON_CT))
    assert (r["status"], r.problem["detail"]) == (400, "There was an error parsing the body")
    r = await call(app, "POST", A, ack_body(HANDLE), (ADMIN, JSON_CT, (b"content-length", b"99999999999")))
    assert (r["status"], r.problem["code"], r["headers"]["connection"]) == (413, "REQUEST_TOO_LARGE", "close")
    r = await call(app, "POST", A, b"[" + b"0," * (5 << 20) + b"0]")
    assert (r["status"], r.problem["code"]) == (413, "REQUEST_TOO_LARGE")


async def test_only_receive_and_ack_of_a_group_take_the_fast_path(broker):
    _, app = broker
    hot = app.hot_path
    for method, path, kind in [
        ("POST", R, "receive"),
        ("POST", "/consumers/%DLQ%g/ack", "ack"),
        ("POST", "/consumers/g/nack", None),
        ("POST", "/consumers/g/invisible", None),
        ("POST", "/consumers/g/dlq/resend", None),
        ("GET", R, None),
        ("POST", "/consumers//receive", None),
        ("POST", R + "/", None),
    ]:
        matched = hot.match({"type": "http", "method": method, "path": path})
        assert (matched and matched[0]) == kind, (method, path)
    # What falls through is FastAPI's: an empty group is no route, a GET is no method.
    assert (await call(app, "POST", "/consumers//receive", receive_body()))["status"] == 404
    r = await call(app, "GET", R)
    assert r["status"] == 405
    assert r["headers"]["allow"] == "POST"  # the methods the path has (was empty: included routers)
    r = await call(app, "DELETE", "/topics/orders/messages")
    assert (r["status"], r["headers"]["allow"]) == (405, "POST")


async def test_a_group_receives_and_acks_through_the_fast_path(broker):
    services, app = broker
    r = await call(app, "POST", "/topics/orders/messages", b'{"messages":[{"body":"m1"},{"body":"m2"}]}')
    assert r["status"] == 200, r["body"]
    consumer = (ADMIN, JSON_CT, (b"user-agent", b"sdk/1"), (b"x-client-id", b"cid-7"), (b"user-agent", b"x"))
    r = await call(app, "POST", "/consumers/billing/receive", receive_body(maxMessages=8), consumer)
    assert (r["status"], r["headers"]["content-type"]) == (200, "application/json")
    got = json.loads(r["body"])["messages"]
    assert [m["body"] for m in got] == ["m1", "m2"] and all(m["reconsumeTimes"] == 0 for m in got)
    [client] = services.clients.clients("billing")
    assert (client.client_id, client.addr, client.topic) == ("cid-7", "10.0.0.1:5555", "orders")
    handles = [m["receiptHandle"] for m in got]
    r = await call(
        app,
        "POST",
        "/consumers/billing/ack",
        ack_body(*handles),
        ((b"authorization", b"Bearer app-tok"), JSON_CT),
    )
    assert r["status"] == 200
    assert json.loads(r["body"]) == {"results": [{"receiptHandle": h, "status": "OK"} for h in handles]}
    # Without X-Client-Id the client is its address and (first) user agent; no client address: "?".
    await call(
        app, "POST", "/consumers/g2/receive", receive_body(), (ADMIN, JSON_CT, (b"user-agent", b"ua/1"))
    )
    await call(app, "POST", "/consumers/g3/receive", receive_body(), (ADMIN, JSON_CT), client=None)
    seen = services.clients.clients("g2") + services.clients.clients("g3")
    assert [(c.client_id, c.addr) for c in seen] == [("10.0.0.1 ua/1", "10.0.0.1:5555"), ("?", "?")]
