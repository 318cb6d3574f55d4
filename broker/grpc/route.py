"""Routes for RocketMQ 5 clients: QueryRoute and QueryAssignment answers.

Any member's endpoint is an access point. A topic's route lists its queues on every broker set
that holds it, each set named by its brokerName, `broker.id` 0 and one address per queue entry
(the Node.js client cannot take several; Python picks one of several by sorting). Where the sets
and masters are comes from the name servers: each member registers its gRPC address,
`GET /routes/{topic}` names each set's master's (`masterGrpcAddr`) and every member's
(`grpcAddrs`); a master knows it is one without asking.

Why a set's queues are not all at its master: the clients keep a route for up to 30 s (Python
refreshes it on a schedule, never after an error), so once a master dies every send to it fails
until then. A producer retries a failed send at once on the NEXT queue of its cached route (Python:
round robin, `max_attempts` from our Settings). So every `PRODUCER_MAX_ATTEMPTS`-th queue entry
names one of the set's other live members instead (`spread`): a send that fails on the dead master
is retried there within its own attempts, and that member forwards it to the new master
(`forward.py`) — sends work again about an election after the kill. Such a queue is read there too:
a simple consumer takes the readable entries in turn (Python, Java), so after the kill its receives
at the dead master fail at once (connection refused) and those at that member are forwarded to the
new master, where its acks go too: it consumes again about an election after the kill instead of at
its route refresh, up to 30 s later. The price in the common case is one extra local hop for an
eighth of the sends, receives and acks of an 8-queue topic. Each such hop costs the slave about a
millisecond of CPU (a gRPC call in and one out, at a concurrency too low for grpc to share its
syscalls across calls), hence as few entries as the producer's attempts allow.

A push consumer finds its queues by QueryAssignment every 5 s, sent to the endpoint of one entry
of its cached route: the Python client picks any entry at random, whatever its permission; the
Java client takes the next one in turn, skipping entries with permission NONE. With most entries
at the master, a push consumer whose master died kept asking it until its route refresh (a
29 s pause, measured with the Python client). So each set's route also carries entries with
permission NONE at its other members (`access_entries`), four times as many as name the master,
in runs just before the entries that name another member: no client sends or receives on them
(they take writable or readable entries), a Python push consumer's pick lands on a live member
about four times in five (29 of 36 entries for 8 queues), and a Java one stepping onto them goes
on to the other member's entry. Any member answers QueryAssignment with its set's current master
(a slave knows it from its log).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from broker.errors import BrokerCode, BrokerError
from broker.grpc.protocol import pb
from broker.grpc.settings import PRODUCER_MAX_ATTEMPTS
from broker.message_type import TopicMessageType, topic_message_type
from broker.topics import PERM_READ, PERM_WRITE

log = logging.getLogger(__name__)

NAMESRV_TIMEOUT_S = 2.0
# How long a slave trusts the name server's word on where its master's gRPC endpoint is. A new
# master re-registers at once (role-change kick), so this bounds how stale a forward can be.
MASTER_CACHE_S = 1.0
# ... and while a forwarded call waits for a master other than the one that just failed.
RETRY_CACHE_S = 0.2
# Message types a topic accepts, by its `message.type` attribute (`broker.message_type`): the
# clients check a send against them before it leaves (Python's validate_message_type).
ACCEPT_TYPES = (pb.NORMAL,)
_ACCEPT_BY_TYPE = {
    TopicMessageType.NORMAL: ACCEPT_TYPES,
    TopicMessageType.FIFO: (pb.FIFO,),
    TopicMessageType.DELAY: (pb.DELAY,),
    TopicMessageType.TRANSACTION: (pb.TRANSACTION,),
    TopicMessageType.MIXED: (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION),
}


def accept_types(attributes: Any) -> tuple[int, ...]:
    """The message types of a topic with these attributes (None: a topic this broker does not
    hold: NORMAL)."""
    return _ACCEPT_BY_TYPE[topic_message_type(attributes)]


@dataclass(frozen=True)
class BrokerRoute:
    """One broker set's share of a topic: where its master is reached and its queues."""

    broker_name: str
    grpc_addr: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    # The endpoints of the set's other live members (its slaves), where some queues are named.
    member_addrs: tuple[str, ...] = ()


