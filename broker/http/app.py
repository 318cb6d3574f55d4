"""`create_app(controller) -> FastAPI`: the broker's HTTP API (OpenAPI at /openapi.json, /docs)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from broker.http import admin, consumers, messages
from broker.http.acl import AclAuthMiddleware
from broker.http.context import HttpContext
from broker.http.hot import HotHandlers, HotPath
from broker.http.limits import BodyLimitMiddleware
from broker.http.metrics import BrokerStateCollector
from broker.http.problems import install_problem_handlers
from broker.http.schemas import ProduceRequest

log = logging.getLogger(__name__)


def _state_for_metrics(ctx: HttpContext) -> dict[str, Any]:
    """Scrape-time view: role, DLedger metadata, consumer lag and queue max offsets."""
    store = ctx.store
    status = ctx.status()
    lag = []
    queues = []
    for topic, cfg in store.topics.all().items():
        for q in range(cfg.queue_nums):
            queues.append((topic, q, store.max_offset(topic, q)))
    maxes = {(t, q): v for t, q, v in queues}
    for group in store.offsets.groups():
        for topic, offs in store.offsets.offsets_of(group).items():
            for q, off in offs.items():
                lag.append((group, topic, q, max(0, maxes.get((topic, q), 0) - off)))
    return {
        "role": status["role"],
        "dledger": status["dledger"],
        "lag": lag,
        "queues": queues,
        "store_path": ctx.config.store_path_root_dir,
        "idempotency": (len(store.idempotency), store.idempotency.evicted),
    }


class BrokerApp(FastAPI):
    """FastAPI with a fast path: produce and pull go straight to `HotPath` (pure ASGI, no
    middleware/dependency stack); everything else is ordinary FastAPI."""

    hot_path: HotPath | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        hot = self.hot_path
        if hot is not None and scope["type"] == "http":
            matched = hot.match(scope)
            if matched is not None:
                await hot(matched[0], matched[1], scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(controller: Any) -> FastAPI:
    """Build the HTTP app for one broker. `controller` provides `config` (BrokerConfig), `store`
    (DefaultMessageStore) and optionally `dledger_server`."""
    ctx = HttpContext(controller)
    app = BrokerApp(
        title=f"LedgerMQ broker {ctx.config.broker_name}",
        version="0.1.0",
        description="Produce, pull (long polling), group consumption, topic and offset admin.",
    )
    app.state.ctx = ctx
    install_problem_handlers(app)
    # Added before the ACL middleware, so it runs after it: a request without rights is refused
    # before its body is read.
    app.add_middleware(BodyLimitMiddleware, limit=ctx.request_limit_bytes)
    if ctx.acl is not None:
        app.add_middleware(AclAuthMiddleware, acl=ctx.acl)
    handlers = HotHandlers(ctx)
    app.hot_path = HotPath(ctx, handlers)
    app.include_router(messages.build_router(ctx, handlers))
    app.include_router(consumers.build_router(ctx))
    app.include_router(admin.build_router(ctx))
    ctx.metrics.registry.register(
        BrokerStateCollector(ctx.config.broker_name, lambda: _state_for_metrics(ctx))
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        # The hot routes decode by hand; publish their request models for the docs and fuzzers.
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        body = ProduceRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components["ProduceRequest"] = body
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
