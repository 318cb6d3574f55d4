"""A master SIGKILL while the official Python producer sends over gRPC for 20 s: no message whose
send succeeded is lost, and the same producer (no restart) sends again within seconds — not at
its next route refresh (10 s after its start, then every 30 s): its route names some queues at
the set's other members, its retry of a send that failed at the dead master lands there, and
that member forwards it to the new master."""

from __future__ import annotations

import signal
import time
import uuid
from typing import Any

import grpc
import httpx
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from broker.grpc.protocol import Code, pb, spb, spb_grpc
from tests.integration._grpc_harness import grpc_set

SEND_S = 20.0
KILL_AT_S = 3.0  # the client's first route refresh comes 7 s after the kill: later than RECOVERED_S
# Sends succeed again this soon after the kill (an election takes ~1-1.5 s) and fail no more.
RECOVERED_S = 5.0
QUEUES = 8


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
        # 8 queues: the longest run of route entries at the master the producer's attempts must outlast.
        cluster.create_topic(topic, queues=QUEUES)
        old = cluster.master()
        producer = Producer(
            ClientConfiguration(cluster.access_points, Credentials(), request_timeout=3), (topic,)
        )
        producer.startup()
        acked: list[int] = []
        failed = 0
        acked_after_kill: list[float] = []  # when each send after the kill returned, since the kill
        failed_after_kill: list[float] = []  # when each failed send after the kill started
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
                started = time.monotonic()
                try:
                    producer.send(msg)
                    acked.append(i)
                    if killed_at is not None:
                        acked_after_kill.append(time.monotonic() - killed_at)
                except Exception:
                    failed += 1
                    if killed_at is not None:
                        failed_after_kill.append(started - killed_at)
                    time.sleep(0.05)  # the client retries at once; do not spin while the route is stale
                i += 1
        finally:
            producer.shutdown()
        assert killed_at is not None
        assert acked_after_kill, f"the producer never sent again after the kill ({failed} failures)"
        assert acked_after_kill[0] < RECOVERED_S, (
            f"first send after the kill succeeded {acked_after_kill[0]:.1f}s after it ({failed} failures)"
        )
        late = [round(t, 2) for t in failed_after_kill if t >= RECOVERED_S]
        assert not late, f"sends started this long after the kill still failed: {late[:10]}"
        new = cluster.master(exclude=frozenset({old}))
        stored = pull_bodies(cluster.http[new], topic, QUEUES)
        missing = {f"f-{i}" for i in acked} - set(stored)
        assert not missing, f"{len(missing)} acked messages lost, e.g. {sorted(missing)[:5]}"
        assert len(stored) == len(set(stored)), "a message was stored twice"


def test_a_send_forwarded_to_a_master_that_hangs_goes_to_the_new_master(tmp_path) -> None:
    """A slave forwards a send to its master, which stops answering with its connections open
    (SIGSTOP: hung, or cut off). The set elects another master within a second or two; the
    forwarded call moves there (`forward.MOVED_CHECK_S`) instead of waiting out the client's
    deadline on the old one."""
    topic = "grpc-hung"
    with grpc_set(tmp_path) as cluster:
        cluster.create_topic(topic, queues=2)
        old = cluster.master()
        slave = next(sid for sid in cluster.grpc if sid != old)

        def send(body: bytes, deadline_s: float) -> tuple[Any, float]:
            msg = pb.Message(
                topic=pb.Resource(name=topic),
                system_properties=pb.SystemProperties(message_id="01" + uuid.uuid4().hex.upper(),
                                                      message_type=pb.NORMAL),
                body=body,
            )
            started = time.monotonic()
            with grpc.insecure_channel(cluster.grpc[slave]) as channel:
                resp = spb_grpc.MessagingServiceStub(channel).SendMessage(
                    spb.SendMessageRequest(messages=[msg]), metadata=[("x-mq-client-id", "t")],
                    timeout=deadline_s,
                )
            return resp, time.monotonic() - started

        resp, _ = send(b"before", 10)  # the slave's channel to the master is up
        assert resp.status.code == Code.OK, resp.status
        cluster.group.procs[old].send_signal(signal.SIGSTOP)
        try:
            resp, took = send(b"while-hung", 15)
            assert resp.status.code == Code.OK, resp.status
            assert took < 8, f"the forwarded send took {took:.1f} s (the old code waited out its 15 s)"
            new = cluster.master(exclude=frozenset({old}))
            stored = pull_bodies(cluster.http[new], topic, 2)
            assert sorted(stored) == ["before", "while-hung"], stored
        finally:
            cluster.group.procs[old].send_signal(signal.SIGCONT)
