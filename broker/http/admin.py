"""Admin routes: topics, consumer offsets, health/status, metrics, leadership transfer."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from broker.errors import BrokerCode, BrokerError
from broker.http.acl import Right
from broker.http.context import HttpContext
from broker.http.schemas import (
    PROBLEM_RESPONSES,
    TOPIC_PATTERN,
    GroupOffsetsOut,
    LeadershipTransferIn,
    OffsetsIn,
    StatusOut,
    TopicIn,
    TopicOut,
    TopicsOut,
)
from broker.topics import validate_topic
from dledger.codes import DLedgerException

log = logging.getLogger(__name__)

TopicPath = Annotated[str, Path(min_length=1, max_length=127, pattern=r"^[%|a-zA-Z0-9_-]{1,127}$")]
GroupPath = Annotated[str, Path(min_length=1, max_length=255, pattern=r"^[%|a-zA-Z0-9_-]{1,255}$")]


def build_router(ctx: HttpContext) -> APIRouter:
    router = APIRouter()

    def topic_doc(topic: str) -> dict[str, Any]:
        cfg = ctx.store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        store = ctx.store
        return {
            "topic": topic,
            "readQueueNums": cfg.read_queue_nums,
            "writeQueueNums": cfg.write_queue_nums,
            "perm": cfg.perm,
            "queues": [
                {
                    "queueId": q,
                    "minOffset": store.min_offset(topic, q),
                    "maxOffset": store.max_offset(topic, q),
                }
                for q in range(cfg.queue_nums)
            ],
        }

    @router.get("/topics", tags=["topics"], response_model=TopicsOut, summary="Topics of this broker set")
    async def list_topics() -> dict[str, Any]:
        return {"topics": ctx.store.topics.names()}

    @router.get(
        "/topics/{topic}",
        tags=["topics"],
        response_model=TopicOut,
        responses=PROBLEM_RESPONSES,
        summary="Topic config and each queue's min/max offset",
    )
    async def get_topic(topic: TopicPath, request: Request) -> dict[str, Any]:
        validate_topic(topic)
        ctx.authorize(request.headers, topic=topic, right=Right.SUB)
        return topic_doc(topic)

    @router.put(
        "/topics/{topic}",
        tags=["topics"],
        response_model=TopicOut,
        responses=PROBLEM_RESPONSES,
        summary="Create or update a topic (master only)",
    )
    async def put_topic(topic: TopicPath, body: TopicIn, request: Request) -> dict[str, Any]:
        validate_topic(topic)
        ctx.authorize(request.headers, admin=True)
        ctx.require_master()
        await ctx.store.topics.create_or_update(topic, body.readQueueNums, body.writeQueueNums, body.perm)
        ctx.topics_changed()
        return topic_doc(topic)

    @router.delete(
        "/topics/{topic}",
        tags=["topics"],
        responses=PROBLEM_RESPONSES,
        summary="Delete a topic and its queues (master only)",
    )
    async def delete_topic(topic: TopicPath, request: Request) -> dict[str, Any]:
        validate_topic(topic)
        ctx.authorize(request.headers, admin=True)
        ctx.require_master()
        await ctx.store.topics.delete(topic)
        ctx.topics_changed()
        return {"deleted": topic}

    @router.get(
        "/topics/{topic}/queues/{queueId}/offset",
        tags=["topics"],
        responses=PROBLEM_RESPONSES,
        summary="First offset stored at or after a timestamp (ms)",
    )
    async def offset_for_time(
        topic: TopicPath,
        queueId: Annotated[int, Path(ge=0, le=65535)],
        timestamp: Annotated[int, Query(ge=0, le=2**62)],
        request: Request,
    ) -> dict[str, Any]:
        validate_topic(topic)
        ctx.authorize(request.headers, topic=topic, right=Right.SUB)
        cfg = ctx.store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if queueId >= cfg.queue_nums:
            raise BrokerError(
                BrokerCode.QUEUE_NOT_EXIST,
                f"topic {topic!r} has queues 0..{cfg.queue_nums - 1}",
                field="queueId",
            )
        return {"offset": ctx.store.offset_for_timestamp(topic, queueId, timestamp)}

    # -- consumer offsets ------------------------------------------------------------------------
    @router.get(
        "/consumers/{group}/offsets",
        tags=["consumers"],
        response_model=GroupOffsetsOut,
        responses=PROBLEM_RESPONSES,
        summary="Committed offsets per topic/queue with lag",
    )
    async def get_offsets(
        group: GroupPath,
        request: Request,
        topic: Annotated[str | None, Query(max_length=127, pattern=TOPIC_PATTERN)] = None,
    ) -> dict[str, Any]:
        if topic is not None:
            validate_topic(topic, allow_system=True)
        ctx.authorize(request.headers, topic=topic, group=group, right=Right.SUB)
        store = ctx.store
        committed = store.offsets.offsets_of(group, topic)
        if topic is not None and topic not in committed and store.topics.get(topic) is not None:
            committed[topic] = {}
        rows = []
        for t, queues in sorted(committed.items()):
            cfg = store.topics.get(t)
            qids = sorted(set(queues) | set(range(cfg.queue_nums if cfg else 0)))
            for q in qids:
                off = queues.get(q, -1)
                hi = store.max_offset(t, q) if cfg else 0
                rows.append(
                    {
                        "topic": t,
                        "queueId": q,
                        "offset": off,
                        "maxOffset": hi,
                        "lag": max(0, hi - max(off, 0)),
                    }
                )
        return {"group": group, "offsets": rows}

    @router.put(
        "/consumers/{group}/offsets",
        tags=["consumers"],
        response_model=GroupOffsetsOut,
        responses=PROBLEM_RESPONSES,
        summary="Commit offsets (replicated; master only)",
    )
    async def put_offsets(group: GroupPath, body: OffsetsIn, request: Request) -> dict[str, Any]:
        validate_topic(body.topic, allow_system=True)
        ctx.authorize(request.headers, topic=body.topic, group=group, right=Right.SUB)
        ctx.require_master()
        cfg = ctx.store.topics.get(body.topic)
        if cfg is None:
            raise BrokerError(
                BrokerCode.TOPIC_NOT_EXIST, f"topic {body.topic!r} does not exist", topic=body.topic
            )
        offsets: dict[int, int] = {}
        for key, off in body.offsets.items():
            if not (key.isascii() and key.isdigit()) or int(key) >= cfg.queue_nums:
                raise BrokerError(
                    BrokerCode.QUEUE_NOT_EXIST,
                    f"offsets: queue {key!r} is not in 0..{cfg.queue_nums - 1}",
                    field=f"offsets.{key}",
                )
            hi = ctx.store.max_offset(body.topic, int(key))
            if not 0 <= off <= hi:
                raise BrokerError(
                    BrokerCode.OFFSET_OUT_OF_RANGE,
                    f"offsets.{key}: {off} is outside [0, {hi}]",
                    field=f"offsets.{key}",
                    minOffset=0,
                    maxOffset=hi,
                )
            offsets[int(key)] = off
        if offsets:
            await ctx.store.offsets.commit_many(group, body.topic, offsets)
        return await get_offsets(group, request, body.topic)

    @router.get("/consumers", tags=["consumers"], summary="Groups with committed offsets")
    async def groups() -> dict[str, Any]:
        return {"groups": ctx.store.offsets.groups()}

    # -- health, status, metrics, leadership ----------------------------------------------------
    @router.get("/health", tags=["ops"], summary="Liveness")
    async def health() -> dict[str, Any]:
        return {"status": "UP", "role": "MASTER" if ctx.is_master() else "SLAVE"}

    @router.get(
        "/status",
        tags=["ops"],
        response_model=StatusOut,
        summary="Role, term, leader, commit index, follower watermarks",
    )
    async def status() -> dict[str, Any]:
        return ctx.status()

    @router.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @router.post(
        "/admin/leadership-transfer",
        tags=["ops"],
        responses=PROBLEM_RESPONSES,
        summary="Hand DLedger leadership to another member (master only)",
    )
    async def leadership_transfer(body: LeadershipTransferIn, request: Request) -> dict[str, Any]:
        ctx.authorize(request.headers, admin=True)
        server = ctx.dledger
        if server is None:
            raise BrokerError(
                BrokerCode.INVALID_REQUEST, "not a DLedger broker (enableDLegerCommitLog=false)"
            )
        ctx.require_master()
        peers = server.metadata().get("peers") or {}
        if peers and body.transfereeId not in peers:
            raise BrokerError(
                BrokerCode.INVALID_REQUEST,
                f"transfereeId {body.transfereeId!r} is not one of {sorted(peers)}",
                field="transfereeId",
            )
        try:
            await server.leadership_transfer(body.transfereeId)
        except DLedgerException as exc:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, f"leadership transfer failed: {exc}") from None
        return {"ok": True, "transfereeId": body.transfereeId, "dledger": ctx.status()["dledger"]}

    return router
