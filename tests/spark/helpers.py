"""Test helpers for the Spark tests: talk to the real brokers over HTTP (produce, topics, pull)."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.integration._ledgermq_procs import ProcessGroup


@dataclass
class Cluster:
    """Addresses of a running name server and broker set, plus the processes behind them."""

    namesrv: str
    brokers: list[str]
    procs: ProcessGroup
    tmp: Path
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def status(self, addr: str) -> dict | None:
        """``GET /status`` of one member, or None if it does not answer."""
        try:
            r = self.http.get(f"http://{addr}/status", timeout=2)
            return r.json() if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def master(self) -> str | None:
        """The member that says it is MASTER, if any."""
        for addr in self.brokers:
            st = self.status(addr)
            if st and st.get("role") == "MASTER":
                return addr
        return None

    def wait_master(self, timeout_s: float = 30.0, exclude: str | None = None) -> str:
        """Poll until some member (other than ``exclude``) is master; returns its address."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for addr in self.brokers:
                if addr == exclude:
                    continue
                st = self.status(addr)
                if st and st.get("role") == "MASTER":
                    return addr
            time.sleep(0.1)
        raise AssertionError(f"no master among {self.brokers} after {timeout_s}s")

    def create_topic(self, topic: str, queues: int = 4, wait_route: bool = True) -> None:
        """Create (or resize) ``topic`` on the master and wait until the name server routes it."""
        master = self.wait_master()
        body = {"readQueueNums": queues, "writeQueueNums": queues, "perm": 6}
        r = self.http.put(f"http://{master}/topics/{topic}", json=body)
        assert r.status_code in (200, 201), r.text
        if wait_route:
            self.wait_route(topic, queues)

    def wait_route(self, topic: str, queues: int, timeout_s: float = 40.0) -> None:
        """Poll ``GET /routes/{topic}`` until it shows ``queues`` read queues."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            r = self.http.get(f"http://{self.namesrv}/routes/{topic}")
            if r.status_code == 200 and any(b.get("readQueueNums") == queues for b in r.json()["brokers"]):
                return
            last = r.text
            time.sleep(0.1)
        raise AssertionError(f"route of {topic} never showed {queues} queues: {last}")

    def produce(
        self,
        topic: str,
        bodies: list[bytes],
        *,
        queue_id: int | None = None,
        batch: int = 1000,
        keys: bool = True,
    ) -> list[tuple[int, int]]:
        """Produce ``bodies`` in batches (to ``queue_id`` if given); returns (queue, offset) pairs."""
        out: list[tuple[int, int]] = []
        for i in range(0, len(bodies), batch):
            chunk = bodies[i : i + batch]
            msgs = []
            for j, b in enumerate(chunk):
                m = {"body": base64.b64encode(b).decode(), "bodyEncoding": "base64", "queueId": queue_id}
                if keys:
                    m["keys"] = [f"k{i + j}"]
                msgs.append(m)
            out.extend(self._post(topic, msgs))
        return out

    def _post(self, topic: str, msgs: list[dict], timeout_s: float = 30.0) -> list[tuple[int, int]]:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            master = self.master()
            if master is not None:
                try:
                    r = self.http.post(f"http://{master}/topics/{topic}/messages", json={"messages": msgs})
                    if r.status_code == 200:
                        return [(x["queueId"], x["queueOffset"]) for x in r.json()["results"]]
                    last = r.text
                except httpx.HTTPError as exc:
                    last = exc
            time.sleep(0.1)
        raise AssertionError(f"produce to {topic} failed: {last}")

    def queue_ranges(self, topic: str, addr: str | None = None) -> dict[int, tuple[int, int]]:
        """``{queueId: (minOffset, maxOffset)}`` from ``GET /topics/{topic}``."""
        addr = addr or self.wait_master()
        r = self.http.get(f"http://{addr}/topics/{topic}")
        assert r.status_code == 200, r.text
        return {q["queueId"]: (q["minOffset"], q["maxOffset"]) for q in r.json()["queues"]}

    def pull_all(self, topic: str) -> list[dict]:
        """Every message of ``topic`` (all queues, from min to max offset) through the pull API."""
        addr = self.wait_master()
        out = []
        for qid, (lo, hi) in sorted(self.queue_ranges(topic, addr).items()):
            off = lo
            while off < hi:
                r = self.http.get(
                    f"http://{addr}/topics/{topic}/queues/{qid}/messages",
                    params={"offset": off, "maxMessages": 500, "bodyEncoding": "base64"},
                )
                assert r.status_code == 200, r.text
                msgs = r.json()["messages"]
                assert msgs, f"empty page at {topic}/{qid}@{off} < {hi}"
                for m in msgs:
                    m["value"] = base64.b64decode(m["body"])
                out.extend(msgs)
                off = msgs[-1]["queueOffset"] + 1
        return out
