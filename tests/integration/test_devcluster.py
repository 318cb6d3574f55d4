"""`ledgermq-run --sets 2` (broker/devcluster.py) on loopback: a name server and two 3-member broker
sets, broker-b on broker-a's ports + 100; one topic spans both; SIGTERM stops every process.

The failover across sets (kill a whole set mid-load) is tests/integration/test_multi_set.py."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from broker.devcluster import SET_PORT_STEP, set_overrides
from client import Admin, Producer
from tests.integration._ledgermq_procs import CONF, REPO, read_conf, write_conf
from tests.ports import free_port

pytestmark = pytest.mark.slow


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_with_next_set_free() -> int:
    """A free port whose broker-b twin (port + SET_PORT_STEP) is free too."""
    while True:
        port = free_port()
        if port + SET_PORT_STEP < 65536 and _bindable(port + SET_PORT_STEP):
            return port


def _conf_dir(root: Path) -> tuple[Path, str, list[int]]:
    """conf/namesrv.conf and conf/dledger/broker-n{0,1,2}.conf on free ports; (dir, namesrv, HTTP ports)."""
    ns = f"127.0.0.1:{free_port()}"
    write_conf(CONF / "namesrv.conf", root / "namesrv.conf", {"listenPort": ns.rpartition(":")[2]})
    http = [_port_with_next_set_free() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{_port_with_next_set_free()}" for i in range(3))
    for i in range(3):
        src = CONF / "dledger" / f"broker-n{i}.conf"
        values = {"listenPort": str(http[i]), "dLegerPeers": peers, "namesrvAddr": ns}
        if "grpcServerPort" in dict(read_conf(src)):
            values["grpcServerPort"] = str(_port_with_next_set_free())
        write_conf(src, root / "dledger" / f"broker-n{i}.conf", values)
    return root, ns, http


def test_set_overrides_rename_the_set_and_move_every_port(tmp_path):
    conf = write_conf(
        CONF / "dledger" / "broker-n1.conf",
        tmp_path / "n1.conf",
        {"grpcServerPort": "18082", "dLegerPeers": "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-h:40913"},
    )
    assert set_overrides(conf, 0) == {}
    assert set_overrides(conf, 2) == {
        "brokerName": "broker-c",
        "dLegerGroup": "broker-c",
        "listenPort": str(10921 + 2 * SET_PORT_STEP),
        "grpcServerPort": str(18082 + 2 * SET_PORT_STEP),
        "dLegerPeers": f"n0-127.0.0.1:{40911 + 200};n1-127.0.0.1:{40912 + 200};n2-h:{40913 + 200}",
    }


def test_ledgermq_run_sets_2_starts_two_sets_that_one_topic_spans(tmp_path):
    conf_dir, ns, http = _conf_dir(tmp_path / "conf")
    out_path = tmp_path / "run.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.devcluster", "--sets", "2", "--conf-dir", str(conf_dir),
             "--store-dir", str(tmp_path / "store"), "--wait-master-s", "60",
             "--console-port", str(free_port())],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while "Store and logs:" not in out_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out_path.read_text()
            time.sleep(0.2)
        banner = out_path.read_text()
        assert "broker set broker-a:" in banner and "broker set broker-b:" in banner, banner
        assert "no master elected yet" not in banner, banner

        def registered() -> dict:
            brokers = httpx.get(f"http://{ns}/cluster", timeout=5).json()["brokers"]
            return {name: b for name, b in brokers.items() if b.get("masterAddr")}

        deadline = time.monotonic() + 30
        while set(registered()) != {"broker-a", "broker-b"} and time.monotonic() < deadline:
            time.sleep(0.2)
        view = registered()
        assert set(view) == {"broker-a", "broker-b"}, view
        ports = {
            name: sorted(int(addr.rpartition(":")[2]) for addr in b["addrs"].values())
            for name, b in view.items()
        }
        assert ports["broker-a"] == sorted(http)
        assert ports["broker-b"] == sorted(p + SET_PORT_STEP for p in http)

        with Admin(ns) as admin:
            assert set(admin.update_topic("spans", 2, 2)) == {"broker-a", "broker-b"}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = httpx.get(f"http://{ns}/routes/spans", timeout=5)
            if r.status_code == 200 and len(r.json()["brokers"]) == 2:
                break
            time.sleep(0.2)
        with Producer(ns) as producer:
            sets = {producer.send("spans", f"m{i}").broker_name for i in range(20)}
        assert sets == {"broker-a", "broker-b"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, out_path.read_text()
    assert "Stopped." in out_path.read_text()
    for port in [*http, *(p + SET_PORT_STEP for p in http)]:
        assert _bindable(port), f"port {port} still served after ledgermq-run stopped"
