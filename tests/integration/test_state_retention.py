"""Broker state that outlives retention, on real `mqbroker` processes (issue 13).

Topic configs and consumer offsets are records in the commit log. Here retention really deletes
the files that held them: the data files are aged the way days of running would age them
(`os.utime`, `fileReservedTime=1` hour, every hour a `deleteWhen` hour) and the brokers' own
clean-up deletes them. The state must come back from the state snapshot the master re-wrote ahead
of them — after restarts, after a failover, on a member whose disk was wiped (it rejoins from the
leader's log, which no longer starts at index 0), and on that member once it is master.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.integration._ledgermq_procs import (
    CONF,
    ProcessGroup,
    free_port,
    start_broker,
    start_dledger_set,
    wait_http,
    wait_master,
)

pytestmark = pytest.mark.slow

FILE_BYTES = 64 * 1024
RETENTION = {
    "mappedFileSizeCommitLog": str(FILE_BYTES),
    "deleteWhen": ";".join(f"{h:02d}" for h in range(24)),  # retention may run at any hour
    "fileReservedTime": "1",  # hours
    "cleanResourceInterval": "500",  # ms (local mode; DLedger's clean-up runs every 100 ms)
    "defaultTopicQueueNums": "2",
}
EMPTY = "EmptyCfg"  # a topic with a custom config and never any data
DATA = "DataCfg"


def api(addr: str, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"http://{addr}{path}", timeout=10, **kw)


def create_state(addr: str) -> None:
    """The state under test, written first so the first data file holds its records."""
    for topic, body in ((EMPTY, {"readQueueNums": 3, "writeQueueNums": 5, "perm": 4}),
                        (DATA, {"readQueueNums": 2, "writeQueueNums": 2, "perm": 6})):
        r = api(addr, "PUT", f"/topics/{topic}", json=body)
        assert r.status_code == 200, r.text
    r = api(addr, "POST", f"/topics/{DATA}/messages", json={"messages": [{"body": "m", "queueId": q % 2}
                                                                          for q in range(20)]})
    assert r.status_code == 200, r.text
    r = api(addr, "PUT", "/consumers/g1/offsets", json={"topic": DATA, "offsets": {"0": 5, "1": 7}})
    assert r.status_code == 200, r.text


def produce_files(addr: str, files: float) -> None:
    """About `files` commit-log files of messages to DATA."""
    body = "x" * 4000
    for _ in range(int(files * FILE_BYTES / (16 * 4100)) + 1):
        r = api(addr, "POST", f"/topics/{DATA}/messages",
                json={"messages": [{"body": body, "queueId": q % 2} for q in range(16)]})
        assert r.status_code == 200, r.text


def roll_past_the_snapshot(addr: str, data_dir: Path, log_text) -> None:
    """Let any due state snapshot be written, then write until the log rolls into a new file: the
    last snapshot now lies in a file retention would delete if nothing held it (the growth since
    it stays under one file, so no new one is due)."""
    wait_until(lambda: _settled(log_text), "state snapshots to settle")
    files = len(list(data_dir.iterdir()))
    while len(list(data_dir.iterdir())) == files:
        r = api(addr, "POST", f"/topics/{DATA}/messages", json={"messages": [{"body": "y" * 4000}] * 4})
        assert r.status_code == 200, r.text


def _settled(log_text, quiet_s: float = 1.5) -> bool:
    """No snapshot written for `quiet_s` (the master writes a due one within a second)."""
    before = log_text().count("event=state_snapshot_written")
    time.sleep(quiet_s)
    return log_text().count("event=state_snapshot_written") == before


def check_state(addr: str) -> None:
    """What create_state wrote, as this broker answers it."""
    for topic, expected in ((EMPTY, (3, 5, 4)), (DATA, (2, 2, 6))):
        r = api(addr, "GET", f"/topics/{topic}")
        assert r.status_code == 200, f"{addr} {topic}: {r.text}"
        doc = r.json()
        assert (doc["readQueueNums"], doc["writeQueueNums"], doc["perm"]) == expected, doc
    r = api(addr, "GET", "/consumers/g1/offsets", params={"topic": DATA})
    assert r.status_code == 200, r.text
    assert {o["queueId"]: o["offset"] for o in r.json()["offsets"]} == {0: 5, 1: 7}, r.text


def age_and_wait_deleted(data_dir: Path, timeout_s: float = 30.0) -> None:
    """Age every data file but the last by two hours, then wait for the clean-up to delete the
    first one (the one holding the oldest records) — re-ageing files that were still written."""
    first = min(p.name for p in data_dir.iterdir())
    deadline = time.monotonic() + timeout_s
    while (data_dir / first).exists():
        assert time.monotonic() < deadline, f"{data_dir}/{first} was not deleted by retention"
        old = time.time() - 2 * 3600
        files = sorted(data_dir.iterdir())
        for path in files[:-1]:
            if path.exists():
                os.utime(path, (old, old))
        time.sleep(0.2)


def wait_until(pred, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def restart(group: ProcessGroup, name: str, conf: Path, addr: str) -> None:
    group.kill(name, signal.SIGTERM)
    proc = group.start(name, "broker", "-c", str(conf))
    wait_http(f"http://{addr}/health", proc=proc, timeout_s=30)


def settle_pop_state(addr: str) -> None:
    """Group consumption state: of three messages received, the 2nd and 3rd acked (acks above the
    group's committed offset, held in the replicated pop state), the 1st left in flight."""
    r = api(addr, "POST", "/topics/PopT/messages", json={"messages": [{"body": f"p{i}", "queueId": 0}
                                                                      for i in range(3)]})
    assert r.status_code == 200, r.text
    r = api(addr, "POST", "/consumers/pg/receive",
            json={"topic": "PopT", "maxMessages": 3, "invisibleMs": 60000})
    got = r.json()["messages"]
    assert [m["body"] for m in got] == ["p0", "p1", "p2"], r.text
    r = api(addr, "POST", "/consumers/pg/ack", json={"topic": "PopT",
                                                     "receiptHandles": [m["receiptHandle"] for m in got[1:]]})
    assert [x["status"] for x in r.json()["results"]] == ["OK", "OK"], r.text


def check_pop_state(addr: str) -> None:
    """After a restart the in-flight message comes back at once; the acked ones never do."""
    r = api(addr, "POST", "/consumers/pg/receive",
            json={"topic": "PopT", "maxMessages": 3, "invisibleMs": 60000})
    assert r.status_code == 200, r.text
    assert [m["body"] for m in r.json()["messages"]] == ["p0"], r.text


def test_local_state_survives_retention_and_restarts(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        addr = start_broker(group, tmp_path, CONF / "broker-single.conf", "b", None, **RETENTION)
        conf = tmp_path / "b.conf"
        create_state(addr)
        data_dir = tmp_path / "store-b" / "commitlog"
        for _ in range(2):  # two rounds: retention twice, restart twice
            produce_files(addr, 4)
            roll_past_the_snapshot(addr, data_dir, lambda: group.log_text("b"))
            age_and_wait_deleted(data_dir)
            restart(group, "b", conf, addr)
            check_state(addr)
        # Pop state in the snapshot: its records now lie before the snapshot the restart starts at.
        settle_pop_state(addr)
        written = group.log_text("b").count("event=state_snapshot_written")
        produce_files(addr, 1.5)  # a snapshot is due once the log grew a file
        wait_until(lambda: group.log_text("b").count("event=state_snapshot_written") > written,
                   "a state snapshot after the acks")
        restart(group, "b", conf, addr)
        check_pop_state(addr)
        check_state(addr)
    finally:
        group.stop_all()


def test_dledger_state_survives_retention_failover_and_a_wiped_member(tmp_path):
    pytest.importorskip("dledger.rpc.tcp")
    group = ProcessGroup(tmp_path)
    try:
        addrs = start_dledger_set(group, tmp_path, None, **RETENTION)
        master = wait_master(addrs)
        create_state(addrs[master])
        produce_files(addrs[master], 4)
        roll_past_the_snapshot(addrs[master], tmp_path / f"store-{master}" / f"dledger-{master}" / "data",
                               lambda: group.log_text(master))
        for sid in addrs:
            age_and_wait_deleted(tmp_path / f"store-{sid}" / f"dledger-{sid}" / "data")
        # Failover: the old master dies; the new one answers from its own log.
        group.kill(master)
        new_master = wait_master(addrs, exclude={master})
        check_state(addrs[new_master])
        proc = group.start(master, "broker", "-c", str(tmp_path / f"{master}.conf"))
        wait_http(f"http://{addrs[master]}/health", proc=proc, timeout_s=30)
        # A replaced machine: a follower's store wiped; the leader's log no longer starts at 0.
        wiped = next(sid for sid in addrs if sid not in (new_master, master))
        group.kill(wiped, signal.SIGTERM)
        shutil.rmtree(tmp_path / f"store-{wiped}")
        proc = group.start(wiped, "broker", "-c", str(tmp_path / f"{wiped}.conf"))
        wait_http(f"http://{addrs[wiped]}/health", proc=proc, timeout_s=30)
        deadline = time.monotonic() + 30
        while True:  # it catches up from the leader's begin index
            try:
                check_state(addrs[wiped])
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        # ... and can become master with that state.
        r = api(addrs[new_master], "POST", "/admin/leadership-transfer", json={"transfereeId": wiped})
        assert r.status_code == 200, r.text
        assert wait_master(addrs, timeout_s=20) == wiped
        check_state(addrs[wiped])
        produce_files(addrs[wiped], 0.2)
        # Every member restarted: the state is rebuilt from what is left of each log.
        for sid in addrs:
            group.kill(sid, signal.SIGTERM)
        for sid in addrs:
            group.start(sid, "broker", "-c", str(tmp_path / f"{sid}.conf"))
        for sid, addr in addrs.items():
            wait_http(f"http://{addr}/health", proc=group.procs[sid], timeout_s=30)
            check_state(addr)
    finally:
        group.stop_all()


@pytest.mark.parametrize("mode", ["local", "dledger"])
def test_full_disk_refuses_writes_with_507_in_both_modes(tmp_path, mode):
    """Past the disk-full ratio (`diskSpaceCleanForciblyRatio` + 5 %, set here below what the
    disk really uses) both modes refuse every write with 507 DISK_FULL — a definite refusal,
    nothing stored — and keep serving reads."""
    usage = shutil.disk_usage(tmp_path)
    forcibly = int(usage.used / usage.total * 100) - 7
    if forcibly < 1:
        pytest.skip("the disk is almost empty: no ratio to set below its use")
    group = ProcessGroup(tmp_path)
    try:
        if mode == "local":
            addr = start_broker(group, tmp_path, CONF / "broker-single.conf", "b", None,
                                diskSpaceCleanForciblyRatio=str(forcibly))
        else:
            pytest.importorskip("dledger.rpc.tcp")
            addr = start_broker(group, tmp_path, CONF / "dledger" / "broker-n0.conf", "b", None,
                                dLegerPeers=f"n0-127.0.0.1:{free_port()}",
                                diskSpaceCleanForciblyRatio=str(forcibly))
        deadline = time.monotonic() + 15
        while True:  # DLedger: once the member has elected itself (it is leader, yet cannot write)
            r = api(addr, "POST", "/topics/Full/messages", json={"messages": [{"body": "x"}]})
            if r.status_code == 507 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r.status_code == 507 and r.json()["code"] == "DISK_FULL", r.text
        r = api(addr, "PUT", "/topics/Admin", json={"readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
        assert r.status_code == 507 and r.json()["code"] == "DISK_FULL", r.text
        assert api(addr, "GET", "/topics").status_code == 200
    finally:
        group.stop_all()


@pytest.mark.parametrize("mode", ["local", "dledger"])
def test_retention_changed_while_the_broker_runs(tmp_path, mode):
    """`updateBrokerConfig` (PATCH /admin/config) of the retention keys reaches the clean-up at its
    next round, in both store modes: data files two hours old stay under the default 72 hours and
    go once fileReservedTime is 1; a force-clean ratio set under what the disk uses refuses writes
    (507) at once, a higher one takes them again; the change outlives a restart."""
    keys = {**RETENTION, "fileReservedTime": "72"}
    group = ProcessGroup(tmp_path)
    try:
        if mode == "local":
            addr = start_broker(group, tmp_path, CONF / "broker-single.conf", "b", None, **keys)
            data_dir = tmp_path / "store-b" / "commitlog"
        else:
            pytest.importorskip("dledger.rpc.tcp")
            addr = start_broker(group, tmp_path, CONF / "dledger" / "broker-n0.conf", "b", None,
                                dLegerPeers=f"n0-127.0.0.1:{free_port()}", **keys)
            data_dir = tmp_path / "store-b" / "dledger-n0" / "data"
            wait_until(lambda: api(addr, "GET", "/status").json().get("role") == "MASTER",
                       "the member to lead")
        produce_files(addr, 4)
        files = sorted(data_dir.iterdir())
        assert len(files) >= 4, files
        old = time.time() - 2 * 3600
        for path in files[:-1]:
            os.utime(path, (old, old))
        time.sleep(2)  # a few clean-up rounds under the 72 hours the broker started with
        assert files[0].exists(), "a file two hours old was deleted under fileReservedTime=72"

        r = api(addr, "PATCH", "/admin/config", json={"fileReservedTime": 1})
        assert r.status_code == 200, r.text
        assert r.json()["updated"] == {"fileReservedTime": {"old": "72", "new": "1"}}, r.text
        age_and_wait_deleted(data_dir)

        usage = shutil.disk_usage(tmp_path)
        forcibly = int(usage.used / usage.total * 100) - 7
        if forcibly >= 1:  # a disk almost empty has no ratio to set below its use
            r = api(addr, "PATCH", "/admin/config", json={"diskSpaceCleanForciblyRatio": str(forcibly)})
            assert r.status_code == 200, r.text
            wait_until(lambda: api(addr, "POST", "/topics/Full/messages",
                                   json={"messages": [{"body": "x"}]}).status_code == 507,
                       "writes refused past the new disk-full ratio", timeout_s=10)
            r = api(addr, "PATCH", "/admin/config", json={"diskSpaceCleanForciblyRatio": 90})
            assert r.status_code == 200, r.text
            wait_until(lambda: api(addr, "POST", "/topics/Full/messages",
                                   json={"messages": [{"body": "x"}]}).status_code == 200,
                       "writes taken again under the restored ratio", timeout_s=10)

        restart(group, "b", tmp_path / "b.conf", addr)
        props = api(addr, "GET", "/admin/config").json()["properties"]
        assert props["fileReservedTime"] == "1", props
    finally:
        group.stop_all()
