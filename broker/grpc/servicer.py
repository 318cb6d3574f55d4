"""`MessagingServicer`: the RPCs of rocketmq-apis v2 `MessagingService` over the broker's services.

Each RPC is an "activity" as in RocketMQ's proxy: authenticate the call (`auth.py`), convert the
request into the services' values (`convert.py`), call one service, convert the result — and any
`BrokerError` into a `Status` (`status.py`). Produce, idempotency, pop/ack, ACL rights and
metrics are the services'; nothing here decides what a message or a consumer may do.

The message model (issue #15) is the services', reached as RocketMQ's proxy reaches it: a send's
`message_type`, `message_group` and `delivery_timestamp` become the message's properties
(`convert.to_message`) and the produce service routes it (FIFO queue, timer, transaction half);
ReceiveMessage's FilterExpression is the message model's filter; EndTransaction and RecallMessage
call it; a producer's Telemetry stream carries the transaction checks of its topics
(RecoverOrphanedTransactionCommand; a gRPC producer's group is its topic); a consumer's Settings
carry its group's fifo flag and retry policy. Lite topics and the offset-based RPCs no RocketMQ 5
client of ours uses (Pull/UpdateOffset/GetOffset/QueryOffset) answer gRPC UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from broker.errors import BrokerCode, BrokerError, from_dledger, invalid
from broker.grpc import auth
from broker.grpc.batching import AckBatcher, SendBatcher
from broker.grpc.convert import duration_ms, from_message, timestamp, to_message
from broker.grpc.forward import Forwarder
from broker.grpc.protocol import Code, pb, spb, spb_grpc
from broker.grpc.renewal import AUTO_RENEW_INVISIBLE_MS, InvisibilityRenewer
from broker.grpc.route import RouteResolver, accept_types, assignments, message_queues
from broker.grpc.settings import identity, lite_refusal, settings_reply, subscribed_topics
from broker.grpc.status import OK, error_status, status
from broker.message_type import TopicMessageType, topic_message_type
from broker.service import BrokerServices
from broker.service.clients import ClientProtocol
from broker.service.pop import AckStatus
from broker.topics import validate_topic
from dledger.codes import DLedgerException

log = logging.getLogger(__name__)

# A long poll answers this long before the client's deadline (the Python client's deadline is
# its request timeout + the await duration), so the answer arrives before the client gives up.
POLL_DEADLINE_MARGIN_MS = 1_000
# A producer's Telemetry stream: transaction checks of up to this many of its topics, taken from
# the message model this many at a time, each wait this long; a member that is not the master
# (it has no checks) asks again after CHECK_RETRY_S.
MAX_CHECKED_TOPICS = 64
CHECKS_PER_PUSH = 32
CHECK_POLL_MS = 10_000
CHECK_RETRY_S = 1.0
_RESOLUTIONS = {pb.COMMIT: "COMMIT", pb.ROLLBACK: "ROLLBACK"}
# Clients whose Settings are remembered (the oldest forgotten first; a forgotten one is known
# again at its next Settings, every 5 minutes at the latest).
MAX_CLIENT_IDENTITIES = 10_000


class Unimplemented(Exception):
    """A feature this endpoint does not serve yet: gRPC UNIMPLEMENTED with the message."""


def _activity(response: type) -> Callable[..., Any]:
    """Wrap a unary RPC: a BrokerError (or DLedger failure) becomes the response's Status, an
    unexpected exception INTERNAL_SERVER_ERROR (logged), `Unimplemented` gRPC UNIMPLEMENTED."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        method = fn.__name__

        @functools.wraps(fn)
        async def call(self: MessagingServicer, request: Any, context: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = await fn(self, request, context)
            except BrokerError as exc:
                out = response(status=error_status(exc))
            except DLedgerException as exc:
                out = response(status=error_status(from_dledger(exc)))
            except Unimplemented as exc:
                self._count(method, "UNIMPLEMENTED", t0)
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(exc))
            except grpc.aio.AbortError:
                raise
            except Exception:
                log.exception("event=grpc_unhandled method=%s", method)
                out = response(
                    status=status(Code.INTERNAL_SERVER_ERROR, "internal error; see the broker log")
                )
            self._count(method, Code.Name(out.status.code), t0)
            return out

        return call

    return wrap


