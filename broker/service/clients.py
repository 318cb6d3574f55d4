"""`ClientRegistry`: the consumers of each group this broker heard from lately, whatever their
protocol — HTTP receives and gRPC telemetry alike — so a console shows a gRPC consumer as online
(rocketmq-dashboard shows RocketMQ 5 gRPC clients as offline, with lag -1).

A consumer is connected while it was seen within `expire_ms` (a long poll waits at most
`brokerSuspendMaxTimeMillis`, 15 s, between two requests of a live consumer). Master-local,
in memory, bounded by count (oldest forgotten first). Plain state, no I/O.
Callers: the front-ends (`seen`, on every receive or heartbeat), the admin views (`clients`)."""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

CLIENT_EXPIRE_MS = 60_000
MAX_CLIENTS = 10_000


class ClientProtocol(enum.StrEnum):
    HTTP = "HTTP"
    GRPC = "gRPC"


class ClientInfo(NamedTuple):
    group: str
    topic: str
    protocol: ClientProtocol
    client_id: str
    addr: str
    last_seen_ms: int
    # What a session protocol's client says about itself (RocketMQ 5 gRPC Settings): PRODUCER,
    # SIMPLE_CONSUMER, PUSH_CONSUMER, ...; the client's language and version. "" when unknown.
    client_type: str = ""
    language: str = ""
    version: str = ""


class ClientRegistry:
    """(group, protocol, client id) → the client's last request."""

    def __init__(
        self, clock_ms: Callable[[], int], expire_ms: int = CLIENT_EXPIRE_MS, max_clients: int = MAX_CLIENTS
    ) -> None:
        self.clock_ms = clock_ms
        self.expire_ms = expire_ms
        self.max_clients = max_clients
        self._clients: OrderedDict[tuple[str, str, str], ClientInfo] = OrderedDict()

    def seen(
        self,
        group: str,
        topic: str,
        protocol: ClientProtocol,
        client_id: str,
        addr: str,
        *,
        client_type: str = "",
        language: str = "",
        version: str = "",
    ) -> None:
        """A client of `group` (a producer's group is its topic, as RocketMQ's proxy names gRPC
        producers) made a request now."""
        key = (group, protocol, client_id)
        self._clients.pop(key, None)
        self._clients[key] = ClientInfo(
            group, topic, protocol, client_id, addr, self.clock_ms(), client_type, language, version
        )
        if len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)

    def clients(self, group: str | None = None) -> list[ClientInfo]:
        """Connected clients (of `group`, or of every group), by group then client id; forgets the
        expired ones."""
        horizon = self.clock_ms() - self.expire_ms
        for key in [k for k, c in self._clients.items() if c.last_seen_ms < horizon]:
            del self._clients[key]
        live = [c for c in self._clients.values() if group is None or c.group == group]
        return sorted(live, key=lambda c: (c.group, c.client_id, c.protocol))

    def forget(self, protocol: ClientProtocol, client_id: str) -> None:
        """The client said it shut down (gRPC NotifyClientTermination): drop it at once."""
        for key in [k for k in self._clients if k[1] == protocol and k[2] == client_id]:
            del self._clients[key]
