"""`BrokerRuntime`: one broker inside a process — controller (store + DLedger), HTTP server
(uvicorn on the process's one event loop) and name-server registration. Used by `mqbroker` (one
runtime) and `mqbrokercontainer` (several in one loop)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
from typing import Any

import uvicorn

from broker.config import BrokerConfig
from broker.http.app import create_app
from broker.http.registration import REGISTER_INTERVAL_S, BrokerRegistrar

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 3
# The cyclic collector's first generation runs every GC_GEN0_THRESHOLD container allocations
# (CPython's default: 700). A batched put allocates a few hundred (parsed JSON, messages, results),
# so at the default the collector ran several times per request: 10,000 cut ~10 % of a master's CPU.
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Once the process's brokers have started: move what start-up allocated (modules, config,
    tables) out of the collector's reach with `gc.freeze()`, and collect the young generation less
    often. Garbage without cycles is still freed at once by reference counting."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process owns SIGINT/SIGTERM and stops every
    runtime it hosts (several servers share one loop in a container)."""

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


def build_controller(config: BrokerConfig) -> Any:
    """The BrokerController (store, DLedger server, role-change handler) for `config`."""
    from broker.controller import BrokerController

    return BrokerController(config)


class BrokerRuntime:
    """Start/stop one broker. Caller: broker/__main__.py and broker/container.py."""

    def __init__(self, config: BrokerConfig, register_interval_s: float | None = None) -> None:
        self.config = config
        self.controller: Any = None
        self.app: Any = None
        self.registrar: BrokerRegistrar | None = None
        self.server: _Server | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._register_interval_s = register_interval_s

    @property
    def name(self) -> str:
        return self.config.broker_name

    async def start(self) -> None:
        """Start the controller, then serve HTTP, then register. Raises if any step fails (after
        undoing the steps that succeeded)."""
        cfg = self.config
        self.controller = build_controller(cfg)
        # The app first: it registers system-record handlers (pop state) that the store's replay
        # at start must already see.
        self.app = create_app(self.controller)
        await self.controller.start()
        try:
            ctx = self.app.state.ctx
            self.registrar = BrokerRegistrar(ctx, cfg.namesrv_addr_list, interval_s=self._register_interval())
            ctx.on_topics_changed(self.registrar.kick)
            self._watch_roles(ctx)
            host = "127.0.0.1" if cfg.broker_ip1 in ("127.0.0.1", "localhost") else "0.0.0.0"
            sock = bind_socket(host, cfg.listen_port)
            self.server = _Server(
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
                self.server.serve(sockets=[sock]), name=f"http-{self.name}"
            )
            while not self.server.started:
                if self._serve_task.done():
                    raise RuntimeError(f"HTTP server of {self.name} stopped during start")
                await asyncio.sleep(0.01)
            self.registrar.start()
        except BaseException:
            await self._stop_controller()
            raise
        log.info(
            "event=broker_started broker=%s addr=%s mode=%s namesrv=%s",
            self.name,
            cfg.broker_addr,
            "dledger" if cfg.enable_dleger_commit_log else "local",
            cfg.namesrv_addr,
        )

    def _register_interval(self) -> float:
        """Seconds between heartbeats: the argument, else RocketMQ's `registerNameServerPeriod`
        (ms), else 30 s."""
        if self._register_interval_s is not None:
            return self._register_interval_s
        period_ms = getattr(self.config, "register_name_server_period", None)
        if period_ms is not None:
            return period_ms / 1000
        return REGISTER_INTERVAL_S

    def _watch_roles(self, ctx: Any) -> None:
        """Re-register as soon as the broker's role flips (master ⇄ slave), not 30 s later. The
        controller calls listeners after the store's role flag changed."""
        add = getattr(self.controller, "add_role_listener", None)
        if add is None:
            return

        def on_role_change(controller: Any) -> None:
            log.info(
                "event=role_change_register broker=%s role=%s brokerId=%s",
                self.name,
                "MASTER" if ctx.is_master() else "SLAVE",
                ctx.broker_id(),
            )
            if self.registrar is not None:
                self.registrar.kick()

        add(on_role_change)

    def request_stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True

    async def wait(self) -> None:
        """Until the HTTP server stops (request_stop or a fatal error)."""
        if self._serve_task is not None:
            await asyncio.shield(self._serve_task)

    async def stop(self) -> None:
        """Graceful: stop accepting, finish requests (bounded), unregister, shut the store."""
        self.request_stop()
        if self._serve_task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._serve_task
        if self.registrar is not None:
            await self.registrar.stop()
        await self._stop_controller()
        log.info("event=broker_stopped broker=%s", self.name)

    async def _stop_controller(self) -> None:
        if self.controller is not None:
            try:
                await self.controller.shutdown()
            except Exception:
                log.exception("event=broker_shutdown_failed broker=%s", self.name)
            self.controller = None
