"""A 3-member DLedger broker set (conf/dledger/broker-n*.conf) behind the HTTP API: slaves redirect
writes, routes follow the master, and a Producer keeps producing through a master kill with no
acknowledged message lost."""

from __future__ import annotations

import io
import signal
import threading
import time

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import Producer
from client.errors import LedgerMQError
from client.mqadmin import main as mqadmin
from tests.integration._ledgermq_procs import (
    ProcessGroup,
    start_dledger_set,
    start_namesrv,
    wait_http,
    wait_master,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def dset(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        ns = start_namesrv(group, tmp_path)
        addrs = start_dledger_set(group, tmp_path, ns, defaultTopicQueueNums="2")
        yield {"group": group, "ns": ns, "addrs": addrs}
    finally:
        group.stop_all()


def route_master(ns: str, topic: str) -> str | None:
    r = httpx.get(f"http://{ns}/routes/{topic}")
    return r.json()["brokers"][0].get("masterAddr") if r.status_code == 200 else None


def read_all(addr: str, topic: str, queues: int) -> list[dict]:
    out = []
    for q in range(queues):
        offset = 0
        while True:
            doc = httpx.get(
                f"http://{addr}/topics/{topic}/queues/{q}/messages",
                params={"offset": offset, "maxMessages": 256},
            ).json()
            out += doc["messages"]
            if doc["nextOffset"] >= doc["maxOffset"]:
                break
            offset = doc["nextOffset"]
    return out


def test_slaves_redirect_and_serve_committed_reads(dset):
    addrs = dset["addrs"]
    master = wait_master(addrs)
    murl = f"http://{addrs[master]}"
    assert (
        httpx.put(f"{murl}/topics/orders", json={"readQueueNums": 2, "writeQueueNums": 2}).status_code == 200
    )
    r = httpx.post(f"{murl}/topics/orders/messages", json={"messages": [{"body": "one", "queueId": 1}]})
    assert r.status_code == 200, r.text
    for sid, addr in addrs.items():
        if sid == master:
            continue
        w = httpx.post(f"http://{addr}/topics/orders/messages", json={"messages": [{"body": "x"}]})
        assert w.status_code == 421 and w.json()["code"] == "NOT_MASTER"
        assert w.json()["masterAddr"] == addrs[master]
        assert httpx.put(f"http://{addr}/topics/other", json={}).status_code == 421
        doc = wait_http(
            f"http://{addr}/topics/orders/queues/1/messages?offset=0",
            ok=lambda r: r.status_code == 200 and r.json()["messages"],
        ).json()
        assert [m["body"] for m in doc["messages"]] == ["one"]
        st = httpx.get(f"http://{addr}/status").json()
        assert st["role"] == "SLAVE" and st["dledger"]["leaderId"] == master and st["brokerId"] != 0
    st = httpx.get(f"{murl}/status").json()
    assert st["brokerId"] == 0 and set(st["dledger"]["peerWaterMarks"]) == {"n0", "n1", "n2"}
    assert set(st["dledger"]["followerLag"]) == set(addrs) - {master}
    assert all(lag >= 0 for lag in st["dledger"]["followerLag"].values())
    metrics = {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(httpx.get(f"{murl}/metrics").text)
        for s in fam.samples
    }
    member = {("group", "broker-a"), ("self_id", master)}
    assert metrics[("dledger_role", frozenset(member | {("role", "LEADER")}))] == 1
    assert metrics[("dledger_role", frozenset(member | {("role", "FOLLOWER")}))] == 0
    assert metrics[("dledger_current_term", frozenset(member))] == st["dledger"]["term"] >= 1
    committed = metrics[("dledger_committed_index", frozenset(member))]
    assert committed >= 1  # at least the topic config and the message
    # The leader's view of every member's watermark, itself included: a quorum holds the commit index.
    marks = sorted(
        (metrics[("dledger_peer_water_mark", frozenset(member | {("remote_id", sid)}))] for sid in addrs),
        reverse=True,
    )
    assert marks[1] >= committed
    route = wait_http(f"http://{dset['ns']}/routes/orders").json()["brokers"][0]
    assert route["masterAddr"] == addrs[master] and set(route["addrs"].values()) == set(addrs.values())
    # mqadmin leadershipTransfer: the chosen member becomes master and the route follows.
    target = next(sid for sid in sorted(addrs) if sid != master)
    out = io.StringIO()
    assert (
        mqadmin(["leadershipTransfer", "-n", dset["ns"], "-B", "broker-a", "-i", target, "--json"], out=out)
        == 0
    )
    assert wait_master(addrs, exclude={master}) == target
    deadline = time.monotonic() + 10
    while route_master(dset["ns"], "orders") != addrs[target] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert route_master(dset["ns"], "orders") == addrs[target]
    bad = httpx.post(f"http://{addrs[target]}/admin/leadership-transfer", json={"transfereeId": "n9"})
    assert bad.status_code == 400 and bad.json()["field"] == "transfereeId"


def test_producer_survives_master_failover_without_losing_acked_messages(dset):
    addrs, ns, group = dset["addrs"], dset["ns"], dset["group"]
    old = wait_master(addrs)
    assert (
        httpx.put(
            f"http://{addrs[old]}/topics/fo", json={"readQueueNums": 2, "writeQueueNums": 2}
        ).status_code
        == 200
    )
    wait_http(f"http://{ns}/routes/fo")
    acked: dict[str, tuple[int, int]] = {}
    failed: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        with Producer(ns, send_timeout_s=20) as p:
            i = 0
            while not stop.is_set():
                body = f"m{i}"
                try:
                    r = p.send("fo", body.encode())
                    acked[body] = (r.queue_id, r.queue_offset)
                except LedgerMQError:
                    failed.append(body)
                i += 1

    th = threading.Thread(target=produce)
    th.start()
    try:
        deadline = time.monotonic() + 10
        while len(acked) < 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(acked) >= 50, f"only {len(acked)} acked before the kill"
        group.kill(old, signal.SIGKILL)
        killed_at = len(acked)
        new = wait_master(addrs, exclude={old}, timeout_s=15)
        # Routes follow: the name server names the new master (registered at once on role change).
        deadline = time.monotonic() + 10
        while route_master(ns, "fo") != addrs[new] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert route_master(ns, "fo") == addrs[new]
        cluster = httpx.get(f"http://{ns}/cluster").json()["brokers"]["broker-a"]
        assert cluster["masterAddr"] == addrs[new]
        deadline = time.monotonic() + 15
        while len(acked) < killed_at + 50 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        th.join(30)
    assert len(acked) >= killed_at + 50, "producing did not resume after failover"
    assert not failed, f"sends failed for good: {failed[:5]}"
    stored = read_all(addrs[new], "fo", 2)
    bodies = [m["body"] for m in stored]
    lost = set(acked) - set(bodies)
    assert not lost, f"{len(lost)} acknowledged messages lost: {sorted(lost)[:10]}"
    dups = len(bodies) - len(set(bodies))
    assert dups == 0, f"{dups} duplicates despite idempotency keys"
    where = {m["body"]: (m["queueId"], m["queueOffset"]) for m in stored}
    assert all(where[b] == pos for b, pos in acked.items()), "a message moved from its acknowledged offset"
    # Every surviving member holds the same messages at the same offsets.
    for sid in addrs:
        if sid not in (old, new):
            wait_http(
                f"http://{addrs[sid]}/topics/fo",
                ok=lambda r: sum(q["maxOffset"] for q in r.json()["queues"]) >= len(stored),
            )
            assert {(m["queueId"], m["queueOffset"], m["body"]) for m in read_all(addrs[sid], "fo", 2)} == {
                (m["queueId"], m["queueOffset"], m["body"]) for m in stored
            }


def test_receipt_state_survives_master_failover(dset):
    """Acks above the committed offset and reconsume counts are replicated: the new master
    delivers only what was still in flight, with the reconsume count carried on."""
    addrs, group = dset["addrs"], dset["group"]
    old = wait_master(addrs)
    url = f"http://{addrs[old]}"
    assert httpx.put(f"{url}/topics/pop", json={"readQueueNums": 1, "writeQueueNums": 1}).status_code == 200
    r = httpx.post(f"{url}/topics/pop/messages", json={"messages": [{"body": f"m{i}"} for i in range(5)]})
    assert r.status_code == 200, r.text
    got = httpx.post(
        f"{url}/consumers/cg/receive", json={"topic": "pop", "maxMessages": 10, "invisibleMs": 60000}
    ).json()["messages"]
    handle = {m["body"]: m["receiptHandle"] for m in got}
    assert sorted(handle) == [f"m{i}" for i in range(5)]

    def settle(action: str, *bodies: str) -> None:
        r = httpx.post(
            f"{url}/consumers/cg/{action}",
            json={"topic": "pop", "receiptHandles": [handle[b] for b in bodies]},
        )
        assert r.status_code == 200 and all(x["status"] == "OK" for x in r.json()["results"]), r.text

    settle("ack", "m2", "m3")  # above the mark: replicated as pop state
    settle("ack", "m0")  # moves the committed offset to 1
    settle("nack", "m4")
    again = httpx.post(f"{url}/consumers/cg/receive", json={"topic": "pop", "invisibleMs": 60000}).json()[
        "messages"
    ]
    assert [(m["body"], m["reconsumeTimes"]) for m in again] == [("m4", 1)]
    offs = httpx.get(f"{url}/consumers/cg/offsets", params={"topic": "pop"}).json()["offsets"]
    assert offs[0]["offset"] == 1

    group.kill(old, signal.SIGKILL)
    new = wait_master(addrs, exclude={old}, timeout_s=15)
    nurl = f"http://{addrs[new]}"
    after = httpx.post(
        f"{nurl}/consumers/cg/receive",
        json={"topic": "pop", "maxMessages": 10, "invisibleMs": 60000, "waitMs": 500},
        timeout=10,
    ).json()["messages"]
    assert sorted((m["body"], m["reconsumeTimes"]) for m in after) == [("m1", 0), ("m4", 2)]
    r = httpx.post(
        f"{nurl}/consumers/cg/ack",
        json={"topic": "pop", "receiptHandles": [m["receiptHandle"] for m in after]},
    )
    assert all(x["status"] == "OK" for x in r.json()["results"])
    offs = httpx.get(f"{nurl}/consumers/cg/offsets", params={"topic": "pop"}).json()["offsets"]
    assert (offs[0]["offset"], offs[0]["lag"]) == (5, 0)
    assert httpx.post(f"{nurl}/consumers/cg/receive", json={"topic": "pop"}).json()["messages"] == []


def _mqadmin_json(*args: str):
    out = io.StringIO()
    assert mqadmin([*args, "--json"], out=out) == 0
    return orjson.loads(out.getvalue())


def test_mqadmin_broker_status_shows_every_member_its_lag_and_a_dead_one(dset):
    ns, addrs, group = dset["ns"], dset["addrs"], dset["group"]
    master = wait_master(addrs, timeout_s=20)
    wait_http(f"http://{ns}/cluster",
              ok=lambda r: len(r.json()["brokers"].get("broker-a", {}).get("addrs", {})) == 3)
    rows = _mqadmin_json("brokerStatus", "-n", ns)
    assert sorted(r["addr"] for r in rows) == sorted(addrs.values())
    lead = next(r for r in rows if r["role"] == "MASTER")
    assert lead["selfId"] == master and lead["addr"] == addrs[master]
    assert set(lead["followerLag"]) == set(addrs) - {master}
    assert all(r["role"] == "SLAVE" and r["term"] == lead["term"] for r in rows if r is not lead)
    one = _mqadmin_json("brokerStatus", "-b", addrs[master])
    assert one["role"] == "MASTER" and one["brokerName"] == "broker-a"
    assert one["dledger.selfId"] == one["dledger.leaderId"] == master and one["uptimeMs"] > 0

    follower = next(sid for sid in addrs if sid != master)
    group.kill(follower, signal.SIGKILL)
    with Producer(ns) as p:
        for i in range(20):
            p.send("status-demo", f"m{i}")
    rows = _mqadmin_json("brokerStatus", "-n", ns)
    dead = next(r for r in rows if r["addr"] == addrs[follower])
    assert dead["role"] == "UNREACHABLE" and dead["error"], dead
    lead = next(r for r in rows if r["role"] == "MASTER")
    assert lead["followerLag"][follower] >= 20, lead
    out = io.StringIO()
    assert mqadmin(["brokerStatus", "-n", ns], out=out) == 0
    assert out.getvalue().splitlines()[0].split()[:4] == ["brokerName", "brokerId", "addr", "role"]
    assert f"{follower}:" in out.getvalue() and "UNREACHABLE" in out.getvalue()


def test_a_produce_is_readable_and_deduplicated_as_soon_as_it_is_answered(dset):
    """The master answers a produce before it dispatches the batch into its consume queue (the
    dispatch runs right after, before the next request is read): a pull, a search and a retry
    sent the moment the answer arrives still see the batch, and the retry stores nothing."""
    addrs = dset["addrs"]
    murl = f"http://{addrs[wait_master(addrs)]}"
    assert httpx.put(f"{murl}/topics/ryw", json={"readQueueNums": 2, "writeQueueNums": 2}).status_code == 200
    rounds, per = 120, 16
    with httpx.Client(base_url=murl) as c:  # one kept-alive connection, as a client's pool has
        for i in range(rounds):
            batch = [{"body": f"r{i}-{j}", "bodyEncoding": "utf-8", "idempotencyKey": f"ryw-{i}-{j}",
                      "queueId": 0} for j in range(per)]  # what the SDK sends
            batch[0]["keys"] = [f"order-{i}"]
            first = c.post("/topics/ryw/messages", json={"messages": batch})
            assert first.status_code == 200, first.text
            results = first.json()["results"]
            offset = results[0]["queueOffset"]
            pulled = c.get("/topics/ryw/queues/0/messages",
                           params={"offset": offset, "maxMessages": per, "waitMs": 0}).json()
            assert [m["msgId"] for m in pulled["messages"]] == [r["msgId"] for r in results], i
            found = c.get("/messages", params={"topic": "ryw", "key": f"order-{i}", "queueId": 0}).json()
            assert [m["msgId"] for m in found["messages"]] == [results[0]["msgId"]], i
            again = c.post("/topics/ryw/messages", json={"messages": batch})
            assert again.status_code == 200 and again.json()["results"] == results, i
        queues = {q["queueId"]: q["maxOffset"] for q in c.get("/topics/ryw").json()["queues"]}
    assert queues[0] == rounds * per  # no retry stored anything
