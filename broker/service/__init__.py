"""The broker's services: every rule of produce, pull, group consumption, offsets, topic admin and
message queries, in typed values (`Message`, `MessageExt`, result tuples, `BrokerError`) — never
HTTP, JSON or a request object. Front-ends (`broker.http`, `broker.grpc`) only parse, call a
service and render (RocketMQ proxy's `MessagingProcessor` under its protocol "activities").

`BrokerServices.create(controller)` builds them all for one broker, before the controller's
store starts (group consumption registers its replicated state with the store's replay).
A front-end authenticates a request once (`services.acl.authenticate(authorization)` → an
`Account`) and passes the account to the service call, which authorizes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from broker.controller import BrokerController
from broker.service.acl import ANONYMOUS, AccessControl, Account, Right
from broker.service.broker_config import BrokerConfigService
from broker.service.clients import ClientInfo, ClientProtocol, ClientRegistry
from broker.service.deliveries import DeliveryQueryService, DeliveryState, GroupDelivery
from broker.service.dlq import DeadLetterService, ResendResult
from broker.service.message_model import MessageModelService
from broker.service.metrics import BrokerMetrics, BrokerStateCollector
from broker.service.offsets import GroupLag, OffsetRow, OffsetService, TopicLag
from broker.service.pop import AckResult, AckStatus, PopService, ReceivedMessage
from broker.service.produce import ProduceService, PutResult
from broker.service.pull import DEFAULT_PULL_BYTES, MAX_PULL_MESSAGES, GetResult, PullService
from broker.service.query import MessageQueryService, SearchResult
from broker.service.state import BrokerState
from broker.service.topics import QueueRange, TopicAdminService, TopicInfo

__all__ = [
    "ANONYMOUS",
    "DEFAULT_PULL_BYTES",
    "MAX_PULL_MESSAGES",
    "AccessControl",
    "Account",
    "AckResult",
    "AckStatus",
    "BrokerConfigService",
    "BrokerServices",
    "BrokerState",
    "ClientInfo",
    "ClientProtocol",
    "ClientRegistry",
    "DeadLetterService",
    "DeliveryQueryService",
    "DeliveryState",
    "GetResult",
    "GroupDelivery",
    "GroupLag",
    "MessageModelService",
    "MessageQueryService",
    "OffsetRow",
    "OffsetService",
    "PopService",
    "ProduceService",
    "PullService",
    "PutResult",
    "QueueRange",
    "ReceivedMessage",
    "ResendResult",
    "Right",
    "SearchResult",
    "TopicAdminService",
    "TopicInfo",
    "TopicLag",
]


def _access_control(controller: BrokerController) -> AccessControl:
    config = controller.config
    if not config.acl_enable:
        return AccessControl.disabled()
    if not config.acl_config_file:
        raise ValueError(f"{config.source}: aclEnable=true needs aclConfigFile")
    return AccessControl.load(config.acl_config_file)


@dataclass(frozen=True)
class BrokerServices:
    """Every service of one broker, sharing its state, access control and metrics. Callers: the
    runtime (builds it, hands it to each front-end), the front-ends."""

    state: BrokerState
    acl: AccessControl
    metrics: BrokerMetrics
    produce: ProduceService
    pull: PullService
    pop: PopService
    offsets: OffsetService
    topics: TopicAdminService
    query: MessageQueryService
    deliveries: DeliveryQueryService
    dead_letters: DeadLetterService
    clients: ClientRegistry
    message_model: MessageModelService
    config: BrokerConfigService

    @classmethod
    def create(cls, controller: BrokerController) -> BrokerServices:
        """Build the services of `controller`'s broker; call before `controller.start()`."""
        state = BrokerState(controller)
        acl = _access_control(controller)
        metrics = BrokerMetrics(controller.config.broker_name)
        model = MessageModelService(state, acl, metrics)
        model.install()
        pop = PopService(state, acl, metrics, model)
        pop.install()
        produce = ProduceService(state, acl, metrics, model)
        query = MessageQueryService(state, acl, model)
        services = cls(
            state=state,
            acl=acl,
            metrics=metrics,
            produce=produce,
            pull=PullService(state, acl, metrics),
            pop=pop,
            offsets=OffsetService(state, acl),
            topics=TopicAdminService(state, acl),
            query=query,
            deliveries=DeliveryQueryService(state, acl, pop, query),
            dead_letters=DeadLetterService(state, acl, produce, query),
            clients=ClientRegistry(lambda: int(time.time() * 1000)),
            message_model=model,
            config=BrokerConfigService(state, acl),
        )
        metrics.registry.register(BrokerStateCollector(controller.config.broker_name, services.snapshot))
        return services

    async def start(self) -> None:
        """Start the services' background work (timer firing, transaction checks: master only);
        after the controller has started; the ACL file's watch."""
        await self.message_model.start()
        self.acl.start_watching()

    async def stop(self) -> None:
        await self.acl.stop_watching()
        await self.message_model.stop()

    def snapshot(self) -> dict[str, Any]:
        """Scrape-time view for the metrics: role, DLedger metadata, consumer lag, queue max
        offsets, the idempotency table's size."""
        store = self.state.store
        status = self.state.status()
        lag = []
        queues = []
        for topic, cfg in store.topics.all().items():
            for q in range(cfg.queue_nums):
                queues.append((topic, q, store.max_offset(topic, q)))
        maxes = {(t, q): v for t, q, v in queues}
        for group in store.offsets.groups():
            for topic, offs in store.offsets.offsets_of(group).items():
                for q, off in offs.items():
                    lag.append((group, topic, q, max(0, maxes.get((topic, q), 0) - off)))
        return {
            "role": status["role"],
            "dledger": status["dledger"],
            "lag": lag,
            "queues": queues,
            "disk_used_ratio": self.state.disk_used_ratio(),
            "idempotency": (len(store.idempotency), store.idempotency.evicted),
        }
