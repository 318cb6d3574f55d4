"""Broker HTTP API against real processes: a name server and a broker from conf/broker-single.conf."""

from __future__ import annotations

import base64
import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_broker, start_namesrv, wait_http


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("http-api")
    group = ProcessGroup(workdir)
    try:
        ns = start_namesrv(group, workdir)
        broker = start_broker(
            group,
            workdir,
            CONF / "broker-single.conf",
            "broker-s",
            ns,
            maxReconsumeTimes="1",
            maxMessageSize="65536",
            brokerSuspendMaxTimeMillis="5000",
        )
        yield {"namesrv": f"http://{ns}", "broker": f"http://{broker}", "addr": broker, "group": group}
    finally:
        group.stop_all()


def produce(url: str, topic: str, *bodies: str, **fields) -> list[dict]:
    r = httpx.post(
        f"{url}/topics/{topic}/messages", json={"messages": [{"body": b, **fields} for b in bodies]}
    )
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_produce_then_pull_round_trip_json_raw_and_base64(cluster):
    url = cluster["broker"]
    res = produce(
        url, "rt", "hello", "world", tags="TagA", keys=["k1", "k2"], properties={"p": "v"}, queueId=0
    )
    assert [r["queueOffset"] for r in res] == [0, 1] and all(r["queueId"] == 0 for r in res)
    raw = httpx.post(
        f"{url}/topics/rt/messages",
        params={"tags": "bin", "keys": "a,b", "queueId": 0},
        content=b"\xff\xfe\x00binary",
        headers={"content-type": "application/octet-stream"},
    )
    assert raw.status_code == 200, raw.text
    b64 = base64.b64encode(b"\x80\x81").decode()
    produce(url, "rt", b64, bodyEncoding="base64", queueId=0)

    doc = httpx.get(f"{url}/topics/rt/queues/0/messages", params={"offset": 0, "maxMessages": 10}).json()
    msgs = doc["messages"]
    assert [m["queueOffset"] for m in msgs] == [0, 1, 2, 3]
    assert doc["nextOffset"] == 4 and doc["minOffset"] == 0 and doc["maxOffset"] == 4
    first = msgs[0]
    assert (first["body"], first["bodyEncoding"], first["tags"], first["keys"]) == (
        "hello",
        "utf-8",
        "TagA",
        ["k1", "k2"],
    )
    assert first["properties"] == {"p": "v"} and first["msgId"] == res[0]["msgId"]
    assert first["storeTimestamp"] >= first["bornTimestamp"] > 0
    assert msgs[2]["bodyEncoding"] == "base64" and base64.b64decode(msgs[2]["body"]) == b"\xff\xfe\x00binary"
    assert msgs[2]["keys"] == ["a", "b"] and msgs[2]["tags"] == "bin"
    assert base64.b64decode(msgs[3]["body"]) == b"\x80\x81"
    forced = httpx.get(
        f"{url}/topics/rt/queues/0/messages", params={"offset": 0, "bodyEncoding": "base64"}
    ).json()
    assert forced["messages"][0]["bodyEncoding"] == "base64"
    assert base64.b64decode(forced["messages"][0]["body"]) == b"hello"
    by_id = httpx.get(f"{url}/messages/{res[1]['msgId']}")
    assert by_id.status_code == 200 and by_id.json()["body"] == "world"


def test_offset_out_of_range_names_the_range(cluster):
    url = cluster["broker"]
    produce(url, "oor", "a", "b", queueId=1)
    r = httpx.get(f"{url}/topics/oor/queues/1/messages", params={"offset": 7})
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == "OFFSET_OUT_OF_RANGE" and (body["minOffset"], body["maxOffset"]) == (0, 2)
    assert "[0, 2]" in body["detail"]
    assert httpx.get(f"{url}/topics/oor/queues/99/messages").json()["code"] == "QUEUE_NOT_EXIST"
    assert httpx.get(f"{url}/topics/nope/queues/0/messages").json()["code"] == "TOPIC_NOT_EXIST"


