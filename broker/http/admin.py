"""Admin routes: topics, consumer offsets, health/status, config, metrics, leadership transfer — each
parses, calls a service (`TopicAdminService`, `OffsetService`, `BrokerState`) and renders."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from broker.config import RUNTIME_KEYS
from broker.http.acl import account_of
from broker.http.schemas import (
    PROBLEM_RESPONSES,
    GroupOffsetsOut,
    LeadershipTransferIn,
    OffsetsIn,
    StatusOut,
    TopicIn,
    TopicOut,
    TopicsOut,
)
from broker.service import Account, BrokerServices, ClientInfo, OffsetRow, Right, TopicInfo
from wire.names import GROUP_PATTERN, MAX_GROUP_LENGTH, MAX_TOPIC_LENGTH, TOPIC_PATTERN

log = logging.getLogger(__name__)

TopicPath = Annotated[str, Path(min_length=1, max_length=MAX_TOPIC_LENGTH, pattern=TOPIC_PATTERN)]
GroupPath = Annotated[str, Path(min_length=1, max_length=MAX_GROUP_LENGTH, pattern=GROUP_PATTERN)]


def topic_json(info: TopicInfo) -> dict[str, Any]:
    """A topic's config and queue ranges as the API shows them."""
    return {
        "topic": info.topic,
        "readQueueNums": info.read_queue_nums,
        "writeQueueNums": info.write_queue_nums,
        "perm": info.perm,
        "queues": [{"queueId": q, "minOffset": lo, "maxOffset": hi} for q, lo, hi in info.queues],
        "attributes": info.attributes,
    }


def offsets_json(group: str, rows: list[OffsetRow]) -> dict[str, Any]:
    """A group's committed offsets as the API shows them."""
    return {
        "group": group,
        "offsets": [
            {
                "topic": r.topic,
                "queueId": r.queue_id,
                "offset": r.offset,
                "maxOffset": r.max_offset,
                "lag": r.lag,
            }
            for r in rows
        ],
    }


def client_json(c: ClientInfo) -> dict[str, Any]:
    """A connected consumer as the API shows it."""
    return {
        "clientId": c.client_id,
        "protocol": c.protocol,
        "addr": c.addr,
        "topic": c.topic,
        "lastSeen": c.last_seen_ms,
        "clientType": c.client_type or None,
        "language": c.language or None,
        "version": c.version or None,
    }


def account_json(account: Account) -> dict[str, Any]:
    """An ACL account as the API shows it: name and rights, never the token."""

    def rights(table: dict[str, Right]) -> dict[str, str]:
        # As the ACL file spells them: "PUB|SUB", "SUB", "DENY".
        return {name: "|".join(r.name for r in (Right.PUB, Right.SUB) if r in granted) or "DENY"
                for name, granted in table.items()}

    return {
        "name": account.name,
        "admin": account.admin,
        "topicPerms": rights(account.topic_perms),
        "groupPerms": rights(account.group_perms),
    }


def build_router(services: BrokerServices) -> APIRouter:
    """Every admin route of one broker."""
    router = APIRouter()
    router.include_router(_topic_routes(services))
    router.include_router(_offset_routes(services))
    router.include_router(_ops_routes(services))
    return router


def _topic_routes(services: BrokerServices) -> APIRouter:
    router = APIRouter(tags=["topics"])
    topics = services.topics

    @router.get("/topics", response_model=TopicsOut, summary="Topics of this broker set")
    async def list_topics() -> dict[str, Any]:
        return {"topics": topics.names()}

    @router.get(
        "/topics/{topic}",
        response_model=TopicOut,
        responses=PROBLEM_RESPONSES,
        summary="Topic config and each queue's min/max offset",
    )
    async def get_topic(topic: TopicPath, request: Request) -> dict[str, Any]:
        return topic_json(topics.get(account_of(request), topic))

    @router.get(
        "/admin/topics",
        summary="Every topic's config and queue offsets in one answer (those the token may read)",
    )
    async def all_topics(request: Request) -> dict[str, Any]:
        infos = topics.readable(account_of(request))
        return {"brokerName": services.state.config.broker_name, "topics": [topic_json(i) for i in infos]}

    @router.put(
        "/topics/{topic}",
        response_model=TopicOut,
        responses=PROBLEM_RESPONSES,
        summary="Create or update a topic (master only)",
    )
    async def put_topic(topic: TopicPath, body: TopicIn, request: Request) -> dict[str, Any]:
        info = await topics.create_or_update(
            account_of(request), topic, body.readQueueNums, body.writeQueueNums, body.perm, body.attributes
        )
        return topic_json(info)

    @router.delete(
        "/topics/{topic}",
        responses=PROBLEM_RESPONSES,
        summary="Delete a topic and its queues (master only)",
    )
    async def delete_topic(topic: TopicPath, request: Request) -> dict[str, Any]:
        await topics.delete(account_of(request), topic)
        return {"deleted": topic}

    @router.get(
        "/topics/{topic}/queues/{queueId}/offset",
        responses=PROBLEM_RESPONSES,
        summary="First offset stored at or after a timestamp (ms)",
    )
    async def offset_for_time(
        topic: TopicPath,
        queueId: Annotated[int, Path(ge=0, le=65535)],
        timestamp: Annotated[int, Query(ge=0, le=2**62)],
        request: Request,
    ) -> dict[str, Any]:
        return {"offset": topics.offset_for_time(account_of(request), topic, queueId, timestamp)}

    return router


