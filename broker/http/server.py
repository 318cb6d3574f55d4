"""`HttpFrontEnd`: the broker's HTTP API on `listenPort`, one of the front-ends
`broker.runtime.BrokerRuntime` starts beside the others, served by a `listener.HttpListener` on the
process's one event loop (TLS, read deadlines and connection caps from the broker's config)."""

from __future__ import annotations

import logging

from broker.http.app import BrokerApp, create_app
from broker.service import BrokerServices
from listener.server import HttpListener

log = logging.getLogger(__name__)


def listen_host(broker_ip: str) -> str:
    """Loopback when the broker names itself by a loopback address, else every interface."""
    return "127.0.0.1" if broker_ip in ("127.0.0.1", "localhost") else "0.0.0.0"


class HttpFrontEnd:
    """The HTTP API of one broker on `listenPort`. Built before the store starts (the app only
    wires routes); `start` binds and serves."""

    name = "HTTP"

    def __init__(self, services: BrokerServices) -> None:
        cfg = services.state.config
        self.app: BrokerApp = create_app(services)
        self.listener = HttpListener(
            self.app,
            name=f"{cfg.broker_name}@{cfg.broker_addr}",
            host=listen_host(cfg.broker_ip1),
            port=cfg.listen_port,
            config=cfg.listener,
        )

    async def start(self) -> None:
        """Listen on `listenPort` and serve; returns once serving."""
        await self.listener.start()

    def request_stop(self) -> None:
        """Stop accepting; requests in progress finish (bounded)."""
        self.listener.request_stop()

    async def wait(self) -> None:
        """Until the server stops (request_stop or a fatal error)."""
        await self.listener.wait()

    async def stop(self) -> None:
        """Graceful stop; returns once the server is down."""
        await self.listener.stop()
