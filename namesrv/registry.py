"""`RouteInfoManager`: the name server's in-memory view of broker sets and their topics.

Plain state, no I/O (the HTTP app and the expiry scanner call it). Entries are keyed by broker
address: in DLedger mode a member's brokerId changes with its role (0 = master), so the same address
re-registers with a new id and must replace its old entry rather than leave a stale one behind.
When two live addresses of one set both claim brokerId 0 (an old master has not yet re-registered
as a slave), the one registered with the higher DLedger term wins, then the most recent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

PERM_READ = 4
PERM_WRITE = 2


@dataclass
class TopicRouteConfig:
    """What one broker says about one topic it holds."""

    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass
class BrokerLiveInfo:
    """One registered broker address and what it last told us."""

    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    ha_addr: str | None
    term: int
    last_update_ms: int
    topics: dict[str, TopicRouteConfig] = field(default_factory=dict)
    grpc_addr: str | None = None  # the broker's RocketMQ 5 gRPC endpoint, if it serves one


class RouteInfoManager:
    """Registry of brokers; callers: namesrv HTTP handlers (register/unregister/views) and the
    scanner (`scan_not_active`). Time is passed in (ms) so tests drive it."""

    def __init__(self, broker_expired_ms: int) -> None:
        self.broker_expired_ms = broker_expired_ms
        self._brokers: dict[str, BrokerLiveInfo] = {}  # by broker_addr
        self.registrations_total = 0
        self.expired_total = 0

    # -- broker callable API -------------------------------------------------------------------
    def register(
        self,
        *,
        cluster: str,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        topics: dict[str, TopicRouteConfig],
        now_ms: int,
        ha_addr: str | None = None,
        term: int = 0,
        grpc_addr: str | None = None,
    ) -> None:
        """Register or refresh a broker (heartbeat). Affects: routes and cluster view at once."""
        old = self._brokers.get(broker_addr)
        if old is None or old.broker_id != broker_id or old.broker_name != broker_name:
            log.info(
                "namesrv register cluster=%s brokerName=%s brokerId=%s addr=%s term=%s (was %s)",
                cluster,
                broker_name,
                broker_id,
                broker_addr,
                term,
                None if old is None else f"{old.broker_name}/{old.broker_id}",
            )
        self._brokers[broker_addr] = BrokerLiveInfo(
            cluster, broker_name, broker_id, broker_addr, ha_addr, term, now_ms, topics, grpc_addr
        )
        self.registrations_total += 1

    def unregister(self, broker_addr: str) -> bool:
        """Remove a broker that shut down cleanly. Returns whether it was known."""
        info = self._brokers.pop(broker_addr, None)
        if info:
            log.info(
                "namesrv unregister brokerName=%s brokerId=%s addr=%s",
                info.broker_name,
                info.broker_id,
                broker_addr,
            )
        return info is not None

    # -- scanner API -------------------------------------------------------------------------------
    def scan_not_active(self, now_ms: int) -> list[str]:
        """Drop brokers silent for longer than `broker_expired_ms`; returns their addresses."""
        dead = [a for a, b in self._brokers.items() if now_ms - b.last_update_ms > self.broker_expired_ms]
        for addr in dead:
            b = self._brokers.pop(addr)
            self.expired_total += 1
            log.warning(
                "namesrv broker expired brokerName=%s brokerId=%s addr=%s silentMs=%d",
                b.broker_name,
                b.broker_id,
                addr,
                now_ms - b.last_update_ms,
            )
        return dead

    # -- views (HTTP) --------------------------------------------------------------------------
    def _live(self, now_ms: int) -> list[BrokerLiveInfo]:
        # Filter on read too, so expiry is exact whatever the scan interval.
        return [b for b in self._brokers.values() if now_ms - b.last_update_ms <= self.broker_expired_ms]

    def _sets(self, now_ms: int) -> dict[str, list[BrokerLiveInfo]]:
        sets: dict[str, list[BrokerLiveInfo]] = {}
        for b in self._live(now_ms):
            sets.setdefault(b.broker_name, []).append(b)
        return sets

    @staticmethod
    def _best(members: list[BrokerLiveInfo]) -> dict[int, BrokerLiveInfo]:
        """brokerId -> the entry that holds it in one set (duplicate ids: highest term, latest)."""
        best: dict[int, BrokerLiveInfo] = {}
        for b in members:
            cur = best.get(b.broker_id)
            if cur is None or (b.term, b.last_update_ms) > (cur.term, cur.last_update_ms):
                best[b.broker_id] = b
        return best

    @classmethod
    def _addrs(cls, members: list[BrokerLiveInfo]) -> tuple[dict[str, str], BrokerLiveInfo | None]:
        """brokerId -> addr for one set, resolving duplicate ids; also returns the master entry."""
        best = cls._best(members)
        addrs = {str(i): best[i].broker_addr for i in sorted(best)}
        return addrs, best.get(0)

    @classmethod
    def _grpc(cls, members: list[BrokerLiveInfo]) -> dict[str, Any]:
        """The set's gRPC endpoints (brokerId -> addr) and its master's, for RocketMQ 5 routes."""
        best = cls._best(members)
        master = best.get(0)
        return {
            "grpcAddrs": {str(i): best[i].grpc_addr for i in sorted(best) if best[i].grpc_addr},
            "masterGrpcAddr": master.grpc_addr if master else None,
        }

    def route(self, topic: str, now_ms: int) -> dict[str, Any] | None:
        """`GET /routes/{topic}` document, or None when no live broker holds the topic."""
        brokers = []
        for name, members in sorted(self._sets(now_ms).items()):
            addrs, master = self._addrs(members)
            # The master's view of the topic wins; slaves mirror it but may lag a heartbeat.
            source = [master] if master else []
            source += sorted((m for m in members if m is not master), key=lambda m: -m.last_update_ms)
            cfg = next((m.topics[topic] for m in source if topic in m.topics), None)
            if cfg is None:
                continue
            brokers.append(
                {
                    "brokerName": name,
                    "cluster": members[0].cluster,
                    "addrs": addrs,
                    "masterAddr": master.broker_addr if master else None,
                    **self._grpc(members),
                    "readQueueNums": cfg.read_queue_nums,
                    "writeQueueNums": cfg.write_queue_nums,
                    "perm": cfg.perm,
                }
            )
        if not brokers:
            return None
        return {"topic": topic, "brokers": brokers}

    def topics(self, now_ms: int) -> list[str]:
        names: set[str] = set()
        for b in self._live(now_ms):
            names.update(b.topics)
        return sorted(names)

    def cluster(self, now_ms: int) -> dict[str, Any]:
        """`GET /cluster` document: clusters -> broker names; broker name -> addrs and freshness."""
        clusters: dict[str, list[str]] = {}
        brokers: dict[str, Any] = {}
        for name, members in sorted(self._sets(now_ms).items()):
            addrs, master = self._addrs(members)
            cluster = members[0].cluster
            clusters.setdefault(cluster, []).append(name)
            brokers[name] = {
                "cluster": cluster,
                "addrs": addrs,
                "masterAddr": master.broker_addr if master else None,
                **self._grpc(members),
                "term": max(m.term for m in members),
                "lastUpdate": max(m.last_update_ms for m in members),
                "members": [
                    {
                        "brokerId": m.broker_id,
                        "addr": m.broker_addr,
                        "haAddr": m.ha_addr,
                        "grpcAddr": m.grpc_addr,
                        "term": m.term,
                        "lastUpdate": m.last_update_ms,
                        "topicCount": len(m.topics),
                    }
                    for m in sorted(members, key=lambda m: (m.broker_id, m.broker_addr))
                ],
            }
        return {"clusters": clusters, "brokers": brokers}

    def live_count(self, now_ms: int) -> int:
        return len(self._live(now_ms))