def _offset_routes(services: BrokerServices) -> APIRouter:
    router = APIRouter(tags=["consumers"])
    offsets = services.offsets

    @router.get(
        "/consumers/{group}/offsets",
        response_model=GroupOffsetsOut,
        responses=PROBLEM_RESPONSES,
        summary="Committed offsets per topic/queue with lag",
    )
    async def get_offsets(
        group: GroupPath,
        request: Request,
        topic: Annotated[str | None, Query(max_length=MAX_TOPIC_LENGTH, pattern=TOPIC_PATTERN)] = None,
    ) -> dict[str, Any]:
        return offsets_json(group, offsets.query(account_of(request), group, topic))

    @router.put(
        "/consumers/{group}/offsets",
        response_model=GroupOffsetsOut,
        responses=PROBLEM_RESPONSES,
        summary="Commit offsets (replicated; master only)",
    )
    async def put_offsets(group: GroupPath, body: OffsetsIn, request: Request) -> dict[str, Any]:
        rows = await offsets.commit(account_of(request), group, body.topic, body.offsets)
        return offsets_json(group, rows)

    @router.get(
        "/admin/consumers",
        summary="Every group's lag, in-flight messages and connected consumers (those the token may read)",
    )
    async def all_groups(request: Request) -> dict[str, Any]:
        summaries = offsets.lag_summaries(account_of(request))
        inflight = services.pop.inflight_counts()  # this master's: {} on a slave
        clients: dict[str, list[dict[str, Any]]] = {}
        for c in services.clients.clients():
            clients.setdefault(c.group, []).append(client_json(c))
        groups = []
        for g in summaries:
            topics = [{**t._asdict(), "inflight": inflight.get((g.group, t.topic), 0)} for t in g.topics]
            total = sum(t["inflight"] for t in topics)
            groups.append(
                {
                    "group": g.group,
                    "lag": g.lag,
                    "inflight": total,
                    "topics": topics,
                    "clients": clients.get(g.group, []),
                }
            )
        return {"brokerName": services.state.config.broker_name, "groups": groups}

    @router.get("/consumers", summary="Groups with committed offsets")
    async def groups() -> dict[str, Any]:
        return {"groups": offsets.groups()}

    @router.get(
        "/clients",
        summary="Clients seen lately (HTTP consumers, RocketMQ 5 gRPC producers and consumers): id, "
        "type, group, topic, language, version, address",
        responses=PROBLEM_RESPONSES,
    )
    async def clients(group: Annotated[str | None, Query(max_length=255)] = None) -> dict[str, Any]:
        return {"clients": [{"group": c.group, **client_json(c)} for c in services.clients.clients(group)]}

    return router


def _ops_routes(services: BrokerServices) -> APIRouter:
    router = APIRouter(tags=["ops"])
    state = services.state

    @router.get("/health", summary="Liveness, and who this member is")
    async def health() -> dict[str, Any]:
        # Open under ACL: what a client needs to find a set's master without a name server (the
        # name servers hand the same addresses to anyone), nothing of /status's monitoring view.
        return {"status": "UP", "role": "MASTER" if state.is_master() else "SLAVE",
                "brokerName": state.config.broker_name, "brokerId": state.broker_id(),
                "masterAddr": state.master_addr(), "term": state.term()}

    @router.get(
        "/status",
        response_model=StatusOut,
        summary="Role, term, leader, commit index, follower watermarks",
    )
    async def status(request: Request) -> dict[str, Any]:
        services.acl.authorize(account_of(request), monitor=True)
        return state.status()

    @router.get("/admin/config", summary="The settings this broker runs with, defaults included")
    async def config(request: Request) -> dict[str, Any]:
        return services.config.view(account_of(request))

    @router.patch(
        "/admin/config",
        responses=PROBLEM_RESPONSES,
        summary="Change settings while the broker runs (RocketMQ's updateBrokerConfig; admin only)",
        description="A JSON object of key: value (`.properties` spelling), e.g. "
        '`{"brokerPermission": 4}` to drain the broker of new writes, `{"fileReservedTime": 24}` to keep '
        f"one day of messages from the next clean-up on. Changeable: {', '.join(RUNTIME_KEYS)}. Saved "
        "under the store root and read again at start. Keys read at start only are refused, naming the key.",
    )
    async def update_config(body: dict[str, Any], request: Request) -> dict[str, Any]:
        return await services.config.update(account_of(request), body)

    @router.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics(request: Request) -> Response:
        services.acl.authorize(account_of(request), monitor=True)
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @router.get("/admin/acl", summary="ACL accounts and their rights, without tokens (an admin sees all)")
    async def acl_accounts(request: Request) -> dict[str, Any]:
        acl = services.acl
        return {
            "enabled": acl.enabled,
            "accounts": [account_json(a) for a in acl.visible_accounts(account_of(request))],
        }

    @router.post(
        "/admin/leadership-transfer",
        responses=PROBLEM_RESPONSES,
        summary="Hand DLedger leadership to another member (master only)",
    )
    async def leadership_transfer(body: LeadershipTransferIn, request: Request) -> dict[str, Any]:
        services.acl.authorize(account_of(request), admin=True)
        dledger = await state.transfer_leadership(body.transfereeId)
        return {"ok": True, "transfereeId": body.transfereeId, "dledger": dledger}

    return router
