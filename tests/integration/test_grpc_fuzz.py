"""Hostile and out-of-range gRPC requests against a real broker's endpoint: every one gets a
status code (a rocketmq-apis `Code` other than 0, or a gRPC status for what the protocol itself
refuses), never a crash or a hang, and a refused request never changes stored data. Also the
signature check with ACL on."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.grpc.convert import duration, timestamp
from broker.grpc.protocol import Code, pb, spb, spb_grpc
from tests.integration._grpc_harness import SCRIPTS, run_client
from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_broker
from tests.ports import free_port

pytestmark = pytest.mark.timeout(180)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
TOPIC = "fz"
GROUP = "fzg"
META = (("x-mq-client-id", "fuzz@1@0@0"), ("x-mq-language", "PYTHON"))

names = st.one_of(
    st.sampled_from([TOPIC, "", " ", "a/b", "x" * 300, "%DLQ%x", "RMQ_SYS_TOPIC_CONFIG", "nope", "ä"]),
    st.text(max_size=20),
)
durations = st.builds(
    lambda seconds, nanos: Duration(seconds=seconds, nanos=nanos),
    st.integers(-(2**40), 2**40),
    st.integers(0, 999_999_999),
)


@contextlib.contextmanager
def broker(tmp: Path, **overrides: str) -> Iterator[tuple[str, str]]:
    group = ProcessGroup(tmp)
    port = free_port()
    try:
        http = start_broker(
            group,
            tmp,
            CONF / "broker-single.conf",
            "fz",
            None,
            grpcServerPort=str(port),
            autoCreateTopicEnable="false",
            **overrides,
        )
        yield http, f"127.0.0.1:{port}"
    finally:
        group.stop_all()


def stored(http: str) -> dict:
    """What the broker stores, as far as a refused request could change it."""
    topics = httpx.get(f"http://{http}/topics", timeout=10).json()["topics"]
    return {t: httpx.get(f"http://{http}/topics/{t}", timeout=10).json()["queues"] for t in sorted(topics)}


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory) -> Iterator[tuple[str, spb_grpc.MessagingServiceStub, grpc.Channel]]:
    tmp = tmp_path_factory.mktemp("grpc-fuzz")
    with broker(tmp, maxMessageSize="65536") as (http, addr):
        r = httpx.put(
            f"http://{http}/topics/{TOPIC}", json={"readQueueNums": 2, "writeQueueNums": 2}, timeout=10
        )
        assert r.status_code == 200, r.text
        for i in range(3):
            httpx.post(f"http://{http}/topics/{TOPIC}/messages", json={"body": f"seed{i}"}, timeout=10)
        with grpc.insecure_channel(addr) as channel:
            yield http, spb_grpc.MessagingServiceStub(channel), channel


def check(status: pb.Status) -> None:
    assert status.code != Code.CODE_UNSPECIFIED
    assert status.code != Code.INTERNAL_SERVER_ERROR, status.message


messages = st.builds(
    lambda topic, body, mid, tag, keys, props, enc, mtype, group: pb.Message(
        topic=pb.Resource(name=topic),
        user_properties=props,
        system_properties=pb.SystemProperties(
            message_id=mid,
            keys=keys,
            body_encoding=enc,
            message_type=mtype,
            born_timestamp=timestamp(0),
            **({"tag": tag} if tag is not None else {}),
            **({"message_group": group} if group is not None else {}),
        ),
        body=body,
    ),
    names,
    st.binary(max_size=70_000),
    st.one_of(st.just(""), st.just("0102FC000000016BC50B17DF6100000004"), st.text(max_size=200)),
    st.one_of(st.none(), st.text(max_size=300)),
    st.lists(st.text(max_size=300), max_size=3),
    st.dictionaries(st.text(max_size=30), st.text(max_size=30), max_size=3),
    st.integers(0, 5),
    st.integers(0, 7),
    st.one_of(st.none(), st.text(max_size=5)),
)


@FUZZ
@given(msgs=st.lists(messages, max_size=3))
def test_send_message_refusals_store_nothing(endpoint, msgs) -> None:
    http, stub, _ = endpoint
    before = stored(http)
    try:
        resp = stub.SendMessage(spb.SendMessageRequest(messages=msgs), metadata=META, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc  # message-model features only
        assert stored(http) == before
        return
    check(resp.status)
    if resp.status.code != Code.OK:
        assert stored(http) == before


@FUZZ
@given(
    group=names,
    topic=names,
    batch=st.integers(-(2**31), 2**31 - 1),
    invisible=durations,
    auto_renew=st.booleans(),
    expr=st.sampled_from(["", "*"]),
)
def test_receive_message_always_answers_a_status(
    endpoint, group, topic, batch, invisible, auto_renew, expr
) -> None:
    _, stub, _ = endpoint
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression=expr),
        batch_size=batch,
        invisible_duration=invisible,
        auto_renew=auto_renew,
        long_polling_timeout=duration(0),
    )
    replies = list(stub.ReceiveMessage(req, metadata=META, timeout=10))
    assert replies and replies[0].WhichOneof("content") == "status"
    check(replies[0].status)
    # Put back what was received, so the next example finds the seed messages again.
    handles = [
        r.message.system_properties.receipt_handle for r in replies if r.WhichOneof("content") == "message"
    ]
    for h in handles:
        stub.ChangeInvisibleDuration(
            spb.ChangeInvisibleDurationRequest(
                group=pb.Resource(name=group),
                topic=pb.Resource(name=topic),
                receipt_handle=h,
                invisible_duration=duration(0),
            ),
            metadata=META,
            timeout=10,
        )


@pytest.mark.parametrize(
    ("poll", "deadline_s"),
    [
        (Duration(seconds=20), 0.5),  # the deadline leaves no time for the poll
        (Duration(seconds=-1), 10.0),  # a negative poll
    ],
)
def test_a_long_poll_the_call_cannot_hold_is_illegal_polling_time(endpoint, poll, deadline_s) -> None:
    """As RocketMQ's proxy: ILLEGAL_POLLING_TIME, not a poll answered after the client gave up
    (the messages it took would stay invisible with nobody holding them)."""
    _, stub, _ = endpoint
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC)),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=1,
        invisible_duration=duration(30_000),
        long_polling_timeout=poll,
    )
    replies = list(stub.ReceiveMessage(req, metadata=META, timeout=deadline_s))
    assert [r.WhichOneof("content") for r in replies] == ["status"]
    assert replies[0].status.code == Code.ILLEGAL_POLLING_TIME, replies[0].status


@FUZZ
@given(handles=st.lists(st.text(max_size=200), max_size=4), topic=names, group=names, invisible=durations)
def test_settling_bad_handles_is_refused_and_changes_nothing(
    endpoint, handles, topic, group, invisible
) -> None:
    http, stub, _ = endpoint
    before = stored(http)
    entries = [pb_entry(h) for h in handles]
    ack = stub.AckMessage(
        spb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=entries),
        metadata=META,
        timeout=10,
    )
    check(ack.status)
    assert ack.status.code != Code.OK
    for h in handles[:1]:
        cid = stub.ChangeInvisibleDuration(
            spb.ChangeInvisibleDurationRequest(
                group=pb.Resource(name=group),
                topic=pb.Resource(name=topic),
                receipt_handle=h,
                invisible_duration=invisible,
            ),
            metadata=META,
            timeout=10,
        )
        check(cid.status)
        assert cid.status.code != Code.OK
    assert stored(http) == before


def pb_entry(handle: str) -> spb.AckMessageEntry:
    return spb.AckMessageEntry(message_id="x", receipt_handle=handle)


@FUZZ
@given(topic=names, client_type=st.integers(0, 9), with_id=st.booleans())
def test_route_heartbeat_telemetry_answer_statuses(endpoint, topic, client_type, with_id) -> None:
    _, stub, _ = endpoint
    meta = META if with_id else (("x-mq-language", "PYTHON"),)
    check(
        stub.QueryRoute(
            spb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=meta, timeout=10
        ).status
    )
    check(
        stub.QueryAssignment(
            spb.QueryAssignmentRequest(topic=pb.Resource(name=topic), group=pb.Resource(name=GROUP)),
            metadata=meta,
            timeout=10,
        ).status
    )
    check(stub.Heartbeat(spb.HeartbeatRequest(client_type=client_type), metadata=meta, timeout=10).status)
    settings_cmd = spb.TelemetryCommand(settings=pb.Settings(client_type=client_type))
    replies = list(stub.Telemetry(iter([settings_cmd]), metadata=meta, timeout=10))
    assert replies
    for r in replies:
        check(r.status)


@FUZZ
@given(
    raw=st.binary(max_size=512),
    method=st.sampled_from(["SendMessage", "AckMessage", "QueryRoute", "Heartbeat"]),
)
def test_undecodable_bytes_get_a_grpc_status(endpoint, raw, method) -> None:
    http, _, channel = endpoint
    before = stored(http)
    call = channel.unary_unary(f"/apache.rocketmq.v2.MessagingService/{method}")
    try:
        call(raw, metadata=META, timeout=10)
    except grpc.RpcError as exc:
        # What does not decode is refused by the protocol layer; never UNKNOWN (a crash).
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
    assert stored(http) == before
    assert httpx.get(f"http://{http}/health", timeout=5).status_code == 200


def test_signature_required_with_acl(tmp_path: Path) -> None:
    """ACL on: unsigned and wrongly signed calls are UNAUTHORIZED, a signed one without the
    right is FORBIDDEN and stores nothing, the right account's send is stored."""
    from types import SimpleNamespace

    from rocketmq.v5.util.signature import Signature

    acl = tmp_path / "acl.json"
    acl.write_text(
        json.dumps(
            {
                "accounts": [
                    {"name": "admin", "token": "admin-secret", "admin": True},
                    {
                        "name": "reader",
                        "token": "reader-secret",
                        "topicPerms": {"*": "SUB"},
                        "groupPerms": {"*": "SUB"},
                    },
                    {
                        "name": "app",
                        "token": "app-secret",
                        "topicPerms": {"acl-rt": "PUB|SUB"},
                        "groupPerms": {"g-rt": "SUB"},
                    },
                ]
            }
        )
    )

    def signed(ak: str, sk: str) -> list[tuple[str, str]]:
        cfg = SimpleNamespace(credentials=SimpleNamespace(ak=ak, sk=sk), namespace="")
        return Signature.metadata(cfg, "acl@1@0@0")

    with broker(tmp_path, aclEnable="true", aclConfigFile=str(acl)) as (http, addr):
        with grpc.insecure_channel(addr) as channel:
            stub = spb_grpc.MessagingServiceStub(channel)
            msg = pb.Message(
                topic=pb.Resource(name="acl-t"),
                system_properties=pb.SystemProperties(message_id="0102FC000000016BC50B17DF6100000009"),
                body=b"x",
            )
            req = spb.SendMessageRequest(messages=[msg])
            admin = {"authorization": "Bearer admin-secret"}
            assert (
                httpx.put(f"http://{http}/topics/acl-t", json={}, headers=admin, timeout=10).status_code
                == 200
            )
            for meta, code in (
                (META, Code.UNAUTHORIZED),
                (signed("admin", "wrong"), Code.UNAUTHORIZED),
                (signed("reader", "reader-secret"), Code.FORBIDDEN),
                (signed("admin", "admin-secret"), Code.OK),
            ):
                assert stub.SendMessage(req, metadata=meta, timeout=10).status.code == code
            queues = httpx.get(f"http://{http}/topics/acl-t", headers=admin, timeout=10).json()["queues"]
            assert sum(q["maxOffset"] for q in queues) == 1
        # The official client, as README says: the account's name and token as its access and secret key.
        created = httpx.put(f"http://{http}/topics/acl-rt", json={}, headers=admin, timeout=10)
        assert created.status_code == 200, created.text
        out = run_client([sys.executable, str(SCRIPTS / "py_roundtrip.py"), addr, "acl-rt", "g-rt", "10",
                          "ak=app", "sk=app-secret"], timeout_s=180)
        assert len(out["sent"]) == 10 and set(out["received"]) == set(out["sent"])


