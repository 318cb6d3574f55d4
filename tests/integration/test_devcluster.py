"""`ledgermq-run --sets 2` (broker/devcluster.py) on loopback: a name server and two 3-member broker
sets, broker-b on broker-a's ports + 100; one topic spans both; SIGTERM stops every process.

The failover across sets (kill a whole set mid-load) is tests/integration/test_multi_set.py."""

from __future__ import annotations

import fcntl
import io
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import pytest

from broker.devcluster import SET_PORT_STEP, set_overrides
from client import Admin, Producer
from client.mqadmin import main as mqadmin
from tests.integration._ledgermq_procs import CONF, REPO, read_conf, write_conf
from tests.ports import free_port
from tests.tls_certs import make_pki

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


def _conf_dir(
    root: Path, ns_extra: dict[str, str] | None = None, broker_extra: dict[str, str] | None = None
) -> tuple[Path, str, list[int]]:
    """conf/namesrv.conf and conf/dledger/broker-n{0,1,2}.conf on free ports (plus the `*_extra`
    keys); (dir, namesrv, HTTP ports)."""
    ns = f"127.0.0.1:{free_port()}"
    ns_values = {"listenPort": ns.rpartition(":")[2], **(ns_extra or {})}
    write_conf(CONF / "namesrv.conf", root / "namesrv.conf", ns_values)
    http = [_port_with_next_set_free() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{_port_with_next_set_free()}" for i in range(3))
    for i in range(3):
        src = CONF / "dledger" / f"broker-n{i}.conf"
        values = {"listenPort": str(http[i]), "dLegerPeers": peers, "namesrvAddr": ns, **(broker_extra or {})}
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


def test_ledgermq_run_sets_2_starts_two_sets_that_one_topic_spans(tmp_path, capsys):
    """Also: the console's port is held by another program, so the console exits: that is reported
    with its last log line and the rest serves; the log it names outlives the temporary store."""
    conf_dir, ns, http = _conf_dir(tmp_path / "conf")
    console_port = free_port()
    console_held = _held(console_port)
    proc, out_path = _ledgermq_run(conf_dir, tmp_path, "--sets", "2", "--console-port", str(console_port))
    try:
        banner = _wait_banner(proc, out_path)
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
        # One queue offset exists once per set: mqadmin asks which set instead of picking one.
        capsys.readouterr()
        assert mqadmin(["queryMsgByOffset", "-n", ns, "-t", "spans", "-i", "0", "-o", "0"]) == 1
        assert "spans broker sets broker-a, broker-b: name one with -B" in capsys.readouterr().err
        out = io.StringIO()
        query = ["queryMsgByOffset", "-n", ns, "-t", "spans", "-B", "broker-b", "-i", "0", "-o", "0"]
        assert mqadmin([*query, "--json"], out=out) == 0
        assert '"brokerName": "broker-b"' in out.getvalue()
        deadline = time.monotonic() + 30
        while "! console exited" not in out_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        try:
            rc = _stop(proc)
        finally:
            console_held.close()
    text = out_path.read_text()
    assert rc == 0, text
    assert "Stopped." in text
    said = next(ln for ln in text.splitlines() if ln.startswith("  ! console exited with status"))
    assert "Address already in use" in said, text
    kept = Path(text.split("Logs kept in ", 1)[1].split()[0])
    assert "Address already in use" in (kept / "console.log").read_text()
    assert [p.name for p in kept.parent.iterdir()] == ["logs"]  # the store itself is gone
    for port in [*http, *(p + SET_PORT_STEP for p in http)]:
        assert _bindable(port), f"port {port} still served after ledgermq-run stopped"


def _held(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port, as another program holding the port would have."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def _ledgermq_run(conf_dir: Path, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """`ledgermq-run --conf-dir conf_dir *args`, its output in a file, its temporary store under
    tmp_path."""
    out_path = tmp_path / "run.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.devcluster", "--conf-dir", str(conf_dir), "--wait-master-s", "60",
             *args],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "TMPDIR": str(tmp_path)},  # its temporary store goes here
        )
    return proc, out_path


def _wait_banner(proc: subprocess.Popen, out_path: Path, timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    while "Store and logs:" not in out_path.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, out_path.read_text()
        time.sleep(0.2)
    return out_path.read_text()


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM (it stops its children, each in its own session, itself); its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.mark.parametrize("taken", ["namesrv", "every member"])
def test_a_failed_start_prints_why_no_banner_keeps_the_logs_and_exits_1(tmp_path, taken):
    """QA: with the name server's port taken, `make run` printed the healthy banner (pointing at the
    other program) and deleted the log it named at Ctrl-C."""
    conf_dir, ns, http = _conf_dir(tmp_path / "conf")
    held = [_held(int(ns.rpartition(":")[2]))] if taken == "namesrv" else [_held(p) for p in http]
    try:
        proc, out_path = _ledgermq_run(conf_dir, tmp_path, "--console-port", str(free_port()))
        try:
            rc = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # it stops its children (own sessions) itself
            proc.wait(30)
            raise
    finally:
        for s in held:
            s.close()
    text = out_path.read_text()
    assert rc == 1, text
    assert "LedgerMQ dev cluster" not in text and "Produce:" not in text, text
    dead = ["namesrv"] if taken == "namesrv" else [f"broker-a-n{i}" for i in range(3)]
    for name in dead:
        line = next((ln for ln in text.splitlines() if ln.startswith(f"  ! {name} exited with status")), "")
        assert "Address already in use" in line, text  # the process's own last word
    why = "the name server exited" if taken == "namesrv" else "every member of broker-a exited"
    assert f"the cluster did not start: {why}" in text, text
    kept = Path(text.split("Logs kept in ", 1)[1].split()[0])
    assert kept.is_relative_to(tmp_path)
    for name in dead:
        assert "Address already in use" in (kept / f"{name}.log").read_text()
    assert [p.name for p in kept.parent.iterdir()] == ["logs"]  # the store itself is gone
    assert "Stopped." in text
    # The members were told to stop while starting (the name server's exit is seen at once): they
    # stop, none is killed for not stopping in time.
    assert "did not stop in time" not in text, text
    for port in [int(ns.rpartition(":")[2]), *http]:
        assert _bindable(port), f"port {port} still served after ledgermq-run stopped"


def test_ledgermq_run_over_tls_waits_for_the_masters_and_prints_https_lines(tmp_path):
    """Files that serve HTTPS (`tls.server.mode=enforcing`) and register over it (`tls.enable`,
    `tls.client.trustCertPath`): the run's probes speak TLS with that CA, so the banner names the
    masters (it said "no master elected yet" after probing plain HTTP), with https URLs and curl
    lines that carry the CA — and those lines work."""
    pki = make_pki(tmp_path / "pki")
    server_tls = {
        "tls.server.mode": "enforcing",
        "tls.server.certPath": str(pki.server_cert),
        "tls.server.keyPath": str(pki.server_key),
    }
    client_tls = {"tls.enable": "true", "tls.client.trustCertPath": str(pki.ca)}
    conf_dir, ns, http = _conf_dir(tmp_path / "conf", server_tls, {**server_tls, **client_tls})
    proc, out_path = _ledgermq_run(conf_dir, tmp_path, "--console-port", str(free_port()))
    try:
        banner = _wait_banner(proc, out_path)
        assert "no master elected yet" not in banner and "(master)" in banner, banner
        assert all(f"https://127.0.0.1:{port}" in banner for port in http), banner
        produce = next(ln for ln in banner.splitlines() if "/topics/demo/messages" in ln)
        assert f"curl -s --cacert {pki.ca} -X POST https://" in produce, banner
        assert f"--ca-file {pki.ca}" in banner, banner  # the mqadmin line
        master = produce.split("https://", 1)[1].split("/", 1)[0]
        verify = ssl.create_default_context(cafile=str(pki.ca))
        r = httpx.post(f"https://{master}/topics/demo/messages", json={"messages": [{"body": "hi"}]},
                       verify=verify, timeout=10)
        assert r.status_code == 200, r.text
        cluster = httpx.get(f"https://{ns}/cluster", verify=verify, timeout=10).json()["brokers"]
        assert cluster["broker-a"]["masterAddr"] == master
    finally:
        rc = _stop(proc)
    assert rc == 0, out_path.read_text()
    for port in http:
        assert _bindable(port), f"port {port} still served after ledgermq-run stopped"


def _child_pid(parent: int, marker: str) -> int:
    """The pid of `parent`'s child process whose command line contains `marker`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and marker in cmdline:
            return int(entry.name)
    raise AssertionError(f"no child of {parent} runs {marker}")


def _role(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/status", timeout=2).json()["role"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def test_a_killed_master_is_started_again_on_request_and_rejoins_as_a_follower(tmp_path):
    """An operator's failover drill on `make run`: kill -9 the master, watch the set elect another,
    then ask the dev cluster (SIGUSR1; Enter on a terminal) to start it again: same store, same
    log, back as a follower holding what was written meanwhile."""
    conf_dir, ns, http = _conf_dir(tmp_path / "conf")
    proc, out_path = _ledgermq_run(conf_dir, tmp_path)
    try:
        banner = _wait_banner(proc, out_path)
        assert f"kill -USR1 {proc.pid}" in banner, banner
        deadline = time.monotonic() + 30
        while "MASTER" not in [_role(p) for p in http] and time.monotonic() < deadline:
            time.sleep(0.2)
        old = [_role(p) for p in http].index("MASTER")
        with Admin(ns) as admin:
            admin.update_topic("drill", 1, 1)
        os.kill(_child_pid(proc.pid, f"broker-n{old}.conf"), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if f"! broker-a-n{old} exited" in out_path.read_text() and "MASTER" in [_role(p) for p in http]:
                break
            time.sleep(0.2)
        assert f"to start it again: Enter here, or kill -USR1 {proc.pid}" in out_path.read_text()
        new = [_role(p) for p in http].index("MASTER")
        assert new != old
        body = f"written while n{old} was down"
        with Producer(ns) as producer:
            sent = producer.send("drill", body)

        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while _role(http[old]) != "SLAVE" and time.monotonic() < deadline:
            assert proc.poll() is None, out_path.read_text()
            time.sleep(0.2)
        assert _role(http[old]) == "SLAVE", out_path.read_text()
        assert f"started again: broker-a-n{old}" in out_path.read_text()
        deadline = time.monotonic() + 30
        got: list = []
        url = f"http://127.0.0.1:{http[old]}/topics/drill/queues/{sent.queue_id}/messages"
        while not got and time.monotonic() < deadline:
            at = {"offset": sent.queue_offset, "maxMessages": 1}
            got = httpx.get(url, params=at, timeout=5).json()["messages"]
            time.sleep(0.2)
        assert [m["body"] for m in got] == [body]
        proc.send_signal(signal.SIGUSR1)  # nothing has exited: said so, nothing started twice
        deadline = time.monotonic() + 10
        while "(every process is running)" not in out_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "(every process is running)" in out_path.read_text()
    finally:
        rc = _stop(proc)
    assert rc == 0, out_path.read_text()
    for port in http:
        assert _bindable(port), f"port {port} still served after ledgermq-run stopped"


def _children(parent: int) -> list[int]:
    """The pids of `parent`'s child processes."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _listenable(port: int) -> bool:
    """Whether a server could listen on the port again, as our servers bind (SO_REUSEADDR: the
    connections the stop left in TIME_WAIT do not count, a listener still there does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("how", ["output pipe gone, then Ctrl-C", "kill -9 of the run"])
def test_every_process_stops_when_the_run_loses_its_output_or_is_killed(tmp_path, how):
    """QA: `make run | tee run.log` and Ctrl-C: the same Ctrl-C stopped tee first, the run's
    "Stopping..." raised BrokenPipeError before it stopped anything, and the name server, the three
    members and the console (each in its own session) kept running and holding their ports. A run
    killed with kill -9 left them the same way."""
    conf_dir, ns, http = _conf_dir(tmp_path / "conf")
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker.devcluster", "--conf-dir", str(conf_dir), "--wait-master-s", "60",
         "--console-port", str(free_port())],
        cwd=REPO, stdout=write_end, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    os.close(write_end)
    out = io.FileIO(read_end, "r")
    children: list[int] = []
    try:
        seen = b""
        deadline = time.monotonic() + 90
        while b"Store and logs:" not in seen and time.monotonic() < deadline:
            chunk = out.read(65536)
            assert chunk, seen.decode()
            seen += chunk
        assert b"Store and logs:" in seen, seen.decode()
        children = _children(proc.pid)
        assert len(children) == 5, children  # name server, three members, console
        if how == "kill -9 of the run":
            proc.kill()
        else:
            out.close()  # tee gone
            proc.send_signal(signal.SIGINT)
        proc.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in children if _alive(pid)]
    finally:
        if not out.closed:
            out.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    for port in [int(ns.rpartition(":")[2]), *http]:
        assert _listenable(port), f"port {port} still served after ledgermq-run stopped"


_MAKE_LIKE = (  # a session leader that, as GNU make does, catches SIGHUP and waits for its child
    "import signal, subprocess, sys; signal.signal(signal.SIGHUP, lambda *_: None); "
    "sys.exit(subprocess.call(sys.argv[1:]))"
)


def _controlling_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_closing_the_terminal_stops_every_process_when_make_leads_the_session(tmp_path):
    """QA: `tmux new-session "make run"`, then kill-session: the kernel's SIGHUP went to `make`
    alone (the session leader), which waits for its child, so the run, the name server, the members
    and the console ran on with the terminal gone. The run now sees its terminal hang up."""
    conf_dir, ns, http = _conf_dir(tmp_path / "conf")
    master_fd, slave_fd = os.openpty()
    leader = subprocess.Popen(
        [sys.executable, "-c", _MAKE_LIKE, sys.executable, "-m", "broker.devcluster", "--conf-dir",
         str(conf_dir), "--wait-master-s", "60", "--console-port", str(free_port())],
        cwd=REPO, stdin=slave_fd, stdout=slave_fd, stderr=slave_fd, preexec_fn=_controlling_terminal,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    os.close(slave_fd)
    run_pid = 0
    children: list[int] = []
    try:
        seen = b""
        deadline = time.monotonic() + 90
        while b"Store and logs:" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master_fd], [], [], 1)
            if ready:
                seen += os.read(master_fd, 65536)
        assert b"Store and logs:" in seen, seen.decode(errors="replace")
        [run_pid] = _children(leader.pid)
        children = _children(run_pid)
        assert len(children) == 5, children
        os.close(master_fd)  # the terminal window closed
        master_fd = -1
        assert leader.wait(30) == 0
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in [run_pid, *children]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in [run_pid, *children] if _alive(pid)]
    finally:
        if master_fd >= 0:
            os.close(master_fd)
        for pid in [leader.pid, run_pid, *children]:
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        leader.wait(10)
    for port in [int(ns.rpartition(":")[2]), *http]:
        assert _listenable(port), f"port {port} still served after ledgermq-run stopped"
