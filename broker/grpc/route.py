"""Routes for RocketMQ 5 clients: QueryRoute and QueryAssignment answers.

Any member's endpoint is an access point. A topic's route lists its queues on every broker set
that holds it, each set named by its brokerName and reached at its MASTER's gRPC endpoint — one
address per broker (the Node.js client cannot take several; Python picks one of several by
sorting). Where the sets and masters are comes from the name servers: each member registers its
gRPC address, `GET /routes/{topic}` names each set's master's (`masterGrpcAddr`); a master knows
it is one without asking. A set whose master is not known right now (mid-election) is named at
the access point itself, which forwards to the master once there is one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from broker.errors import BrokerCode, BrokerError
from broker.grpc.protocol import pb
from broker.topics import PERM_READ, PERM_WRITE

log = logging.getLogger(__name__)

NAMESRV_TIMEOUT_S = 2.0
# How long a slave trusts the name server's word on where its master's gRPC endpoint is. A new
# master re-registers at once (role-change kick), so this bounds how stale a forward can be.
MASTER_CACHE_S = 1.0
# Message types a topic accepts until topics carry RocketMQ 5's `message.type` attribute.
ACCEPT_TYPES = (pb.NORMAL,)


@dataclass(frozen=True)
class BrokerRoute:
    """One broker set's share of a topic: where its master is reached and its queues."""

    broker_name: str
    grpc_addr: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


def endpoints(addr: str) -> pb.Endpoints:
    """`host:port` as Endpoints (IPv4 literal or a domain name, one address)."""
    host, _, port = addr.rpartition(":")
    parts = host.split(".")
    is_ipv4 = len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
    return pb.Endpoints(
        scheme=pb.IPv4 if is_ipv4 else pb.DOMAIN_NAME,
        addresses=[pb.Address(host=host, port=int(port))],
    )


def _permission(perm: int, readable: bool, writable: bool) -> int:
    readable = readable and bool(perm & PERM_READ)
    writable = writable and bool(perm & PERM_WRITE)
    if readable and writable:
        return pb.READ_WRITE
    if readable:
        return pb.READ
    if writable:
        return pb.WRITE
    return pb.NONE


def message_queues(topic: pb.Resource, routes: list[BrokerRoute]) -> list[pb.MessageQueue]:
    """One MessageQueue per queue id of each set (broker id 0: the master), as RocketMQ's proxy
    splits read and write queues."""
    out = []
    for r in routes:
        broker = pb.Broker(name=r.broker_name, id=0, endpoints=endpoints(r.grpc_addr))
        for qid in range(max(r.read_queue_nums, r.write_queue_nums)):
            out.append(
                pb.MessageQueue(
                    topic=topic,
                    id=qid,
                    permission=_permission(r.perm, qid < r.read_queue_nums, qid < r.write_queue_nums),
                    broker=broker,
                    accept_message_types=ACCEPT_TYPES,
                )
            )
    return out


def assignments(topic: pb.Resource, routes: list[BrokerRoute]) -> list[pb.Assignment]:
    """QueryAssignment: one assignment per readable set, queue id -1 (the broker receives across
    all its queues, as RocketMQ's proxy does for non-FIFO groups)."""
    return [
        pb.Assignment(
            message_queue=pb.MessageQueue(
                topic=topic,
                id=-1,
                permission=_permission(r.perm, True, True),
                broker=pb.Broker(name=r.broker_name, id=0, endpoints=endpoints(r.grpc_addr)),
                accept_message_types=ACCEPT_TYPES,
            )
        )
        for r in routes
        if r.read_queue_nums > 0 and r.perm & PERM_READ
    ]


