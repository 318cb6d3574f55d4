"""`mqbrokercontainer -c broker-container.conf`: several brokers in one process and one event loop.

Container keys (RocketMQ's BrokerContainer names): `listenHost` (default 0.0.0.0; RocketMQ 5's
`bindAddress` is the same), `listenPort` (the container's own HTTP port: `/health`, `/brokers`),
`namesrvAddr` (given to every hosted broker), `brokerConfigPaths` (`:`-separated broker .properties
files; relative paths are relative to the container file). The other keys RocketMQ 5.3 reads from a
container file (`UNIMPLEMENTED_CONTAINER_KEYS`) are accepted with one warning each, so an operator's
`broker-container.conf` starts; a key nobody knows (a typo) is refused with the nearest known key.
Each broker keeps its own store, ports and name-server registration. A broker that fails to start
is reported (log, `/brokers`) and does not take the others down; SIGINT/SIGTERM stop all of them
gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

import uvloop
from fastapi import FastAPI

from apidocs import install_offline_docs
from broker.config import ConfigError, load_broker_config, parse_properties
from broker.runtime import BrokerRuntime, tune_gc
from listener.config import SERVER_KEYS, ListenerConfig, ListenerConfigError, apply_key
from listener.server import HttpListener

log = logging.getLogger("broker.container")

CONTAINER_KEYS = ("listenHost", "bindAddress", "listenPort", "namesrvAddr", "brokerConfigPaths")

# What RocketMQ 5.3's BrokerContainerStartup reads from a container file and LedgerMQ does not
# implement: the setters of BrokerContainerConfig, NettyServerConfig and NettyClientConfig (the file
# is applied to all three), plus BrokerContainerConfig's brokerContainerIP (a field without setter).
UNIMPLEMENTED_CONTAINER_KEYS = frozenset("""
rocketmqHome fetchNameSrvAddrByDnsLookup fetchNamesrvAddrByAddressServer brokerContainerIP
fetchNamesrvAddrInterval updateNamesrvAddrInterval configBlackList
serverWorkerThreads serverSelectorThreads serverOnewaySemaphoreValue serverCallbackExecutorThreads
serverAsyncSemaphoreValue serverSocketSndBufSize serverSocketRcvBufSize
serverSocketBacklog serverPooledByteBufAllocatorEnable useEpollNativeSelector writeBufferLowWaterMark
writeBufferHighWaterMark serverNettyWorkerGroupEnable enableShutdownGracefully shutdownWaitTimeSeconds
clientCloseSocketIfTimeout clientWorkerThreads clientOnewaySemaphoreValue connectTimeoutMillis
clientCallbackExecutorThreads channelNotActiveInterval clientAsyncSemaphoreValue
clientChannelMaxIdleTimeSeconds clientSocketSndBufSize clientSocketRcvBufSize
clientPooledByteBufAllocatorEnable useTLS disableCallbackExecutor disableNettyWorkerGroup
maxReconnectIntervalTimeSeconds enableReconnectForGoAway socksProxyConfig scanAvailableNameSrv
""".split())


@dataclass
class ContainerConfig:
    listen_host: str = "0.0.0.0"
    listen_port: int = 10700
    namesrv_addr: str = ""
    broker_config_paths: list[str] = field(default_factory=list)
    # The container port's TLS, deadlines and caps (listener.config's keys; each hosted broker
    # has its own in its file).
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    source: str = "<defaults>"

    @classmethod
    def load(cls, path: str) -> ContainerConfig:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(path, "-", f"cannot read config file: {exc.strerror}") from None
        cfg = cls(source=path)
        base = os.path.dirname(os.path.abspath(path))
        for lineno, key, value in parse_properties(text):
            where = f"{path}:{lineno}"
            if key == "listenPort":
                if not value.isdigit() or not 0 < int(value) < 65536:
                    raise ConfigError(where, key, f"bad value {value!r}: expected a port 1..65535")
                cfg.listen_port = int(value)
            elif key in ("listenHost", "bindAddress"):
                cfg.listen_host = value
            elif key == "namesrvAddr":
                cfg.namesrv_addr = value
            elif key == "brokerConfigPaths":
                cfg.broker_config_paths = [
                    p if os.path.isabs(p) else os.path.join(base, p) for p in value.split(":") if p.strip()
                ]
            elif key in SERVER_KEYS:
                try:
                    apply_key(cfg.listener, key, value)
                except ValueError as exc:
                    raise ConfigError(where, key, f"bad value: {exc}") from None
            elif key in UNIMPLEMENTED_CONTAINER_KEYS:
                log.warning(
                    "event=config_key_ignored source=%s key=%s reason=not implemented by LedgerMQ", where, key
                )
            else:
                known = [*CONTAINER_KEYS, *SERVER_KEYS, *UNIMPLEMENTED_CONTAINER_KEYS]
                near = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
                raise ConfigError(where, key, "unknown container key", near[0] if near else None)
        if not cfg.broker_config_paths:
            raise ConfigError(path, "brokerConfigPaths", "no broker config listed")
        try:
            cfg.listener.validate()
        except ListenerConfigError as exc:
            raise ConfigError(path, exc.key, exc.reason) from None
        return cfg


@dataclass
class HostedBroker:
    conf_path: str
    name: str = "?"
    addr: str | None = None
    state: str = "NEW"  # NEW -> STARTING -> RUNNING -> STOPPED | FAILED
    error: str | None = None
    runtime: BrokerRuntime | None = None
    watch: asyncio.Task[None] | None = None


class BrokerContainer:
    """Hosts several `BrokerRuntime`s. Caller: `main`."""

    def __init__(self, config: ContainerConfig) -> None:
        self.config = config
        self.brokers = [HostedBroker(p) for p in config.broker_config_paths]
        self.listener: HttpListener | None = None
        self.stopping = asyncio.Event()

    def app(self) -> FastAPI:
        app = FastAPI(title="LedgerMQ broker container", version="0.1.0", docs_url=None, redoc_url=None)
        install_offline_docs(app)

        @app.get("/health", summary="Container liveness and its brokers' states")
        async def health() -> dict[str, Any]:
            running = sum(1 for b in self.brokers if b.state == "RUNNING")
            return {"status": "UP" if running else "DOWN", "running": running, "brokers": len(self.brokers)}

        @app.get("/brokers", summary="Hosted brokers: name, address, state, error")
        async def brokers() -> dict[str, Any]:
            return {"brokers": [self._row(b) for b in self.brokers]}

        return app

    @staticmethod
    def _row(b: HostedBroker) -> dict[str, Any]:
        row: dict[str, Any] = {
            "config": b.conf_path,
            "brokerName": b.name,
            "addr": b.addr,
            "state": b.state,
            "error": b.error,
        }
        if b.runtime is not None and b.runtime.services is not None and b.state == "RUNNING":
            row["role"] = "MASTER" if b.runtime.services.state.is_master() else "SLAVE"
        return row

    async def _start_one(self, b: HostedBroker) -> None:
        b.state = "STARTING"
        try:
            overrides = {"namesrvAddr": self.config.namesrv_addr} if self.config.namesrv_addr else None
            cfg = load_broker_config(b.conf_path, overrides)
            b.name, b.addr = cfg.broker_name, cfg.broker_addr
            b.runtime = BrokerRuntime(cfg)
            await b.runtime.start()
            b.state = "RUNNING"
            b.watch = asyncio.get_running_loop().create_task(self._watch(b), name=f"watch-{b.name}")
        except Exception as exc:  # one broker's failure must not take the others down
            b.state, b.error, b.runtime = "FAILED", f"{type(exc).__name__}: {exc}", None
            log.error(
                "event=container_broker_failed config=%s broker=%s error=%s", b.conf_path, b.name, b.error
            )

    async def _watch(self, b: HostedBroker) -> None:
        """A hosted broker whose HTTP server stops while the container runs is reported FAILED
        and shut down (unregistered, store closed); the others keep running."""
        stopped = await b.runtime.wait()
        if self.stopping.is_set() or b.state != "RUNNING":
            return
        b.state, b.error = "FAILED", f"its {stopped.name if stopped else 'front-end'} server stopped"
        log.error("event=container_broker_failed config=%s broker=%s error=%s", b.conf_path, b.name, b.error)
        runtime, b.runtime = b.runtime, None
        await runtime.stop()

    async def start(self) -> None:
        """Serve the container's own port first (so it is never taken by a hosted broker), then
        start the brokers concurrently."""
        cfg = self.config
        self.listener = HttpListener(
            self.app(),
            name=f"container@{cfg.listen_host}:{cfg.listen_port}",
            host=cfg.listen_host,
            port=cfg.listen_port,
            config=cfg.listener,
        )
        await self.listener.start()
        await asyncio.gather(*(self._start_one(b) for b in self.brokers))
        log.info(
            "event=container_started port=%d brokers=%s",
            self.config.listen_port,
            ",".join(f"{b.name}:{b.state}" for b in self.brokers),
        )

    async def run_until_stopped(self) -> None:
        waits = [asyncio.ensure_future(self.stopping.wait())]
        if self.listener is not None:
            waits.append(asyncio.ensure_future(self.listener.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        await self.stop()

    async def stop(self) -> None:
        self.stopping.set()
        if self.listener is not None:
            self.listener.request_stop()
        running = [b for b in self.brokers if b.runtime is not None]
        await asyncio.gather(*(b.runtime.stop() for b in running), return_exceptions=True)
        for b in running:
            b.state = "STOPPED"
        if self.listener is not None:
            await self.listener.stop()
        log.info("event=container_stopped")


async def run(config: ContainerConfig) -> int:
    container = BrokerContainer(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, container.stopping.set)
    try:
        await container.start()
    except (RuntimeError, OSError) as exc:
        log.error("event=container_start_failed error=%s", exc)
        await container.stop()
        return 1
    if not any(b.state == "RUNNING" for b in container.brokers):
        log.error("event=container_no_broker_running")
    tune_gc()
    await container.run_until_stopped()
    return 0 if any(b.state == "STOPPED" for b in container.brokers) else 1


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    p = argparse.ArgumentParser(prog="mqbrokercontainer", description="Host several LedgerMQ brokers")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One line per request from our own httpx clients (registration, probes) is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = ContainerConfig.load(args.config)
    except ConfigError as exc:
        print(f"mqbrokercontainer: {exc}", file=sys.stderr)
        return 2
    return uvloop.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
