"""RouteInfoManager: registration, role changes of DLedger members, expiry, views."""

from __future__ import annotations

from pathlib import Path

import pytest

from namesrv.config import NamesrvConfig, read_properties
from namesrv.registry import RouteInfoManager, TopicRouteConfig

T = {"orders": TopicRouteConfig(4, 4, 6)}


def reg(m: RouteInfoManager, addr: str, bid: int, now: int, term: int = 1, name: str = "broker-a", topics=T):
    m.register(
        cluster="DefaultCluster",
        broker_name=name,
        broker_id=bid,
        broker_addr=addr,
        topics=topics,
        now_ms=now,
        term=term,
    )


def test_route_lists_set_members_by_broker_id():
    m = RouteInfoManager(broker_expired_ms=1000)
    reg(m, "h:1", 0, 0)
    reg(m, "h:2", 1, 0)
    reg(m, "h:3", 2, 0)
    r = m.route("orders", now_ms=10)
    assert r["brokers"][0]["addrs"] == {"0": "h:1", "1": "h:2", "2": "h:3"}
    assert r["brokers"][0]["masterAddr"] == "h:1"
    assert r["brokers"][0]["writeQueueNums"] == 4
    assert m.route("nope", now_ms=10) is None


def test_role_change_same_addr_replaces_old_id_and_higher_term_wins_master():
    m = RouteInfoManager(broker_expired_ms=1000)
    reg(m, "h:1", 0, 0, term=1)
    reg(m, "h:2", 1, 0, term=1)
    # h:2 became master in term 2 before h:1 re-registered as slave: the higher term is the master.
    reg(m, "h:2", 0, 5, term=2)
    assert m.route("orders", 6)["brokers"][0]["masterAddr"] == "h:2"
    reg(m, "h:1", 1, 7, term=2)
    assert m.route("orders", 8)["brokers"][0]["addrs"] == {"0": "h:2", "1": "h:1"}


def test_expiry_removes_silent_broker_from_routes_and_scan():
    m = RouteInfoManager(broker_expired_ms=100)
    reg(m, "h:1", 0, 0)
    reg(m, "h:9", 0, 0, name="broker-b")
    reg(m, "h:9", 0, 90, name="broker-b")
    assert {b["brokerName"] for b in m.route("orders", 150)["brokers"]} == {"broker-b"}
    assert m.scan_not_active(150) == ["h:1"]
    assert list(m.cluster(150)["brokers"]) == ["broker-b"]
    assert m.route("orders", 500) is None


def test_cluster_view_groups_sets_by_cluster():
    m = RouteInfoManager(broker_expired_ms=1000)
    reg(m, "h:1", 0, 0)
    m.register(cluster="Other", broker_name="broker-z", broker_id=0, broker_addr="h:5", topics={}, now_ms=0)
    view = m.cluster(1)
    assert view["clusters"] == {"DefaultCluster": ["broker-a"], "Other": ["broker-z"]}
    assert view["brokers"]["broker-a"]["addrs"] == {"0": "h:1"}


def test_config_refuses_typo_with_nearest_key(tmp_path: Path):
    p = tmp_path / "n.conf"
    p.write_text("listenPort=1234\nbrokerExpiredMS=5\n")
    with pytest.raises(ValueError, match="did you mean brokerExpiredMs"):
        NamesrvConfig.load(p)
    p.write_text("# c\nlistenPort = 1234\nrocketmqHome=/opt\nbrokerExpiredMs: 500\n")
    cfg = NamesrvConfig.load(p)
    assert (cfg.listen_port, cfg.broker_expired_ms) == (1234, 500)
    p.write_text("listenPort=abc\n")
    with pytest.raises(ValueError, match="listenPort"):
        NamesrvConfig.load(p)


def test_read_properties_continuation(tmp_path: Path):
    p = tmp_path / "x.properties"
    p.write_text("a=1\\\n  2\n! bang\nb : two words\n")
    assert read_properties(p) == {"a": "12", "b": "two words"}


def test_grpc_addresses_of_members_and_master_in_route_and_cluster():
    """Members that serve RocketMQ 5 gRPC register its address; routes name the master's (what a
    gRPC QueryRoute answers), and a member without one is left out of `grpcAddrs`."""
    m = RouteInfoManager(broker_expired_ms=1000)
    for bid, addr, grpc in ((0, "h:1", "h:8081"), (1, "h:2", "h:8082"), (2, "h:3", None)):
        m.register(
            cluster="DefaultCluster",
            broker_name="broker-a",
            broker_id=bid,
            broker_addr=addr,
            topics=T,
            now_ms=0,
            term=1,
            grpc_addr=grpc,
        )
    b = m.route("orders", now_ms=10)["brokers"][0]
    assert (b["grpcAddrs"], b["masterGrpcAddr"]) == ({"0": "h:8081", "1": "h:8082"}, "h:8081")
    c = m.cluster(now_ms=10)["brokers"]["broker-a"]
    assert c["masterGrpcAddr"] == "h:8081"
    assert [x["grpcAddr"] for x in c["members"]] == ["h:8081", "h:8082", None]
