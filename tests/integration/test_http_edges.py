"""Edges of the broker HTTP API a client can reach, against real processes (a name server and a
broker from conf/broker-single.conf): names that need percent-escaping, request bodies over the
limit on every route, message ids of another broker, permission bits the name server must accept."""

from __future__ import annotations

import socket
from urllib.parse import quote

import httpx
import pytest

from tests.integration._ledgermq_procs import namesrv_and_broker, wait_http


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("http-edges")
    with namesrv_and_broker(workdir, "broker-e", registerNameServerPeriod="200") as (_, ns, addr):
        yield {"url": f"http://{addr}", "addr": addr, "ns": f"http://{ns}", "log": workdir / "broker-e.log"}


@pytest.mark.parametrize("topic", ["a%de", "%RETRY%cafe", "x%2Fy", "p%25"])
def test_topic_names_with_percent_are_decoded_once(broker, topic):
    url, path = broker["url"], quote(topic, safe="")
    r = httpx.post(f"{url}/topics/{path}/messages", json={"messages": [{"body": "one", "queueId": 0}]})
    assert r.status_code == 200, r.text
    pulled = httpx.get(f"{url}/topics/{path}/queues/0/messages")
    assert pulled.status_code == 200 and [m["body"] for m in pulled.json()["messages"]] == ["one"]
    assert topic in httpx.get(f"{url}/topics").json()["topics"]
    assert httpx.get(f"{url}/topics/{path}").json()["topic"] == topic


def raw_request(addr: str, head: bytes, body_chunks: list[bytes] = ()) -> tuple[int, dict]:
    """Send a request by hand (headers as given) and read the status line and problem body."""
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head)
        for chunk in body_chunks:
            s.sendall(chunk)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        headers, _, rest = data.partition(b"\r\n\r\n")
        length = int(
            next(h for h in headers.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        while len(rest) < length:
            rest += s.recv(65536)
    return int(headers.split(b" ")[1]), httpx.Response(200, content=rest).json()


@pytest.mark.parametrize("path", ["/consumers/g/ack", "/consumers/g/receive", "/topics/big/messages"])
def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(broker, path):
    # No body follows the headers: the answer can only come from the declared length.
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {64 * 1024 * 1024}\r\n\r\n"
    ).encode()
    status, problem = raw_request(broker["addr"], head)
    assert status == 413 and problem["code"] in ("REQUEST_TOO_LARGE", "MESSAGE_TOO_LARGE")
    assert problem["limit"] >= 8 * 1024 * 1024


def test_a_chunked_body_over_the_limit_is_refused(broker):
    head = (
        b"PUT /consumers/g/offsets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    block = b"x" * (1024 * 1024)
    chunk = f"{len(block):x}\r\n".encode() + block + b"\r\n"
    status, problem = raw_request(broker["addr"], head, [chunk] * 9 + [b"0\r\n\r\n"])
    assert status == 413 and problem["code"] == "REQUEST_TOO_LARGE"
    # The broker is fine afterwards, and logged why.
    assert httpx.get(f"{broker['url']}/health").status_code == 200
    assert "event=request_too_large" in broker["log"].read_text()


def test_raw_produce_queue_id_of_any_length_is_a_400(broker):
    r = httpx.post(
        f"{broker['url']}/topics/rawq/messages",
        params={"queueId": "9" * 5000},
        content=b"x",
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 400 and r.json()["field"] == "queueId"


def test_message_id_of_another_broker_is_not_found(broker):
    url = broker["url"]
    res = httpx.post(f"{url}/topics/ids/messages", json={"messages": [{"body": "mine"}]}).json()["results"][0]
    assert httpx.get(f"{url}/messages/{res['msgId']}").json()["body"] == "mine"
    # Same commit-log offset, another store host (10.0.0.1:10911): not this broker's message.
    other = "0A00000100002AAF" + res["msgId"][16:]
    r = httpx.get(f"{url}/messages/{other}")
    assert r.status_code == 404 and r.json()["code"] == "MESSAGE_NOT_FOUND"


def test_admin_routes_name_a_bad_topic_invalid_topic(broker):
    r = httpx.put(f"{broker['url']}/topics/bad%20name", json={})
    assert r.status_code == 400 and r.json()["code"] == "INVALID_TOPIC" and r.json()["field"] == "topic"


def test_every_permission_bit_keeps_the_topic_routed(broker):
    # PermName: PRIORITY 8 | READ 4 | WRITE 2. The name server must accept what the broker does.
    r = httpx.put(f"{broker['url']}/topics/prio", json={"readQueueNums": 2, "writeQueueNums": 2, "perm": 14})
    assert r.status_code == 200, r.text
    route = wait_http(f"{broker['ns']}/routes/prio", timeout_s=10).json()
    assert route["brokers"][0]["perm"] == 14 and route["brokers"][0]["masterAddr"] == broker["addr"]
    # And the broker is still registered for its other topics (a refused heartbeat expires it).
    assert httpx.get(f"{broker['ns']}/routes/ids").status_code == 200