@pytest.mark.parametrize("client_type", [pb.LITE_PUSH_CONSUMER, pb.LITE_SIMPLE_CONSUMER])
def test_lite_consumers_are_told_lite_topics_are_not_served(endpoint, client_type) -> None:
    """The official lite consumers (Python 5.1.2) otherwise fail only with "Lite subscription
    exceed quota: 0": Heartbeat and Telemetry say why, SyncLiteSubscription too."""
    _, stub, _ = endpoint
    beat = stub.Heartbeat(
        spb.HeartbeatRequest(client_type=client_type, group=pb.Resource(name=GROUP)),
        metadata=META,
        timeout=10,
    )
    assert beat.status.code == Code.UNSUPPORTED and "lite topics are not supported" in beat.status.message
    settings_cmd = spb.TelemetryCommand(
        settings=pb.Settings(
            client_type=client_type,
            subscription=pb.Subscription(
                group=pb.Resource(name=GROUP),
                subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name=TOPIC))],
            ),
        )
    )
    replies = list(stub.Telemetry(iter([settings_cmd]), metadata=META, timeout=10))
    assert [r.status.code for r in replies] == [Code.UNSUPPORTED]
    assert not replies[0].HasField("settings")
    assert "PushConsumer or a SimpleConsumer" in replies[0].status.message
    with pytest.raises(grpc.RpcError) as err:
        stub.SyncLiteSubscription(
            spb.SyncLiteSubscriptionRequest(topic=pb.Resource(name=TOPIC), group=pb.Resource(name=GROUP)),
            metadata=META,
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED and "lite topics" in err.value.details()