def test_long_poll_wakes_within_50ms_of_produce_and_times_out_empty(cluster):
    url = cluster["broker"]
    produce(url, "lp", "seed", queueId=0)
    t0 = time.monotonic()
    r = httpx.get(f"{url}/topics/lp/queues/0/messages", params={"offset": 1, "waitMs": 400})
    waited = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["messages"] == []
    assert 0.38 <= waited < 1.5

    acked_at: list[float] = []

    def later():
        with httpx.Client() as c:
            c.get(f"{url}/health")  # connect first: measure the broker, not the TCP handshake
            time.sleep(0.5)
            r = c.post(f"{url}/topics/lp/messages", json={"messages": [{"body": "wake", "queueId": 0}]})
            acked_at.append(time.monotonic())
            assert r.status_code == 200

    th = threading.Thread(target=later)
    th.start()
    r = httpx.get(f"{url}/topics/lp/queues/0/messages", params={"offset": 1, "waitMs": 4000}, timeout=10)
    returned = time.monotonic()
    th.join()
    assert [m["body"] for m in r.json()["messages"]] == ["wake"]
    # The held pull answers within 50 ms of the produce being acknowledged (usually before it).
    assert returned - acked_at[0] < 0.05, returned - acked_at[0]


def test_receive_ack_redelivery_and_dlq(cluster):
    url = cluster["broker"]
    r = httpx.put(f"{url}/topics/work", json={"readQueueNums": 2, "writeQueueNums": 2})
    assert r.status_code == 200, r.text
    produce(url, "work", "m1", "m2", queueId=0)
    produce(url, "work", "m3", queueId=1)
    rcv = httpx.post(
        f"{url}/consumers/g1/receive", json={"topic": "work", "maxMessages": 10, "invisibleMs": 300}
    ).json()["messages"]
    assert sorted(m["body"] for m in rcv) == ["m1", "m2", "m3"]
    assert all(m["reconsumeTimes"] == 0 for m in rcv)
    # Nothing visible while they are in flight.
    assert httpx.post(f"{url}/consumers/g1/receive", json={"topic": "work"}).json()["messages"] == []
    keep = [m for m in rcv if m["body"] != "m2"]
    ack = httpx.post(
        f"{url}/consumers/g1/ack",
        json={"topic": "work", "receiptHandles": [m["receiptHandle"] for m in keep]},
    ).json()
    assert [x["status"] for x in ack["results"]] == ["OK", "OK"]
    # m2 comes back after its invisible time with reconsumeTimes 1 (long poll wakes on expiry).
    t0 = time.monotonic()
    again = httpx.post(
        f"{url}/consumers/g1/receive", json={"topic": "work", "invisibleMs": 200, "waitMs": 3000}, timeout=10
    ).json()["messages"]
    assert [m["body"] for m in again] == ["m2"] and again[0]["reconsumeTimes"] == 1
    assert time.monotonic() - t0 < 1.5
    # An old receipt handle of m2 no longer settles it.
    old = next(m for m in rcv if m["body"] == "m2")
    stale = httpx.post(
        f"{url}/consumers/g1/ack", json={"topic": "work", "receiptHandles": [old["receiptHandle"]]}
    )
    assert stale.json()["results"][0]["status"] == "EXPIRED"
    # maxReconsumeTimes=1: after the next expiry m2 goes to %DLQ%g1 instead of a third delivery.
    time.sleep(0.3)
    assert httpx.post(f"{url}/consumers/g1/receive", json={"topic": "work"}).json()["messages"] == []
    dlq = httpx.get(f"{url}/topics/%25DLQ%25g1/queues/0/messages", params={"offset": 0}).json()["messages"]
    assert [m["body"] for m in dlq] == ["m2"] and dlq[0]["properties"]["RETRY_TOPIC"] == "work"
    # All settled: the committed offsets (replicated) reached the end of both queues.
    offs = httpx.get(f"{url}/consumers/g1/offsets", params={"topic": "work"}).json()["offsets"]
    assert {(o["queueId"], o["offset"], o["lag"]) for o in offs} == {(0, 2, 0), (1, 1, 0)}


