"""The broker routes the console reads, on a real broker with access control on: bulk topic and
group views filtered per token, message search by key and store time (bounded, bad input 400),
delivery state per group, dead-letter resend refusals, ACL accounts without tokens, disk use."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_broker

ADMIN = {"Authorization": "Bearer admin-tok"}
ORDERS = {"Authorization": "Bearer orders-tok"}
ACCOUNTS = {
    "accounts": [
        {"name": "ops", "token": "admin-tok", "admin": True},
        {
            "name": "orders-app",
            "token": "orders-tok",
            "topicPerms": {"orders": "PUB|SUB", "*": "DENY"},
            "groupPerms": {"billing": "SUB"},
        },
    ]
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("console-admin")
    acl = workdir / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    group = ProcessGroup(workdir)
    try:
        addr = start_broker(
            group, workdir, CONF / "broker-single.conf", "b", None, aclEnable="true", aclConfigFile=str(acl)
        )
        base = f"http://{addr}"
        for topic in ("orders", "payroll"):
            r = httpx.put(
                f"{base}/topics/{topic}", json={"readQueueNums": 2, "writeQueueNums": 2}, headers=ADMIN
            )
            assert r.status_code == 200, r.text
        yield base
    finally:
        group.stop_all()


def produce(base: str, topic: str, *msgs: dict) -> list[dict]:
    r = httpx.post(f"{base}/topics/{topic}/messages", json={"messages": list(msgs)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_bulk_views_list_only_what_the_token_may_read(broker: str) -> None:
    for group, topic in (("billing", "orders"), ("payroll-app", "payroll")):
        r = httpx.put(
            f"{broker}/consumers/{group}/offsets", json={"topic": topic, "offsets": {"0": 0}}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
    every = httpx.get(f"{broker}/admin/topics", headers=ADMIN).json()["topics"]
    assert {t["topic"] for t in every} >= {"orders", "payroll"}
    mine = httpx.get(f"{broker}/admin/topics", headers=ORDERS).json()["topics"]
    assert [t["topic"] for t in mine] == ["orders"]
    assert [q["queueId"] for q in mine[0]["queues"]] == [0, 1]
    groups = httpx.get(f"{broker}/admin/consumers", headers=ORDERS).json()["groups"]
    assert [g["group"] for g in groups] == ["billing"]
    assert groups[0]["topics"][0]["topic"] == "orders" and groups[0]["inflight"] == 0
    assert httpx.get(f"{broker}/admin/topics").status_code == 401


def test_search_by_key_and_by_time_is_bounded_and_checked(broker: str) -> None:
    t0 = int(time.time() * 1000)
    sent = produce(
        broker,
        "orders",
        {"body": "first", "keys": ["k-1"], "queueId": 0},
        {"body": "second", "keys": ["k-2", "shared"], "queueId": 0},
        {"body": "third", "keys": ["shared"], "queueId": 1},
    )
    found = httpx.get(
        f"{broker}/messages", params={"topic": "orders", "key": "shared"}, headers=ORDERS
    ).json()
    assert sorted(m["body"] for m in found["messages"]) == ["second", "third"] and not found["truncated"]
    by_id = httpx.get(
        f"{broker}/messages", params={"topic": "orders", "key": sent[0]["msgId"]}, headers=ORDERS
    )
    assert [m["body"] for m in by_id.json()["messages"]] == ["first"]
    queue1 = httpx.get(
        f"{broker}/messages", params={"topic": "orders", "queueId": 1, "begin": t0 - 1000}, headers=ORDERS
    ).json()
    assert [m["body"] for m in queue1["messages"]] == ["third"]
    past = httpx.get(
        f"{broker}/messages",
        params={"topic": "orders", "queueId": 0, "begin": 0, "end": t0 - 60_000},
        headers=ORDERS,
    ).json()
    assert past["messages"] == []
    limited = httpx.get(
        f"{broker}/messages", params={"topic": "orders", "maxMessages": 1}, headers=ORDERS
    ).json()
    assert len(limited["messages"]) == 1
    bad = httpx.get(f"{broker}/messages", params={"topic": "orders", "begin": 5, "end": 1}, headers=ORDERS)
    assert bad.status_code == 400 and bad.json()["field"] == "end"
    assert (
        httpx.get(
            f"{broker}/messages", params={"topic": "orders", "maxMessages": 0}, headers=ORDERS
        ).status_code
        == 400
    )
    assert (
        httpx.get(f"{broker}/messages", params={"topic": "payroll", "key": "x"}, headers=ORDERS).status_code
        == 403
    )
    missing = httpx.get(f"{broker}/messages", params={"topic": "nope", "key": "x"}, headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["code"] == "TOPIC_NOT_EXIST"


def test_delivery_state_follows_receive_and_ack(broker: str) -> None:
    (sent,) = produce(broker, "orders", {"body": "tracked", "queueId": 1})

    def state() -> dict:
        doc = httpx.get(f"{broker}/messages/{sent['msgId']}/deliveries", headers=ORDERS).json()
        return {g["group"]: g for g in doc["groups"]}

    assert state()["billing"]["state"] == "NOT_RECEIVED"
    got = []
    for _ in range(10):
        r = httpx.post(
            f"{broker}/consumers/billing/receive",
            json={"topic": "orders", "maxMessages": 32, "invisibleMs": 60_000},
            headers={**ORDERS, "X-Client-Id": "billing-worker-1"},
        )
        got += r.json()["messages"]
        if any(m["msgId"] == sent["msgId"] for m in got):
            break
    mine = next(m for m in got if m["msgId"] == sent["msgId"])
    billing = state()["billing"]
    assert billing["state"] == "IN_FLIGHT" and billing["invisibleUntil"] > time.time() * 1000
    assert [e["event"] for e in billing["events"]] == ["RECEIVED"]
    summary = httpx.get(f"{broker}/admin/consumers", headers=ORDERS).json()["groups"][0]
    assert summary["inflight"] == len(got)
    (client,) = summary["clients"]
    assert (client["clientId"], client["protocol"], client["topic"]) == ("billing-worker-1", "HTTP", "orders")
    r = httpx.post(
        f"{broker}/consumers/billing/ack",
        json={"topic": "orders", "receiptHandles": [m["receiptHandle"] for m in got]},
        headers=ORDERS,
    )
    assert r.status_code == 200
    billing = state()["billing"]
    assert billing["state"] == "ACKED" and [e["event"] for e in billing["events"]] == ["RECEIVED", "ACKED"]
    assert "payroll-app" not in state()  # a group the token may not read
    assert mine["body"] == "tracked"


def test_resend_refuses_what_is_not_a_dead_letter_of_the_group(broker: str) -> None:
    (sent,) = produce(broker, "orders", {"body": "alive"})
    r = httpx.post(f"{broker}/consumers/billing/dlq/resend", json={"msgIds": [sent["msgId"]]}, headers=ORDERS)
    assert r.status_code == 400 and r.json()["field"] == "msgIds[0]"
    r = httpx.post(f"{broker}/consumers/billing/dlq/resend", json={"msgIds": ["zz"]}, headers=ORDERS)
    assert r.status_code == 400
    r = httpx.post(
        f"{broker}/consumers/payroll-app/dlq/resend", json={"msgIds": [sent["msgId"]]}, headers=ORDERS
    )
    assert r.status_code == 403


def test_acl_accounts_are_listed_without_tokens(broker: str) -> None:
    admin = httpx.get(f"{broker}/admin/acl", headers=ADMIN).json()
    assert admin["enabled"] and [a["name"] for a in admin["accounts"]] == ["ops", "orders-app"]
    mine = httpx.get(f"{broker}/admin/acl", headers=ORDERS).json()["accounts"]
    assert mine == [
        {
            "name": "orders-app",
            "admin": False,
            "topicPerms": {"orders": "PUB|SUB", "*": "DENY"},
            "groupPerms": {"billing": "SUB"},
        }
    ]
    assert "tok" not in httpx.get(f"{broker}/admin/acl", headers=ADMIN).text


def test_status_reports_the_disk_use(broker: str) -> None:
    # Under ACL, /status and /metrics need the monitoring right (an admin has it).
    ratio = httpx.get(f"{broker}/status", headers=ADMIN).json()["diskUsedRatio"]
    assert 0 < ratio < 1
    metrics = httpx.get(f"{broker}/metrics", headers=ADMIN).text
    assert "ledgermq_disk_used_ratio{" in metrics
