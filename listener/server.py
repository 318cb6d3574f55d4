"""`HttpListener`: one ASGI app served by uvicorn on the process's event loop, as every LedgerMQ
HTTP port is (broker, name server, broker container): the socket bound by us (a port in use is an
OSError for the caller, not uvicorn's sys.exit inside a shared loop), HTTPS when the listener's
config says so (TLS handshake bounded by the header deadline; a rotated certificate picked up
without a restart, `listener.certs`), and every connection under a `ConnectionGuard`
(`listener.guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
from typing import Any

import uvicorn

from listener.certs import CertReloader
from listener.config import ListenerConfig
from listener.guard import ConnectionGuard, GuardedHttpToolsProtocol

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 3
# Descriptors a process keeps beside its listeners' connections (stores, peers, logs, clients).
FD_RESERVE = 256
FD_SOFT_TARGET = 65536


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """Bind the listening socket ourselves: a port in use is then an OSError for the caller, not
    uvicorn's sys.exit inside the shared event loop (which would take every hosted broker down)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def raise_fd_limit(target: int = FD_SOFT_TARGET) -> int:
    """Raise the process's soft RLIMIT_NOFILE towards `target` (never above the hard limit, never
    lowered): systemd and many shells start processes at 1024. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(target, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    return soft


class _GuardedServer(uvicorn.Server):
    """uvicorn.Server whose listening sockets are created here: our protocol with its guard, the
    TLS handshake bounded, and (unless asked) no signal handling of its own — the process owns
    SIGINT/SIGTERM and stops every server it hosts."""

    def __init__(
        self, config: uvicorn.Config, guard: ConnectionGuard, ssl_context: ssl.SSLContext | None,
        handle_signals: bool,
    ) -> None:
        super().__init__(config)
        self.guard = guard
        self.ssl_context = ssl_context
        self.handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        if self.handle_signals:
            with super().capture_signals():
                yield
        else:
            yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            raise RuntimeError(f"{self.guard.name}: the app's lifespan start-up failed")
        config, loop = self.config, asyncio.get_running_loop()

        def create_protocol() -> asyncio.Protocol:
            return GuardedHttpToolsProtocol(
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=loop,
                guard=self.guard,
            )

        handshake_s = self.guard.header_timeout_s if self.ssl_context is not None else None
        self.servers = [
            await loop.create_server(
                create_protocol,
                sock=sock,
                ssl=self.ssl_context,
                ssl_handshake_timeout=handshake_s,
                backlog=config.backlog,
            )
            for sock in sockets or []
        ]
        self.started = True


class HttpListener:
    """One HTTP(S) port of a process. Callers: the broker's HTTP front-end, the name server, the
    broker container. `start` binds and serves; `request_stop`/`wait`/`stop` as a front-end's."""

    def __init__(
        self,
        app: Any,
        *,
        name: str,
        host: str,
        port: int,
        config: ListenerConfig,
        lifespan: str = "off",
        handle_signals: bool = False,
        graceful_shutdown_s: float = GRACEFUL_SHUTDOWN_S,
    ) -> None:
        self.app = app
        self.name = name
        self.host = host
        self.port = port
        self.config = config
        self.lifespan = lifespan
        self.handle_signals = handle_signals
        self.graceful_shutdown_s = graceful_shutdown_s
        self.guard: ConnectionGuard | None = None
        self.server: _GuardedServer | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._reloader: CertReloader | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.config.tls else "http"

    async def start(self) -> None:
        """Bind, then serve; returns once serving. Raises (socket closed) if it cannot."""
        cfg = self.config
        soft = raise_fd_limit()
        cap = cfg.max_connections
        if soft != resource.RLIM_INFINITY and soft - FD_RESERVE < cap:
            cap = max(1, soft - FD_RESERVE)
            log.warning(
                "event=fd_limit_low listener=%s softLimit=%d maxConnections=%d effective=%d",
                self.name, soft, cfg.max_connections, cap,
            )
        self.guard = ConnectionGuard(self.name, cfg, cap)
        ssl_context = cfg.ssl_context()
        sock = bind_socket(self.host, self.port)
        self.server = _GuardedServer(
            uvicorn.Config(
                self.app,
                loop="none",
                http=GuardedHttpToolsProtocol,
                lifespan=self.lifespan,
                proxy_headers=False,  # no proxy in front: skip the per-request header rewrite
                server_header=False,
                log_level="warning",
                access_log=False,
                timeout_keep_alive=cfg.idle_timeout_s,
                timeout_graceful_shutdown=self.graceful_shutdown_s,
            ),
            self.guard,
            ssl_context,
            self.handle_signals,
        )
        self._serve_task = asyncio.get_running_loop().create_task(
            self.server.serve(sockets=[sock]), name=f"http-{self.name}"
        )
        while not self.server.started:
            if self._serve_task.done():
                sock.close()
                exc = self._serve_task.exception()
                raise RuntimeError(f"HTTP server of {self.name} stopped during start: {exc!r}") from exc
            await asyncio.sleep(0.01)
        if ssl_context is not None:  # a rotated certificate is served without a restart
            self._reloader = CertReloader(self.name, cfg, ssl_context)
            self._reloader.start()
        if not is_loopback(self.host) and not cfg.tls:
            log.warning(
                "event=insecure_listener listener=%s addr=%s:%d tls=disabled "
                "hint=set tls.server.mode=enforcing with tls.server.certPath/keyPath off a trusted network",
                self.name, self.host, self.port,
            )
        log.info(
            "event=listener_started listener=%s addr=%s://%s:%d maxConnections=%d maxConnectionsPerIp=%d "
            "headerTimeoutMs=%d bodyTimeoutMs=%d idleTimeoutS=%d",
            self.name, self.scheme, self.host, self.port, self.guard.max_connections, self.guard.max_per_ip,
            cfg.request_header_timeout_ms, cfg.request_body_timeout_ms, cfg.idle_timeout_s,
        )

    def request_stop(self) -> None:
        """Stop accepting; requests in progress finish (bounded by graceful_shutdown_s)."""
        if self.server is not None:
            self.server.should_exit = True

    async def wait(self) -> None:
        """Until the server stops (request_stop, a signal it handles, or a fatal error)."""
        if self._serve_task is not None:
            await asyncio.shield(self._serve_task)

    async def stop(self) -> None:
        """Graceful stop; returns once the server is down."""
        if self._reloader is not None:
            await self._reloader.stop()
        self.request_stop()
        if self._serve_task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._serve_task
