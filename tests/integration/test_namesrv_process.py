"""Name servers as real processes started from conf/namesrv.conf."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration._ledgermq_procs import CONF, ProcessGroup, free_port, wait_http, write_conf


@pytest.fixture
def namesrvs(tmp_path):
    group = ProcessGroup(tmp_path)
    urls = []
    try:
        for i in range(2):
            port = free_port()
            conf = write_conf(
                CONF / "namesrv.conf",
                tmp_path / f"namesrv{i}.conf",
                {"listenPort": str(port), "brokerExpiredMs": "1500", "scanNotActiveBrokerInterval": "100"},
            )
            proc = group.start(f"namesrv{i}", "namesrv", "-c", str(conf))
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/health", proc=proc)
            urls.append(url)
        yield urls
    finally:
        group.stop_all()


def register(url: str, addr: str, bid: int, term: int = 1) -> None:
    r = httpx.post(
        url + "/brokers/register",
        json={
            "clusterName": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerId": bid,
            "brokerAddr": addr,
            "term": term,
            "topics": {"orders": {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6}},
        },
    )
    assert r.status_code == 200, r.text


def test_route_cluster_and_expiry(namesrvs):
    a, b = namesrvs
    register(a, "127.0.0.1:1001", 0)
    register(a, "127.0.0.1:1002", 1)
    route = httpx.get(a + "/routes/orders").json()
    assert route["brokers"][0]["addrs"] == {"0": "127.0.0.1:1001", "1": "127.0.0.1:1002"}
    # Name servers are independent: b never heard of the broker.
    r = httpx.get(b + "/routes/orders")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "TOPIC_NOT_EXIST"
    assert httpx.get(a + "/cluster").json()["clusters"] == {"DefaultCluster": ["broker-a"]}
    # Keep 1002 alive by heartbeats; 1001 goes silent and must expire (brokerExpiredMs=1500).
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        register(a, "127.0.0.1:1002", 1)
        addrs = httpx.get(a + "/routes/orders").json()["brokers"][0]["addrs"]
        if addrs == {"1": "127.0.0.1:1002"}:
            break
        time.sleep(0.1)
    assert addrs == {"1": "127.0.0.1:1002"}
    # Routes leave a silent broker out at once; the periodic scan (scanNotActiveBrokerInterval)
    # then drops it and counts it: wait for that scan.
    while True:
        register(a, "127.0.0.1:1002", 1)
        metrics = httpx.get(a + "/metrics").text
        if "ledgermq_namesrv_expired_brokers_total 1.0" in metrics or time.monotonic() > deadline + 5:
            break
        time.sleep(0.1)
    assert "ledgermq_namesrv_expired_brokers_total 1.0" in metrics
    assert "ledgermq_namesrv_live_brokers 1.0" in metrics


def test_bad_registration_is_problem_json_naming_field(namesrvs):
    a, _ = namesrvs
    r = httpx.post(
        a + "/brokers/register",
        json={"clusterName": "c", "brokerName": "x", "brokerId": -1, "brokerAddr": "h:1"},
    )
    assert r.status_code == 400
    assert r.json()["code"] == "INVALID_REQUEST" and r.json()["field"] == "brokerId"
    r = httpx.post(
        a + "/brokers/register", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400


def test_real_brokers_register_with_every_namesrv_and_a_dead_one_expires(namesrvs, tmp_path):
    """Two independent name servers; a broker heartbeating every 200 ms (registerNameServerPeriod)
    appears in both; after SIGKILL it leaves routes once brokerExpiredMs (1500 ms) has passed."""
    from tests.integration._ledgermq_procs import CONF, start_broker

    group = ProcessGroup(tmp_path)
    try:
        ns_list = ";".join(u.removeprefix("http://") for u in namesrvs)
        addr = start_broker(
            group,
            tmp_path,
            CONF / "broker-single.conf",
            "broker-x",
            ns_list,
            brokerName="broker-x",
            registerNameServerPeriod="200",
        )
        assert httpx.put(f"http://{addr}/topics/exp", json={}).status_code == 200
        for url in namesrvs:
            route = wait_http(f"{url}/routes/exp").json()
            assert route["brokers"][0]["addrs"] == {"0": addr}
        time.sleep(2.0)  # longer than brokerExpiredMs: heartbeats keep it alive
        assert httpx.get(f"{namesrvs[0]}/routes/exp").status_code == 200
        group.kill("broker-x")
        t0 = time.monotonic()
        for url in namesrvs:
            wait_http(f"{url}/routes/exp", ok=lambda r: r.status_code == 404, timeout_s=8)
        assert time.monotonic() - t0 < 5
        assert "broker-x" not in httpx.get(f"{namesrvs[1]}/cluster").json()["brokers"]
    finally:
        group.stop_all()
