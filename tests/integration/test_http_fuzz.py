"""HTTP fuzzing against a real broker process (local commit log, started from conf/broker-single.conf
with free ports and a temporary store) and a real name server: hostile input must end in a 4xx
`application/problem+json`, never a 5xx, never a hang, never a file outside the store, and the
server must keep answering. Also: ACL on every non-open route, secrets never logged, and a pile
of idle/slow connections cannot starve a normal request."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fault.cluster import CONF, REPO, free_ports, read_properties, write_properties

pytestmark = pytest.mark.timeout(120)
HTTP_FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
TOKEN = "fuzz-admin-token-7f3a9c"  # must never appear in a log


@dataclass
class Server:
    """One started process and where it answers."""

    proc: subprocess.Popen
    url: str
    log: Path
    root: Path


def _start(args: list[str], log: Path, url: str) -> Server:
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return Server(proc, url, log, log.parent)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{args} not healthy: {log.read_text()[-2000:]}")


def _stop(server: Server) -> None:
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(5)


def _broker(tmp: Path, namesrv_port: int, acl: bool = False) -> Server:
    port = free_ports(1)[0]
    # A fuzzed waitMs may ask for the longest long poll: capped at 2 s here so it always ends
    # well inside the requests' 10 s timeout (the default cap, 15 s, made such a draw a timeout).
    overrides: dict[str, object] = {"listenPort": port, "storePathRootDir": tmp / "store",
                                    "namesrvAddr": f"127.0.0.1:{namesrv_port}",
                                    "brokerSuspendMaxTimeMillis": 2000, "grpcServerPort": 0}
    if acl:
        acl_file = tmp / "acl.json"
        acl_file.write_text(json.dumps({"accounts": [
            {"name": "admin", "token": TOKEN, "admin": True},
            {"name": "reader", "token": "reader-token-1", "topicPerms": {"*": "SUB"},
             "groupPerms": {"*": "SUB"}},
        ]}))
        overrides.update({"aclEnable": "true", "aclConfigFile": acl_file})
    conf = write_properties(read_properties(CONF / "broker-single.conf"), overrides, tmp / "broker.conf")
    return _start(["-m", "broker", "-c", str(conf)], tmp / "broker.log", f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    tmp = tmp_path_factory.mktemp("httpfuzz")
    ns_port = free_ports(1)[0]
    ns_conf = write_properties(read_properties(CONF / "namesrv.conf"), {"listenPort": ns_port},
                               tmp / "ns.conf")
    namesrv = _start(["-m", "namesrv", "-c", str(ns_conf)], tmp / "namesrv.log", f"http://127.0.0.1:{ns_port}")
    try:
        broker = _broker(tmp, ns_port)
    except BaseException:
        _stop(namesrv)
        raise
    try:
        httpx.put(f"{broker.url}/topics/fuzz", json={"readQueueNums": 2, "writeQueueNums": 2, "perm": 6})
        yield broker, namesrv
    finally:
        _stop(broker)
        _stop(namesrv)


def assert_problem(r: httpx.Response, *statuses: int) -> None:
    """A 4xx answer in RFC 9457 shape (or one of the given statuses)."""
    assert r.status_code < 500, f"{r.request.method} {r.request.url} → {r.status_code}: {r.text[:300]}"
    if r.status_code >= 400:
        assert r.headers.get("content-type", "").startswith("application/problem+json"), r.headers
        doc = r.json()
        assert doc["status"] == r.status_code and doc.get("code") and doc.get("title"), doc
    if statuses:
        assert r.status_code in statuses, f"{r.status_code} not in {statuses}: {r.text[:300]}"


@pytest.fixture
def broker(servers: tuple[Server, Server]) -> Iterator[Server]:
    yield servers[0]
    assert servers[0].proc.poll() is None, "the broker died"
    assert httpx.get(f"{servers[0].url}/health", timeout=2).status_code == 200


def test_oversized_body_is_refused_before_it_is_read(broker: Server) -> None:
    big = "x" * (5 * 1024 * 1024)
    r = httpx.post(f"{broker.url}/topics/fuzz/messages", json={"messages": [{"body": big}]}, timeout=30)
    assert_problem(r, 413)
    # A declared 10 GB body: the answer must come before (and without) the body.
    with socket.create_connection(("127.0.0.1", int(broker.url.rsplit(":", 1)[1])), timeout=5) as s:
        s.sendall(b"POST /topics/fuzz/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000000\r\n\r\n")
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


@pytest.mark.parametrize("params", [
    {"offset": 0, "maxMessages": 10**12}, {"offset": 0, "maxMessages": -1},
    {"offset": 0, "maxMessages": "abc"},
    {"offset": 0, "waitMs": 10**12}, {"offset": 0, "waitMs": -5}, {"offset": 0, "waitMs": "1e9"},
    {"offset": -1}, {"offset": "9" * 5000}, {"offset": "NaN"}, {"offset": 0, "bodyEncoding": "rot13"},
])
def test_absurd_pull_parameters(broker: Server, params: dict) -> None:
    t0 = time.monotonic()
    r = httpx.get(f"{broker.url}/topics/fuzz/queues/0/messages", params=params, timeout=20)
    assert time.monotonic() - t0 < 16, "an absurd waitMs must be refused or clamped to the suspend max"
    assert_problem(r, 400, 422)


@pytest.mark.parametrize("name", [
    "..", "../etc", "a/../../b", "%2e%2e%2f%2e%2e", "..%2fescape", "nul%00byte", "a" * 10_000,
    "sp ace", "uni\u00e9", "%ff%fe", "CON", "-", "a" * 128,
])
def test_path_tricks_in_topic_and_group_names(broker: Server, name: str) -> None:
    before = set(os.listdir(broker.root))
    for method, path, body in [
        ("POST", f"/topics/{name}/messages", {"messages": [{"body": "x"}]}),
        ("GET", f"/topics/{name}/queues/0/messages?offset=0", None),
        ("PUT", f"/topics/{name}", {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}),
        ("GET", f"/topics/{name}", None),
        ("DELETE", f"/topics/{name}", None),
        ("GET", f"/consumers/{name}/offsets?topic=fuzz", None),
        ("PUT", f"/consumers/{name}/offsets", {"topic": "fuzz", "offsets": {"0": 0}}),
        ("POST", f"/consumers/{name}/receive", {"topic": "fuzz", "maxMessages": 1, "waitMs": 0}),
    ]:
        r = httpx.request(method, f"{broker.url}{path}", json=body, timeout=10)
        if r.status_code < 400:  # a legal name: fine, as long as it stayed inside the store
            continue
        assert_problem(r)
    assert set(os.listdir(broker.root)) == before, "a request created files beside the store"
    assert not list(broker.root.parent.glob("etc*")), "path traversal escaped the store"


@pytest.mark.parametrize(("content_type", "payload"), [
    ("text/plain", b'{"messages": [{"body": "x"}]}'),
    ("application/xml", b"<messages/>"),
    ("multipart/form-data; boundary=zz", b"--zz\r\n\r\nx\r\n--zz--"),
    ("application/json", b"{not json"),
    ("application/json", b'{"messages": "nope"}'),
    ("application/json", b'{"messages": [{"body": 5}]}'),
    ("application/json", b'{"messages": [{"body": "@@@", "bodyEncoding": "base64"}]}'),
    ("application/json", b'{"messages": [{"body": "x", "bodyEncoding": "utf-16"}]}'),
    ("application/json", b'{"messages": [{"body": "x", "queueId": 99999}]}'),
    ("application/json", b'{"messages": [{"body": "x", "properties": {"a\\u0001": "b"}}]}'),
    ("application/json", b'{"messages": []}'),
    ("application/json", b"[" * 50_000 + b"]" * 50_000),
    ("application/json", b'{"messages": [{"body": "\\ud800"}]}'),
    ("application/json", b"\xff\xfe\x00"),
])
def test_bad_produce_bodies(broker: Server, content_type: str, payload: bytes) -> None:
    r = httpx.post(f"{broker.url}/topics/fuzz/messages", content=payload,
                   headers={"content-type": content_type}, timeout=10)
    assert_problem(r)
    assert r.status_code >= 400, f"accepted garbage: {payload[:80]!r} → {r.text[:200]}"


def test_valid_base64_round_trips(broker: Server) -> None:
    raw = bytes(range(256))
    r = httpx.post(f"{broker.url}/topics/fuzz/messages", timeout=10, json={
        "messages": [{"body": base64.b64encode(raw).decode(), "bodyEncoding": "base64", "queueId": 1}]})
    assert r.status_code == 200, r.text
    off = r.json()["results"][0]["queueOffset"]
    got = httpx.get(f"{broker.url}/topics/fuzz/queues/1/messages",
                    params={"offset": off, "maxMessages": 1, "bodyEncoding": "base64"}, timeout=10).json()
    assert base64.b64decode(got["messages"][0]["body"]) == raw


json_leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=30)
json_doc = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(
    st.sampled_from(["messages", "body", "bodyEncoding", "tags", "keys", "properties", "queueId",
                     "idempotencyKey", "topic", "offsets", "maxMessages", "waitMs", "invisibleMs",
                     "receiptHandles", "readQueueNums", "writeQueueNums", "perm"]) | st.text(max_size=8),
    c, max_size=6), max_leaves=25)


@HTTP_FUZZ
@given(doc=json_doc, route=st.sampled_from([
    ("POST", "/topics/fuzz/messages"), ("PUT", "/topics/fuzz2"), ("PUT", "/consumers/g/offsets"),
    ("POST", "/consumers/g/receive"), ("POST", "/consumers/g/ack"), ("POST", "/consumers/g/nack"),
    ("POST", "/consumers/g/invisible")]))
def test_random_json_bodies_never_5xx(servers: tuple[Server, Server], doc: object, route: tuple) -> None:
    broker = servers[0]
    method, path = route
    body = json.dumps(doc, allow_nan=True).encode()
    r = httpx.request(method, f"{broker.url}{path}", content=body,
                      headers={"content-type": "application/json"}, timeout=10)
    assert_problem(r)


@HTTP_FUZZ
@given(q=st.dictionaries(st.sampled_from(["offset", "maxMessages", "waitMs", "bodyEncoding", "timestamp",
                                          "topic", "x"]),
                         st.text(max_size=12) | st.integers(-(2**40), 2**40).map(str), max_size=4),
       queue=st.text(min_size=1, max_size=6))
def test_random_query_strings_never_5xx(servers: tuple[Server, Server], q: dict, queue: str) -> None:
    broker = servers[0]
    q.setdefault("waitMs", "0")
    queue = quote(queue, safe="")
    for path in (f"/topics/fuzz/queues/{queue}/messages", f"/topics/fuzz/queues/{queue}/offset",
                 "/consumers/g/offsets"):
        r = httpx.get(f"{broker.url}{path}", params=q, timeout=10)
        assert_problem(r)


@HTTP_FUZZ
@given(doc=json_doc, topic=st.text(max_size=40))
def test_name_server_never_5xx(servers: tuple[Server, Server], doc: object, topic: str) -> None:
    namesrv = servers[1]
    r = httpx.post(f"{namesrv.url}/brokers/register", content=json.dumps(doc).encode(),
                   headers={"content-type": "application/json"}, timeout=10)
    assert_problem(r)
    r = httpx.get(f"{namesrv.url}/routes/{quote(topic, safe='')}", timeout=10)
    assert_problem(r)


def test_idle_and_slow_connections_do_not_starve_a_request(broker: Server) -> None:
    port = int(broker.url.rsplit(":", 1)[1])
    socks = []
    try:
        for i in range(200):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # slow loris: headers never end
            socks.append(s)
        t0 = time.monotonic()
        r = httpx.get(f"{broker.url}/health", timeout=5)
        assert r.status_code == 200 and time.monotonic() - t0 < 2
    finally:
        for s in socks:
            s.close()


def test_acl_guards_every_route_and_never_logs_the_token(tmp_path: Path,
                                                         servers: tuple[Server, Server]) -> None:
    ns_port = int(servers[1].url.rsplit(":", 1)[1])
    b = _broker(tmp_path, ns_port, acl=True)
    try:
        spec = httpx.get(f"{b.url}/openapi.json", timeout=5).json()
        open_paths = {"/health", "/openapi.json", "/docs", "/redoc"}
        checked = 0
        unguarded: list[str] = []
        for path, ops in spec["paths"].items():
            if path in open_paths:
                continue
            concrete = path.replace("{topic}", "fuzz").replace("{queueId}", "0").replace("{group}", "g") \
                .replace("{msgId}", "7F000001000046BF00000000000000DE")
            for method in ops:
                for headers in ({}, {"authorization": "Bearer wrong-token"}):
                    r = httpx.request(method.upper(), f"{b.url}{concrete}", json={}, timeout=10,
                                      headers=headers)
                    if r.status_code != 401:
                        unguarded.append(f"{method.upper()} {path} {headers or 'no token'} → {r.status_code}")
                checked += 1
        assert checked >= 8, spec["paths"].keys()
        assert not unguarded, f"routes answering without a valid token: {unguarded}"
        r = httpx.put(f"{b.url}/topics/fuzz", timeout=10, headers={"authorization": "Bearer reader-token-1"},
                      json={"readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
        assert_problem(r, 403)
        r = httpx.put(f"{b.url}/topics/fuzz", timeout=10, headers={"authorization": f"Bearer {TOKEN}"},
                      json={"readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
        assert r.status_code < 300, r.text
    finally:
        _stop(b)
    text = b.log.read_text(errors="replace") + (tmp_path / "broker.conf").read_text()
    assert TOKEN not in b.log.read_text(errors="replace"), "the ACL token was logged"
    assert "reader-token-1" not in b.log.read_text(errors="replace")
    assert "aclEnable=true" in text
