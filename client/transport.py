"""HTTP plumbing shared by the SDK: the HTTP client (`client.http`), problem+json → typed
exceptions, and the name-server route cache."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import math
import os
import platform
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import orjson

from client.errors import (
    BrokerUnreachableError,
    InvalidTopicError,
    LedgerMQError,
    NotMasterError,
    ServerError,
    TopicNotExistError,
    error_from_problem,
)
from client.http import BlockingHttpClient, HttpClient, HttpResponse, HttpTransportError, LateAnswer, Watch
from client.outcome import ERROR_FOR_PHASE

log = logging.getLogger(__name__)

T = TypeVar("T")

PERM_WRITE = 2
PERM_READ = 4


def base_url(addr: str) -> str:
    """`host:port` (as brokers register) → `http://host:port`; full URLs pass through (without
    surrounding blanks or a trailing slash)."""
    addr = addr.strip().rstrip("/")
    return addr if addr.startswith(("http://", "https://")) else f"http://{addr}"


def seg(name: str | int) -> str:
    """`name` as one URL path segment: every reserved character percent-escaped, '%' included
    (topic names like `%DLQ%default` must not reach the server as the escape `%de`)."""
    return quote(str(name), safe="")


def split_addrs(addrs: str | list[str] | None) -> list[str]:
    """`a:1;b:2` (RocketMQ's namesrvAddr) or a list → list of base URLs. Raises ValueError
    naming an item that is neither `host:port` nor an http(s) URL (a typo fails here, not as
    an unreachable server on the first send)."""
    if not addrs:
        return []
    items = addrs if isinstance(addrs, list) else addrs.replace(",", ";").split(";")
    return [_checked_url(a.strip()) for a in items if a.strip()]


def _checked_url(addr: str) -> str:
    url = base_url(addr)
    problem = None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is not a number in 0..65535
        problem = str(exc)
    else:
        if not parts.hostname or any(c.isspace() for c in addr):
            problem = "no host name"
        elif port is None and url != addr.rstrip("/"):
            problem = "no port (host:port, as RocketMQ's namesrvAddr)"
    if problem is not None:
        raise ValueError(f"address {addr!r} is not host:port or an http(s) URL: {problem}")
    return url


def _sdk_version() -> str:
    try:
        return importlib.metadata.version("ledgermq")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "0"


# Every request says what sent it: the broker shows HTTP clients' language and version from it
# (`GET /clients`, `mqadmin clientList`, the console), as RocketMQ does for its own clients.
USER_AGENT = f"ledgermq-python/{_sdk_version()} (Python {platform.python_version()})"


def new_client_id() -> str:
    """`host@pid@random`: one per producer or consumer instance, sent as `X-Client-Id` (the
    brokers' client lists and the console name clients by it)."""
    return f"{socket.gethostname()}@{os.getpid()}@{os.urandom(4).hex()}"


class AsyncTransport:
    """The SDK's HTTP client (`client.http`, one keep-alive pool per origin); `request` returns
    decoded JSON or raises a LedgerMQError (a failure without an answer as the phase it happened
    in says: `client.outcome`).

    TLS: with `ca_file` (PEM bundle) every connection — to `host:port` addresses as the name
    servers hand them out, too — is TLS verified against that CA; `client_cert` (PEM with the
    certificate and its key, or a (cert, key) pair) is shown to servers that ask for one.
    `headers` go with every request."""

    def __init__(
        self,
        token: str | None = None,
        timeout_s: float = 10.0,
        *,
        max_connections: int = 64,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        hdrs = {"User-Agent": USER_AGENT, **(headers or {})}
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        ctx = tls_context(ca_file, client_cert)
        self.http = HttpClient(max_connections=max_connections, headers=hdrs, ssl_context=ctx)
        self.blocking_http = BlockingHttpClient(headers=hdrs, ssl_context=ctx)
        self.timeout_s = timeout_s

    async def send(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        keep_late: Callable[[LateAnswer], None] | None = None,
    ) -> HttpResponse:
        """The raw answer of any status; a failure without an answer raised as its SDK error.
        `keep_late`: see `HttpClient.request`."""
        try:
            return await self.http.request(
                method,
                url,
                body=body,
                params={k: v for k, v in params.items() if v is not None} if params else None,
                headers=headers,
                timeout_s=self.timeout_s if timeout_s is None else timeout_s,
                keep_late=keep_late,
            )
        except HttpTransportError as exc:
            # By the phase it failed in: unreachable (nothing sent) or outcome unknown.
            raise ERROR_FOR_PHASE[exc.phase](f"{method} {url}: {exc} (failed in phase {exc.phase})") from exc

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        keep_late: Callable[[LateAnswer], None] | None = None,
    ) -> Any:
        """Decoded JSON (text for another content type, None for an empty answer); an error
        answer raised as the typed exception of its problem `code`. `keep_late`: see
        `HttpClient.request`."""
        if json is not None:
            content = orjson.dumps(json)
            headers = {"Content-Type": "application/json", **(headers or {})}
        resp = await self.send(
            method, url, body=content or b"", params=params, headers=headers, timeout_s=timeout_s,
            keep_late=keep_late,
        )
        return decode_answer(resp, f"{method} {url}")

    def request_blocking(self, method: str, url: str, *, json: Any, watch: Watch | None = None) -> Any:
        """`request` on the calling thread, over blocking sockets (`client.http.BlockingHttpClient`),
        for a caller that waits for the answer anyway; `watch` as `BlockingHttpClient.request`."""
        try:
            resp = self.blocking_http.request(
                method,
                url,
                body=orjson.dumps(json),
                headers={"Content-Type": "application/json"},
                timeout_s=self.timeout_s,
                watch=watch,
            )
        except HttpTransportError as exc:
            raise ERROR_FOR_PHASE[exc.phase](f"{method} {url}: {exc} (failed in phase {exc.phase})") from exc
        return decode_answer(resp, f"{method} {url}")

    async def aclose(self) -> None:
        await self.http.aclose()
        self.blocking_http.close()


def tls_context(ca_file: str | None, client_cert: str | tuple[str, str] | None) -> ssl.SSLContext | None:
    """The client TLS context for `ca_file` / `client_cert`; None without a CA file (plain HTTP,
    except to `https://` URLs, verified against the system's CAs)."""
    if ca_file is None:
        if client_cert is not None:
            raise ValueError("client_cert needs ca_file (the CA that signed the servers' certificates)")
        return None
    ctx = ssl.create_default_context(cafile=ca_file)
    if client_cert is not None:
        cert, key = (client_cert, None) if isinstance(client_cert, str) else client_cert
        ctx.load_cert_chain(cert, key)
    return ctx


def decode_answer(resp: HttpResponse, what: str) -> Any:
    """The JSON of a 2xx answer; an error answer as the typed exception of its problem `code`."""
    if resp.status >= 400:
        try:
            body = orjson.loads(resp.body)
        except orjson.JSONDecodeError:
            body = resp.body.decode("utf-8", "replace")
        raise error_from_problem(resp.status, body)
    if not resp.body:
        return None
    if "json" not in resp.content_type:
        return resp.body.decode("utf-8", "replace")
    try:
        return orjson.loads(resp.body)
    except orjson.JSONDecodeError as exc:
        raise ServerError(f"{what}: answer is not valid JSON: {exc}", status=resp.status) from None


@dataclass
class BrokerSetRoute:
    """One broker set holding a topic, as `GET /routes/{topic}` describes it."""

    broker_name: str
    addrs: dict[int, str]
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    master_addr: str | None = None

    @property
    def master_url(self) -> str | None:
        addr = self.master_addr or self.addrs.get(0)
        return base_url(addr) if addr else None

    def urls(self) -> list[str]:
        """Master first, then the slaves (for reads)."""
        ordered = [self.master_addr] if self.master_addr else []
        ordered += [a for _, a in sorted(self.addrs.items()) if a != self.master_addr]
        return [base_url(a) for a in ordered]

    def write_url(self) -> str:
        """Where a write goes: the master, else any member (which names the master if it knows
        it); BrokerUnreachableError when the route lists no address at all."""
        urls = self.urls()
        if self.master_url is None and not urls:
            raise BrokerUnreachableError(f"broker set {self.broker_name} has no address in the route")
        return self.master_url or urls[0]


@dataclass
class TopicRoute:
    topic: str
    brokers: list[BrokerSetRoute]
    fetched_at: float = field(default_factory=time.monotonic)

    def broker(self, name: str) -> BrokerSetRoute | None:
        return next((b for b in self.brokers if b.broker_name == name), None)


class RouteCache:
    """Topic routes from the name servers (tried in turn), cached for `ttl_s`.

    Static mode: with no name servers but `broker_addrs`, each address is a single-member set named
    by its address (handy for a single broker and tests)."""

    def __init__(
        self,
        transport: AsyncTransport,
        namesrv_addrs: list[str],
        broker_addrs: list[str],
        ttl_s: float = 30.0,
    ) -> None:
        self.transport = transport
        self.namesrv_urls = namesrv_addrs
        self.broker_urls = broker_addrs
        self.ttl_s = ttl_s
        self._routes: dict[str, TopicRoute] = {}
        self._next_ns = 0
        self._lock = asyncio.Lock()
        self._warned_at: dict[str, float] = {}

    async def get(self, topic: str, refresh: bool = False) -> TopicRoute:
        route = self._routes.get(topic)
        if route and not refresh and time.monotonic() - route.fetched_at < self.ttl_s:
            return route
        async with self._lock:
            route = self._routes.get(topic)
            if route and not refresh and time.monotonic() - route.fetched_at < self.ttl_s:
                return route
            return await self._refetch(topic, route)

    async def _refetch(self, topic: str, cached: TopicRoute | None) -> TopicRoute:
        """`topic`'s route from the name servers, now cached. If none answers, the `cached` one
        (RocketMQ clients keep theirs) with its masters as the sets' members now name them."""
        try:
            route = await self._fetch(topic)
        except BrokerUnreachableError as exc:
            if cached is None:
                raise
            route = await self._without_name_servers(cached, exc)
        self._routes[topic] = route
        return route

    async def _without_name_servers(self, route: TopicRoute, why: LedgerMQError) -> TopicRoute:
        """`route` (cached) with each set's master as its members report it (`GET /health`: the
        member of the highest term that names one), for while no name server answers: a set
        whose master died or hung meanwhile is still found. Kept briefly, then the name servers
        are asked again."""
        now = time.monotonic()
        if now - self._warned_at.get(route.topic, -1e9) >= NAMESRV_DOWN_LOG_S:
            self._warned_at[route.topic] = now
            log.warning("route refresh failed for topic=%s (%s); using the cached route, its masters as the "
                        "broker sets' members name them", route.topic, why)
        brokers = await asyncio.gather(*(self._master_by_members(b) for b in route.brokers))
        return TopicRoute(route.topic, list(brokers), fetched_at=now - self.ttl_s + DEFAULT_ROUTE_TTL_S)

    async def _master_by_members(self, broker: BrokerSetRoute) -> BrokerSetRoute:
        async def status(addr: str) -> tuple[int, str] | None:
            # /health, open under ACL (/status needs the monitoring right an application's token lacks).
            try:
                doc = await self.transport.request(
                    "GET", f"{base_url(addr)}/health", timeout_s=MEMBER_STATUS_TIMEOUT_S
                )
            except LedgerMQError:
                return None
            master = doc.get("masterAddr") if isinstance(doc, dict) else None
            if not isinstance(master, str) or not master:
                return None
            term = doc.get("term", 0)
            return (term if isinstance(term, int) else 0), master

        answers = [a for a in await asyncio.gather(*(status(a) for a in broker.addrs.values())) if a]
        if not answers:
            return broker
        return replace(broker, master_addr=max(answers)[1])

    async def master_url(self, topic: str, broker_name: str, refresh: bool = False) -> str:
        """Base URL of `broker_name`'s master per `topic`'s route; NotMasterError when the route
        names none."""
        broker = (await self.get(topic, refresh=refresh)).broker(broker_name)
        if broker is None or broker.master_url is None:
            raise NotMasterError(f"broker set {broker_name} has no master in the route")
        return broker.master_url

    async def master_now(self, topic: str, broker_name: str, max_age_s: float) -> str | None:
        """The base URL of `broker_name`'s master per a route of `topic` at most `max_age_s` old:
        read again from the name servers when the cached one is older (one read for every caller
        asking meanwhile). None when the route names no master for the set (an election under
        way) or no name server answers — quietly: the caller asks again later."""
        route = self._routes.get(topic)
        if route is None or time.monotonic() - route.fetched_at >= max_age_s:
            async with self._lock:
                route = self._routes.get(topic)
                if route is None or time.monotonic() - route.fetched_at >= max_age_s:
                    try:
                        route = await self._refetch(topic, route)
                    except LedgerMQError as exc:
                        log.debug("route check failed topic=%s: %s", topic, exc)
                        return None
        broker = route.broker(broker_name)
        return base_url(broker.master_addr) if broker is not None and broker.master_addr else None

    async def unless_master_moves(
        self, topic: str, broker_name: str, url: str, send: Awaitable[T], every_s: float
    ) -> tuple[T, None] | tuple[None, str]:
        """Await `send`, a request to `url` as the set's master, and raise what it raises:
        (its answer, None). While it waits, the set's master is looked up every `every_s`; if
        the route names another one first (the set elected it: the old one hung, crashed or was
        cut off), the request is cancelled and (None, the new master's URL) returned. Cancelling
        the caller cancels the request too."""
        request = asyncio.ensure_future(send)
        try:
            while True:
                done, _ = await asyncio.wait((request,), timeout=every_s)
                if done:
                    return request.result(), None
                master = await self.master_now(topic, broker_name, every_s)
                if master is not None and master != url and not request.done():
                    return None, master
        finally:
            if not request.done():
                request.cancel()
                await asyncio.wait((request,))

    def cached(self, topic: str) -> TopicRoute | None:
        """The cached route of `topic`, however old (no I/O)."""
        return self._routes.get(topic)

    def fresh(self, topic: str) -> TopicRoute | None:
        """The cached route of `topic` if it is younger than `ttl_s` (no I/O)."""
        route = self._routes.get(topic)
        if route is not None and time.monotonic() - route.fetched_at < self.ttl_s:
            return route
        return None

    def invalidate(self, topic: str) -> None:
        """The next `get` of `topic` asks the name servers again; the route stays cached for
        while none answers."""
        route = self._routes.get(topic)
        if route is not None:
            self._routes[topic] = replace(route, fetched_at=-math.inf)

    async def _fetch(self, topic: str) -> TopicRoute:
        if not isinstance(topic, str) or not topic:
            raise InvalidTopicError(f"a topic name is a non-empty string, got {topic!r}")
        if not self.namesrv_urls:
            if not self.broker_urls:
                raise LedgerMQError("no name server and no broker address configured")
            return TopicRoute(
                topic, [BrokerSetRoute(u, {0: u}, 0, 0, PERM_READ | PERM_WRITE, u) for u in self.broker_urls]
            )
        last: LedgerMQError | None = None
        for i in range(len(self.namesrv_urls)):
            url = self.namesrv_urls[(self._next_ns + i) % len(self.namesrv_urls)]
            try:
                doc = await self.transport.request("GET", f"{url}/routes/{seg(topic)}", timeout_s=3.0)
            except TopicNotExistError:
                # A topic no broker registered yet (auto-created on first produce): offer every
                # broker set with a master and let the broker pick the queue (RocketMQ uses the
                # TBW102 default route the same way). Kept briefly, then looked up again.
                fallback = await self._cluster_route(url, topic)
                if fallback is None:
                    raise
                return fallback
            except LedgerMQError as exc:
                if not exc.retryable:  # e.g. a malformed topic name: no other name server helps
                    raise
                last = exc
                continue
            self._next_ns = (self._next_ns + i) % len(self.namesrv_urls)
            return parse_route(doc)
        raise BrokerUnreachableError(f"no name server answered for topic {topic!r}: {last}")

    async def masters(self) -> list[str]:
        """Base URLs of every broker set's master, from the name servers' cluster view (tried in
        turn); in static mode, the broker addresses."""
        if not self.namesrv_urls:
            return list(self.broker_urls)
        last: LedgerMQError | None = None
        for url in self.namesrv_urls:
            try:
                view = await self.transport.request("GET", f"{url}/cluster", timeout_s=3.0)
            except LedgerMQError as exc:
                last = exc
                continue
            return [base_url(b["masterAddr"]) for b in view["brokers"].values() if b.get("masterAddr")]
        raise BrokerUnreachableError(f"no name server answered for the cluster view: {last}")

    async def _cluster_route(self, url: str, topic: str) -> TopicRoute | None:
        try:
            view = await self.transport.request("GET", f"{url}/cluster", timeout_s=3.0)
        except LedgerMQError:
            return None
        brokers = [
            BrokerSetRoute(
                name,
                {int(k): v for k, v in b["addrs"].items()},
                0,
                0,
                PERM_READ | PERM_WRITE,
                b.get("masterAddr"),
            )
            for name, b in sorted(view.get("brokers", {}).items())
            if b.get("masterAddr")
        ]
        if not brokers:
            return None
        # Expire soon, so the real route (registered right after the auto-create) replaces it.
        return TopicRoute(topic, brokers, fetched_at=time.monotonic() - self.ttl_s + DEFAULT_ROUTE_TTL_S)


DEFAULT_ROUTE_TTL_S = 1.0
# While no name server answers: how long a member may take to say who its set's master is, and
# how often the fallback is logged per topic.
MEMBER_STATUS_TIMEOUT_S = 1.0
NAMESRV_DOWN_LOG_S = 30.0


def parse_route(doc: dict[str, Any]) -> TopicRoute:
    """Decode a `GET /routes/{topic}` answer."""
    brokers = [
        BrokerSetRoute(
            b["brokerName"],
            {int(k): v for k, v in b.get("addrs", {}).items()},
            int(b.get("readQueueNums", 0)),
            int(b.get("writeQueueNums", 0)),
            int(b.get("perm", 6)),
            b.get("masterAddr"),
        )
        for b in doc.get("brokers", [])
    ]
    return TopicRoute(doc["topic"], brokers)
