"""`ProduceService`: store messages sent to a topic, answered after commit.

The front-end decodes its wire form into `Message`s (bounded by `max_message_size`, stamped with
`born_host`); the service owns the rest: the caller's PUB right, the topic name, the master
check (all before a front-end reads a body: `admit`), auto-creation, writability and the queue
range of every message before anything is stored, one store call per run of messages bound for
the same queue, and the produce metrics. Idempotency keys are answered by the store."""

from __future__ import annotations

import time

from broker.errors import BrokerCode, BrokerError, from_dledger
from broker.message import KeyRun, Message
from broker.message_model import SendResult
from broker.message_type import TopicMessageType, topic_message_type
from broker.service.acl import AccessControl, Account, Right
from broker.service.message_model import MessageModelService
from broker.service.metrics import BrokerMetrics
from broker.service.state import BrokerState
from broker.store.offsets import PutResult
from broker.topics import TopicConfig, validate_topic
from dledger.codes import DLedgerException

__all__ = ["ProduceService", "PutResult"]


class ProduceService:
    """Produce for one broker. Callers: the front-ends (HTTP hot path and routes, gRPC)."""

    def __init__(self, state: BrokerState, acl: AccessControl, metrics: BrokerMetrics,
                 model: MessageModelService) -> None:
        self.state = state
        self.model = model
        self.store = state.store
        self.acl = acl
        self.metrics = metrics
        self.max_message_size = state.config.max_message_size
        # What a front-end stamps into each message's BORNHOST.
        self.born_host = state.config.broker_addr

    async def produce(
        self,
        account: Account,
        topic: str,
        msgs: list[Message],
        queue_ids: list[int | None],
    ) -> list[PutResult | SendResult]:
        """`admit` then `put`: the whole produce for a front-end that has its messages at hand."""
        started = time.perf_counter()
        self.admit(account, topic)
        return await self.put(topic, msgs, queue_ids, started)

    def admit(self, account: Account, topic: str) -> None:
        """What a produce to `topic` must pass before its body is even read: the caller's PUB
        right, a legal topic name, and this broker being the master."""
        try:
            self.acl.authorize(account, topic=topic, right=Right.PUB)
            validate_topic(topic)
            self.state.require_master()
        except BrokerError as exc:
            self.refused(topic, exc)
            raise

    async def put(
        self,
        topic: str,
        msgs: list[Message],
        queue_ids: list[int | None],
        started: float | None = None,
        key_run: KeyRun | None = None,
    ) -> list[PutResult | SendResult]:
        """Store `msgs` (admitted) in order; `queue_ids[i]` is message i's queue or None (the
        store chooses). Nothing is stored when any message names a queue the topic lacks.
        `started` (perf_counter) is when the request began, for the latency metric. `key_run`
        gives message i the idempotency key `key_run.key(i)` (the messages carry none)."""
        t0 = time.perf_counter() if started is None else started
        try:
            results = await self._put(topic, msgs, queue_ids, key_run)
        except BrokerError as exc:
            self.refused(topic, exc)
            raise
        tm = self.metrics.topic(topic)
        tm.put_messages.inc(len(results))
        tm.put_bytes.inc(sum(len(m.body) for m in msgs))
        tm.put_latency.observe(time.perf_counter() - t0)
        return results

    def refused(self, topic: str, exc: BrokerError) -> None:
        """Count a refused produce (a front-end calls it for a body it could not decode)."""
        # Label only topics that exist: arbitrary names must not grow the metric without bound.
        label = topic if self.store.topics.get(topic) is not None else "_other"
        self.metrics.put_errors.labels(topic=label, code=exc.code.value).inc()

    async def _put(
        self, topic: str, msgs: list[Message], queue_ids: list[int | None], key_run: KeyRun | None
    ) -> list[PutResult | SendResult]:
        topics = self.store.topics
        created = topics.get(topic) is None
        # The topic's rules have one home (broker/topics.py), for the store's own puts too; here
        # every message's queue is checked before the first store call of a multi-run batch.
        cfg = await topics.writable(topic)
        if not self.state.config.broker_writable and \
                topic_message_type(cfg.attributes) is TopicMessageType.FIFO:
            # RocketMQ's rule: a broker without write permission still takes what producers with
            # an old route send (routes move them off within a refresh), except to a FIFO topic,
            # whose message groups must not be spread over two brokers meanwhile.
            raise BrokerError(BrokerCode.NO_PERMISSION, f"broker {self.state.config.broker_addr}: sending to "
                              f"FIFO topic {topic!r} is forbidden (brokerPermission="
                              f"{self.state.config.broker_permission})", topic=topic)
        if created:
            self.state.topics_changed()
        if queue_ids.count(None) != len(queue_ids):
            self._check_queues(cfg, queue_ids)
        results: list[PutResult | SendResult] = []
        now = int(time.time() * 1000)
        routed = self.model.route(cfg, topic, msgs, queue_ids, now)
        if routed is not None and key_run is not None:
            # Typed messages go to the message model's topics one by one: each carries its key.
            msgs, key_run = key_run.keyed(msgs), None
            routed = self.model.route(cfg, topic, msgs, queue_ids, now)
        # One store call per run of messages bound for the same queue, in request order. The store
        # answers a commit timeout itself (TIMEOUT, outcome unknown), so no extra timer here.
        put_messages = self.store.put_messages
        start, n = 0, len(msgs)
        try:
            if routed is None:  # plain messages of a NORMAL topic: stored as they are
                while start < n:
                    end = start + 1
                    while end < n and queue_ids[end] == queue_ids[start]:
                        end += 1
                    batch = msgs if start == 0 and end == n else msgs[start:end]
                    results += await put_messages(topic, batch, queue_ids[start], await_dispatch=False,
                                                  key_run=None if key_run is None else key_run.part(start))
                    start = end
                return results
            while start < n:  # typed messages: each run to where the message model sends it
                first = routed[start]
                end = start + 1
                while end < n and (routed[end].topic, routed[end].queue_id) == (first.topic, first.queue_id):
                    end += 1
                run = routed[start:end]
                puts = await put_messages(first.topic, [r.message for r in run], first.queue_id,
                                          _system=first.system, await_dispatch=False)
                results += [self.model.model.result(topic, r, p) for r, p in zip(run, puts, strict=True)]
                start = end
        except DLedgerException as exc:
            raise from_dledger(exc) from None
        return results

    @staticmethod
    def _check_queues(cfg: TopicConfig, queue_ids: list[int | None]) -> None:
        """Every named queue is a write queue of the topic; the first message naming one that is
        not is the field refused. Each queue is checked once (a batch names one or a few)."""
        if set(map(type, queue_ids)) <= {int, type(None)}:
            for q in dict.fromkeys(queue_ids):
                if q is not None and not 0 <= q < cfg.write_queue_nums:
                    cfg.check_write_queue(q, f"messages[{queue_ids.index(q)}].queueId")
            return
        for i, q in enumerate(queue_ids):  # a bool or another type: refused, named as it came
            if q is not None:
                cfg.check_write_queue(q, f"messages[{i}].queueId")
