"""The Telemetry settings handshake, and what a client's Settings say about it.

Every RocketMQ 5 client opens a Telemetry stream to each broker endpoint of its route, sends its
`Settings` and (Python 5.1.1, Node.js, every push consumer) waits for the server's before it
starts. `settings_reply` answers with COMPLETE settings: the client's own merged with the
server's values, as RocketMQ's proxy does (`GrpcClientSettingsManager`) — a reply without
`publishing.max_body_size` makes the Python producer refuse every later send, Node.js insists on
an exponential producer backoff, a push consumer polls with `subscription.long_polling_timeout`.
"""

from __future__ import annotations

from typing import Any

from broker.errors import invalid
from broker.grpc.convert import duration
from broker.grpc.protocol import pb
from broker.retry_policy import RetryPolicy, RetryPolicyType

# A send is tried this often, each attempt on the next queue of the client's route (Python: at
# once; Java and Node.js: after 10, 20, 40 ... ms): `route.spread` names a set's other members
# at every 8th queue entry, so a send that fails at a dead master is retried there within its
# attempts, while 7 of 8 sends of an 8-queue topic still go straight to the master (with 4
# attempts a quarter took the slave's hop: +100 us of set CPU per message sent).
PRODUCER_MAX_ATTEMPTS = 8
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1_000
CONSUMER_BACKOFF_INITIAL_MS = 1_000
CONSUMER_BACKOFF_MAX_MS = 60_000
BACKOFF_MULTIPLIER = 2.0
RECEIVE_BATCH_SIZE = 32
DEFAULT_LONG_POLLING_MS = 20_000

_CONSUMERS = (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER, pb.PULL_CONSUMER)
_LITE_CONSUMERS = (pb.LITE_PUSH_CONSUMER, pb.LITE_SIMPLE_CONSUMER)


def lite_refusal(client_type: int) -> str | None:
    """Why a lite consumer (LitePushConsumer, LiteSimpleConsumer) is refused, else None.
    LedgerMQ serves no lite topics; said in the Heartbeat and Telemetry status because the
    Python client otherwise only reports a lite subscription quota of 0."""
    if client_type not in _LITE_CONSUMERS:
        return None
    return (
        f"{pb.ClientType.Name(client_type)}: lite topics are not supported by LedgerMQ; "
        "consume the topic with a PushConsumer or a SimpleConsumer"
    )


def _backoff(max_attempts: int, initial_ms: int, max_ms: int) -> pb.RetryPolicy:
    return pb.RetryPolicy(
        max_attempts=max_attempts,
        exponential_backoff=pb.ExponentialBackoff(
            initial=duration(initial_ms), max=duration(max_ms), multiplier=BACKOFF_MULTIPLIER
        ),
    )


def _consumer_backoff(max_attempts: int, policy: RetryPolicy | None) -> pb.RetryPolicy:
    """A consumer group's retry policy as the clients take it (a push consumer waits this long
    before a failed message comes again). CUSTOMIZED: the client's `next[attempt - 1]` is the
    broker's `next[reconsumeTimes + 2]` (`broker.retry_policy`), so the list starts at level 3.
    No policy (nack = at once on the broker): the endpoint's own exponential backoff."""
    if policy is None:
        return _backoff(max_attempts, CONSUMER_BACKOFF_INITIAL_MS, CONSUMER_BACKOFF_MAX_MS)
    if policy.type is RetryPolicyType.EXPONENTIAL:
        return pb.RetryPolicy(
            max_attempts=max_attempts,
            exponential_backoff=pb.ExponentialBackoff(
                initial=duration(policy.initial_ms), max=duration(policy.max_ms), multiplier=policy.multiplier
            ),
        )
    levels = policy.next_ms[2:] or policy.next_ms[-1:]
    return pb.RetryPolicy(
        max_attempts=max_attempts,
        customized_backoff=pb.CustomizedBackoff(next=[duration(ms) for ms in levels]),
    )


def subscribed_topics(client: pb.Settings) -> list[str]:
    """The topics a consumer's Settings subscribe to."""
    return [e.topic.name for e in client.subscription.subscriptions]


def settings_reply(
    client: pb.Settings,
    *,
    max_message_size: int,
    max_reconsume_times: int,
    group: Any = None,
    fifo_topic: bool = False,
) -> pb.Settings:
    """The server's answer to a client's Settings: the client's own, completed with the server's
    values. INVALID_REQUEST for a Settings that names no known client type or lacks its part.
    A consumer's `group` (`broker.subscription.SubscriptionGroupConfig`, the group's replicated
    settings) decides its fifo flag (`orderly_for(fifo_topic)`: whether it subscribes a FIFO
    topic), its attempts (retryMaxTimes + 1) and its backoff (retryPolicy)."""
    if client.client_type == pb.PRODUCER:
        if not client.HasField("publishing"):
            raise invalid("settings.publishing", "a producer's settings carry `publishing`")
    elif client.client_type in _CONSUMERS:
        if not client.HasField("subscription") or not client.subscription.group.name:
            raise invalid("settings.subscription.group", "a consumer's settings name its group")
    else:
        raise invalid("settings.clientType", f"unsupported client type {client.client_type}")
    out = pb.Settings()
    out.CopyFrom(client)
    out.metric.CopyFrom(pb.Metric(on=False))
    if client.client_type == pb.PRODUCER:
        out.backoff_policy.CopyFrom(
            _backoff(PRODUCER_MAX_ATTEMPTS, PRODUCER_BACKOFF_INITIAL_MS, PRODUCER_BACKOFF_MAX_MS)
        )
        out.publishing.max_body_size = max_message_size
        out.publishing.validate_message_type = True
    else:
        sub = out.subscription
        sub.receive_batch_size = RECEIVE_BATCH_SIZE
        if not sub.HasField("long_polling_timeout") or (
            sub.long_polling_timeout.seconds <= 0 and sub.long_polling_timeout.nanos <= 0
        ):
            sub.long_polling_timeout.CopyFrom(duration(DEFAULT_LONG_POLLING_MS))
        if group is None:
            sub.fifo = False
            out.backoff_policy.CopyFrom(_consumer_backoff(max_reconsume_times + 1, None))
        else:
            sub.fifo = group.orderly_for(fifo_topic)
            attempts = group.effective_retry_max_times(max_reconsume_times) + 1
            out.backoff_policy.CopyFrom(_consumer_backoff(attempts, group.retry_policy))
    return out


def identity(settings: pb.Settings, meta: dict[str, str]) -> tuple[list[tuple[str, str]], str, str, str]:
    """What an accepted Settings says about its client, for the client registry: its (group,
    topic) pairs — a producer's group is its topic, as RocketMQ's proxy names gRPC producers —,
    its type, language and version."""
    if settings.HasField("subscription"):
        group = settings.subscription.group.name
        pairs = [(group, s.topic.name) for s in settings.subscription.subscriptions] or [(group, "")]
    else:
        pairs = [(t.name, t.name) for t in settings.publishing.topics]
    ua = settings.user_agent
    language = pb.Language.Name(ua.language) if ua.language in pb.Language.values() and ua.language else ""
    return (
        pairs,
        pb.ClientType.Name(settings.client_type),
        language or meta.get("x-mq-language", ""),
        ua.version or meta.get("x-mq-client-version", ""),
    )
