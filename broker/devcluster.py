"""`ledgermq-run` (`make run`): a name server, 3-member DLedger broker sets and the console on
loopback.

Starts `mqnamesrv -c conf/namesrv.conf`, for each of `--sets N` (default 1) broker sets
`mqbroker -c conf/dledger/broker-n{0,1,2}.conf`, and `mqdashboard -n <name server> --port 8080` as
separate processes with a fresh temporary store directory (or `--store-dir`), waits until every set
has elected a master and the name server lists it, prints curl lines to produce and consume and
the console's address, and stops everything on Ctrl-C / SIGTERM / SIGHUP, when its terminal hangs
up (`Terminal`), and, its children by PR_SET_PDEATHSIG, when it is killed. A process that exits is
reported with the last line of its log (kept at exit); Enter in the terminal (or SIGUSR1) starts
every exited process again with its own command, store and log — kill -9 a master to watch the
failover, then bring it back as a follower. When the name server or every member of a set exits
during the start (a port another program holds, a bad conf), there is no banner: the
rest is stopped, the logs are kept and the exit status is 1.

Set k (0-based) is `broker-a`, `broker-b`, …: the same three files with brokerName and dLegerGroup
renamed and every port (listenPort, the dLegerPeers ports, grpcServerPort) moved up by
`SET_PORT_STEP` * k, so the sets of one machine never share a port.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import logging
import os
import select
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from broker.config import load_broker_config, parse_properties
from dledger.config import parse_peers

log = logging.getLogger("ledgermq.run")

REPO_CONF = Path(__file__).resolve().parents[1] / "conf"
MEMBERS = ("n0", "n1", "n2")
# Set k's ports are the files' ports + SET_PORT_STEP * k (broker-b: HTTP 11011, 11021, 11031).
SET_PORT_STEP = 100
MAX_SETS = 9
_PORT_KEYS = ("listenPort", "grpcServerPort")


def set_name(k: int) -> str:
    """The brokerName of set k: broker-a, broker-b, …"""
    return f"broker-{chr(ord('a') + k)}"


def set_overrides(conf: Path, k: int) -> dict[str, str]:
    """The `-D` overrides that turn member file `conf` (written for broker-a) into set k's: its
    name, DLedger group and every port moved by SET_PORT_STEP * k. Set 0 is the file as it is."""
    if k == 0:
        return {}
    step = SET_PORT_STEP * k
    values = {key: value for _, key, value in parse_properties(conf.read_text(encoding="utf-8"))}
    name = set_name(k)
    out = {"brokerName": name, "dLegerGroup": name}
    for key in _PORT_KEYS:
        if key in values:
            out[key] = str(int(values[key]) + step)
    if "dLegerPeers" in values:
        peers = parse_peers(values["dLegerPeers"])
        moved = []
        for sid, addr in peers.items():
            host, _, port = addr.rpartition(":")
            moved.append(f"{sid}-{host}:{int(port) + step}")
        out["dLegerPeers"] = ";".join(moved)
    return out


class DevCluster:
    """The processes of `make run`. Caller: `main`."""

    def __init__(self, conf_dir: Path, store_dir: Path, sets: int = 1, console_port: int = 8080) -> None:
        self.conf_dir = conf_dir
        self.console_port = console_port
        self.store_dir = store_dir
        self.sets = sets
        self.log_dir = store_dir / "logs"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, list[str]] = {}  # name -> its `python -m` arguments, to restart it
        # set name -> selfId -> HTTP address, and the members serving the RocketMQ 5 gRPC endpoint
        self.broker_addrs: dict[str, dict[str, str]] = {}
        self.grpc_addrs: dict[str, dict[str, str]] = {}
        self.namesrv_addr = "127.0.0.1:9876"
        self.reported: set[str] = set()
        # TLS as the members' files set it: their listeners' scheme, the name server's (the
        # members' `tls.enable`), and the CA their `tls.client.trustCertPath` names — what this
        # run's probes, the console and the banner's curl lines use too.
        self.schemes: dict[str, str] = {}  # member HTTP address -> http / https
        self.namesrv_scheme = "http"
        self.ca_file = ""
        self._verify: ssl.SSLContext | bool = True
        self.last_probe_error = ""

    def _spawn(self, name: str, args: list[str]) -> None:
        self.commands[name] = args
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_stop_with_the_run,
            )

    def start(self) -> None:
        ns_conf = self.conf_dir / "namesrv.conf"
        self._spawn("namesrv", ["namesrv", "-c", str(ns_conf)])
        for k in range(self.sets):
            self._start_set(k)
        ca = ["--ca-file", self.ca_file] if self.ca_file else []
        self._spawn("console", ["console", "-n", self.namesrv_addr, "--port", str(self.console_port), *ca])

    def _start_set(self, k: int) -> None:
        name = set_name(k)
        addrs = self.broker_addrs.setdefault(name, {})
        for sid in MEMBERS:
            conf = self.conf_dir / "dledger" / f"broker-{sid}.conf"
            overrides = {**set_overrides(conf, k), "storePathRootDir": str(self.store_dir / name / sid)}
            try:
                cfg = load_broker_config(str(conf), overrides)
                addrs[sid] = cfg.broker_addr
                self.schemes[cfg.broker_addr] = "https" if cfg.listener.tls else "http"
                self.namesrv_scheme = cfg.tls_client.scheme
                if cfg.tls_client.enable:
                    self.ca_file = cfg.tls_client.trust_cert_path
                    self._verify = cfg.tls_client.ssl_context() or True
                if cfg.grpc_addr:
                    self.grpc_addrs.setdefault(name, {})[sid] = cfg.grpc_addr
                self.namesrv_addr = cfg.namesrv_addr_list[0] if cfg.namesrv_addr_list else self.namesrv_addr
            except Exception as exc:  # report and keep going: the broker itself will say more
                say(f"  ! {conf}: {exc}")
            args = [arg for key, value in overrides.items() for arg in ("-D", f"{key}={value}")]
            self._spawn(f"{name}-{sid}", ["broker", "-c", str(conf), *args])

    def check_exits(self) -> None:
        """Report each process that has exited since the last call, with its log's last line."""
        for name, proc in self.procs.items():
            if proc.poll() is not None and name not in self.reported:
                self.reported.add(name)
                path = self.log_dir / f"{name}.log"
                said = last_log_line(path) or "(nothing logged)"
                say(f"  ! {name} exited with status {proc.returncode}: {said}")
                say(f"    log: {path}")
                say(f"    to start it again: Enter here, or kill -USR1 {os.getpid()}")

    def restart_exited(self) -> list[str]:
        """Start every process that has exited again, with its own command, store and log (a
        member rejoins its set as a follower and catches up). Returns their names."""
        again = [name for name, proc in self.procs.items() if proc.poll() is not None]
        for name in again:
            self._spawn(name, self.commands[name])
            self.reported.discard(name)
        return again

    def start_failure(self) -> str | None:
        """Why the cluster cannot serve, once the name server or every member of a set has exited."""
        ns = self.procs.get("namesrv")
        if ns is not None and ns.poll() is not None:
            return "the name server exited"
        for name, addrs in self.broker_addrs.items():
            members = [self.procs.get(f"{name}-{sid}") for sid in addrs]
            if members and all(p is not None and p.poll() is not None for p in members):
                return f"every member of {name} exited"
        return None

    def url(self, addr: str) -> str:
        """A member's base URL (https when its listener serves TLS)."""
        return f"{self.schemes.get(addr, 'http')}://{addr}"

    def _get(self, url: str) -> Any:
        """GET a probe's JSON; its failure is kept in `last_probe_error` (said if no master shows)."""
        try:
            return httpx.get(url, timeout=0.5, verify=self._verify).json()
        except (httpx.HTTPError, ValueError) as exc:
            self.last_probe_error = f"{url}: {type(exc).__name__}: {exc}"
            raise

    def registered(self) -> bool:
        """Whether this run's name server answers and lists every set with its master."""
        try:
            brokers = self._get(f"{self.namesrv_scheme}://{self.namesrv_addr}/cluster").get("brokers", {})
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        return all(brokers.get(name, {}).get("masterAddr") for name in self.broker_addrs)

    def master(self, name: str) -> tuple[str, str] | None:
        """(selfId, address) of set `name`'s master, if one answers."""
        for sid, addr in self.broker_addrs.get(name, {}).items():
            try:
                st = self._get(f"{self.url(addr)}/status")
            except (httpx.HTTPError, ValueError):
                continue
            if st.get("role") == "MASTER":
                return sid, addr
        return None

    def masters(self) -> dict[str, tuple[str, str] | None]:
        """Every set's master (None while it has none)."""
        return {name: self.master(name) for name in self.broker_addrs}

    def wait_ready(self, timeout_s: float, stop: list[int]) -> dict[str, tuple[str, str] | None]:
        """Until every set has a master the name server lists, the start fails (`start_failure`), a
        stop is requested or `timeout_s` passed; the masters found."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_exits()
            if self.start_failure() or stop:
                return {}
            found = self.masters()
            if (all(found.values()) and self.registered()) or time.monotonic() >= deadline:
                # A process that failed while the last probes ran is reported before the banner.
                self.check_exits()
                return {} if self.start_failure() else found
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 8
        for name, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"  ! {name} did not stop in time; killing pid {proc.pid}")
                proc.kill()
                proc.wait(5)


def remove_store(store_dir: Path, keep: Path | None) -> None:
    """Remove a temporary store root, all of it or all but `keep` (the logs)."""
    if keep is None:
        shutil.rmtree(store_dir, ignore_errors=True)
        return
    for entry in store_dir.iterdir():
        if entry != keep:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def last_log_line(path: Path) -> str:
    """The last non-blank line of a process's log: what it said before exiting ("" if nothing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def banner(masters: dict[str, tuple[str, str] | None], cluster: DevCluster) -> str:
    lines = ["", f"LedgerMQ dev cluster: name server {cluster.namesrv_addr}"]
    for name, addrs in cluster.broker_addrs.items():
        master = masters.get(name)
        lines.append(f"broker set {name}:")
        grpc_addrs = cluster.grpc_addrs.get(name, {})
        for sid, addr in addrs.items():
            role = "master" if master and master[0] == sid else "slave"
            grpc = f"  grpc {grpc_addrs[sid]}" if sid in grpc_addrs else ""
            lines.append(f"  {sid}  {cluster.url(addr)}{grpc}  ({role})")
        if master is None:
            lines.append("  (no master elected yet)")
            if cluster.last_probe_error:
                lines.append(f"  last probe: {cluster.last_probe_error}")
    first = next(iter(cluster.broker_addrs), "")
    master = masters.get(first)
    m = master[1] if master else next(iter(cluster.broker_addrs.get(first, {}).values()), "127.0.0.1:10911")
    u = cluster.url(m)
    curl = f"curl -s --cacert {cluster.ca_file}" if u.startswith("https") and cluster.ca_file else "curl -s"
    ns_tls = f" --ca-file {cluster.ca_file}" if cluster.namesrv_scheme == "https" and cluster.ca_file else ""
    if len(cluster.broker_addrs) > 1:
        lines += ["", f"The curl lines below go to {first}'s master; the SDK and mqadmin span every set."]
    lines += [
        "",
        "Produce:",
        f"  {curl} -X POST {u}/topics/demo/messages -H 'Content-Type: application/json' \\",
        '       -d \'{"messages": [{"body": "hello", "tags": "greeting", "queueId": 0}]}\'',
        "Consume (long poll up to 10 s):",
        f"  {curl} '{u}/topics/demo/queues/0/messages?offset=0&maxMessages=32&waitMs=10000'",
        "Group consumption:",
        f"  {curl} -X POST {u}/consumers/demo-group/receive -H 'Content-Type: application/json' \\",
        '       -d \'{"topic": "demo", "maxMessages": 16, "invisibleMs": 30000, "waitMs": 5000}\'',
        *(
            [
                "RocketMQ 5 clients (Java, Go, Python, Node.js ...), any member is an access point:",
                f"  endpoints = \"{';'.join(a for s in cluster.grpc_addrs.values() for a in s.values())}\"",
                *_grpc_tls_lines(cluster),
            ]
            if cluster.grpc_addrs
            else []
        ),
        "Operate:",
        f"  {_command('mqadmin')} clusterList -n {cluster.namesrv_addr}{ns_tls}     |  {curl} {u}/status",
        f"  API docs: {u}/docs     metrics: {u}/metrics",
        f"Console: http://127.0.0.1:{cluster.console_port}/",
        "",
        f"Store and logs: {cluster.store_dir}   (Ctrl-C stops everything)",
        f"A process killed (a master, say, with kill -9)? Enter here or kill -USR1 {os.getpid()} restarts it",
    ]
    return "\n".join(lines)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _stop_with_the_run() -> None:
    """In a child, before its exec: SIGTERM when the run itself dies, even by kill -9. Each child
    has its own session (a hang-up must reach only the run, which stops them in order), so nothing
    else would reach it and it would keep its ports from the next `make run`."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _grpc_tls_lines(cluster: DevCluster) -> list[str]:
    """How the official clients reach gRPC ports that serve TLS (the members' HTTP ports do)."""
    if "https" not in cluster.schemes.values():
        return []
    # Python's and Node's gRPC both take their roots from this variable (Node ignores
    # NODE_EXTRA_CA_CERTS for a gRPC channel).
    roots = f", both with GRPC_DEFAULT_SSL_ROOTS_FILE_PATH={cluster.ca_file}" if cluster.ca_file else ""
    return [f"  over TLS: Python tls_enable=True, Node.js sslEnabled: true{roots}; Java enableSsl(true)"]


def say(line: str) -> None:
    """One line of the run's own output. When the terminal or pipe is gone (a closed window, or
    `make run | tee` whose tee the same Ctrl-C stopped first), what is left to print is dropped:
    the write used to raise, and the shutdown that follows never stopped the children, which run
    in their own sessions and so outlived the run."""
    try:
        print(line, flush=True)
    except OSError:  # BrokenPipeError, or EIO from a hung-up terminal
        sys.stdout = open(os.devnull, "w")  # the process's stdout from now on


class Terminal:
    """The terminal `make run` was started on: Enter typed there asks for a restart, and its hang-up
    stops the run. The kernel sends SIGHUP only to the session leader, and a `make` that leads the
    session (`tmux new-session "make run"`, a terminal running it without a shell) catches it and
    waits for the run, which then never heard it: its terminal's reads say end of file and every
    ioctl EIO, which this notices."""

    def __init__(self) -> None:
        self.stdin = sys.stdin
        try:
            self.was_tty = self.stdin is not None and self.stdin.isatty()
        except ValueError:
            self.was_tty = False

    def _hung_up(self) -> bool:
        try:
            os.tcgetpgrp(self.stdin.fileno())
        except OSError as exc:
            return exc.errno == errno.EIO
        except ValueError:  # stdin closed
            return False
        return False

    def wait(self, timeout_s: float) -> str | None:
        """Wait up to `timeout_s` for a line on stdin when it is the terminal this process is in
        the foreground of (not a pipe or /dev/null, as under CI, nor a background job: there this
        only sleeps): "enter" for a line, "hangup" once the terminal is gone, else None."""
        if not self.was_tty:
            time.sleep(timeout_s)
            return None
        stdin = self.stdin
        try:
            # Only in the foreground: a background job (`make run &`) reading its terminal is
            # stopped by SIGTTIN as soon as the user types into the shell.
            usable = os.tcgetpgrp(stdin.fileno()) == os.getpgrp()
        except OSError as exc:
            if exc.errno == errno.EIO:
                return "hangup"
            usable = False
        except ValueError:
            usable = False
        if not usable:
            time.sleep(timeout_s)
            return None
        try:
            ready, _, _ = select.select([stdin], [], [], timeout_s)
            if not ready:
                return None
            line = stdin.readline()
        except OSError as exc:
            if exc.errno == errno.EIO:
                return "hangup"
            time.sleep(timeout_s)
            return None
        except ValueError:
            time.sleep(timeout_s)
            return None
        if not line and self._hung_up():  # end of file: Ctrl-D, or the terminal gone
            return "hangup"
        return "enter"


def _command(name: str) -> str:
    """How to call one of our console scripts from the shell `make run` was started in: by name
    when that PATH finds this install's, else by its path (`.venv/bin/mqadmin` from the clone)."""
    script = Path(sys.executable).parent / name
    if not script.exists() or shutil.which(name) == str(script):
        return name
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`ledgermq-run`)."""
    p = argparse.ArgumentParser(prog="ledgermq-run", description=__doc__.splitlines()[0])
    p.add_argument("--store-dir", help="store root (default: a fresh temporary directory, removed at exit)")
    p.add_argument("--conf-dir", default=str(REPO_CONF), help="directory holding namesrv.conf and dledger/")
    p.add_argument("--wait-master-s", type=float, default=30.0)
    p.add_argument(
        "--sets",
        type=int,
        default=1,
        choices=range(1, MAX_SETS + 1),
        metavar=f"1..{MAX_SETS}",
        help="number of 3-member broker sets (broker-a, broker-b, ...)",
    )
    p.add_argument("--console-port", type=int, default=8080, help="port of the web console (mqdashboard)")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One line per request from our own httpx clients (registration, probes) is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    temp = args.store_dir is None
    store_dir = Path(args.store_dir or tempfile.mkdtemp(prefix="ledgermq-run-")).resolve()
    store_dir.mkdir(parents=True, exist_ok=True)
    cluster = DevCluster(Path(args.conf_dir), store_dir, args.sets, args.console_port)
    stop_requested: list[int] = []
    restart_requested: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_requested.append(signum)

    signal.signal(signal.SIGUSR1, lambda signum, _frame: restart_requested.append(signum))

    # SIGHUP too: closing the terminal must stop the cluster like Ctrl-C (each child runs in its
    # own session, so the hang-up reaches at most this process; `Terminal` notices it otherwise).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    names = ", ".join(set_name(k) for k in range(args.sets))
    say(f"Starting name server, {names} (n0, n1, n2 each), console; logs in {cluster.log_dir}")
    terminal = Terminal()
    cluster.start()
    failed = False  # a failed start, or every process gone: logs kept, exit 1
    try:
        masters = cluster.wait_ready(args.wait_master_s, stop_requested)
        why = cluster.start_failure()
        if why:
            say(f"  ! the cluster did not start: {why}; stopping the rest")
            failed = True
        elif not stop_requested:
            say(banner(masters, cluster))
        last = masters
        while not failed and not stop_requested:
            typed = terminal.wait(0.5)
            if typed == "hangup":
                log.info("event=terminal_hung_up action=stop")
                stop_requested.append(signal.SIGHUP)
                break
            if typed == "enter":
                restart_requested.append(0)
            if restart_requested:
                restart_requested.clear()
                again = cluster.restart_exited()
                say(f"  started again: {', '.join(again)}" if again else "  (every process is running)")
            cluster.check_exits()
            if len(cluster.reported) == len(cluster.procs):
                say("  ! every process has exited")
                failed = True
                break
            now = cluster.masters()
            for name, master in now.items():
                if master and master != last.get(name):
                    say(f"  {name}: master is now {master[0]} at {cluster.url(master[1])}")
            last = {name: master or last.get(name) for name, master in now.items()}
    finally:
        say("Stopping...")
        # Exits seen before the stop: their "!" lines name logs that must outlive the run.
        keep_logs = failed or bool(cluster.reported)
        cluster.stop()
        if temp:
            remove_store(store_dir, keep=cluster.log_dir if keep_logs else None)
        if keep_logs:
            say(f"Logs kept in {cluster.log_dir}")
        say("Stopped.")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
