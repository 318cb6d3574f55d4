"""The executor's read path without Spark: the stdlib pull client, the columnar key column and the
per-worker gc freeze, against the real broker of the session."""

from __future__ import annotations

import gc
import socket

import pyarrow as pa
import pytest

import pipeline.worker
from pipeline.binpull import PULL_BINARY_CONTENT_TYPE, decode_pull_page, first_keys, split_keys
from pipeline.fetch import FetchOptions, QueuePartition, read_partition
from pipeline.pullclient import TRANSPORT_ERRORS, PageClient
from pipeline.worker import freeze_worker_heap

BINARY = {"accept": PULL_BINARY_CONTENT_TYPE}


def test_first_keys_is_the_first_of_split_keys():
    raw = ["", "a", "a b", "  a  b ", " ", "   ", "é x", "x  ", "k1 k2 k3", " only"]
    got = first_keys(pa.array(raw, pa.string())).to_pylist()
    assert got == [(split_keys(k) or [None])[0] for k in raw]
    assert first_keys(pa.array(["", ""], pa.string())).to_pylist() == [None, None]
    assert first_keys(pa.array([], pa.string())).to_pylist() == []


def test_page_client_reuses_its_connection_and_recovers_from_a_stale_one(cluster, topic_name):
    cluster.create_topic(topic_name, queues=1)
    cluster.produce(topic_name, [b"one", b"two", b"three"], queue_id=0)
    base = f"http://{cluster.brokers[0]}"
    path = f"/topics/{topic_name}/queues/0/messages"
    client = PageClient(timeout_s=10)
    try:
        first = client.get(base, path, {"offset": 0, "maxMessages": 10}, BINARY)
        assert first.status_code == 200
        assert first.headers["content-type"].startswith(PULL_BINARY_CONTENT_TYPE)
        assert decode_pull_page(first.content).bodies.to_pylist() == [b"one", b"two", b"three"]
        conn = client._conns[base]
        again = client.get(base, path, {"offset": 1, "maxMessages": 1}, BINARY)
        assert client._conns[base] is conn  # keep-alive: the same connection
        assert decode_pull_page(again.content).bodies.to_pylist() == [b"two"]
        conn.sock.close()  # as if the server had dropped the idle connection
        third = client.get(base, path, {"offset": 2, "maxMessages": 5}, BINARY)
        assert decode_pull_page(third.content).bodies.to_pylist() == [b"three"]
        assert client._conns[base] is not conn
        # An error answer comes back as-is (the fetcher turns it into a problem), not as an exception.
        bad = client.get(base, path, {"offset": 99, "maxMessages": 5}, BINARY)
        assert bad.status_code == 400
        assert bad.as_httpx().json()["code"] == "OFFSET_OUT_OF_RANGE"
    finally:
        client.close()


def test_page_client_unreachable_member_is_a_transport_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    client = PageClient(timeout_s=2)
    with pytest.raises(TRANSPORT_ERRORS):
        client.get(f"http://127.0.0.1:{port}", "/health", {}, {})
    client.close()


def test_read_partition_yields_the_exact_range_with_first_keys(cluster, topic_name):
    cluster.create_topic(topic_name, queues=1)
    bodies = [f"m{i}".encode() for i in range(2500)]
    cluster.produce(topic_name, bodies, queue_id=0)  # keys k0, k1, ...
    part = QueuePartition(topic_name, "broker-s", 0, 700, 2300, (f"http://{cluster.brokers[0]}",))
    batches = list(read_partition(part, FetchOptions((cluster.namesrv,), (), page_size=500)))
    table = pa.Table.from_batches(batches)
    assert table.column("queueOffset").to_pylist() == list(range(700, 2300))
    assert table.column("value").to_pylist() == bodies[700:2300]
    assert table.column("key").to_pylist() == [f"k{i}" for i in range(700, 2300)]
    assert set(table.column("queueId").to_pylist()) == {0}
    assert all(len(b) <= 500 for b in batches)


def test_freeze_worker_heap_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other tests may already have run a source read() in this process: start from a clean state.
    gc.unfreeze()
    monkeypatch.setattr(pipeline.worker, "_frozen_pid", None)
    try:
        freeze_worker_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        # A frozen object may still be freed by its refcount (the count can drop), so a second
        # freeze is recognised by what it would add: these containers, created after the first.
        fresh = [[] for _ in range(5000)]
        freeze_worker_heap()  # already done in this process: no second collect/freeze
        assert gc.get_freeze_count() < frozen + len(fresh)
    finally:
        gc.unfreeze()
