"""The broker's services called directly, no socket: every rule answers the same BrokerError a
front-end renders (ACL, ranges, message content), and group consumption's explicit dead-letter.
A real local-mode broker (controller, store files in tmp_path)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.errors import BrokerCode, BrokerError
from broker.message import Message, message_ext_from
from broker.service import ANONYMOUS, AccessControl, BrokerServices
from broker.service.validation import check_message


async def _started(tmp_path, **overrides) -> AsyncIterator[BrokerServices]:
    cfg = BrokerConfig(store_path_root_dir=str(tmp_path / "store"), default_topic_queue_nums=2, **overrides)
    controller = BrokerController(cfg)
    svc = BrokerServices.create(controller)
    await controller.start()
    try:
        yield svc
    finally:
        await controller.shutdown()


@pytest.fixture
async def services(tmp_path) -> AsyncIterator[BrokerServices]:
    async for svc in _started(tmp_path):
        yield svc


@pytest.fixture
async def acl_services(tmp_path) -> AsyncIterator[BrokerServices]:
    acl_file = tmp_path / "acl.json"
    acl_file.write_bytes(
        orjson.dumps({"accounts": [{"name": "app", "token": "tok", "topicPerms": {"t": "PUB"}}]})
    )
    async for svc in _started(tmp_path, acl_enable=True, acl_config_file=str(acl_file)):
        yield svc


def _build(view: memoryview, head: tuple, topic_at: int, props_at: int):
    return message_ext_from(view, head, topic_at, props_at, head[6])


async def test_produce_then_pull_round_trip(services: BrokerServices) -> None:
    res = await services.produce.produce(ANONYMOUS, "t", [Message("t", b"a"), Message("t", b"b")], [1, 1])
    assert [(r.queue_id, r.queue_offset) for r in res] == [(1, 0), (1, 1)]
    got = await services.pull.pull(ANONYMOUS, "t", 1, 0, 10, 0, _build)
    assert [m.body for m in got.messages] == [b"a", b"b"] and got.next_offset == 2
    assert services.query.by_id(ANONYMOUS, res[1].msg_id).body == b"b"


async def test_a_bad_queue_id_stores_nothing_of_the_batch(services: BrokerServices) -> None:
    with pytest.raises(BrokerError) as err:
        await services.produce.produce(ANONYMOUS, "t", [Message("t", b"a"), Message("t", b"b")], [0, 7])
    assert err.value.code == BrokerCode.QUEUE_NOT_EXIST and err.value.extra["field"] == "messages[1].queueId"
    assert [q.max_offset for q in services.topics.info("t").queues] == [0, 0]


async def test_acl_is_enforced_by_the_services(acl_services: BrokerServices) -> None:
    services = acl_services
    acl = services.acl
    with pytest.raises(BrokerError) as err:
        acl.authenticate("Bearer nope")
    assert err.value.code == BrokerCode.UNAUTHORIZED
    app = acl.authenticate("Bearer tok")
    await services.produce.produce(app, "t", [Message("t", b"a")], [0])
    with pytest.raises(BrokerError) as err:
        services.produce.admit(app, "other")
    assert err.value.code == BrokerCode.FORBIDDEN
    with pytest.raises(BrokerError) as err:
        await services.pull.pull(app, "t", 0, 0, 1, 0, _build)
    assert err.value.code == BrokerCode.FORBIDDEN
    with pytest.raises(BrokerError) as err:
        await services.topics.delete(app, "t")
    assert err.value.code == BrokerCode.FORBIDDEN
    assert AccessControl.disabled().authenticate(None) is ANONYMOUS


async def test_receive_bounds_and_group_name(services: BrokerServices) -> None:
    pop = services.pop
    for args, field in (
        (("g", "t", 0, 30_000, 0), "maxMessages"),
        (("g", "t", 1, 99, 0), "invisibleMs"),
        (("g", "t", 1, 30_000, 3_600_001), "waitMs"),
        (("g" * 121, "t", 1, 30_000, 0), "group"),
        (("g.x", "t", 1, 30_000, 0), "group"),
    ):
        with pytest.raises(BrokerError) as err:
            await pop.receive(ANONYMOUS, *args)
        assert err.value.code == BrokerCode.INVALID_REQUEST and err.value.extra["field"] == field


async def test_dead_letter_forwards_and_settles(services: BrokerServices) -> None:
    await services.produce.produce(ANONYMOUS, "t", [Message("t", b"m0"), Message("t", b"m1")], [0, 0])
    pop = services.pop
    got = await pop.receive(ANONYMOUS, "g", "t", 10, 60_000, 0)
    assert [r.message.body for r in got] == [b"m0", b"m1"]
    await pop.dead_letter(ANONYMOUS, "g", "t", got[0].receipt_handle)
    dlq = services.state.store.get_messages("%DLQ%g", 0, 0, 10).messages
    assert [m.body for m in dlq] == [b"m0"] and dlq[0].user_properties["RETRY_TOPIC"] == "t"
    # Settled: its handle no longer acks, the other one still does, and the group's mark moves.
    acked = await pop.ack(ANONYMOUS, "g", "t", [got[0].receipt_handle, got[1].receipt_handle])
    assert [a.status for a in acked] == ["EXPIRED", "OK"]
    assert services.state.store.offsets.query("g", "t", 0) == 2
    with pytest.raises(BrokerError) as err:
        await pop.dead_letter(ANONYMOUS, "g", "t", got[1].receipt_handle)
    assert err.value.code == BrokerCode.MESSAGE_NOT_FOUND



@pytest.mark.parametrize(
    "bad",
    ["zzz", "1.2.3", "1.2.3.4.5", "e.1..3", "e.1.2.3\n", "e.1.2.\u0663", "e.-1.2.3", "e.1.2." + "9" * 130],
)
async def test_a_malformed_receipt_handle_refuses_the_whole_ack_and_settles_nothing(
    services: BrokerServices, bad: str
) -> None:
    await services.produce.produce(ANONYMOUS, "t", [Message("t", b"m0")], [0])
    pop = services.pop
    (got,) = await pop.receive(ANONYMOUS, "g", "t", 10, 60_000, 0)
    for settle in (pop.ack, pop.nack):
        with pytest.raises(BrokerError) as err:
            await settle(ANONYMOUS, "g", "t", [got.receipt_handle, bad])
        assert err.value.code == BrokerCode.INVALID_REQUEST
        assert err.value.extra["field"] == "receiptHandles[1]"
    assert services.state.store.offsets.query("g", "t", 0) == 0  # the mark stays before m0
    # A well-formed handle of another master is no error: it settles nothing (EXPIRED).
    other = "x" + got.receipt_handle
    acked = await pop.ack(ANONYMOUS, "g", "t", [other, got.receipt_handle])
    assert [a.status for a in acked] == ["EXPIRED", "OK"]

@pytest.mark.parametrize(
    "msg,field,code",
    [
        (Message("t", b"x" * 11), "m.body", BrokerCode.MESSAGE_TOO_LARGE),
        (Message("t", b"x", tags="a\x01b"), "m.tags", BrokerCode.INVALID_REQUEST),
        (Message("t", b"x", keys=["a b"]), "m.keys[0]", BrokerCode.INVALID_REQUEST),
        (Message("t", b"x", properties={"TAGS": "y"}), "m.properties.TAGS", BrokerCode.INVALID_REQUEST),
        (Message("t", b"x", idempotency_key="k" * 256), "m.idempotencyKey", BrokerCode.INVALID_REQUEST),
    ],
)
def test_check_message_names_the_field(msg: Message, field: str, code: BrokerCode) -> None:
    with pytest.raises(BrokerError) as err:
        check_message(msg, "m", max_message_size=10)
    assert err.value.code == code and err.value.extra["field"] == field
    assert orjson.dumps(err.value.problem())  # renders as a problem body


def test_check_message_accepts_a_full_message() -> None:
    check_message(
        Message("t", b"x", tags="a", keys=["k1"], properties={"p": "v"}, idempotency_key="i"), "m", 10
    )


async def test_a_message_is_found_by_its_clients_id_too(services: BrokerServices) -> None:
    """RocketMQ 5 clients know a message by their own id (34 hex digits, sent as UNIQ_KEY and used
    as the idempotency key): the query finds it through the idempotency table."""
    client_id = "01" + "AB" * 16
    msg = Message("t", b"by-client-id", properties={"UNIQ_KEY": client_id}, idempotency_key=client_id)
    (res,) = await services.produce.produce(ANONYMOUS, "t", [msg], [0])
    found = services.query.by_id(ANONYMOUS, client_id)
    assert found.body == b"by-client-id" and found.msg_id == res.msg_id
    with pytest.raises(BrokerError) as err:
        services.query.by_id(ANONYMOUS, "01" + "CD" * 16)
    assert err.value.code == BrokerCode.MESSAGE_NOT_FOUND
    with pytest.raises(BrokerError) as err:
        services.query.by_id(ANONYMOUS, "x" * 129)
    assert err.value.code == BrokerCode.INVALID_REQUEST and err.value.extra["field"] == "msgId"
