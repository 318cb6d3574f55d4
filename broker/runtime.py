"""`BrokerRuntime`: one broker inside a process — the composition root. It builds the controller
(store + DLedger), the services over it, and the front-ends over the services (the HTTP API, and
any other protocol server), all on the process's one event loop, and registers with the name
servers. Used by `mqbroker` (one runtime) and `mqbrokercontainer` (several in one loop).

A front-end is anything with the `FrontEnd` methods; a `FrontEndFactory` builds one from the
broker's `BrokerServices` (or answers None when the broker's config does not enable it).
`default_front_ends()` lists the factories a broker process starts."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from broker.config import BrokerConfig, load_runtime_updates, updates_path
from broker.controller import BrokerController
from broker.grpc.server import GrpcFrontEnd
from broker.http.server import HttpFrontEnd
from broker.registration import BrokerRegistrar
from broker.service import BrokerServices

log = logging.getLogger(__name__)

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


class FrontEnd(Protocol):
    """A protocol server of one broker (HTTP, gRPC) over its services, on the process's loop."""

    name: str  # for logs and errors: "HTTP", "gRPC"

    async def start(self) -> None:
        """Listen and serve; return once serving. Raises (after closing what it opened) if not."""

    def request_stop(self) -> None:
        """Stop accepting; requests in progress finish."""

    async def wait(self) -> None:
        """Return when the server has stopped (request_stop, stop or a fatal error)."""

    async def stop(self) -> None:
        """Graceful stop; return once it is down. Safe after a failed or no `start`."""


# Builds a broker's front-end from its services, before the store starts; None = not enabled.
FrontEndFactory = Callable[[BrokerServices], "FrontEnd | None"]


def default_front_ends() -> list[FrontEndFactory]:
    """The front-ends every broker process starts, in start order."""
    return [HttpFrontEnd, GrpcFrontEnd.create]


def build_controller(config: BrokerConfig) -> BrokerController:
    """The BrokerController (store, DLedger server, role-change handler) for `config`."""
    return BrokerController(config)


class BrokerRuntime:
    """Start/stop one broker. Caller: broker/__main__.py and broker/container.py."""

    def __init__(
        self,
        config: BrokerConfig,
        register_interval_s: float | None = None,
        front_ends: Sequence[FrontEndFactory] | None = None,
    ) -> None:
        self.config = config
        self.controller: BrokerController | None = None
        self.services: BrokerServices | None = None
        self.front_ends: list[FrontEnd] = []
        self.registrar: BrokerRegistrar | None = None
        self._factories = list(front_ends) if front_ends is not None else default_front_ends()
        self._register_interval_s = register_interval_s

    @property
    def name(self) -> str:
        return self.config.broker_name

    async def start(self) -> None:
        """Build the controller, the services and the front-ends; start the store, then serve,
        then register. Raises if any step fails (after undoing the steps that succeeded)."""
        cfg = self.config
        for key, (was, now) in load_runtime_updates(cfg).items():
            log.info("event=config_update_loaded broker=%s key=%s value=%s configFileValue=%s file=%s",
                     self.name, key, now, was, updates_path(cfg))
        self.controller = build_controller(cfg)
        # Before the store starts: group consumption registers the system-record handlers that
        # the store's replay at start must already see.
        services = self.services = BrokerServices.create(self.controller)
        built = [factory(services) for factory in self._factories]
        await self.controller.start()
        try:
            await services.start()
            self.registrar = BrokerRegistrar(services.state, cfg.namesrv_addr_list, self._register_interval())
            services.state.on_topics_changed(self.registrar.kick)
            self._watch_roles(self.controller, services)
            for front_end in built:
                if front_end is not None:
                    self.front_ends.append(front_end)
                    await front_end.start()
            self.registrar.start()
        except BaseException:
            await self._stop_front_ends()
            await self._stop_controller()
            raise
        log.info(
            "event=broker_started broker=%s addr=%s mode=%s namesrv=%s frontEnds=%s",
            self.name,
            cfg.broker_addr,
            "dledger" if cfg.enable_dledger_commit_log else "local",
            cfg.namesrv_addr,
            ",".join(f.name for f in self.front_ends),
        )

    def _register_interval(self) -> float:
        """Seconds between heartbeats: the argument, else RocketMQ's `registerNameServerPeriod`
        (ms; REGISTER_INTERVAL_S by default)."""
        if self._register_interval_s is not None:
            return self._register_interval_s
        return self.config.register_name_server_period / 1000

    def _watch_roles(self, controller: BrokerController, services: BrokerServices) -> None:
        """Re-register as soon as the broker's role flips (master ⇄ slave), not 30 s later. The
        controller calls listeners after the role changed."""

        def on_role_change(_: BrokerController) -> None:
            log.info(
                "event=role_change_register broker=%s role=%s brokerId=%d",
                self.name,
                "MASTER" if services.state.is_master() else "SLAVE",
                services.state.broker_id(),
            )
            if self.registrar is not None:
                self.registrar.kick()

        controller.add_role_listener(on_role_change)

    def request_stop(self) -> None:
        """Ask every front-end to stop accepting (`wait` then returns)."""
        for front_end in self.front_ends:
            front_end.request_stop()

    async def wait(self) -> FrontEnd | None:
        """Until the first front-end stops (request_stop or a fatal error); that front-end."""
        if not self.front_ends:
            return None
        waits = {asyncio.ensure_future(f.wait()): f for f in self.front_ends}
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return waits[next(iter(done))]

    async def stop(self) -> None:
        """Graceful: stop accepting, finish requests (bounded), unregister, shut the store."""
        await self._stop_front_ends()
        if self.registrar is not None:
            await self.registrar.stop()
        await self._stop_controller()
        log.info("event=broker_stopped broker=%s", self.name)

    async def _stop_front_ends(self) -> None:
        for front_end in self.front_ends:
            front_end.request_stop()
        for front_end in self.front_ends:
            try:
                await front_end.stop()
            except Exception:
                log.exception("event=front_end_stop_failed broker=%s frontEnd=%s", self.name, front_end.name)

    async def _stop_controller(self) -> None:
        if self.services is not None:
            await self.services.stop()
        if self.controller is not None:
            try:
                await self.controller.shutdown()
            except Exception:
                log.exception("event=broker_shutdown_failed broker=%s", self.name)
            self.controller = None
