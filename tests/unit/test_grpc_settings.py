"""The Telemetry settings reply: complete settings for every client type (the traps of the
official clients: producer max_body_size, an exponential backoff, consumer long polling)."""

from __future__ import annotations

import pytest

from broker.errors import BrokerError
from broker.grpc.convert import duration
from broker.grpc.protocol import pb
from broker.grpc.settings import PRODUCER_MAX_ATTEMPTS, identity, settings_reply
from broker.service.clients import ClientProtocol, ClientRegistry


def reply(settings: pb.Settings) -> pb.Settings:
    return settings_reply(settings, max_message_size=4 * 1024 * 1024, max_reconsume_times=16)


def test_producer_gets_max_body_size_and_exponential_backoff() -> None:
    out = reply(
        pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="t")]))
    )
    assert out.publishing.max_body_size == 4 * 1024 * 1024
    assert out.publishing.validate_message_type
    assert [t.name for t in out.publishing.topics] == ["t"]
    assert out.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert (
        out.backoff_policy.max_attempts == PRODUCER_MAX_ATTEMPTS == 8
        and out.backoff_policy.exponential_backoff.multiplier == 2
    )
    assert out.HasField("metric") and not out.metric.on


@pytest.mark.parametrize("client_type", [pb.SIMPLE_CONSUMER, pb.PUSH_CONSUMER])
def test_consumer_gets_polling_batch_fifo_and_backoff(client_type: int) -> None:
    sub = pb.Subscription(group=pb.Resource(name="g"))
    out = reply(pb.Settings(client_type=client_type, subscription=sub))
    assert out.subscription.long_polling_timeout.seconds == 20
    assert out.subscription.receive_batch_size == 32
    assert out.subscription.HasField("fifo") and not out.subscription.fifo
    assert out.backoff_policy.max_attempts == 17
    assert out.backoff_policy.WhichOneof("strategy") == "exponential_backoff"


def test_consumer_keeps_its_own_long_polling_timeout() -> None:
    sub = pb.Subscription(group=pb.Resource(name="g"), long_polling_timeout=duration(5_000))
    assert (
        reply(
            pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=sub)
        ).subscription.long_polling_timeout.seconds
        == 5
    )


@pytest.mark.parametrize(
    "settings",
    [
        pb.Settings(client_type=pb.PRODUCER),
        pb.Settings(client_type=pb.SIMPLE_CONSUMER),
        pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription()),
        pb.Settings(),
    ],
)
def test_incomplete_client_settings_are_refused(settings: pb.Settings) -> None:
    with pytest.raises(BrokerError):
        reply(settings)


def test_identity_of_consumers_and_producers() -> None:
    sub = pb.Subscription(
        group=pb.Resource(name="g"),
        subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=t)) for t in ("t1", "t2")],
    )
    ua = pb.UA(language=pb.PYTHON, version="5.1.2")
    assert identity(pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=sub, user_agent=ua), {}) == (
        [("g", "t1"), ("g", "t2")],
        "PUSH_CONSUMER",
        "PYTHON",
        "5.1.2",
    )
    producer = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="t")]))
    meta = {"x-mq-language": "HTTP", "x-mq-client-version": "1.0.8"}  # Node.js says HTTP in its header
    assert identity(producer, meta) == ([("t", "t")], "PRODUCER", "HTTP", "1.0.8")


def test_registry_forgets_a_terminated_grpc_client_only() -> None:
    reg = ClientRegistry(lambda: 1_000)
    reg.seen("g", "t", ClientProtocol.GRPC, "c1", "h:1", client_type="SIMPLE_CONSUMER", language="PYTHON")
    reg.seen("g", "t", ClientProtocol.HTTP, "c1", "h:1")
    reg.forget(ClientProtocol.GRPC, "c1")
    assert [(c.protocol, c.client_type) for c in reg.clients()] == [(ClientProtocol.HTTP, "")]
