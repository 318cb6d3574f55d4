"""`create_app(namesrv_addr) -> FastAPI`: the console's pages, server-rendered HTML.

Each page is rendered whole on the server from one view (`console.views`) and works without
JavaScript; `static/console.js` only re-fetches a page's `#live` part (`X-Console-Fragment: live`)
every `refresh_ms` so the cluster and group pages follow the cluster, and asks before a delete.
Actions are HTML forms (POST, then a redirect back with a one-line notice).

Access control: a broker answering 401 sends the operator to `/login`, which keeps the token in
the console's memory behind an HttpOnly, SameSite=Strict session cookie; every later call to the
cluster carries it, so the pages show only what that token may read.

Every response says how many requests to name servers and brokers it cost
(`X-Console-Backend-Requests`): a page view costs a handful whatever the number of topics."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, Undefined, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from client.admin import AsyncAdmin
from client.errors import LedgerMQError, UnauthorizedError
from console import views
from console.backend import SESSION_COOKIE, Backend, start_page_count
from console.throughput import sparkline

log = logging.getLogger(__name__)

FLASH_COOKIE = "ledgermq_console_notice"
FRAGMENT_HEADER = "x-console-fragment"
COUNT_HEADER = "X-Console-Backend-Requests"
STATIC_DIR = Path(__file__).parent / "static"
# Form bodies are a few fields; anything larger is not from our pages.
MAX_FORM_BYTES = 16 * 1024
# Time zones lie within UTC-12..UTC+14; a day either way leaves room and keeps the sum in range.
MAX_TZ_OFFSET_MIN = 24 * 60

NAV = [
    ("cluster", "/cluster", "Cluster"),
    ("topics", "/topics", "Topics"),
    ("groups", "/groups", "Consumer groups"),
    ("messages", "/messages", "Messages"),
    ("throughput", "/throughput", "Throughput"),
    ("acl", "/acl", "ACL"),
]


class FormError(ValueError):
    """A form field the console refuses before asking the cluster (names the field)."""


def _env() -> Environment:
    env = Environment(loader=PackageLoader("console", "templates"), autoescape=select_autoescape(["html"]))
    env.filters["num"] = lambda v: "—" if v is None or isinstance(v, Undefined) else f"{int(v):,}"
    env.filters["ms_ago"] = _ago
    env.filters["datetime"] = lambda ms: "—" if not ms else _utc(ms)
    env.filters["perm"] = views.perm_label
    env.filters["urlseg"] = lambda v: quote(str(v), safe="")
    return env


def _ago(ms: int | None) -> str:
    if ms is None:
        return "—"
    s = int(ms // 1000)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h"


def create_app(namesrv_addr: str, *, refresh_ms: int = 1000, ca_file: str | None = None) -> FastAPI:
    """The console for the cluster behind `namesrv_addr` (`host:port[;host:port]`); `ca_file`: the
    PEM CA of the cluster's certificates when it serves HTTPS."""
    backend = Backend(namesrv_addr, ca_file)
    env = _env()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        log.info("event=console_started namesrv=%s", namesrv_addr)
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(
        title="LedgerMQ console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.backend = backend
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.middleware("http")
    async def same_origin_forms(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # A page of another site must not drive the console's forms (delete a topic, move
        # offsets) through the operator's browser: browsers name the page's origin on a POST.
        if request.method == "POST" and not _same_origin(request):
            origin = request.headers.get("origin")
            log.warning("event=console_cross_origin_post path=%s origin=%s", request.url.path, origin)
            return HTMLResponse("cross-origin form refused", status_code=403)
        return await call_next(request)

    @app.middleware("http")
    async def count_backend_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        counter = start_page_count()
        t0 = time.perf_counter()
        response = await call_next(request)
        response.headers[COUNT_HEADER] = str(counter[0])
        response.headers["Server-Timing"] = f"render;dur={(time.perf_counter() - t0) * 1000:.1f}"
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        # A bug of ours must still leave the operator a page that says what failed.
        log.exception("event=console_error method=%s path=%s", request.method, request.url.path)
        detail = f"the console failed to render this page ({type(exc).__name__}: {exc}); see its log"
        tmpl = env.get_template("error.html")
        html = tmpl.render(nav=NAV, current="", title="Console error", namesrv=namesrv_addr, detail=detail)
        return HTMLResponse(html, status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # A mistyped address or a form posted to a page gets a page with the navigation, not JSON.
        detail = f"{request.method} {request.url.path}: {exc.detail}"
        tmpl = env.get_template("error.html")
        html = tmpl.render(nav=NAV, current="", title=exc.detail, namesrv=namesrv_addr, detail=detail)
        return HTMLResponse(html, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    def admin_for(request: Request) -> AsyncAdmin:
        return backend.admin(backend.session_token(request.cookies.get(SESSION_COOKIE)))

    def page(request: Request, template: str, nav: str, title: str, **context: Any) -> Response:
        tmpl = env.get_template(template)
        ctx = {
            "nav": NAV,
            "current": nav,
            "title": title,
            "refresh_ms": refresh_ms,
            "notice": _read_notice(request),
            "logged_in": backend.session_token(request.cookies.get(SESSION_COOKIE)) is not None,
            "namesrv": namesrv_addr,
            **context,
        }
        if request.headers.get(FRAGMENT_HEADER) == "live":
            html = "".join(tmpl.blocks["live"](tmpl.new_context(ctx)))
        else:
            html = tmpl.render(ctx)
        response = HTMLResponse(html, headers={"Cache-Control": "no-store"})
        if ctx["notice"]:
            response.delete_cookie(FLASH_COOKIE)
        return response

    async def guarded(request: Request, render: Callable[[], Awaitable[Response]]) -> Response:
        """Render, or send the operator to the login page when the cluster wants a token."""
        try:
            return await render()
        except UnauthorizedError:
            if request.headers.get(FRAGMENT_HEADER):
                return JSONResponse({"login": "/login"}, status_code=401)
            return _login_redirect(request)

    # -- pages -----------------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return RedirectResponse("/cluster", status_code=303)

    @app.get("/health", include_in_schema=False)
    async def health() -> dict[str, Any]:
        return {"status": "UP", "namesrv": namesrv_addr, "backendRequests": backend.requests_total()}

    @app.get("/cluster", include_in_schema=False)
    async def cluster(request: Request) -> Response:
        async def render() -> Response:
            view = await views.cluster_view(admin_for(request), backend.member_ids)
            return page(request, "cluster.html", "cluster", "Cluster", view=view)

        return await guarded(request, render)

    @app.post("/cluster/leadership-transfer", include_in_schema=False)
    async def leadership_transfer(request: Request) -> Response:
        form = await _form(request)

        async def act() -> str:
            broker, transferee = _field(form, "brokerName"), _field(form, "transfereeId")
            await admin_for(request).leadership_transfer(broker, transferee)
            return f"{broker}: leadership handed to {transferee}"

        return await _action(request, "/cluster", act)

    @app.get("/topics", include_in_schema=False)
    async def topics(request: Request) -> Response:
        async def render() -> Response:
            view = await views.topics_view(admin_for(request))
            return page(request, "topics.html", "topics", "Topics", view=view)

        return await guarded(request, render)

    @app.post("/topics", include_in_schema=False)
    async def create_topic(request: Request) -> Response:
        form = await _form(request)

        async def act() -> str:
            topic = _field(form, "topic")
            read = _int_field(form, "readQueueNums", 1, 1024)
            write = _int_field(form, "writeQueueNums", 1, 1024)
            perm = _int_field(form, "perm", 0, 7)
            done = await admin_for(request).update_topic(topic, read, write, perm)
            return f"topic {topic} created or updated on {', '.join(sorted(done))}"

        return await _action(request, "/topics", act)

    @app.get("/topics/{topic}", include_in_schema=False)
    async def topic(request: Request, topic: str) -> Response:
        async def render() -> Response:
            view = await views.topic_view(admin_for(request), topic)
            return page(request, "topic.html", "topics", f"Topic {topic}", view=view)

        return await guarded(request, render)

    @app.post("/topics/{topic}/delete", include_in_schema=False)
    async def delete_topic(request: Request, topic: str) -> Response:
        async def act() -> str:
            done = await admin_for(request).delete_topic(topic)
            where = ", ".join(sorted(done)) or "no broker set (it was not there)"
            return f"topic {topic} deleted from {where}"

        return await _action(request, "/topics", act, error_to=f"/topics/{quote(topic, safe='')}")

    @app.get("/groups", include_in_schema=False)
    async def groups(request: Request) -> Response:
        async def render() -> Response:
            view = await views.groups_view(admin_for(request))
            return page(request, "groups.html", "groups", "Consumer groups", view=view)

        return await guarded(request, render)

    @app.get("/groups/{group}", include_in_schema=False)
    async def group(request: Request, group: str) -> Response:
        async def render() -> Response:
            admin = admin_for(request)
            view, dead = await views.gather_pages(
                views.group_view(admin, group), views.dead_letters_view(admin, group)
            )
            return page(request, "group.html", "groups", f"Group {group}", view=view, dead=dead)

        return await guarded(request, render)

    @app.post("/groups/{group}/dlq/resend", include_in_schema=False)
    async def resend(request: Request, group: str) -> Response:
        form = await _form(request)

        async def act() -> str:
            msg_id = _field(form, "msgId")
            done = await admin_for(request).resend_dead_letters(group, [msg_id])
            lines = [f"dead letter {r['msgId']} resent to {r['topic']} as {r['newMsgId']}" for r in done]
            return "; ".join(lines)

        return await _action(request, f"/groups/{quote(group, safe='')}", act)

    @app.post("/groups/{group}/reset-offset", include_in_schema=False)
    async def reset_offset(request: Request, group: str) -> Response:
        form = await _form(request)
        back = f"/groups/{quote(group, safe='')}"

        async def act() -> str:
            topic = _field(form, "topic")
            ts_ms = _time_field(form, "time", "tzOffsetMin")
            rows = await admin_for(request).reset_offset_by_time(group, topic, ts_ms)
            return f"group {group}, topic {topic}: {len(rows)} queue offsets moved to {_utc(ts_ms)}"

        return await _action(request, back, act)

    @app.get("/messages", include_in_schema=False)
    async def messages(request: Request) -> Response:
        q = {k: v.strip() for k, v in request.query_params.items()}

        async def render() -> Response:
            admin = admin_for(request)
            found, search, error = None, None, None
            try:
                if q.get("msgId"):
                    found = await views.message_view(admin, q["msgId"], q.get("topic") or None)
                elif q.get("topic"):
                    search = await views.search_view(admin, q["topic"], **_search_criteria(q))
            except FormError as exc:
                error = str(exc)
            return page(
                request, "messages.html", "messages", "Messages", q=q, found=found, search=search, error=error
            )

        return await guarded(request, render)

    @app.get("/throughput", include_in_schema=False)
    async def throughput(request: Request) -> Response:
        async def render() -> Response:
            filtered = backend.session_token(request.cookies.get(SESSION_COOKIE)) is not None
            view = await views.throughput_view(admin_for(request), backend.throughput, filtered=filtered)
            return page(request, "throughput.html", "throughput", "Throughput", view=view, spark=sparkline)

        return await guarded(request, render)

    @app.get("/acl", include_in_schema=False)
    async def acl(request: Request) -> Response:
        async def render() -> Response:
            view = await views.acl_view(admin_for(request))
            return page(request, "acl.html", "acl", "Access control", view=view)

        return await guarded(request, render)

    # -- login -----------------------------------------------------------------------------------
    @app.get("/login", include_in_schema=False)
    async def login_page(request: Request) -> Response:
        nxt = _safe_next(request.query_params.get("next"))
        return page(request, "login.html", "", "Access token", next=nxt, error=None)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = await _form(request)
        nxt = _safe_next(form.get("next"))
        token = form.get("token", "").strip()
        error = None
        if not token:
            error = "token: enter the access token of your ACL account"
        else:
            try:
                # The name server is open; a broker's listing proves the token is known.
                async with AsyncAdmin(
                    namesrv_addr, token=token, request_timeout_s=5.0, ca_file=ca_file
                ) as probe:
                    sets = await probe.broker_sets()
                    await probe.groups_of_set(sets[0])
            except UnauthorizedError:
                error = "token: the brokers do not know this token"
            except LedgerMQError as exc:
                error = f"could not check the token: {views.error_text(exc)}"
        if error:
            response = page(request, "login.html", "", "Access token", next=nxt, error=error)
            response.status_code = 401
            return response
        response = RedirectResponse(nxt, status_code=303)
        response.set_cookie(SESSION_COOKIE, backend.open_session(token), httponly=True, samesite="strict")
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        await backend.close_session(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    return app


# -- helpers -------------------------------------------------------------------------------------------
async def _action(
    request: Request, back: str, act: Callable[[], Awaitable[str]], error_to: str | None = None
) -> Response:
    """Run a form's action; redirect to `back` with a notice (or to `error_to` with the error)."""
    try:
        text, kind, to = await act(), "ok", back
    except UnauthorizedError:
        return _login_redirect(request, back)
    except (LedgerMQError, FormError) as exc:
        text = views.error_text(exc) if isinstance(exc, LedgerMQError) else str(exc)
        kind, to = "error", error_to or back
    log.info("event=console_action path=%s outcome=%s detail=%s", request.url.path, kind, text)
    response = RedirectResponse(to, status_code=303)
    response.set_cookie(FLASH_COOKIE, quote(f"{kind}|{text}"), httponly=True, samesite="strict")
    return response


def _read_notice(request: Request) -> dict[str, str] | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    kind, _, text = unquote(raw).partition("|")
    return {"kind": "error" if kind == "error" else "ok", "text": text}


def _same_origin(request: Request) -> bool:
    """True unless the request names an origin other than this console's host."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host")


def _login_redirect(request: Request, back: str | None = None) -> Response:
    nxt = back or request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(nxt, safe='')}", status_code=303)


def _safe_next(nxt: str | None) -> str:
    """Only a path of this console (never another site) after login."""
    if not nxt or not nxt.startswith("/") or nxt.startswith("//"):
        return "/cluster"
    return nxt


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}


def _field(form: dict[str, str], name: str) -> str:
    value = form.get(name, "").strip()
    if not value:
        raise FormError(f"{name}: required")
    return value


def _int_field(form: dict[str, str], name: str, lo: int, hi: int) -> int:
    raw = _field(form, name)
    try:
        value = int(raw)
    except ValueError:
        raise FormError(f"{name}: {raw!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise FormError(f"{name}: {value} is outside {lo}..{hi}")
    return value


def _time_field(form: dict[str, str], name: str, offset_name: str) -> int:
    """Epoch ms of a `datetime-local` value entered in the browser's time zone (its offset from
    UTC in minutes, as JavaScript's getTimezoneOffset gives it; UTC without JavaScript)."""
    raw = _field(form, name)
    try:
        local = datetime.fromisoformat(raw)
    except ValueError:
        raise FormError(f"{name}: {raw!r} is not a date and time (YYYY-MM-DDTHH:MM)") from None
    try:
        offset_min = int(form.get(offset_name) or 0)
    except ValueError:
        raise FormError(f"{offset_name}: not a number of minutes") from None
    if abs(offset_min) > MAX_TZ_OFFSET_MIN:
        raise FormError(f"{offset_name}: {offset_min} is outside ±{MAX_TZ_OFFSET_MIN} minutes")
    try:
        utc = local.replace(tzinfo=UTC) + timedelta(minutes=offset_min)
    except OverflowError:
        raise FormError(f"{name}: {raw!r} is out of range in UTC") from None
    return int(utc.timestamp() * 1000)


def _search_criteria(q: dict[str, str]) -> dict[str, Any]:
    """`search_view` keywords from the messages page's query string (by key, or by queue and
    store time; times in the browser's zone, see `_time_field`)."""
    criteria: dict[str, Any] = {"max_messages": 64}
    if q.get("maxMessages"):
        criteria["max_messages"] = _int_field(q, "maxMessages", 1, 1000)
    if q.get("key"):
        criteria["key"] = q["key"]
    if q.get("queueId"):
        criteria["queue_id"] = _int_field(q, "queueId", 0, 65535)
    if q.get("begin"):
        criteria["begin_ms"] = _time_field(q, "begin", "tzOffsetMin")
    if q.get("end"):
        criteria["end_ms"] = _time_field(q, "end", "tzOffsetMin")
    if "key" not in criteria and "queue_id" not in criteria:
        raise FormError("key or queueId: give a key, or a queue and a time range")
    return criteria


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