def spread(n: int, master: str, others: tuple[str, ...], attempts: int = PRODUCER_MAX_ATTEMPTS) -> list[str]:
    """The endpoint of each of a set's `n` queue entries: the master's, except evenly spaced
    entries naming the other members in turn, so that going round the entries (cyclically) no
    run of master entries is longer than `attempts - 1`: a send that fails at the master reaches
    another member within its attempts. A single entry, or no other member: all at the master."""
    out = [master] * n
    if n < 2 or not others:
        return out
    slots = -(-n // attempts)  # ceil: fewest entries that break every run of `attempts`
    for k in range(slots):
        out[(k + 1) * n // slots - 1] = others[k % len(others)]
    return out


# Entries with permission NONE per entry naming a set's master (see the module's docstring),
# and at most this many per set: a topic of 1,024 queues would otherwise answer every route query
# with thousands of entries.
ACCESS_ENTRIES_PER_MASTER_ENTRY = 4
MAX_ACCESS_ENTRIES = 128


def access_entries(placed: list[str], master: str, others: tuple[str, ...]) -> list[str | None]:
    """`placed` (the endpoint of each of a set's entries, in order) with a set's NONE entries
    inserted: `ACCESS_ENTRIES_PER_MASTER_ENTRY` per entry naming `master` (at most
    `MAX_ACCESS_ENTRIES`), naming `others` in turn, in runs just before the entries that name
    another member (after the last entry when none does). Inserted entries are given as their
    endpoint, `placed`'s own as None."""
    if not others:
        return [None] * len(placed)
    total = min(ACCESS_ENTRIES_PER_MASTER_ENTRY * sum(addr == master for addr in placed), MAX_ACCESS_ENTRIES)
    names = (others[k % len(others)] for k in range(total))
    n_at_others = sum(addr != master for addr in placed)
    if not n_at_others:
        return [None] * len(placed) + list(names)
    out: list[str | None] = []
    j = 0  # how many entries naming another member came before
    for addr in placed:
        if addr != master:
            share = total * (j + 1) // n_at_others - total * j // n_at_others
            out += [next(names) for _ in range(share)]
            j += 1
        out.append(None)
    return out


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


def message_queues(
    topic: pb.Resource, routes: list[BrokerRoute], accept: tuple[int, ...] = ACCEPT_TYPES
) -> list[pb.MessageQueue]:
    """One MessageQueue per queue id of each set (broker id 0: the master), as RocketMQ's proxy
    splits read and write queues."""
    out = []
    for r in routes:
        n = max(r.read_queue_nums, r.write_queue_nums)
        brokers = {
            addr: pb.Broker(name=r.broker_name, id=0, endpoints=endpoints(addr))
            for addr in (r.grpc_addr, *r.member_addrs)
        }
        entries: list[tuple[str, pb.MessageQueue]] = []  # (endpoint, entry)
        for qid, addr in enumerate(spread(n, r.grpc_addr, r.member_addrs)):
            readable, writable = qid < r.read_queue_nums, qid < r.write_queue_nums
            entries.append((addr, pb.MessageQueue(
                topic=topic,
                id=qid,
                permission=_permission(r.perm, readable, writable),
                broker=brokers[addr],
                accept_message_types=accept,
            )))
        # Queue ids after the set's own, as RocketMQ's proxy numbers a NONE entry.
        access_ids = itertools.count(n)
        queue_of = (q for _, q in entries)
        for inserted in access_entries([where for where, _ in entries], r.grpc_addr, r.member_addrs):
            if inserted is None:
                out.append(next(queue_of))
            else:
                out.append(pb.MessageQueue(topic=topic, id=next(access_ids), permission=pb.NONE,
                                           broker=brokers[inserted], accept_message_types=accept))
    return out


def assignments(
    topic: pb.Resource, routes: list[BrokerRoute], accept: tuple[int, ...] = ACCEPT_TYPES
) -> list[pb.Assignment]:
    """QueryAssignment: one assignment per readable set, queue id -1 (the broker receives across
    all its queues, as RocketMQ's proxy does for non-FIFO groups), at the master: a push consumer
    asks again every 5 s, so after a failover it moves to the new master by itself."""
    return [
        pb.Assignment(
            message_queue=pb.MessageQueue(
                topic=topic,
                id=-1,
                permission=_permission(r.perm, True, True),
                broker=pb.Broker(name=r.broker_name, id=0, endpoints=endpoints(r.grpc_addr)),
                accept_message_types=accept,
            )
        )
        for r in routes
        if r.read_queue_nums > 0 and r.perm & PERM_READ
    ]


class RouteResolver:
    """A topic's broker sets, their masters' and members' gRPC endpoints. Callers: the servicer
    (routes), the forwarder (where this set's master is)."""

    def __init__(self, state: Any, self_addr: str) -> None:
        self.state = state  # broker.service.BrokerState
        self.self_addr = self_addr
        cfg = state.config
        self.namesrv_urls = [a if a.startswith("http") else f"http://{a}" for a in cfg.namesrv_addr_list]
        self._client: httpx.AsyncClient | None = None
        # Our set's entry in the name servers' /cluster, and when it was looked up.
        self._my_set: tuple[float, dict[str, Any]] = (float("-inf"), {})
        self._lookup = asyncio.Lock()

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
            master, others = await self._members()
            routes[cfg.broker_name] = BrokerRoute(
                cfg.broker_name, master, n, n, PERM_READ | PERM_WRITE, others
            )
        if not routes:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"no route for topic {topic!r}", topic=topic)
        return sorted(routes.values(), key=lambda r: r.broker_name)

    async def master_grpc_addr(self, exclude: frozenset[str] = frozenset()) -> str | None:
        """The gRPC endpoint of this broker set's master: ours when we are it; else the member the
        log names master (its HTTP address, mapped through the name servers' member list), else
        the name servers' `masterGrpcAddr` — skipping `exclude` (endpoints that just failed) and
        ourselves. None while unknown. The name servers are asked at most every MASTER_CACHE_S,
        every RETRY_CACHE_S while a caller waits out a failed master."""
        if self.state.is_master():
            return self.self_addr
        mine = await self._cluster_entry(RETRY_CACHE_S if exclude else MASTER_CACHE_S)
        by_http = {m.get("addr"): m.get("grpcAddr") for m in mine.get("members") or ()}
        for addr in (by_http.get(self.state.master_addr()), mine.get("masterGrpcAddr")):
            if isinstance(addr, str) and addr and addr != self.self_addr and addr not in exclude:
                return addr
        return None

    async def _members(self) -> tuple[str, tuple[str, ...]]:
        """This set's master endpoint (ours while none is known) and its other live members'."""
        master = await self.master_grpc_addr() or self.self_addr
        mine = await self._cluster_entry(MASTER_CACHE_S)
        grpc_addrs = mine.get("grpcAddrs") or {}
        live = self.state.live_slave_ids()  # known on the master only
        others = {
            addr
            for broker_id, addr in grpc_addrs.items()
            if isinstance(addr, str)
            and addr
            and broker_id != "0"
            and (live is None or (broker_id.isdigit() and int(broker_id) in live))
        }
        if not self.state.is_master():
            others.add(self.self_addr)
        others.discard(master)
        return master, tuple(sorted(others))

    async def _cluster_entry(self, max_age_s: float) -> dict[str, Any]:
        """Our set's entry in the name servers' `GET /cluster` (at most `max_age_s` old; one
        lookup at a time, the others wait for it)."""
        if time.monotonic() - self._my_set[0] < max_age_s:
            return self._my_set[1]
        async with self._lookup:
            now = time.monotonic()
            if now - self._my_set[0] < max_age_s:
                return self._my_set[1]
            doc = await self._namesrv_get("/cluster")
            mine = ((doc or {}).get("brokers") or {}).get(self.state.config.broker_name) or {}
            self._my_set = (now, mine if isinstance(mine, dict) else {})
            return self._my_set[1]

    async def _local(self, topic: str) -> BrokerRoute | None:
        tc = self.state.store.topics.get(topic)
        if tc is None:
            return None
        master, others = await self._members()
        return BrokerRoute(
            self.state.config.broker_name,
            master,
            tc.read_queue_nums,
            tc.write_queue_nums,
            self.state.config.registered_perm(tc.perm),
            others,
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
        members = sorted({str(a) for i, a in (b.get("grpcAddrs") or {}).items() if a and str(i) != "0"})
        grpc_addr = b.get("masterGrpcAddr") or None
        if grpc_addr is None:
            # No master right now: any live member's endpoint forwards to the next one.
            grpc_addr = next(iter(members), None)
        if grpc_addr is None:
            return None  # a set without gRPC endpoints
        try:
            return BrokerRoute(
                str(b["brokerName"]),
                str(grpc_addr),
                int(b["readQueueNums"]),
                int(b["writeQueueNums"]),
                int(b["perm"]),
                tuple(a for a in members if a != grpc_addr),
            )
        except (KeyError, TypeError, ValueError):
            log.warning("event=grpc_route_bad_broker broker=%r", b)
            return None