class GrpcMetrics:
    """Per-RPC request counts by status code and latency, beside the broker's other metrics."""

    def __init__(self, registry: Any) -> None:
        self.requests = Counter(
            "ledgermq_grpc_requests",
            "gRPC requests by method and rocketmq-apis status code",
            ["method", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "ledgermq_grpc_latency_seconds", "gRPC request latency", ["method"], registry=registry
        )
        # (method, code) -> its counter and histogram children: `labels()` costs more than the
        # increment itself, once per call.
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def record(self, method: str, code: str, seconds: float) -> None:
        """One request of `method` answered with `code` after `seconds`."""
        children = self._children.get((method, code))
        if children is None:
            children = self._children[(method, code)] = (
                self.requests.labels(method=method, code=code),
                self.latency.labels(method=method),
            )
        children[0].inc()
        children[1].observe(seconds)


class MessagingServicer(spb_grpc.MessagingServiceServicer):
    """The RPCs of one broker. Built by `GrpcEndpoint`."""

    def __init__(
        self,
        services: BrokerServices,
        routes: RouteResolver,
        renewer: InvisibilityRenewer,
        forwarder: Forwarder,
        metrics: GrpcMetrics,
    ) -> None:
        self.services = services  # broker.service.BrokerServices
        self.config = services.state.config
        self.routes = routes
        self.renewer = renewer
        self.forwarder = forwarder
        self.metrics = metrics
        self.acks = AckBatcher(services.pop, renewer.current)
        self.sends = SendBatcher(services.produce)
        # client id -> what its last Settings said (re-reported to the registry on each heartbeat)
        self._identities: OrderedDict[str, tuple[list[tuple[str, str]], str, str, str]] = OrderedDict()

    def _count(self, method: str, code: str, t0: float) -> None:
        self.metrics.record(method, code, time.perf_counter() - t0)

    def _caller(self, context: Any) -> tuple[dict[str, str], Any]:
        meta = auth.metadata(context)
        account = auth.authenticate(self.services.acl, meta)
        self.renewer.seen(meta.get(auth.CLIENT_ID, ""))
        return meta, account

    def _report(self, client_id: str, context: Any) -> None:
        """Tell the client registry this client is alive (admin API, `mqadmin clientList`)."""
        known = self._identities.get(client_id)
        if known is None:
            return
        pairs, client_type, language, version = known
        addr = context.peer().partition(":")[2]
        for group, topic in pairs:
            self.services.clients.seen(
                group,
                topic,
                ClientProtocol.GRPC,
                client_id,
                addr,
                client_type=client_type,
                language=language,
                version=version,
            )

    @staticmethod
    def _client_id(meta: dict[str, str]) -> str:
        cid = meta.get(auth.CLIENT_ID, "")
        if not cid:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"{auth.CLIENT_ID} is required", field="clientId")
        return cid

    # -- route ---------------------------------------------------------------------------------
    @_activity(spb.QueryRouteResponse)
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        self._caller(context)
        validate_topic(request.topic.name)
        routes = await self.routes.resolve(request.topic.name)
        accept = accept_types(self._attributes(request.topic.name))
        return spb.QueryRouteResponse(status=OK, message_queues=message_queues(request.topic, routes, accept))

    @_activity(spb.QueryAssignmentResponse)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        self._caller(context)
        validate_topic(request.topic.name)
        routes = await self.routes.resolve(request.topic.name)
        accept = accept_types(self._attributes(request.topic.name))
        return spb.QueryAssignmentResponse(status=OK, assignments=assignments(request.topic, routes, accept))

    def _attributes(self, topic: str) -> dict[str, str] | None:
        """A topic's attributes here (None: a topic this broker does not hold)."""
        cfg = self.services.state.store.topics.get(topic)
        return None if cfg is None else cfg.attributes

    # -- clients -------------------------------------------------------------------------------
    @_activity(spb.HeartbeatResponse)
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        meta, _ = self._caller(context)
        client_id = self._client_id(meta)
        if request.client_type not in pb.ClientType.values():
            return spb.HeartbeatResponse(
                status=status(Code.UNRECOGNIZED_CLIENT_TYPE, f"unknown client type {request.client_type}")
            )
        refusal = lite_refusal(request.client_type)
        if refusal is not None:
            return spb.HeartbeatResponse(status=status(Code.UNSUPPORTED, refusal))
        self._report(client_id, context)
        return spb.HeartbeatResponse(status=OK)

    @_activity(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        meta, _ = self._caller(context)
        client_id = self._client_id(meta)
        self.renewer.forget_client(client_id)
        self._identities.pop(client_id, None)
        self.services.clients.forget(ClientProtocol.GRPC, client_id)
        return spb.NotifyClientTerminationResponse(status=OK)

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """Answer every Settings the client sends with complete settings; keep the stream open
        (server-to-client commands travel on it) until the client closes it. A producer's stream
        also carries the transaction checks of the topics it publishes to."""
        try:
            meta, account = self._caller(context)
            client_id = self._client_id(meta)
        except BrokerError as exc:
            self._count("Telemetry", Code.Name(error_status(exc).code), time.perf_counter())
            yield spb.TelemetryCommand(status=error_status(exc))
            return
        out: asyncio.Queue[Any] = asyncio.Queue()
        checkers: dict[str, asyncio.Task[None]] = {}
        reader = asyncio.create_task(
            self._read_telemetry(request_iterator, context, meta, client_id, account, out, checkers)
        )
        try:
            while (cmd := await out.get()) is not None:
                yield cmd
        finally:
            reader.cancel()
            for task in checkers.values():
                task.cancel()

    async def _read_telemetry(
        self,
        request_iterator: Any,
        context: Any,
        meta: dict[str, str],
        client_id: str,
        account: Any,
        out: asyncio.Queue[Any],
        checkers: dict[str, asyncio.Task[None]],
    ) -> None:
        try:
            async for cmd in request_iterator:
                if cmd.WhichOneof("command") != "settings":
                    continue  # results of server commands: a check is answered by EndTransaction
                t0 = time.perf_counter()
                refusal = lite_refusal(cmd.settings.client_type)
                if refusal is not None:
                    log.warning(
                        "event=grpc_lite_consumer_refused client=%s group=%s",
                        client_id,
                        cmd.settings.subscription.group.name,
                    )
                    self._count("Telemetry", "UNSUPPORTED", t0)
                    out.put_nowait(spb.TelemetryCommand(status=status(Code.UNSUPPORTED, refusal)))
                    continue
                try:
                    reply = self._settings(cmd.settings)
                except BrokerError as exc:
                    self._count("Telemetry", Code.Name(error_status(exc).code), t0)
                    out.put_nowait(spb.TelemetryCommand(status=error_status(exc)))
                    continue
                self._identities.pop(client_id, None)
                self._identities[client_id] = identity(cmd.settings, meta)
                if len(self._identities) > MAX_CLIENT_IDENTITIES:
                    self._identities.popitem(last=False)
                self._report(client_id, context)
                self._count("Telemetry", "OK", t0)
                out.put_nowait(spb.TelemetryCommand(status=OK, settings=reply))
                if cmd.settings.client_type == pb.PRODUCER:
                    for r in cmd.settings.publishing.topics:
                        if r.name not in checkers and len(checkers) < MAX_CHECKED_TOPICS:
                            checkers[r.name] = asyncio.create_task(self._push_checks(r.name, account, out))
        except Exception as exc:  # the stream broke: its end is the client's business
            log.debug("event=grpc_telemetry_closed error=%r", exc)
        finally:
            out.put_nowait(None)

    def _settings(self, client: Any) -> Any:
        config = self.config
        if client.client_type == pb.PRODUCER or not client.HasField("subscription"):
            return settings_reply(
                client,
                max_message_size=config.max_message_size,
                max_reconsume_times=config.max_reconsume_times,
            )
        fifo_topic = any(
            topic_message_type(self._attributes(t)) is TopicMessageType.FIFO
            for t in subscribed_topics(client)
        )
        return settings_reply(
            client,
            max_message_size=config.max_message_size,
            max_reconsume_times=config.max_reconsume_times,
            group=self.services.message_model.group(client.subscription.group.name),
            fifo_topic=fifo_topic,
        )

    async def _push_checks(self, topic: str, account: Any, out: asyncio.Queue[Any]) -> None:
        """The transaction checks of `topic` (a gRPC producer's group is its topic), pushed as
        RecoverOrphanedTransactionCommand: the client asks its TransactionChecker and answers
        with EndTransaction (source SERVER_CHECK). A check no one answers is offered again next
        round (transactionCheckInterval)."""
        model = self.services.message_model
        while True:
            try:
                checks = await model.transaction_checks(account, topic, CHECKS_PER_PUSH, CHECK_POLL_MS)
                commands = [_check_command(c) for c in checks]
            except BrokerError:  # not the master now (or not allowed): ask again later
                await asyncio.sleep(CHECK_RETRY_S)
                continue
            except Exception:
                log.exception("event=grpc_transaction_checks_failed topic=%s", topic)
                await asyncio.sleep(CHECK_RETRY_S)
                continue
            for command in commands:
                out.put_nowait(command)

    # -- produce -------------------------------------------------------------------------------
    @_activity(spb.SendMessageResponse)
    async def SendMessage(self, request: Any, context: Any) -> Any:
        meta, account = self._caller(context)
        if not request.messages:
            raise invalid("messages", "at least one message is required")
        if self.forwarder.must_forward(meta):
            return await self.forwarder.unary("SendMessage", request, context)
        topic = request.messages[0].topic.name
        produce = self.services.produce
        peer = context.peer()
        msgs = []
        for i, m in enumerate(request.messages):
            where = f"messages[{i}]"
            if m.topic.name != topic:
                raise invalid(f"{where}.topic", "the messages of one request go to one topic")
            msgs.append(to_message(m, where, produce.max_message_size, peer))
        results = await self.sends.send(account, topic, msgs)
        entries = []
        for m, r in zip(msgs, results, strict=True):
            mid = m.idempotency_key or r.msg_id
            entry = spb.SendResultEntry(
                status=OK,
                message_id=mid,
                transaction_id=getattr(r, "transaction_id", None) or mid,
                offset=r.queue_offset,
            )
            if getattr(r, "recall_handle", None):
                entry.recall_handle = r.recall_handle
            entries.append(entry)
        return spb.SendMessageResponse(status=OK, entries=entries)

    # -- consume -------------------------------------------------------------------------------
    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Pop from the broker set: a status first (MESSAGE_NOT_FOUND when nothing came within
        the long poll), then the messages, then the delivery timestamp."""
        t0 = time.perf_counter()
        try:
            meta, account = self._caller(context)
            if self.forwarder.must_forward(meta):
                async for item in self.forwarder.stream("ReceiveMessage", request, context):
                    yield item
                self._count("ReceiveMessage", "FORWARDED", t0)
                return
            group = request.group.name
            topic = request.message_queue.topic.name
            expr = request.filter_expression
            message_filter = self.services.message_model.message_filter(
                "SQL92" if expr.type == pb.SQL else "TAG", expr.expression
            )
            if request.auto_renew:
                invisible_ms = AUTO_RENEW_INVISIBLE_MS
            elif request.HasField("invisible_duration"):
                invisible_ms = duration_ms(request.invisible_duration)
            else:
                raise invalid("invisibleMs", "invisible_duration is required unless auto_renew is set")
            wait_ms = _poll_ms(request, context)
            received = await self.services.pop.receive(
                account,
                group,
                topic,
                request.batch_size,
                invisible_ms,
                wait_ms,
                message_filter=message_filter,
            )
        except BrokerError as exc:
            self._count("ReceiveMessage", Code.Name(error_status(exc).code), t0)
            yield spb.ReceiveMessageResponse(status=error_status(exc))
            return
        except DLedgerException as exc:
            st = error_status(from_dledger(exc))
            self._count("ReceiveMessage", Code.Name(st.code), t0)
            yield spb.ReceiveMessageResponse(status=st)
            return
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("event=grpc_unhandled method=ReceiveMessage")
            self._count("ReceiveMessage", "INTERNAL_SERVER_ERROR", t0)
            yield spb.ReceiveMessageResponse(
                status=status(Code.INTERNAL_SERVER_ERROR, "internal error; see the broker log")
            )
            return
        if not received:
            self._count("ReceiveMessage", "MESSAGE_NOT_FOUND", t0)
            yield spb.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            yield spb.ReceiveMessageResponse(delivery_timestamp=timestamp(int(time.time() * 1000)))
            return
        self._count("ReceiveMessage", "OK", t0)
        namespace = request.group.resource_namespace
        client_id = meta.get(auth.CLIENT_ID, "")
        yield spb.ReceiveMessageResponse(status=OK)
        for r in received:
            if request.auto_renew:
                self.renewer.track(group, topic, r.receipt_handle, client_id, account)
            yield spb.ReceiveMessageResponse(
                message=from_message(
                    r.message,
                    namespace=namespace,
                    receipt_handle=r.receipt_handle,
                    delivery_attempt=r.reconsume_times + 1,
                    invisible_ms=invisible_ms,
                )
            )
        yield spb.ReceiveMessageResponse(delivery_timestamp=timestamp(int(time.time() * 1000)))

    @_activity(spb.AckMessageResponse)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        meta, account = self._caller(context)
        if self.forwarder.must_forward(meta):
            return await self.forwarder.unary("AckMessage", request, context)
        group, topic = request.group.name, request.topic.name
        if not request.entries:
            raise invalid("receiptHandles", "at least one entry is required")
        handles = [e.receipt_handle for e in request.entries]
        results = await self.acks.ack(account, group, topic, handles)
        entries = []
        for e, r in zip(request.entries, results, strict=True):
            if r.status == AckStatus.OK:
                self.renewer.settled(group, topic, e.receipt_handle)
                st = OK
            else:
                st = status(Code.INVALID_RECEIPT_HANDLE, "receipt handle is expired (redelivered or settled)")
            entries.append(pb_ack_entry(e, st))
        codes = {e.status.code for e in entries}
        top = entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "multiple results")
        return spb.AckMessageResponse(status=top, entries=entries)

    @_activity(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        meta, account = self._caller(context)
        if self.forwarder.must_forward(meta):
            return await self.forwarder.unary("ChangeInvisibleDuration", request, context)
        group, topic = request.group.name, request.topic.name
        handle = self.renewer.current(group, topic, request.receipt_handle)
        new = await self.services.pop.change_invisible(
            account, group, topic, handle, duration_ms(request.invisible_duration)
        )
        # The client now steers this message's invisibility itself (a push consumer's nack).
        self.renewer.settled(group, topic, request.receipt_handle)
        return spb.ChangeInvisibleDurationResponse(status=OK, receipt_handle=new)

    # -- not served (yet) ----------------------------------------------------------------------
    async def _unimplemented(self, context: Any, method: str, what: str) -> None:
        self._count(method, "UNIMPLEMENTED", time.perf_counter())
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"LedgerMQ does not serve {method} yet: {what}")

    @_activity(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """A consumer gave up on a message (FIFO push consumers, past their attempts): to the
        group's DLQ now."""
        meta, account = self._caller(context)
        if self.forwarder.must_forward(meta):
            return await self.forwarder.unary("ForwardMessageToDeadLetterQueue", request, context)
        group, topic = request.group.name, request.topic.name
        handle = self.renewer.current(group, topic, request.receipt_handle)
        await self.services.pop.dead_letter(account, group, topic, handle)
        self.renewer.settled(group, topic, request.receipt_handle)
        return spb.ForwardMessageToDeadLetterQueueResponse(status=OK)

    # -- the message model ---------------------------------------------------------------------
    @_activity(spb.EndTransactionResponse)
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        """Commit or roll back a transactional message (its transaction id is the send's)."""
        meta, account = self._caller(context)
        if self.forwarder.must_forward(meta):
            return await self.forwarder.unary("EndTransaction", request, context)
        resolution = _RESOLUTIONS.get(request.resolution)
        if resolution is None:
            raise invalid("resolution", "resolution must be COMMIT or ROLLBACK")
        await self.services.message_model.end_transaction(
            account,
            request.topic.name,
            request.transaction_id,
            resolution,
            from_check=request.source == pb.SOURCE_SERVER_CHECK,
        )
        return spb.EndTransactionResponse(status=OK)

    @_activity(spb.RecallMessageResponse)
    async def RecallMessage(self, request: Any, context: Any) -> Any:
        """Recall a delayed message before it is due, by the send's recall handle."""
        meta, account = self._caller(context)
        if self.forwarder.must_forward(meta):
            return await self.forwarder.unary("RecallMessage", request, context)
        message_id = await self.services.message_model.recall(
            account, request.topic.name, request.recall_handle
        )
        return spb.RecallMessageResponse(status=OK, message_id=message_id)

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        await self._unimplemented(
            context,
            "SyncLiteSubscription",
            "lite topics are not supported; consume the topic with a PushConsumer or a SimpleConsumer",
        )

    async def PullMessage(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "PullMessage", "pull by offset is served over HTTP")

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "UpdateOffset", "offsets are served over HTTP")

    async def GetOffset(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "GetOffset", "offsets are served over HTTP")

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "QueryOffset", "offsets are served over HTTP")