class RouteResolver:
    """A topic's broker sets and their masters' gRPC endpoints. Caller: the servicer."""

    def __init__(self, state: Any, self_addr: str) -> None:
        self.state = state  # broker.service.BrokerState
        self.self_addr = self_addr
        cfg = state.config
        self.namesrv_urls = [a if a.startswith("http") else f"http://{a}" for a in cfg.namesrv_addr_list]
        self._client: httpx.AsyncClient | None = None
        self._master: tuple[float, str | None] = (0.0, None)  # (when looked up, address)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def resolve(self, topic: str) -> list[BrokerRoute]:
        """The sets holding `topic`; TOPIC_NOT_EXIST when none does (and this broker would not
        create it on the first send)."""
        cfg = self.state.config
        routes = {r.broker_name: r for r in await self._from_namesrv(topic)}
        local = await self._local(topic)
        if local is not None:
            routes[local.broker_name] = local  # our own set: our role state is the freshest
        if not routes and cfg.auto_create_topic_enable:
            n = cfg.default_topic_queue_nums
            routes[cfg.broker_name] = BrokerRoute(
                cfg.broker_name, await self._master_or_self(), n, n, PERM_READ | PERM_WRITE
            )
        if not routes:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"no route for topic {topic!r}", topic=topic)
        return sorted(routes.values(), key=lambda r: r.broker_name)

    async def master_grpc_addr(self) -> str | None:
        """The gRPC endpoint of this broker set's master: ours when we are it, else what the name
        servers last said (looked up at most every MASTER_CACHE_S); None while unknown."""
        if self.state.is_master():
            return self.self_addr
        looked_up, addr = self._master
        now = time.monotonic()
        if now - looked_up < MASTER_CACHE_S:
            return addr
        addr = None
        doc = await self._namesrv_get("/cluster")
        if doc is not None:
            mine = (doc.get("brokers") or {}).get(self.state.config.broker_name) or {}
            found = mine.get("masterGrpcAddr")
            addr = found if isinstance(found, str) and found != self.self_addr else None
        self._master = (now, addr)
        return addr

    async def _master_or_self(self) -> str:
        return await self.master_grpc_addr() or self.self_addr

    async def _local(self, topic: str) -> BrokerRoute | None:
        tc = self.state.store.topics.get(topic)
        if tc is None:
            return None
        return BrokerRoute(
            self.state.config.broker_name,
            await self._master_or_self(),
            tc.read_queue_nums,
            tc.write_queue_nums,
            tc.perm,
        )

    async def _from_namesrv(self, topic: str) -> list[BrokerRoute]:
        """The route the first name server that answers gives (none configured, none up, or 404:
        no sets)."""
        doc = await self._namesrv_get(f"/routes/{topic}")
        if doc is None:
            return []
        return [b for b in map(self._broker_route, doc.get("brokers", [])) if b is not None]

    async def _namesrv_get(self, path: str) -> dict[str, Any] | None:
        """The JSON document of the first name server that answers `path` (None: none did, or 404)."""
        if not self.namesrv_urls:
            return None
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=NAMESRV_TIMEOUT_S)
        for url in self.namesrv_urls:
            try:
                r = await self._client.get(f"{url}{path}")
            except httpx.HTTPError as exc:
                log.warning("event=grpc_namesrv_failed namesrv=%s path=%s error=%r", url, path, exc)
                continue
            if r.status_code == 404:
                return None
            if r.status_code != 200:
                log.warning(
                    "event=grpc_namesrv_failed namesrv=%s path=%s status=%d", url, path, r.status_code
                )
                continue
            return r.json()
        return None

    def _broker_route(self, b: dict[str, Any]) -> BrokerRoute | None:
        grpc_addr = b.get("masterGrpcAddr") or None
        if grpc_addr is None:
            # No master right now: any live member's endpoint forwards to the next one.
            grpc_addr = next(iter(sorted((b.get("grpcAddrs") or {}).items())), (None, None))[1]
        if grpc_addr is None:
            return None  # a set without gRPC endpoints
        try:
            return BrokerRoute(
                str(b["brokerName"]),
                str(grpc_addr),
                int(b["readQueueNums"]),
                int(b["writeQueueNums"]),
                int(b["perm"]),
            )
        except (KeyError, TypeError, ValueError):
            log.warning("event=grpc_route_bad_broker broker=%r", b)
            return None
