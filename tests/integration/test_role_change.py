"""Role change with three real `mqbroker` processes (one DLedger group, real TCP, HTTP API):
kill the master under load; a slave becomes master with every acknowledged message exactly once,
in queue-offset order, no gap; committed consumer offsets survive; the old master's address fails
cleanly and the new master takes writes; the old master restarts as a slave whose consume queues
equal the master's."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.integration._ledgermq_procs import CONF, ProcessGroup, free_port, wait_http, write_conf

pytest.importorskip("dledger.rpc.tcp")
pytestmark = pytest.mark.slow

TOPIC = "Failover"
GROUP = "cg"


@pytest.fixture
def cluster(tmp_path):
    procs = ProcessGroup(tmp_path)
    peer_ports = [free_port() for _ in range(3)]
    http_ports = [free_port() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(peer_ports))
    confs = []
    for i in range(3):
        confs.append(write_conf(CONF / "dledger" / f"broker-n{i}.conf", tmp_path / f"n{i}.conf", {
            "listenPort": str(http_ports[i]), "storePathRootDir": str(tmp_path / f"store-n{i}"),
            "namesrvAddr": "", "dLegerPeers": peers, "mappedFileSizeCommitLog": str(1 << 20),
            "defaultTopicQueueNums": "2", "grpcServerPort": "0"}))
    addrs = [f"127.0.0.1:{p}" for p in http_ports]

    def start(i: int) -> None:
        proc = procs.start(f"n{i}", "broker", "-c", str(confs[i]))
        wait_http(f"http://{addrs[i]}/health", timeout_s=30, proc=proc)

    try:
        for i in range(3):
            start(i)
        yield procs, addrs, start
    finally:
        procs.stop_all()


def status(addr: str) -> dict | None:
    try:
        r = httpx.get(f"http://{addr}/status", timeout=2)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def find_master(addrs: list[str], timeout_s: float = 20.0, exclude: str | None = None) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for a in addrs:
            if a != exclude:
                st = status(a)
                if st and st["role"] == "MASTER":
                    return a
        time.sleep(0.05)
    raise AssertionError(f"no master among {addrs} after {timeout_s}s")


class Producer(threading.Thread):
    """Produces numbered messages with idempotency keys; on failure retries the same key at
    whichever broker is master. Records every acknowledged result."""

    def __init__(self, addrs: list[str]) -> None:
        super().__init__(daemon=True)
        self.addrs = addrs
        self.master = find_master(addrs)
        self.acked: dict[str, tuple[int, int]] = {}
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        i = 0
        with httpx.Client(timeout=5) as c:
            while not self.stop.is_set():
                body = f"m{i}"
                doc = {"messages": [{"body": body, "queueId": i % 2, "idempotencyKey": body}]}
                while not self.stop.is_set():
                    try:
                        r = c.post(f"http://{self.master}/topics/{TOPIC}/messages", json=doc)
                        if r.status_code == 200:
                            res = r.json()["results"][0]
                            self.acked[body] = (res["queueId"], res["queueOffset"])
                            break
                        self.errors.append(f"{r.status_code} {r.json().get('code')}")
                    except httpx.HTTPError as exc:
                        self.errors.append(type(exc).__name__)
                    time.sleep(0.05)
                    try:
                        self.master = find_master(self.addrs, timeout_s=1)
                    except AssertionError:
                        pass
                i += 1


def pull_all(addr: str, queue_id: int) -> list[dict]:
    out, offset = [], 0
    while True:
        r = httpx.get(f"http://{addr}/topics/{TOPIC}/queues/{queue_id}/messages",
                      params={"offset": offset, "maxMessages": 256}, timeout=5)
        assert r.status_code == 200, r.text
        doc = r.json()
        out += doc["messages"]
        if doc["nextOffset"] >= doc["maxOffset"]:
            return out
        offset = doc["nextOffset"]


def test_kill_master_under_load(cluster):
    procs, addrs, start = cluster
    old = find_master(addrs)
    old_name = f"n{addrs.index(old)}"
    prod = Producer(addrs)
    prod.start()
    try:
        deadline = time.monotonic() + 20
        while len(prod.acked) < 100 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(prod.acked) >= 100, prod.errors[-5:]
        r = httpx.put(f"http://{old}/consumers/{GROUP}/offsets", json={"topic": TOPIC,
                      "offsets": {"0": 7, "1": 11}}, timeout=5)
        assert r.status_code == 200, r.text
        before_kill = len(prod.acked)
        procs.kill(old_name)
        new = find_master(addrs, timeout_s=20, exclude=old)
        deadline = time.monotonic() + 20
        while len(prod.acked) < before_kill + 100 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(prod.acked) >= before_kill + 100, prod.errors[-5:]
    finally:
        prod.stop.set()
        prod.join(10)
    new = find_master(addrs, exclude=old)
    # every acked message exactly once, in queue-offset order, no gap
    for q in (0, 1):
        msgs = pull_all(new, q)
        assert [m["queueOffset"] for m in msgs] == list(range(len(msgs)))
        bodies = [m["body"] for m in msgs]
        assert len(bodies) == len(set(bodies)), "a message is stored twice"
        acked_q = {b: o for b, (qq, o) in prod.acked.items() if qq == q}
        for b, o in acked_q.items():
            assert o < len(bodies) and bodies[o] == b, f"acked {b} at {q}/{o} missing"
    r = httpx.get(f"http://{new}/consumers/{GROUP}/offsets", params={"topic": TOPIC}, timeout=5)
    got = {o["queueId"]: o["offset"] for o in r.json()["offsets"]}
    assert got == {0: 7, 1: 11}
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"http://{old}/topics/{TOPIC}/messages", json={"messages": [{"body": "x"}]}, timeout=2)
    r = httpx.post(f"http://{new}/topics/{TOPIC}/messages", json={"messages": [{"body": "after"}]}, timeout=5)
    assert r.status_code == 200
    # the old master comes back as a slave and catches up
    start(addrs.index(old))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        st = status(old)
        if st and st["role"] == "SLAVE" and st["masterAddr"] == new:
            break
        time.sleep(0.1)
    assert st["role"] == "SLAVE" and st["brokerId"] == addrs.index(old) + 1 and st["masterAddr"] == new
    r = httpx.post(f"http://{old}/topics/{TOPIC}/messages", json={"messages": [{"body": "x"}]}, timeout=5)
    assert r.status_code == 421 and r.json()["code"] == "NOT_MASTER" and r.json()["masterAddr"] == new
    for q in (0, 1):
        want = [(m["queueOffset"], m["commitLogOffset"], m["msgId"]) for m in pull_all(new, q)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            have = [(m["queueOffset"], m["commitLogOffset"], m["msgId"]) for m in pull_all(old, q)]
            if have == want:
                break
            time.sleep(0.2)
        assert have == want
    r = httpx.get(f"http://{old}/consumers/{GROUP}/offsets", params={"topic": TOPIC}, timeout=5)
    assert {o["queueId"]: o["offset"] for o in r.json()["offsets"]} == {0: 7, 1: 11}
