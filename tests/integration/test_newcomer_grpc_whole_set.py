"""A RocketMQ application meets the worst day: every member of its broker set is killed (SIGKILL)
at once while the official Python producer sends and a SimpleConsumer receives over gRPC, and the
set comes back on the same disks. The same client objects carry on without a restart: no message
whose send succeeded is lost, none is stored twice, and the consumer gets every one of them."""

from __future__ import annotations

import signal
import threading
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from tests.integration._grpc_harness import grpc_set
from tests.integration.test_grpc_failover import pull_bodies

TOPIC = "whole-set"
SEND_S = 14.0
KILL_AT_S = 3.0
DOWN_S = 2.0
MEMBERS = ("n0", "n1", "n2")


def test_official_clients_carry_on_after_the_whole_set_is_killed_and_restarted(tmp_path) -> None:
    with grpc_set(tmp_path) as cluster:
        cluster.create_topic(TOPIC)
        config = ClientConfiguration(cluster.access_points, Credentials(), request_timeout=3)
        producer = Producer(config, (TOPIC,))
        producer.startup()
        consumer = SimpleConsumer(config, "whole-set-g", {TOPIC: FilterExpression()}, await_duration=2)
        consumer.startup()
        consumed: list[str] = []
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                try:
                    for m in consumer.receive(32, 30):
                        consumed.append(m.body.decode())
                        consumer.ack(m)
                except Exception:  # the set is down or electing: the application retries
                    time.sleep(0.2)

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        acked: list[str] = []
        acked_after_restart = 0
        killed_at = restarted_at = None
        try:
            start = time.monotonic()
            i = 0
            while time.monotonic() - start < SEND_S:
                now = time.monotonic()
                if killed_at is None and now - start >= KILL_AT_S:
                    for sid in MEMBERS:
                        cluster.group.kill(sid, signal.SIGKILL)
                    killed_at = now
                if killed_at is not None and restarted_at is None and now - killed_at >= DOWN_S:
                    for sid in MEMBERS:  # same conf, same store: the machines came back
                        cluster.group.start(sid, "broker", "-c", str(cluster.workdir / f"{sid}.conf"))
                    restarted_at = now
                msg = Message()
                msg.topic, msg.body = TOPIC, f"w-{i}".encode()
                try:
                    producer.send(msg)
                    acked.append(f"w-{i}")
                    acked_after_restart += restarted_at is not None
                except Exception:
                    time.sleep(0.05)
                i += 1
            assert acked_after_restart > 0, "the producer never sent again after the set came back"
            deadline = time.monotonic() + 30
            while set(acked) - set(consumed) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            reader.join(40)
            producer.shutdown()
            consumer.shutdown()
        stored = pull_bodies(cluster.http[cluster.master()], TOPIC, 4)
        lost = set(acked) - set(stored)
        assert not lost, f"{len(lost)} acked messages lost, e.g. {sorted(lost)[:5]}"
        assert len(stored) == len(set(stored)), "a message was stored twice"
        unseen = set(acked) - set(consumed)
        assert not unseen, f"{len(unseen)} acked never consumed, e.g. {sorted(unseen)[:5]}"
