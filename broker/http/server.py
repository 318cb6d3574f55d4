"""`HttpFrontEnd`: the broker's HTTP API served by uvicorn on the process's one event loop, as one
of the front-ends `broker.runtime.BrokerRuntime` starts beside the others."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from broker.http.app import BrokerApp, create_app
from broker.service import BrokerServices

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 3


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the process owns SIGINT/SIGTERM and stops every
    server it hosts (several share one loop in a container)."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


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


def listen_host(broker_ip: str) -> str:
    """Loopback when the broker names itself by a loopback address, else every interface."""
    return "127.0.0.1" if broker_ip in ("127.0.0.1", "localhost") else "0.0.0.0"


class HttpFrontEnd:
    """The HTTP API of one broker on `listenPort`. Built before the store starts (the app only
    wires routes); `start` binds and serves."""

    name = "HTTP"

    def __init__(self, services: BrokerServices) -> None:
        self.config = services.state.config
        self.app: BrokerApp = create_app(services)
        self.server: QuietServer | None = None
        self._serve_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen on `listenPort` and serve; returns once uvicorn has started."""
        cfg = self.config
        sock = bind_socket(listen_host(cfg.broker_ip1), cfg.listen_port)
        self.server = QuietServer(
            uvicorn.Config(
                self.app,
                loop="none",
                http="httptools",
                lifespan="off",
                proxy_headers=False,  # no proxy in front: skip the per-request header rewrite
                server_header=False,
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            )
        )
        self._serve_task = asyncio.get_running_loop().create_task(
            self.server.serve(sockets=[sock]), name=f"http-{cfg.broker_name}"
        )
        while not self.server.started:
            if self._serve_task.done():
                raise RuntimeError(f"HTTP server of {cfg.broker_name} stopped during start")
            await asyncio.sleep(0.01)

    def request_stop(self) -> None:
        """Stop accepting; requests in progress finish (bounded by GRACEFUL_SHUTDOWN_S)."""
        if self.server is not None:
            self.server.should_exit = True

    async def wait(self) -> None:
        """Until the server stops (request_stop or a fatal error)."""
        if self._serve_task is not None:
            await asyncio.shield(self._serve_task)

    async def stop(self) -> None:
        """Graceful stop; returns once the server is down."""
        self.request_stop()
        if self._serve_task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._serve_task
