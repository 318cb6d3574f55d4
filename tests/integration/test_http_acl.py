"""ACL (aclEnable=true): bearer tokens mapped to topics/groups and rights; 401 and 403 as set."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from client import Producer
from client.errors import ForbiddenError, UnauthorizedError
from client.transport import AsyncTransport, BrokerSetRoute, RouteCache
from pipeline.access import Access
from pipeline.routes import RouteResolver
from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_broker

ACCOUNTS = {
    "accounts": [
        {"name": "ops", "token": "admin-tok", "admin": True},
        {
            "name": "orders-app",
            "token": "pub-tok",
            "topicPerms": {"orders": "PUB|SUB", "*": "DENY"},
            "groupPerms": {"billing": "SUB"},
        },
        {"name": "reader", "token": "sub-tok", "topicPerms": {"*": "SUB"}, "groupPerms": {"*": "SUB"}},
        {"name": "prometheus", "token": "mon-tok", "monitor": True},
    ]
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("acl")
    acl = workdir / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    group = ProcessGroup(workdir)
    try:
        addr = start_broker(
            group,
            workdir,
            CONF / "broker-single.conf",
            "broker-acl",
            None,
            aclEnable="true",
            aclConfigFile=str(acl),
        )
        url = f"http://{addr}"
        r = httpx.put(f"{url}/topics/orders", json={}, headers={"authorization": "Bearer admin-tok"})
        assert r.status_code == 200, r.text
        yield {"url": url, "addr": addr, "group": group, "acl": acl}
    finally:
        group.stop_all()


def h(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_missing_or_unknown_token_is_401(broker):
    url = broker["url"]
    for headers in ({}, h("nope"), {"authorization": "Basic abc"}):
        r = httpx.post(f"{url}/topics/orders/messages", json={"messages": [{"body": "x"}]}, headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
        assert r.headers["content-type"] == "application/problem+json"
    # Authentication comes before validation: a bad body still answers 401 to a stranger.
    assert httpx.post(f"{url}/topics/orders/messages", content=b"{{{").status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200  # liveness stays open


def test_changing_the_config_at_runtime_needs_an_admin(broker):
    url = broker["url"]
    body = {"brokerPermission": 6}
    assert httpx.patch(f"{url}/admin/config", json=body).status_code == 401
    for token in ("pub-tok", "mon-tok"):  # the monitoring right reads the config, no more
        r = httpx.patch(f"{url}/admin/config", json=body, headers=h(token))
        assert r.status_code == 403 and "not an admin" in r.json()["detail"], r.text
    r = httpx.patch(f"{url}/admin/config", json=body, headers=h("admin-tok"))
    assert r.status_code == 200, r.text
    assert r.json()["updated"] == {"brokerPermission": {"old": "6", "new": "6"}}


def test_rights_per_topic_group_and_admin(broker):
    url = broker["url"]
    r = httpx.post(
        f"{url}/topics/orders/messages",
        json={"messages": [{"body": "o1", "queueId": 0}]},
        headers=h("pub-tok"),
    )
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/topics/other/messages", json={"messages": [{"body": "x"}]}, headers=h("pub-tok"))
    assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
    r = httpx.post(f"{url}/topics/orders/messages", json={"messages": [{"body": "x"}]}, headers=h("sub-tok"))
    assert r.status_code == 403
    r = httpx.get(f"{url}/topics/orders/queues/0/messages", headers=h("sub-tok"))
    assert r.status_code == 200 and [m["body"] for m in r.json()["messages"]] == ["o1"]
    r = httpx.post(f"{url}/consumers/billing/receive", json={"topic": "orders"}, headers=h("pub-tok"))
    assert r.status_code == 200
    r = httpx.post(f"{url}/consumers/other-group/receive", json={"topic": "orders"}, headers=h("pub-tok"))
    assert r.status_code == 403
    r = httpx.put(f"{url}/topics/new", json={}, headers=h("pub-tok"))
    assert r.status_code == 403
    assert httpx.put(f"{url}/topics/new", json={}, headers=h("admin-tok")).status_code == 200


def test_sdk_passes_the_token_and_maps_errors(broker):
    # Twice each: a topic's first send fetches its route on the I/O thread, the next goes out on
    # the calling thread (`Producer.send`'s direct path): both carry the token, both map errors.
    with Producer(broker_addr=broker["addr"], token="pub-tok") as p:
        first, second = p.send("orders", b"via-sdk"), p.send("orders", b"via-sdk again")
        assert second.commit_log_offset > first.commit_log_offset >= 0
        for _ in range(2):
            with pytest.raises(ForbiddenError):
                p.send("other", b"x")
    with Producer(broker_addr=broker["addr"], token="bad") as p:
        for _ in range(2):
            with pytest.raises(UnauthorizedError):
                p.send("orders", b"x")


def test_metrics_and_status_need_the_monitoring_right(broker):
    url = broker["url"]
    for path in ("/metrics", "/status", "/admin/config"):
        assert httpx.get(f"{url}{path}").status_code == 401
        assert httpx.get(f"{url}{path}", headers=h("nope")).status_code == 401
        r = httpx.get(f"{url}{path}", headers=h("pub-tok"))  # a producer's token: no monitoring right
        assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN", r.text
        assert "monitoring right" in r.json()["detail"]
        for token in ("mon-tok", "admin-tok"):
            assert httpx.get(f"{url}{path}", headers=h(token)).status_code == 200, (path, token)
    r = httpx.get(f"{url}/metrics", headers=h("mon-tok"))
    assert "ledgermq_put_messages_total" in r.text
    assert httpx.get(f"{url}/status", headers=h("mon-tok")).json()["brokerName"] == "broker-s"
    props = httpx.get(f"{url}/admin/config", headers=h("mon-tok")).json()["properties"]
    assert props["aclEnable"] == "true" and props["brokerName"] == "broker-s"
    # The monitoring right is read-only: nothing else comes with it.
    r = httpx.post(f"{url}/topics/orders/messages", json={"messages": [{"body": "x"}]}, headers=h("mon-tok"))
    assert r.status_code == 403
    assert httpx.get(f"{url}/topics/orders/queues/0/messages", headers=h("mon-tok")).status_code == 403
    assert httpx.get(f"{url}/health").status_code == 200  # liveness stays open


def _until(check, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_acl_file_is_read_again_when_it_changes(broker):
    """An operator adds an application, revokes a token, saves a broken file and fixes it, with
    the broker running: each applies to the next requests (a broken file keeps what was in force)."""
    url, acl = broker["url"], broker["acl"]

    def produce(token: str) -> int:
        body = {"messages": [{"body": "reload"}]}
        return httpx.post(f"{url}/topics/orders/messages", json=body, headers=h(token)).status_code

    assert produce("late-tok") == 401
    late = {"name": "late-app", "token": "late-tok", "topicPerms": {"orders": "PUB"}}
    try:
        acl.write_text(json.dumps({"accounts": [*ACCOUNTS["accounts"], late]}))
        _until(lambda: produce("late-tok") == 200, "a new account works without a restart")
        without_orders_app = [a for a in ACCOUNTS["accounts"] if a["name"] != "orders-app"]
        acl.write_text(json.dumps({"accounts": [*without_orders_app, late]}))
        _until(lambda: produce("pub-tok") == 401, "a revoked token is refused without a restart")

        acl.write_text('{"accounts": [{"name": "half-saved')
        _until(lambda: "event=acl_reload_failed" in broker["group"].log_text("broker-acl"),
               "a broken file is reported")
        assert produce("late-tok") == 200 and produce("admin-tok") == 200  # kept in force
        assert produce("pub-tok") == 401
    finally:
        acl.write_text(json.dumps(ACCOUNTS))
    _until(lambda: produce("pub-tok") == 200 and produce("late-tok") == 401, "the original file in force")


def test_a_sets_master_is_found_from_its_members_with_an_applications_token(broker):
    """Without a name server the SDK asks a set's members who their master is, and the Spark
    source given `brokerAddr` asks each broker its name: both over `/health`, open under ACL, since
    `/status` needs the monitoring right an application's token lacks (they used to get 403 there)."""
    addr = broker["addr"]
    health = httpx.get(f"{broker['url']}/health").json()  # no token
    assert health == {"status": "UP", "role": "MASTER", "brokerName": "broker-s", "brokerId": 0,
                      "masterAddr": addr, "term": 0}

    async def master_by_members() -> str | None:
        transport = AsyncTransport(token="pub-tok")
        try:
            # A cached route naming a master that is gone: the members say which one it is now.
            stale = BrokerSetRoute("broker-s", {0: addr}, 4, 4, 6, master_addr="127.0.0.1:1")
            return (await RouteCache(transport, [], [])._master_by_members(stale)).master_addr
        finally:
            await transport.aclose()

    assert asyncio.run(master_by_members()) == addr
    resolver = RouteResolver([], [addr], access=Access(token="pub-tok"))
    try:
        [only] = resolver.broker_sets("orders")
        assert only.broker_name == "broker-s" and only.urls() == [f"http://{addr}"]
    finally:
        resolver.close()
