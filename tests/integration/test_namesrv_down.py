"""The SDK with its name server gone: clients keep their cached routes (RocketMQ's do), and when a
set's master dies meanwhile they learn the new one from the set's members (`GET /health`,
`RouteCache._without_name_servers`) instead of sending to the dead one until the name server
returns. A consumer whose request failed keeps its route too (it used to drop it, and then had
none to ask while the name server was down)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from client import ConsumeResult, Producer, PushConsumer
from tests.integration._ledgermq_procs import (
    CONF,
    ProcessGroup,
    start_broker,
    start_dledger_set,
    start_namesrv,
    wait_master,
)
from tests.integration.test_batching_producer import create, read_queue
from tests.ports import free_port

pytestmark = pytest.mark.slow


def test_with_the_name_server_gone_clients_follow_a_new_master_through_the_sets_members(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        ns = start_namesrv(group, tmp_path)
        addrs = start_dledger_set(group, tmp_path, ns)
        old = wait_master(addrs, timeout_s=30)
        create(addrs[old], ns, "orphan", 2)
        pushed: list[str] = []
        lock = threading.Lock()

        def on_message(msg) -> ConsumeResult:
            with lock:
                pushed.append(msg.body.decode())
            return ConsumeResult.SUCCESS

        with PushConsumer("orphan-g", "orphan", on_message, ns), Producer(ns, send_timeout_s=20) as p:
            p.send("orphan", "before")  # routes cached by both clients
            deadline = time.monotonic() + 20
            while "before" not in pushed and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "before" in pushed
            group.kill("namesrv", signal.SIGKILL)
            group.kill(old, signal.SIGKILL)
            new = wait_master(addrs, timeout_s=30, exclude={old})
            sent = [f"m{i}" for i in range(50)]
            for body in sent:
                p.send("orphan", body)  # raised BrokerUnreachableError until the name server came back
            deadline = time.monotonic() + 30
            while not set(sent) <= set(pushed) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert set(sent) <= set(pushed), f"the push consumer missed {len(set(sent) - set(pushed))} of 50"
        stored = [m["body"] for q in (0, 1) for m in read_queue(addrs[new], "orphan", q)]
        assert sorted(stored) == sorted(["before", *sent])
    finally:
        group.stop_all()


def test_a_broker_registers_within_seconds_once_its_name_server_is_reachable(tmp_path):
    """A beat that reached no name server is tried again after 1, 2, 4 … s instead of a whole
    registerNameServerPeriod (30 s) later: a member cut off during a failover (its entry replaced
    by the new master's) is back in the cluster view soon after the network heals."""
    group = ProcessGroup(tmp_path)
    try:
        ns = f"127.0.0.1:{free_port()}"
        start_broker(group, tmp_path, CONF / "broker-single.conf", "lone", ns)
        deadline = time.monotonic() + 10
        while "event=register_failed" not in group.log_text("lone") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "event=register_failed" in group.log_text("lone")
        time.sleep(1.5)  # a few failed beats: the retry has backed off to a few seconds
        start_namesrv(group, tmp_path, listenPort=ns.rsplit(":", 1)[1])
        up = time.monotonic()
        brokers: dict = {}
        while time.monotonic() - up < 20:
            brokers = httpx.get(f"http://{ns}/cluster", timeout=5).json()["brokers"]
            if brokers:
                break
            time.sleep(0.1)
        assert brokers, "the broker did not register within 20 s of its name server coming up"
        assert time.monotonic() - up < 10, f"registered only {time.monotonic() - up:.1f} s after"
    finally:
        group.stop_all()
