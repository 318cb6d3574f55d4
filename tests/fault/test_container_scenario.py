"""Matrix row 14: a broker container crash. One `mqbrokercontainer` process hosts member n0 of
broker set A (its preferred leader, so A's master) and member n0 of broker set B (a slave: B
prefers n1). SIGKILL the container under load: A must elect a new master within 5 s, B must keep
its master, the name server's route for A must follow the new master, and after the container
restarts both groups hold every acked write with identical committed bytes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fault.cluster import FaultCluster, free_ports, write_properties
from tests.fault.history import History
from tests.fault.scenario import _save, assert_safe, brief, check_history
from tests.fault.workload import Workload, WorkloadConfig, final_reads

pytestmark = [pytest.mark.timeout(240), pytest.mark.fault_full]


async def _wait_leader_is(cluster: FaultCluster, name: str, timeout_s: float = 20.0) -> None:
    """Until `name` leads `cluster`, asking the current leader to transfer if needed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leader = await cluster.wait_leader()
        if leader.name == name:
            return
        with contextlib.suppress(httpx.HTTPError):
            await cluster.http.post(f"{leader.url}/admin/leadership-transfer", json={"transfereeId": name},
                                    timeout=3)
        await asyncio.sleep(0.5)
    raise AssertionError(f"{name} never became leader of {cluster.broker_name}")


async def _route_master(http: httpx.AsyncClient, namesrv_port: int, topic: str, broker: str) -> str | None:
    try:
        r = await http.get(f"http://127.0.0.1:{namesrv_port}/routes/{topic}", timeout=1)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    for b in r.json().get("brokers", []):
        if b.get("brokerName") == broker:
            return b.get("addrs", {}).get("0")
    return None


def _spawn_container(conf: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "broker.container", "-c", str(conf)],
                                cwd=Path(__file__).resolve().parents[2], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


async def test_row14_broker_container_crash(tmp_path: Path) -> None:
    hist = {"A": History(tmp_path / "a.jsonl"), "B": History(tmp_path / "b.jsonl")}
    a = FaultCluster(tmp_path / "a", hist["A"], broker_name="broker-a", hosted={"n0"},
                     conf_overrides={"preferredLeaderIds": "n0"})
    b = FaultCluster(tmp_path / "b", hist["B"], broker_name="broker-b", hosted={"n0"},
                     conf_overrides={"preferredLeaderIds": "n1"}, namesrv_port=a.namesrv_port)
    container: subprocess.Popen | None = None
    hosted = f"{a.member('n0').conf_path}:{b.member('n0').conf_path}"
    conf = write_properties([], {"listenPort": free_ports(1)[0], "namesrvAddr": f"127.0.0.1:{a.namesrv_port}",
                                 "brokerConfigPaths": hosted}, tmp_path / "container.conf")
    reports = {}
    try:
        await a.start()
        await b.start()
        container = _spawn_container(conf, tmp_path / "container.log")
        for c in (a, b):
            c.attach("n0", container)
            await c.wait_member_up(c.member("n0"))
        await _wait_leader_is(a, "n0")
        await _wait_leader_is(b, "n1")
        loads = {"A": Workload(a, hist["A"], WorkloadConfig(topic="jepsenA", producers=2, pollers=1), seed=1),
                 "B": Workload(b, hist["B"], WorkloadConfig(topic="jepsenB", producers=2, pollers=1), seed=2)}
        for w in loads.values():
            await w.start()
        await asyncio.sleep(3)
        b_term = b.max_term()
        a.kill(a.member("n0"))  # kills the container: A's master and B's slave together
        b.kill(b.member("n0"))  # already dead: records the fault in B's history
        t_kill = time.monotonic()
        new_a = await a.wait_leader(timeout_s=10, exclude="n0")
        route_after = None
        while time.monotonic() - t_kill < 15:
            if await _route_master(a.http, a.namesrv_port, "jepsenA", "broker-a") == new_a.addr:
                route_after = round(time.monotonic() - t_kill, 2)
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        container = _spawn_container(conf, tmp_path / "container.log")
        for c in (a, b):
            c.attach("n0", container)
            await c.wait_member_up(c.member("n0"))
        await asyncio.sleep(3)
        for w in loads.values():
            await w.stop()
        for name, c in (("A", a), ("B", b)):
            view = await c.wait_converged(timeout_s=40)
            reports[name] = {"scenario": f"row14_container_{name}", "row": 14, "seed": 0,
                             "read_back_per_member": await final_reads(c, hist[name], loads[name].cfg)}
            reports[name].update(check_history(sorted(hist[name].events, key=lambda e: e.time_ns),
                                               c.member_logs(view)))
        reports["A"]["extra"] = {"route_follows_new_master_s": route_after, "new_master": new_a.name}
        reports["B"]["extra"] = {"term_before": b_term, "term_after": b.max_term()}
    finally:
        for h in hist.values():
            h.close()
        await b.stop()
        await a.stop()
        if container is not None and container.poll() is None:
            os.kill(container.pid, signal.SIGKILL)
            container.wait(5)
        for r in reports.values():
            _save(r["scenario"], r, tmp_path)
    assert_safe(reports["A"])
    assert_safe(reports["B"], new_master=False)
    assert reports["A"]["extra"]["route_follows_new_master_s"] is not None, brief(reports["A"])
    # B's master was not in the container: B keeps its leader and term.
    assert reports["B"]["extra"]["term_after"] == reports["B"]["extra"]["term_before"], brief(reports["B"])
