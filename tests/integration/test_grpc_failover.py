"""A master SIGKILL while the official Python producer sends over gRPC for 20 s: no message whose
send succeeded is lost, and the same producer goes on sending (no restart) once its route names
the new master."""

from __future__ import annotations

import signal
import time

import httpx
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from tests.integration._grpc_harness import grpc_set

SEND_S = 20.0
KILL_AT_S = 3.0


def pull_bodies(http_addr: str, topic: str, queues: int) -> list[str]:
    bodies = []
    for q in range(queues):
        offset = 0
        while True:
            page = httpx.get(
                f"http://{http_addr}/topics/{topic}/queues/{q}/messages",
                params={"offset": offset, "maxMessages": 1024},
                timeout=10,
            ).json()
            bodies += [m["body"] for m in page["messages"]]
            if page["nextOffset"] >= page["maxOffset"]:
                break
            offset = page["nextOffset"]
    return bodies


def test_master_sigkill_during_python_producer_sends(tmp_path) -> None:
    topic = "grpc-failover"
    with grpc_set(tmp_path) as cluster:
        cluster.create_topic(topic)
        old = cluster.master()
        producer = Producer(
            ClientConfiguration(cluster.access_points, Credentials(), request_timeout=3), (topic,)
        )
        producer.startup()
        acked: list[int] = []
        failed = 0
        acked_after_kill = 0
        killed_at = None
        try:
            start = time.monotonic()
            i = 0
            while time.monotonic() - start < SEND_S:
                if killed_at is None and time.monotonic() - start >= KILL_AT_S:
                    cluster.group.kill(old, signal.SIGKILL)
                    killed_at = time.monotonic()
                msg = Message()
                msg.topic = topic
                msg.body = f"f-{i}".encode()
                try:
                    producer.send(msg)
                    acked.append(i)
                    if killed_at is not None:
                        acked_after_kill += 1
                except Exception:
                    failed += 1
                    time.sleep(0.05)  # the client retries at once; do not spin while the route is stale
                i += 1
        finally:
            producer.shutdown()
        assert killed_at is not None
        assert acked_after_kill > 0, f"the producer never sent again after the kill ({failed} failures)"
        new = cluster.master(exclude=frozenset({old}))
        stored = pull_bodies(cluster.http[new], topic, 4)
        missing = {f"f-{i}" for i in acked} - set(stored)
        assert not missing, f"{len(missing)} acked messages lost, e.g. {sorted(missing)[:5]}"
        assert len(stored) == len(set(stored)), "a message was stored twice"
