"""A master SIGKILL while the official Python producer sends over gRPC for 20 s: no message whose
send succeeded is lost, and the same producer (no restart) sends again within seconds — not at
its next route refresh (10 s after its start, then every 30 s): its route names some queues at
the set's other members, its retry of a send that failed at the dead master lands there, and
that member forwards it to the new master. The official Python push and simple consumers, too,
consume from the new master before their next route refresh: most entries of the push consumer's
route lead to the other members, where its QueryAssignment learns the new master, and the simple
consumer's receives at the queue named at another member are forwarded to the new master."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any

import grpc
import httpx
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

from broker.grpc.protocol import Code, pb, spb, spb_grpc
from client.producer import Producer as HttpProducer
from tests.integration._grpc_harness import GrpcSet, grpc_set

SEND_S = 20.0
KILL_AT_S = 3.0  # the client's first route refresh comes 7 s after the kill: later than RECOVERED_S
# Sends succeed again this soon after the kill (an election takes ~1-1.5 s) and fail no more.
RECOVERED_S = 5.0
QUEUES = 8


# The push consumer's master is killed this long after its start: after the client's first route
# refresh (10 s after its start), so its next one comes 28 s after the kill ...
PUSH_KILL_AFTER_START_S = 12.0
# ... and it consumes from the new master well before that (it asks for its assignment every
# 5 s, at a random entry of its route: 29 of its 36 entries lead to a live member).
PUSH_RESUMED_S = 25.0
# A simple consumer started with it receives again within about an election: its receives take
# the readable entries in turn, those at the dead master fail at once, the one at another member
# is forwarded to the new master.
SIMPLE_RESUMED_S = 10.0
META = (("x-mq-client-id", "failover-test"),)


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


def _addr(q: Any) -> str:
    a = q.broker.endpoints.addresses[0]
    return f"{a.host}:{a.port}"


def _assignment_at(cluster: GrpcSet, sid: str, topic: str) -> str | None:
    """The endpoint member `sid` assigns the topic's queues at (None: the call failed)."""
    try:
        with grpc.insecure_channel(cluster.grpc[sid]) as channel:
            resp = spb_grpc.MessagingServiceStub(channel).QueryAssignment(
                spb.QueryAssignmentRequest(topic=pb.Resource(name=topic), group=pb.Resource(name="g")),
                metadata=META, timeout=3,
            )
    except grpc.RpcError:
        return None
    if resp.status.code != Code.OK or not resp.assignments:
        return None
    return _addr(resp.assignments[0].message_queue)


def test_python_push_and_simple_consumers_consume_from_the_new_master_before_their_route_refresh(
    tmp_path,
) -> None:
    """Before: the push consumer kept asking the dead master for its assignment until its route
    refresh (measured 29 s without consuming), and the simple consumer's receives all went to the
    dead master until then; now the push consumer moves within a few of its 5 s scans and the
    simple consumer receives again about an election after the kill."""
    topic = "grpc-push-failover"
    with grpc_set(tmp_path) as cluster:
        cluster.create_topic(topic, queues=QUEUES)
        old = cluster.master()
        # The route as the consumer caches it: most entries at the other members (NONE entries
        # among them), every usable one as before.
        with grpc.insecure_channel(cluster.grpc[old]) as channel:
            route = spb_grpc.MessagingServiceStub(channel).QueryRoute(
                spb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=META, timeout=10
            )
        entries = list(route.message_queues)
        at_old = sum(_addr(q) == cluster.grpc[old] for q in entries)
        assert (len(entries) - at_old) / len(entries) >= 0.75, [(q.id, _addr(q)) for q in entries]
        usable = [q for q in entries if q.permission != pb.NONE]
        assert sorted({q.id for q in usable}) == list(range(QUEUES))

        consumed: dict[str, float] = {}
        lock = threading.Lock()

        class Listener(MessageListener):
            def consume(self, msg) -> ConsumeResult:
                with lock:
                    consumed.setdefault(msg.body.decode(), time.monotonic())
                return ConsumeResult.SUCCESS

        received: dict[str, float] = {}  # the simple consumer's group: body -> first received
        stop = threading.Event()

        def receive_loop(simple: SimpleConsumer) -> None:
            while not stop.is_set():
                try:
                    msgs = simple.receive(16, 15)
                except Exception:  # a receive at the dead master: the next entry is tried next
                    time.sleep(0.05)
                    continue
                for m in msgs:
                    with lock:
                        received.setdefault(m.body.decode(), time.monotonic())
                    try:
                        simple.ack(m)
                    except Exception:  # received at the killed member just before the kill
                        pass

        def wait_received(bodies: list[str], until: float) -> None:
            while time.monotonic() < until:
                with lock:
                    if all(b in consumed and b in received for b in bodies):
                        return
                time.sleep(0.05)

        config = ClientConfiguration(cluster.access_points, Credentials(), request_timeout=3)
        consumer = PushConsumer(config, "g-push-failover", Listener(), {topic: FilterExpression()})
        simple = SimpleConsumer(config, "g-simple-failover", {topic: FilterExpression()}, await_duration=2)
        started = time.monotonic()
        consumer.startup()
        simple.startup()
        receiver = threading.Thread(target=receive_loop, args=(simple,), daemon=True)
        receiver.start()
        try:
            with HttpProducer(cluster.namesrv) as producer:
                before = [f"before-{i}" for i in range(20)]
                for body in before:
                    producer.send(topic, body)
                wait_received(before, time.monotonic() + 30)
                assert all(b in consumed for b in before), sorted(set(before) - set(consumed))
                assert all(b in received for b in before), sorted(set(before) - set(received))
                time.sleep(max(0.0, started + PUSH_KILL_AFTER_START_S - time.monotonic()))
                cluster.group.kill(old, signal.SIGKILL)
                killed = time.monotonic()
                after = []
                while time.monotonic() < killed + 4:
                    body = f"after-{len(after)}"
                    producer.send(topic, body)  # the SDK finds the new master within its retries
                    after.append(body)
                    time.sleep(0.1)
                wait_received(after, killed + 45)
            new = cluster.master(exclude=frozenset({old}))
            # Every member left assigns the queues at the new master (a slave knows it from its log).
            for sid in cluster.grpc:
                if sid != old:
                    deadline = time.monotonic() + 10
                    while _assignment_at(cluster, sid, topic) != cluster.grpc[new]:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.2)
                    assert _assignment_at(cluster, sid, topic) == cluster.grpc[new], sid
        finally:
            stop.set()
            receiver.join(30)
            simple.shutdown()
            consumer.shutdown()
        missing = [b for b in after if b not in consumed]
        assert not missing, f"{len(missing)} of {len(after)} messages sent after the kill never consumed"
        resumed = min(consumed[b] for b in after) - killed
        assert resumed < PUSH_RESUMED_S, (
            f"the push consumer took {resumed:.1f} s after the kill to consume again (its route refresh "
            f"came {started + 40 - killed:.0f} s after it)"
        )
        simple_resumed = min(received[b] for b in after if b in received) if received else float("nan")
        print(f"after the kill: push consumer consuming again {resumed:.1f} s, simple consumer "
              f"receiving again {simple_resumed - killed:.1f} s")
        missing = [b for b in after if b not in received]
        assert not missing, f"{len(missing)} of {len(after)} messages sent after the kill never received"
        resumed = min(received[b] for b in after) - killed
        assert resumed < SIMPLE_RESUMED_S, (
            f"the simple consumer took {resumed:.1f} s after the kill to receive again (its route "
            f"refresh came {started + 40 - killed:.0f} s after it)"
        )
