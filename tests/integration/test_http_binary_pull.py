"""The binary pull page (`Accept: application/x-ledgermq-messages` / `?format=binary`) against a real
broker: the same messages as the JSON form, the documented header, and problem+json errors."""

from __future__ import annotations

import base64
import struct
import time

import httpx
import pytest

from pipeline.binpull import PULL_BINARY_CONTENT_TYPE, decode_pull_page, parse_properties, split_keys
from tests.integration._ledgermq_procs import (
    namesrv_and_broker,
)

BINARY = {"accept": PULL_BINARY_CONTENT_TYPE}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with namesrv_and_broker(
        tmp_path_factory.mktemp("http-binary"), "broker-b", brokerSuspendMaxTimeMillis="5000"
    ) as (_, _, addr):
        yield f"http://{addr}"


def _pull(url: str, topic: str, qid: int, **params) -> httpx.Response:
    return httpx.get(f"{url}/topics/{topic}/queues/{qid}/messages", params=params, timeout=10)


def _json_body(m: dict) -> bytes:
    return m["body"].encode() if m["bodyEncoding"] == "utf-8" else base64.b64decode(m["body"])


def test_binary_and_json_forms_return_the_same_messages(broker):
    url = broker
    r = httpx.post(
        f"{url}/topics/bin/messages",
        json={
            "messages": [
                {"body": "plain", "queueId": 0},
                {
                    "body": "héllo ✓",
                    "tags": "TagA",
                    "keys": ["k1", "k2"],
                    "properties": {"p": "v", "é": "ü"},
                    "queueId": 0,
                },
                {
                    "body": base64.b64encode(b"\xff\x00\x80raw").decode(),
                    "bodyEncoding": "base64",
                    "tags": "ünï",
                    "queueId": 0,
                },
                {"body": "", "keys": ["only"], "queueId": 0},
            ]
        },
    )
    assert r.status_code == 200, r.text
    raw = httpx.post(
        f"{url}/topics/bin/messages",
        params={"tags": "bin", "keys": "a,b", "queueId": 0},
        content=b"\xfe\xff\x00binary" * 50,
        headers={"content-type": "application/octet-stream"},
    )
    assert raw.status_code == 200, raw.text

    doc = _pull(url, "bin", 0, offset=0, maxMessages=100).json()
    resp = _pull(url, "bin", 0, offset=0, maxMessages=100, format="binary")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == PULL_BINARY_CONTENT_TYPE
    by_accept = httpx.get(
        f"{url}/topics/bin/queues/0/messages",
        params={"offset": 0, "maxMessages": 100},
        headers={"accept": f"text/html, {PULL_BINARY_CONTENT_TYPE};q=0.9"},
    )
    assert by_accept.content == resp.content

    # The documented header, read with struct directly (not only through the pipeline's decoder).
    magic, version, count, nxt, lo, hi = struct.unpack_from(">4sB3xIqqq", resp.content, 0)
    assert (magic, version, count) == (b"LMQP", 1, 5)
    assert (nxt, lo, hi) == (doc["nextOffset"], doc["minOffset"], doc["maxOffset"]) == (5, 0, 5)

    page = decode_pull_page(resp.content)
    msgs = doc["messages"]
    assert len(page) == len(msgs) == 5
    for i, m in enumerate(msgs):
        assert page.queue_offsets[i] == m["queueOffset"] == i
        assert page.commit_log_offsets[i] == m["commitLogOffset"]
        assert page.born_timestamps[i] == m["bornTimestamp"]
        assert page.store_timestamps[i] == m["storeTimestamp"]
        assert page.reconsume_times[i] == m["reconsumeTimes"]
        assert page.queue_ids[i] == m["queueId"] == 0
        assert page.msg_ids[i] == m["msgId"]
        assert page.tags[i] == m["tags"]
        assert split_keys(page.keys[i]) == m["keys"]
        assert dict(parse_properties(page.properties[i])) == m["properties"]
        assert page.bodies[i].as_py() == _json_body(m)
    assert page.tags[0] is None and page.tags[2] == "ünï" and page.tags[1] == "TagA"
    assert page.bodies[2].as_py() == b"\xff\x00\x80raw" and page.bodies[3].as_py() == b""
    assert page.bodies[4].as_py() == b"\xfe\xff\x00binary" * 50
    assert dict(parse_properties(page.properties[1])) == {"p": "v", "é": "ü"}

    # Paging: the same [offset, offset+n) window in both forms.
    mid = decode_pull_page(_pull(url, "bin", 0, offset=2, maxMessages=2, format="binary").content)
    assert mid.queue_offsets == [2, 3] and mid.next_offset == 4
    assert mid.bodies.to_pylist() == [b"\xff\x00\x80raw", b""]
    # format=json wins over the Accept header.
    j = httpx.get(f"{url}/topics/bin/queues/0/messages", params={"format": "json"}, headers=BINARY)
    assert j.headers["content-type"].startswith("application/json") and j.json()["nextOffset"] == 5


def test_binary_errors_stay_problem_json(broker):
    url = broker
    assert httpx.post(f"{url}/topics/errs/messages", json={"body": "x", "queueId": 0}).status_code == 200
    r = httpx.get(f"{url}/topics/errs/queues/0/messages", params={"offset": 99}, headers=BINARY)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == "OFFSET_OUT_OF_RANGE" and body["minOffset"] == 0 and body["maxOffset"] == 1
    j = _pull(url, "errs", 0, offset=99)
    assert (j.status_code, j.json()["code"]) == (r.status_code, "OFFSET_OUT_OF_RANGE")

    bad = _pull(url, "errs", 0, format="xml")
    assert bad.status_code == 400 and bad.headers["content-type"].startswith("application/problem+json")
    assert "format" in bad.text
    missing = httpx.get(f"{url}/topics/nope/queues/0/messages", headers=BINARY)
    assert missing.status_code == 404 and missing.json()["code"] == "TOPIC_NOT_EXIST"


def test_binary_long_poll_waits_like_json(broker):
    url = broker
    assert httpx.post(f"{url}/topics/lp/messages", json={"body": "x", "queueId": 0}).status_code == 200
    t0 = time.monotonic()
    r = _pull(url, "lp", 0, offset=1, waitMs=300, format="binary")
    waited = time.monotonic() - t0
    page = decode_pull_page(r.content)
    assert r.status_code == 200 and len(page) == 0 and page.next_offset == 1 and page.max_offset == 1
    assert waited >= 0.25
