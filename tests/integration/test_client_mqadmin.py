"""mqadmin commands against a real name server and broker; the Producer's route fallback for a
topic nobody registered yet."""

from __future__ import annotations

import io
import time

import httpx
import orjson
import pytest

from client import Message, Producer, PullConsumer
from client.errors import TopicNotExistError
from client.mqadmin import main as mqadmin
from tests.integration._ledgermq_procs import namesrv_and_broker, wait_http


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with namesrv_and_broker(tmp_path_factory.mktemp("mqadmin"), "broker-s") as (_, ns, broker):
        # /health answers before the broker's first registration reaches the name server.
        wait_http(f"http://{ns}/cluster", ok=lambda r: "broker-s" in r.json()["brokers"])
        yield {"ns": ns, "broker": broker}


def admin(env, *args: str, as_json: bool = True):
    out = io.StringIO()
    rc = mqadmin([args[0], "-n", env["ns"], *(["--json"] if as_json else []), *args[1:]], out=out)
    assert rc == 0
    return orjson.loads(out.getvalue()) if as_json else out.getvalue()


def test_mqadmin_topic_lifecycle_and_messages(env):
    created = admin(env, "updateTopic", "-t", "ops", "-r", "2", "-w", "2")
    assert created == [
        {"brokerName": "broker-s", "topic": "ops", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    ]
    deadline = time.monotonic() + 5
    while "ops" not in [t["topic"] for t in admin(env, "topicList")] and time.monotonic() < deadline:
        time.sleep(0.05)
    route = admin(env, "topicRoute", "-t", "ops")
    assert route["brokers"][0]["addrs"] == {"0": env["broker"]}
    sent = [
        admin(env, "sendMessage", "-t", "ops", "-p", f"hello{i}", "-g", "T", "-k", "a,b")[0] for i in range(4)
    ]
    status = admin(env, "topicStatus", "-t", "ops")
    assert sum(r["maxOffset"] for r in status) == 4
    got = admin(env, "consumeMessage", "-t", "ops")
    assert sorted(m["body"] for m in got) == [f"hello{i}" for i in range(4)]
    msg = admin(env, "queryMsgById", "-i", sent[2]["msgId"])
    assert msg["body"] == "hello2" and msg["keys"] == ["a", "b"]
    # resetOffsetByTime to now: every queue's committed offset moves to its end (lag 0).
    admin(env, "resetOffsetByTime", "-g", "ops-g", "-t", "ops", "-s", "now")
    progress = admin(env, "consumerProgress", "-g", "ops-g", "-t", "ops")
    assert {r["lag"] for r in progress} == {0} and sum(r["offset"] for r in progress) == 4
    admin(env, "resetOffsetByTime", "-g", "ops-g", "-t", "ops", "-s", "0")
    progress = admin(env, "consumerProgress", "-g", "ops-g", "-t", "ops")
    assert sum(r["offset"] for r in progress) == 0
    # Without -g: every group, each row naming it (RocketMQ's consumerProgress does the same).
    every = admin(env, "consumerProgress", "-t", "ops")
    assert {r["group"] for r in every} >= {"ops-g"}
    assert [r for r in every if r["group"] == "ops-g"] == [{"group": "ops-g", **r} for r in progress]
    assert "group" in admin(env, "consumerProgress", as_json=False).splitlines()[0]
    rows = admin(env, "clusterList")
    assert rows[0]["brokerName"] == "broker-s" and rows[0]["role"] == "MASTER"
    table = admin(env, "topicStatus", "-t", "ops", as_json=False)
    assert table.splitlines()[0].split() == ["brokerName", "queueId", "minOffset", "maxOffset"]
    assert admin(env, "deleteTopic", "-t", "ops") == [{"brokerName": "broker-s", "deleted": "ops"}]


def test_mqadmin_reports_errors_with_status_1(env, capsys):
    assert mqadmin(["queryMsgById", "-n", env["ns"], "-i", "00" * 16]) == 1
    assert "MESSAGE_NOT_FOUND" in capsys.readouterr().err


def test_producer_sends_to_a_topic_nobody_registered_yet(env):
    with Producer(env["ns"]) as p:
        r = p.send("fresh-topic", b"first")
    assert r.broker_name == "broker-s" and r.queue_offset == 0
    with PullConsumer(env["ns"]) as c:
        deadline = time.monotonic() + 5
        while True:
            try:
                queues = c.queues("fresh-topic")
                break
            except TopicNotExistError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        res = c.pull("fresh-topic", r.queue_id, 0)
    assert [m.body for m in res.messages] == [b"first"]
    assert len(queues) == 4


async def test_async_clients_concurrent_sends_long_poll_and_typed_errors(env):
    import asyncio

    from client import AsyncProducer, AsyncPullConsumer, AsyncSimpleConsumer, Message
    from client.errors import BadRequestError, OffsetOutOfRangeError

    async with AsyncProducer(env["ns"]) as p:
        await create_topic_async(env["ns"], "async-t")
        results = await asyncio.gather(*(p.send("async-t", f"a{i}", queue_id=0) for i in range(20)))
        assert sorted(r.queue_offset for r in results) == list(range(20))
        batch = await p.send_batch(
            "async-t", [Message(body=b"b1", queue_id=1), Message(body=b"b2", queue_id=1)]
        )
        assert [r.queue_offset for r in batch] == [0, 1]
        with pytest.raises(BadRequestError) as err:
            await p.send("async-t", Message(body="x", properties={"TAGS": "reserved"}))
        assert err.value.field == "messages[0].properties.TAGS"
        c = AsyncPullConsumer(env["ns"])
        try:
            with pytest.raises(OffsetOutOfRangeError) as oor:
                await c.pull("async-t", 0, 999)
            assert (oor.value.min_offset, oor.value.max_offset) == (0, 20)
            waiter = asyncio.ensure_future(c.pull("async-t", 1, 2, wait_ms=5000))
            await asyncio.sleep(0.3)
            assert not waiter.done()
            await p.send("async-t", Message(body="late", queue_id=1))
            res = await asyncio.wait_for(waiter, 3)
            assert [m.body for m in res.messages] == [b"late"]
        finally:
            await c.close()
    sc = AsyncSimpleConsumer("async-g", "async-t", env["ns"], invisible_ms=5000)
    try:
        got = []
        while len(got) < 23:
            batch_msgs = await sc.receive(max_messages=32)
            assert batch_msgs, f"only {len(got)} received"
            got += batch_msgs
        await sc.ack(*got)
        assert await sc.receive() == []
    finally:
        await sc.close()


async def create_topic_async(ns: str, topic: str) -> None:
    from client import AsyncAdmin

    admin = AsyncAdmin(ns)
    try:
        await admin.update_topic(topic, 2, 2)
    finally:
        await admin.close()


def test_mqadmin_finds_messages_by_key_and_by_the_id_a_client_printed(env):
    client_id = "0102FC00A1B2C3D4E5F60718293A4B5C6D"  # a RocketMQ 5 client's id: 34 hex digits
    with Producer(env["ns"]) as p:
        p.send("lookup", Message(body=b"by-key-1", keys=["order-7"]))
        p.send("lookup", Message(body=b"other", keys=["order-8"]))
        p.send("lookup", Message(body=b"by-key-2", keys=["order-7", "x"]))
        stored = p.send("lookup", Message(body=b"by-client-id", idempotency_key=client_id))
    found = admin(env, "queryMsgByKey", "-t", "lookup", "-k", "order-7")
    assert sorted(m["body"] for m in found) == ["by-key-1", "by-key-2"]
    assert {m["brokerName"] for m in found} == {"broker-s"}
    assert admin(env, "queryMsgByKey", "-t", "lookup", "-k", "order-9") == []
    # The id the client printed is looked up directly (the broker knows it within its
    # idempotency window), by queryMsgByUniqueKey and by queryMsgById alike.
    for command in ("queryMsgByUniqueKey", "queryMsgById"):
        msg = admin(env, command, "-i", client_id)
        assert msg["body"] == "by-client-id" and msg["msgId"] == stored.msg_id
    # An id no broker knows: an error naming it, exit status 1.
    assert mqadmin(["queryMsgByUniqueKey", "-n", env["ns"], "-i", "0102FC" + "0" * 28]) == 1


def test_mqadmin_get_broker_config_and_broker_status(env):
    one = admin(env, "getBrokerConfig", "-b", env["broker"])
    props = {r["key"]: r["value"] for r in one}
    assert props["brokerName"] == "broker-s" and props["listenPort"] == env["broker"].rpartition(":")[2]
    assert props["flushDiskType"] in ("ASYNC_FLUSH", "SYNC_FLUSH") and "autoCreateTopicEnable" in props
    every = admin(env, "getBrokerConfig", "-k", "flush")
    assert every and {r["broker"] for r in every} == {env["broker"]}
    assert all("flush" in r["key"].lower() for r in every)
    status = admin(env, "brokerStatus", "-b", env["broker"])
    assert status["role"] == "MASTER" and status["brokerName"] == "broker-s" and status["uptimeMs"] > 0
    (row,) = admin(env, "brokerStatus")
    assert row["role"] == "MASTER" and row["addr"] == env["broker"] and row["selfId"] is None
    table = admin(env, "getBrokerConfig", "-b", env["broker"], "-k", "brokerName", as_json=False)
    assert table.splitlines()[0].split() == ["key", "value"] and "broker-s" in table


def test_mqadmin_query_msg_by_offset(env, capsys):
    admin(env, "updateTopic", "-t", "byoff", "-r", "1", "-w", "1")
    sent = [admin(env, "sendMessage", "-t", "byoff", "-p", f"m{i}", "-q", "0")[0] for i in range(3)]
    got = admin(env, "queryMsgByOffset", "-t", "byoff", "-i", "0", "-o", "1")
    assert got["body"] == "m1" and got["queueOffset"] == 1 and got["msgId"] == sent[1]["msgId"]
    assert got["brokerName"] == "broker-s"
    first = admin(env, "queryMsgByOffset", "-t", "byoff", "-B", "broker-s", "-i", "0", "-o", "0")
    assert first["body"] == "m0"
    capsys.readouterr()
    at = ["queryMsgByOffset", "-n", env["ns"], "-t", "byoff", "-i", "0"]
    assert mqadmin([*at, "-o", "3"]) == 1
    err = capsys.readouterr().err
    assert "MESSAGE_NOT_FOUND" in err and "holds 0..2" in err
    assert mqadmin([*at, "-o", "0", "-B", "nope"]) == 1
    assert "TOPIC_NOT_EXIST" in capsys.readouterr().err


def test_mqadmin_update_broker_config_on_one_member_and_its_refusals(env, capsys):
    admin(env, "updateTopic", "-t", "perms", "-r", "1", "-w", "1")
    (row,) = admin(env, "updateBrokerConfig", "-b", env["broker"], "-k", "brokerPermission", "-v", "4")
    assert row == {"brokerName": "broker-s", "addr": env["broker"], "key": "brokerPermission", "old": "6",
                   "new": "4"}
    try:
        deadline = time.monotonic() + 10
        while httpx.get(f"http://{env['ns']}/routes/perms").json()["brokers"][0]["perm"] != 4:
            assert time.monotonic() < deadline, "the route never showed the broker read-only"
            time.sleep(0.1)
        (cfg,) = admin(env, "getBrokerConfig", "-b", env["broker"], "-k", "brokerPermission")
        assert cfg == {"key": "brokerPermission", "value": "4"}
        drained = pytest.raises(TopicNotExistError, match="every set holding it is read-only")
        with Producer(env["ns"]) as p, drained:
            p.send("perms", "x")  # the only set is drained: said so, not "no such topic"
    finally:
        admin(env, "updateBrokerConfig", "-B", "broker-s", "-k", "brokerPermission", "-v", "6")
    capsys.readouterr()
    base = ["updateBrokerConfig", "-n", env["ns"]]
    for args, expected in [
        (["-k", "brokerPermission", "-v", "4"], "say which brokers to change"),
        (["-b", env["broker"], "-B", "broker-s", "-k", "brokerPermission", "-v", "4"], "give one of"),
        (["-B", "broker-s", "-k", "brokerPermision", "-v", "4"], "did you mean 'brokerPermission'"),
        (["-B", "broker-s", "-k", "listenPort", "-v", "1"], "listenPort: read at start only"),
        (["-c", "DefaultCluster", "-k", "brokerPermission", "-v", "3"], "brokerPermission: bad value"),
        (["-B", "nope", "-k", "brokerPermission", "-v", "4"], "no live broker set"),
    ]:
        assert mqadmin([*base, *args]) == 1, args
        err = capsys.readouterr().err
        assert expected in err, (args, err)
        assert err.count("\n") == 1, err  # one line, said once for every member
    (cfg,) = admin(env, "getBrokerConfig", "-b", env["broker"], "-k", "brokerPermission")
    assert cfg["value"] == "6"


def test_mqadmin_wipe_and_add_write_perm_of_a_broker_set(env, capsys):
    """RocketMQ operators' drain, by its own name: the set's members keep brokerPermission 4, the
    route shows the set read-only, addWritePerm gives the writes back."""
    admin(env, "updateTopic", "-t", "wipe", "-r", "1", "-w", "1")

    def route_perm() -> int:
        return httpx.get(f"http://{env['ns']}/routes/wipe").json()["brokers"][0]["perm"]

    try:
        rows = admin(env, "wipeWritePerm", "-B", "broker-s")
        assert [(r["key"], r["old"], r["new"]) for r in rows] == [("brokerPermission", "6", "4")], rows
        deadline = time.monotonic() + 10
        while route_perm() != 4:
            assert time.monotonic() < deadline, "the route never showed the set read-only"
            time.sleep(0.1)
    finally:
        rows = admin(env, "addWritePerm", "-B", "broker-s")
    assert [(r["old"], r["new"]) for r in rows] == [("4", "6")], rows
    deadline = time.monotonic() + 10
    while route_perm() != 6:
        assert time.monotonic() < deadline, "the route never showed the set writable again"
        time.sleep(0.1)
    with Producer(env["ns"]) as p:
        assert p.send("wipe", "x").broker_name == "broker-s"
    capsys.readouterr()
    assert mqadmin(["wipeWritePerm", "-n", env["ns"], "-B", "nope"]) == 1
    assert "no live broker set" in capsys.readouterr().err
    assert mqadmin(["wipeWritePerm", "-b", env["broker"], "-B", "broker-s"]) == 1
    assert "names a broker set with -B" in capsys.readouterr().err
