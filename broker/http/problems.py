"""RFC 9457 problem+json answers for the broker HTTP app.

Every error the app returns goes through here: `BrokerError` (from the store or our validation),
FastAPI/Starlette errors (404 route, 405, validation) and anything unexpected (500 with the
exception logged, never leaked). The fast path (`hot.py`) renders its errors with the same
functions (`validation_problem`, `http_problem`, `unexpected`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Route

from broker.errors import BrokerCode, BrokerError, from_dledger, invalid
from dledger.codes import DLedgerException
from wire.codes import ErrorCode
from wire.problem import PROBLEM_CONTENT_TYPE

log = logging.getLogger(__name__)


def error_response(exc: BrokerError, headers: dict[str, str] | None = None) -> Response:
    body = exc.problem()
    return Response(
        orjson.dumps(body), status_code=body["status"], media_type=PROBLEM_CONTENT_TYPE, headers=headers
    )


def validation_problem(errors: Sequence[Mapping[str, Any]]) -> BrokerError:
    """The answer to pydantic validation errors (FastAPI's, or a model's own on the fast path):
    the first error, naming its field as a dotted path without the "body"/"path"/… prefix."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    field = ".".join(loc) or "body"
    msg = str(first.get("msg", "invalid"))
    if field == "topic":  # a topic name anywhere (path, query, body) has its own stable code
        return BrokerError(BrokerCode.INVALID_TOPIC, f"topic: {msg}", field=field)
    return invalid(field, msg)


def http_problem(exc: StarletteHTTPException, path: str) -> dict[str, Any]:
    """The problem body of a framework's HTTP error (a 404 route, a 405, a body it cannot parse),
    which has no code of ours: the generic code of its status."""
    return {
        "type": "about:blank",
        "title": str(exc.detail),
        "status": exc.status_code,
        "code": ErrorCode.for_status(exc.status_code).value,
        "detail": f"no such resource: {path}" if exc.status_code == 404 else str(exc.detail),
    }


def unexpected(exc: Exception) -> BrokerError:
    """The 500 of an exception nothing expected (the caller logs it; the answer names only its type)."""
    return BrokerError(BrokerCode.INTERNAL_ERROR, f"internal error ({type(exc).__name__}); see broker log")


def _routes(routes: Sequence[Any]) -> list[Route]:
    """Every route of the app, those of included routers too (FastAPI keeps an included router
    as one entry holding its own routes; none of ours is included under a prefix)."""
    out: list[Route] = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            out += _routes(inner.routes)
        elif isinstance(r, Route):
            out.append(r)
    return out


def install_problem_handlers(app: FastAPI) -> None:
    """Map every exception type to problem+json."""

    @app.exception_handler(BrokerError)
    async def _broker_error(request: Request, exc: BrokerError) -> Response:
        if exc.code == BrokerCode.TIMEOUT:
            exc.extra.setdefault("outcome", "unknown")
        return error_response(exc)

    @app.exception_handler(DLedgerException)
    async def _dledger_error(request: Request, exc: DLedgerException) -> Response:
        return error_response(from_dledger(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(validation_problem(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            # Starlette names only the first route's methods; list every method of the path.
            methods = sorted(
                {
                    m
                    for r in _routes(app.routes)
                    if r.methods and r.path_regex.match(request.url.path)
                    for m in r.methods
                }
            )
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(methods)}
        return Response(
            orjson.dumps(http_problem(exc, request.url.path)),
            status_code=exc.status_code,
            media_type=PROBLEM_CONTENT_TYPE,
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("event=http_unhandled method=%s path=%s", request.method, request.url.path)
        return error_response(unexpected(exc))
