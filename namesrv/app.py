"""The name server's HTTP app: broker registration/heartbeat, topic routes, cluster view, metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from apidocs import install_offline_docs
from namesrv.config import NamesrvConfig
from namesrv.registry import RouteInfoManager, TopicRouteConfig
from wire.codes import ErrorCode
from wire.limits import BodyLimitMiddleware
from wire.names import BROKER_NAME_PATTERN
from wire.problem import PROBLEM_CONTENT_TYPE, problem_body
from wire.regauth import RegistrationVerifier

log = logging.getLogger(__name__)

# A registration lists every topic of a broker (~60 bytes each): room for ~500,000 topics.
REQUEST_LIMIT_BYTES = 32 * 1024 * 1024


class TopicRouteIn(BaseModel):
    """A topic as a broker reports it."""

    model_config = ConfigDict(extra="ignore")
    readQueueNums: int = Field(ge=0, le=65535)
    writeQueueNums: int = Field(ge=0, le=65535)
    perm: int = Field(default=6, ge=0, le=15)  # PermName: PRIORITY 8, READ 4, WRITE 2, INHERIT 1


class RegisterBrokerIn(BaseModel):
    """`POST /brokers/register` body; also the heartbeat (sent every 30 s)."""

    model_config = ConfigDict(extra="ignore")
    clusterName: str = Field(min_length=1, max_length=255)
    brokerName: str = Field(min_length=1, max_length=255, pattern=BROKER_NAME_PATTERN)
    brokerId: int = Field(ge=0)
    brokerAddr: str = Field(min_length=3, max_length=255)
    haAddr: str | None = Field(default=None, max_length=255)
    grpcAddr: str | None = Field(default=None, min_length=3, max_length=255)
    term: int = Field(default=0, ge=0)
    topics: dict[str, TopicRouteIn] = Field(default_factory=dict)


class UnregisterBrokerIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    brokerAddr: str = Field(min_length=3, max_length=255)


def problem_response(code: ErrorCode, detail: str, status: int | None = None, **extra: Any) -> Response:
    """An `application/problem+json` answer."""
    body = problem_body(code, detail, status, **extra)
    return Response(orjson.dumps(body), status_code=body["status"], media_type=PROBLEM_CONTENT_TYPE)


def install_problem_handlers(app: FastAPI) -> None:
    """Every error this app produces is problem+json with a stable `code` (never FastAPI's default)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or None
        return problem_response(
            ErrorCode.INVALID_REQUEST, f"{field or 'request'}: {first.get('msg', 'invalid')}", field=field
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = ErrorCode.for_status(exc.status_code)
        return problem_response(code, str(exc.detail), status=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("event=http_unhandled method=%s path=%s", request.method, request.url.path)
        detail = f"internal error ({type(exc).__name__}); see the name server log"
        return problem_response(ErrorCode.INTERNAL_ERROR, detail)


class _Metrics:
    """The name server's Prometheus instruments, in their own registry."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.live_brokers = Gauge(
            "ledgermq_namesrv_live_brokers", "Live registered broker addresses", registry=r
        )
        self.topics = Gauge("ledgermq_namesrv_topics", "Topics known from live brokers", registry=r)
        self.registrations = Counter(
            "ledgermq_namesrv_registrations", "Broker registrations and heartbeats", registry=r
        )
        self.expired = Counter("ledgermq_namesrv_expired_brokers", "Brokers dropped for silence", registry=r)
        self.route_requests = Counter(
            "ledgermq_namesrv_route_requests", "Route lookups", ["found"], registry=r
        )
        self.refused = Counter(
            "ledgermq_namesrv_registrations_refused",
            "Registrations and unregistrations refused (registrationSecretFile)",
            ["reason"],
            registry=r,
        )


def _claimed_broker(body: bytes) -> dict[str, str]:
    """brokerName / brokerAddr as a refused request claims them, for the log line (short, str)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: str(doc[k])[:128] for k in ("brokerName", "brokerAddr") if k in doc}


def create_app(
    config: NamesrvConfig, registry: RouteInfoManager | None = None, clock_ms: Callable[[], int] | None = None
) -> FastAPI:
    """Build the name server app. `clock_ms` is injectable for tests; the expiry scanner runs as a
    task for the app's lifetime."""
    registry = registry or RouteInfoManager(config.broker_expired_ms)
    now_ms = clock_ms or (lambda: int(time.time() * 1000))
    metrics = _Metrics()

    async def scanner() -> None:
        interval_s = config.scan_not_active_broker_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            dead = registry.scan_not_active(now_ms())
            if dead:
                metrics.expired.inc(len(dead))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        task = asyncio.create_task(scanner(), name="namesrv-scan-not-active")
        log.info("namesrv started port=%d brokerExpiredMs=%d", config.listen_port, config.broker_expired_ms)
        try:
            yield
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    app = FastAPI(
        title="LedgerMQ name server", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    install_offline_docs(app)
    app.state.registry = registry
    install_problem_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limit=REQUEST_LIMIT_BYTES)
    _broker_routes(app, config, registry, now_ms, metrics)
    _route_routes(app, registry, now_ms, metrics)
    return app


def _broker_routes(
    app: FastAPI,
    config: NamesrvConfig,
    registry: RouteInfoManager,
    now_ms: Callable[[], int],
    metrics: _Metrics,
) -> None:
    """What brokers call: register (heartbeat) and unregister; signed (`wire.regauth`) when the
    name server has a `registrationSecretFile`."""
    verifier = (
        RegistrationVerifier.from_file(config.registration_secret_file)
        if config.registration_secret_file
        else None
    )

    async def signed(request: Request) -> None:
        """Runs before the body is validated: an unsigned caller learns nothing about the schema."""
        if verifier is None:
            return
        body = await request.body()
        reason = verifier.verify(request.method, request.url.path, request.headers, body)
        if reason is None:
            return
        metrics.refused.labels(reason=reason).inc()
        claimed = _claimed_broker(body)
        log.warning(
            "event=registration_refused reason=%s remote=%s path=%s brokerName=%s brokerAddr=%s",
            reason,
            request.client.host if request.client else "?",
            request.url.path,
            claimed.get("brokerName", "?"),
            claimed.get("brokerAddr", "?"),
        )
        raise StarletteHTTPException(
            401, f"registration refused ({reason}): not signed with this name server's registration secret"
        )

    @app.post(
        "/brokers/register",
        summary="Register a broker or refresh its heartbeat",
        dependencies=[Depends(signed)],
    )
    async def register(body: RegisterBrokerIn) -> dict[str, Any]:
        topics = {
            name: TopicRouteConfig(t.readQueueNums, t.writeQueueNums, t.perm)
            for name, t in body.topics.items()
        }
        registry.register(
            cluster=body.clusterName,
            broker_name=body.brokerName,
            broker_id=body.brokerId,
            broker_addr=body.brokerAddr,
            ha_addr=body.haAddr,
            grpc_addr=body.grpcAddr,
            term=body.term,
            topics=topics,
            now_ms=now_ms(),
        )
        metrics.registrations.inc()
        return {"ok": True, "brokerExpiredMs": config.broker_expired_ms}

    @app.post(
        "/brokers/unregister", summary="Remove a broker that is shutting down", dependencies=[Depends(signed)]
    )
    async def unregister(body: UnregisterBrokerIn) -> dict[str, Any]:
        return {"removed": registry.unregister(body.brokerAddr)}


def _route_routes(
    app: FastAPI, registry: RouteInfoManager, now_ms: Callable[[], int], metrics: _Metrics
) -> None:
    """What clients and operators call: routes, topics, the cluster view, health, metrics."""

    @app.get(
        "/routes/{topic}",
        summary="Broker sets holding a topic, their members and queue numbers",
        responses={404: {"description": "TOPIC_NOT_EXIST"}},
    )
    async def route(topic: Annotated[str, Path(min_length=1, max_length=255)]) -> Any:
        doc = registry.route(topic, now_ms())
        metrics.route_requests.labels(found=str(doc is not None).lower()).inc()
        if doc is None:
            return problem_response(
                ErrorCode.TOPIC_NOT_EXIST, f"no live broker holds topic {topic!r}", topic=topic
            )
        return doc

    @app.get("/topics", summary="All topics held by live brokers")
    async def topics() -> dict[str, Any]:
        return {"topics": registry.topics(now_ms())}

    @app.get("/cluster", summary="Clusters, broker sets and their member addresses")
    async def cluster() -> dict[str, Any]:
        return registry.cluster(now_ms())

    @app.get("/health", summary="Liveness")
    async def health() -> dict[str, Any]:
        return {"status": "UP", "liveBrokers": registry.live_count(now_ms())}

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus() -> Response:
        t = now_ms()
        metrics.live_brokers.set(registry.live_count(t))
        metrics.topics.set(len(registry.topics(t)))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