def test_nack_and_change_invisible(cluster):
    url = cluster["broker"]
    produce(url, "nk", "x", queueId=0)
    m = httpx.post(f"{url}/consumers/g2/receive", json={"topic": "nk", "invisibleMs": 60000}).json()[
        "messages"
    ][0]
    r = httpx.post(
        f"{url}/consumers/g2/invisible",
        json={"topic": "nk", "receiptHandle": m["receiptHandle"], "invisibleMs": 60000},
    )
    assert r.status_code == 200
    handle = r.json()["receiptHandle"]
    assert handle != m["receiptHandle"]
    bad = httpx.post(
        f"{url}/consumers/g2/invisible",
        json={"topic": "nk", "receiptHandle": m["receiptHandle"], "invisibleMs": 1000},
    )
    assert bad.status_code == 404 and bad.json()["field"] == "receiptHandle"
    assert (
        httpx.post(f"{url}/consumers/g2/nack", json={"topic": "nk", "receiptHandles": [handle]}).status_code
        == 200
    )
    again = httpx.post(f"{url}/consumers/g2/receive", json={"topic": "nk"}).json()["messages"]
    assert [x["body"] for x in again] == ["x"] and again[0]["reconsumeTimes"] == 1
    garbage = httpx.post(f"{url}/consumers/g2/ack", json={"topic": "nk", "receiptHandles": ["zzz"]})
    assert garbage.status_code == 400 and garbage.json()["field"].startswith("receiptHandles")


def test_topic_admin_and_offsets(cluster):
    url = cluster["broker"]
    r = httpx.put(f"{url}/topics/adm", json={"readQueueNums": 3, "writeQueueNums": 3, "perm": 6})
    assert r.json()["queues"] == [{"queueId": q, "minOffset": 0, "maxOffset": 0} for q in range(3)]
    assert "adm" in httpx.get(f"{url}/topics").json()["topics"]
    produce(url, "adm", "a", "b", "c", queueId=2)
    t_mid = httpx.get(f"{url}/topics/adm/queues/2/messages", params={"offset": 1}).json()["messages"][0]
    ts = httpx.get(f"{url}/topics/adm/queues/2/offset", params={"timestamp": t_mid["storeTimestamp"]}).json()
    assert ts["offset"] <= 1
    r = httpx.put(f"{url}/consumers/cg/offsets", json={"topic": "adm", "offsets": {"2": 2}})
    assert r.status_code == 200, r.text
    row = next(o for o in r.json()["offsets"] if o["queueId"] == 2)
    assert (row["offset"], row["maxOffset"], row["lag"]) == (2, 3, 1)
    r = httpx.put(f"{url}/consumers/cg/offsets", json={"topic": "adm", "offsets": {"2": 99}})
    assert r.status_code == 400 and r.json()["code"] == "OFFSET_OUT_OF_RANGE"
    r = httpx.put(f"{url}/topics/adm", json={"readQueueNums": 0})
    assert r.status_code == 400 and r.json()["field"] == "readQueueNums"
    assert httpx.delete(f"{url}/topics/adm").status_code == 200
    assert httpx.get(f"{url}/topics/adm").json()["code"] == "TOPIC_NOT_EXIST"


@pytest.mark.parametrize(
    "body,ctype,field",
    [
        (b"{bad json", "application/json", "body"),
        (b'{"messages": []}', "application/json", "messages"),
        (
            b'{"messages": [{"body": "x", "bodyEncoding": "utf-16"}]}',
            "application/json",
            "messages[0].bodyEncoding",
        ),
        (b'{"messages": [{"body": "x", "queueId": -1}]}', "application/json", "messages[0].queueId"),
        (b'{"messages": [{"body": "x", "keys": [1]}]}', "application/json", "messages[0].keys[0]"),
        (
            b'{"messages": [{"body": "x", "properties": {"TAGS": "y"}}]}',
            "application/json",
            "messages[0].properties.TAGS",
        ),
        (b"x", "text/plain", "Content-Type"),
    ],
)
def test_bad_produce_is_400_naming_the_field(cluster, body, ctype, field):
    r = httpx.post(f"{cluster['broker']}/topics/bad/messages", content=body, headers={"content-type": ctype})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["field"] == field


def test_size_limits(cluster):
    url = cluster["broker"]
    r = httpx.post(f"{url}/topics/big/messages", json={"messages": [{"body": "x" * 70000}]})
    assert r.status_code == 413 and r.json()["code"] == "MESSAGE_TOO_LARGE"
    # A declared Content-Length over the request limit is refused before the body is read: the
    # broker answers 413 after only the headers and a few bytes were sent.
    host, port = cluster["addr"].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"POST /topics/big/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 67108864\r\n\r\n{"
        )
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:100]
    assert (
        httpx.post(f"{url}/topics/bad.name/messages", json={"messages": [{"body": "x"}]}).json()["code"]
        == "INVALID_TOPIC"
    )