def pb_ack_entry(entry: Any, st: Any) -> Any:
    return spb.AckMessageResultEntry(
        message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st
    )


def _check_command(check: Any) -> Any:
    """A transaction check as the producer's client takes it: the half under its real topic."""
    message = from_message(
        check.message, namespace="", receipt_handle="", delivery_attempt=1, invisible_ms=0, topic=check.topic
    )
    command = spb.RecoverOrphanedTransactionCommand(message=message, transaction_id=check.transaction_id)
    return spb.TelemetryCommand(recover_orphaned_transaction_command=command)


def _poll_ms(request: Any, context: Any) -> int:
    """The long poll: the client's `long_polling_timeout`, ended before its deadline.
    ILLEGAL_POLLING_TIME, as RocketMQ's proxy answers, for a negative one or one the call's
    deadline leaves no time for (an answer after the client gave up would hold messages
    invisible that nobody got)."""
    wait_ms = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
    if wait_ms < 0:
        raise invalid("longPollingTimeout", f"long_polling_timeout must not be negative, got {wait_ms} ms")
    remaining = context.time_remaining()
    if remaining is None or wait_ms == 0:
        return wait_ms
    room = int(remaining * 1000) - POLL_DEADLINE_MARGIN_MS
    if room <= 0:
        raise invalid(
            "longPollingTimeout",
            f"the call's deadline ({remaining * 1000:.0f} ms left) leaves no time for a long poll of "
            f"{wait_ms} ms: give the call at least {POLL_DEADLINE_MARGIN_MS} ms more than the poll",
        )
    return min(wait_ms, room)
