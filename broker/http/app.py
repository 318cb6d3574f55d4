"""`create_app(services) -> FastAPI`: the broker's HTTP API (OpenAPI at /openapi.json, offline
/docs and /redoc), a thin adapter over `broker.service`: each route parses, calls a service and renders."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from apidocs import install_offline_docs
from broker.http import admin, consumers, message_model, messages
from broker.http.acl import AuthMiddleware
from broker.http.hot import HotHandlers, HotPath
from broker.http.problems import install_problem_handlers
from broker.http.schemas import ProduceRequest
from broker.service import BrokerServices
from wire.limits import BodyLimitMiddleware, request_limit_bytes

log = logging.getLogger(__name__)


class BrokerApp(FastAPI):
    """FastAPI with a fast path: produce, pull, receive and ack go straight to `HotPath` (pure
    ASGI, no middleware/dependency stack); everything else is ordinary FastAPI."""

    hot_path: HotPath | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        hot = self.hot_path
        if hot is not None and scope["type"] == "http":
            matched = hot.match(scope)
            if matched is not None:
                await hot(matched[0], matched[1], scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(services: BrokerServices) -> BrokerApp:
    """Build the HTTP app for one broker's services."""
    config = services.state.config
    limit = request_limit_bytes(config.max_message_size)
    app = BrokerApp(
        title=f"LedgerMQ broker {config.broker_name}",
        version="0.1.0",
        description="Produce, pull (long polling), group consumption, topic and offset admin.",
        docs_url=None,
        redoc_url=None,
    )
    install_offline_docs(app)
    install_problem_handlers(app)
    # Added before the auth middleware, so it runs after it: a request without rights is refused
    # before its body is read.
    app.add_middleware(BodyLimitMiddleware, limit=limit)
    app.add_middleware(AuthMiddleware, acl=services.acl)
    handlers = HotHandlers(services)
    app.hot_path = HotPath(services, handlers, limit)
    app.include_router(messages.build_router(services, handlers))
    app.include_router(consumers.build_router(services, handlers))
    app.include_router(admin.build_router(services))
    app.include_router(message_model.build_router(services))
    _publish_hot_schemas(app)
    return app


def _publish_hot_schemas(app: FastAPI) -> None:
    """The hot routes decode by hand; publish their request models for the docs and fuzzers."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        body = ProduceRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components["ProduceRequest"] = body
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