def test_registration_routes_and_sdk(cluster):
    from client import Admin, Message, Producer, PullConsumer, SimpleConsumer

    ns, addr = cluster["namesrv"], cluster["addr"]
    with Admin(ns) as admin:
        admin.update_topic("sdk", 2, 2)
        route = wait_http(f"{ns}/routes/sdk").json()
        assert route["brokers"][0]["addrs"] == {"0": addr} and route["brokers"][0]["writeQueueNums"] == 2
        with Producer(ns) as p:
            results = [p.send("sdk", f"m{i}".encode(), tags="T") for i in range(6)]
            results += p.send_batch("sdk", [Message(body=b"\x00\xff", keys=["bin"]), "text"])
        assert {r.queue_id for r in results} == {0, 1}
        with PullConsumer(ns) as c:
            got = []
            for q in c.queues("sdk"):
                got += c.pull("sdk", q.queue_id, 0, 100).messages
        assert sorted(m.body for m in got) == sorted(
            [f"m{i}".encode() for i in range(6)] + [b"\x00\xff", b"text"]
        )
        with SimpleConsumer("sdk-group", "sdk", ns) as sc:
            msgs = sc.receive(max_messages=100)
            assert len(msgs) == 8
            assert all(r["status"] == "OK" for r in sc.ack(*msgs)["results"])
        status = admin.topic_status("sdk")
        assert sum(row["maxOffset"] for row in status) == 8
        progress = admin.consumer_progress("sdk-group", "sdk")
        assert sum(row["offset"] for row in progress) == 8
        msg = admin.query_msg_by_id(results[0].msg_id)
        assert msg["body"] == "m0"
        rows = admin.cluster_list()
        assert rows[0]["role"] == "MASTER" and rows[0]["addr"] == addr


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """The broker's /metrics as {(sample name, labels): value}, parsed by prometheus_client."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_and_openapi(cluster):
    url = cluster["broker"]
    produce(url, "met", "a", "b", "c", queueId=0)
    assert len(httpx.get(f"{url}/topics/met/queues/0/messages").json()["messages"]) == 3
    r = httpx.put(f"{url}/consumers/gmet/offsets", json={"topic": "met", "offsets": {"0": 1}})
    assert r.status_code == 200, r.text
    m = scrape(url)
    topic = frozenset({("topic", "met")})
    assert m[("ledgermq_put_messages_total", topic)] == 3
    assert m[("ledgermq_get_messages_total", topic)] == 3
    assert m[("ledgermq_put_latency_seconds_count", topic)] == 1
    assert m[("ledgermq_put_latency_seconds_bucket", topic | {("le", "+Inf")})] == 1
    assert m[("ledgermq_get_latency_seconds_count", topic)] == 1
    lag = frozenset({("group", "gmet"), ("topic", "met"), ("queueid", "0")})
    assert m[("ledgermq_consumer_lag", lag)] == 2  # max offset 3, committed 1
    assert m[("ledgermq_queue_max_offset", frozenset({("topic", "met"), ("queueid", "0")}))] == 3
    assert 0 < m[("ledgermq_disk_used_ratio", frozenset({("broker", "broker-s")}))] < 1
    assert m[("ledgermq_broker_is_master", frozenset({("broker", "broker-s")}))] == 1
    assert m[("ledgermq_long_poll_waiters", frozenset())] == 0
    # A held pull is counted while it waits, and no longer once it has answered.
    answers: list[httpx.Response] = []
    pull = f"{url}/topics/met/queues/0/messages"
    held = threading.Thread(
        target=lambda: answers.append(httpx.get(pull, params={"offset": 3, "waitMs": 3000}, timeout=10))
    )
    held.start()
    deadline = time.monotonic() + 2.5
    while scrape(url)[("ledgermq_long_poll_waiters", frozenset())] != 1:
        assert time.monotonic() < deadline, "the held pull was never counted"
        time.sleep(0.02)
    produce(url, "met", "wake", queueId=0)
    held.join()
    assert [x["body"] for x in answers[0].json()["messages"]] == ["wake"]
    assert scrape(url)[("ledgermq_long_poll_waiters", frozenset())] == 0
    spec = httpx.get(f"{url}/openapi.json").json()
    assert "/topics/{topic}/messages" in spec["paths"] and "ProduceRequest" in spec["components"]["schemas"]
    assert "/consumers/{group}/receive" in spec["paths"]
