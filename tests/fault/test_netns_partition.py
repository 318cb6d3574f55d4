"""A broker set on three hosts of their own: one network namespace per member, each with a veth
on a bridge, the name server and the clients on the bridge's host address. The master is cut off
by iptables inside its namespace, so the kernel drops the packets (no proxy in between, unlike
the matrix's `netproxy`), first both ways, then only what it sends. Every send the SDK acknowledged
is stored once, a new master serves within seconds, and the healed member is back in the name
server's cluster view within seconds (its beats failed while it was cut off). Needs root, `ip` and
`iptables`; skipped otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client import Producer, PullConsumer
from tests.integration._ledgermq_procs import CONF, ProcessGroup, wait_http, write_conf
from tests.ports import free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.fault_full]
HTTP_PORT, PEER_PORT, GRPC_PORT = 10911, 40911, 18081  # each member has a port space of its own


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=20)


class Hosts:
    """Three namespaces on a bridge; member i is 10.231.<k>.1i, the host side 10.231.<k>.1."""

    def __init__(self) -> None:
        tag = os.getpid() % 100_000
        self.bridge = f"lmqbr{tag}"
        self.ns = [f"lmq{tag}-{i}" for i in range(3)]
        self.veth = [f"lmq{tag}v{i}" for i in range(3)]
        net = f"10.231.{20 + os.getpid() % 200}"
        self.host_ip = f"{net}.1"
        self.ips = [f"{net}.1{i}" for i in range(3)]

    def up(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        # Bridged traffic may pass the host's FORWARD chain (br_netfilter), which a Docker host drops.
        _run("iptables", "-w", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
        for ns, veth, ip in zip(self.ns, self.veth, self.ips, strict=True):
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def down(self) -> None:
        for cmd in (
            # A veth pair goes with either end: deleted here, not left to the namespace's end,
            # which a socket still closing can keep alive.
            *(("ip", "link", "del", veth) for veth in self.veth),
            *(("ip", "netns", "del", ns) for ns in self.ns),
            ("ip", "link", "del", self.bridge),
            ("iptables", "-w", "-D", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"),
        ):
            subprocess.run(cmd, capture_output=True, timeout=20)

    def cut(self, i: int, outbound_only: bool = False) -> None:
        """Drop member i's packets inside its namespace: everything, or only what it sends."""
        chains = ("OUTPUT",) if outbound_only else ("INPUT", "OUTPUT")
        for chain in chains:
            _run("ip", "netns", "exec", self.ns[i], "iptables", "-w", "-A", chain, "-j", "DROP")

    def heal(self, i: int) -> None:
        _run("ip", "netns", "exec", self.ns[i], "iptables", "-w", "-F")


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    missing = [t for t in ("ip", "iptables") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"network namespaces need {', '.join(missing)}")
    h = Hosts()
    try:
        h.up()
    except subprocess.CalledProcessError as exc:
        h.down()
        pytest.skip(f"cannot make network namespaces here: {' '.join(exc.cmd)}: {exc.stderr.strip()}")
    try:
        yield h
    finally:
        h.down()


def _start_set(group: ProcessGroup, tmp: Path, h: Hosts) -> tuple[str, list[str]]:
    ns_port = free_port()
    conf = write_conf(CONF / "namesrv.conf", tmp / "namesrv.conf",
                      {"listenPort": str(ns_port), "listenHost": h.host_ip})
    proc = group.start("namesrv", "namesrv", "-c", str(conf))
    namesrv = f"{h.host_ip}:{ns_port}"
    wait_http(f"http://{namesrv}/health", proc=proc)
    peers = ";".join(f"n{i}-{ip}:{PEER_PORT}" for i, ip in enumerate(h.ips))
    for i, ip in enumerate(h.ips):
        conf = write_conf(CONF / "dledger" / f"broker-n{i}.conf", tmp / f"n{i}.conf", {
            "brokerIP1": ip, "listenPort": str(HTTP_PORT), "grpcServerPort": str(GRPC_PORT),
            "dLegerPeers": peers, "namesrvAddr": namesrv, "storePathRootDir": str(tmp / f"store-n{i}"),
            "registerNameServerPeriod": "30000",
        })
        group.start(f"n{i}", "broker", "-c", str(conf), wrap=("ip", "netns", "exec", h.ns[i]))
    members = [f"{ip}:{HTTP_PORT}" for ip in h.ips]
    for i, addr in enumerate(members):
        wait_http(f"http://{addr}/health", proc=group.procs[f"n{i}"], timeout_s=30)
    return namesrv, members


def _cluster(namesrv: str) -> dict[str, str]:
    """selfId -> role as the name server lists broker-a's members."""
    status = httpx.get(f"http://{namesrv}/cluster", timeout=5).json()["brokers"].get("broker-a", {})
    return {a: "MASTER" if int(bid) == 0 else "SLAVE" for bid, a in status.get("addrs", {}).items()}


def _master(namesrv: str, members: list[str], timeout_s: float = 30) -> str:
    """The one of `members` the name server lists as broker-a's master, once it lists one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        masters = [a for a, role in _cluster(namesrv).items() if role == "MASTER"]
        if len(masters) == 1 and masters[0] in members:
            return masters[0]
        time.sleep(0.2)
    raise AssertionError(f"no master of broker-a in the name server's view: {_cluster(namesrv)}")


def _read_all(namesrv: str, topic: str) -> list[str]:
    bodies: list[str] = []
    with PullConsumer(namesrv) as c:
        for q in c.queues(topic, refresh=True):
            offset = 0
            while True:
                page = c.pull(topic, q.queue_id, offset, 256, broker_name=q.broker_name)
                if not page.messages:
                    break
                bodies += [m.body.decode() for m in page.messages]
                offset = page.next_offset
    return bodies


def _produce(namesrv: str, tag: str, stop: threading.Event, acked: list[tuple[float, str]],
             failed: list[str]) -> None:
    """Send `tag-0`, `tag-1` … one at a time until `stop`; record what was acked and what failed."""
    with Producer(namesrv) as p:
        i = 0
        while not stop.is_set():
            body = f"{tag}-{i}"
            i += 1
            try:
                p.send("part", body)
                acked.append((time.monotonic(), body))
            except Exception:  # a failed send need only be stored at most once
                failed.append(body)
            time.sleep(0.005)


def test_master_cut_off_by_iptables_loses_no_acked_send(tmp_path: Path, hosts: Hosts) -> None:
    group = ProcessGroup(tmp_path)
    try:
        namesrv, members = _start_set(group, tmp_path, hosts)
        httpx.put(f"http://{_master(namesrv, members)}/topics/part",
                  json={"readQueueNums": 4, "writeQueueNums": 4}, timeout=10).raise_for_status()
        for outbound_only in (False, True):
            acked: list[tuple[float, str]] = []
            failed: list[str] = []
            stop = threading.Event()

            tag = "oneway" if outbound_only else "both"
            worker = threading.Thread(target=_produce, args=(namesrv, tag, stop, acked, failed))
            worker.start()
            time.sleep(3)
            old = members.index(_master(namesrv, members))
            hosts.cut(old, outbound_only=outbound_only)
            cut_at = time.monotonic()
            _master(namesrv, [m for i, m in enumerate(members) if i != old], timeout_s=20)
            time.sleep(max(0.0, cut_at + 8 - time.monotonic()))
            hosts.heal(old)
            healed = time.monotonic()
            while len(_cluster(namesrv)) < 3 and time.monotonic() - healed < 20:
                time.sleep(0.2)
            back_s = time.monotonic() - healed
            time.sleep(2)
            stop.set()
            worker.join(30)
            view = _cluster(namesrv)
            assert len(view) == 3, f"{tag}: the healed member never re-registered: {view}"
            # ~1 s measured; a beat in flight at the heal may still spend its 2 x 3 s connect
            # timeouts first. Without the retries it was a whole registerNameServerPeriod (30 s).
            assert back_s < 15, f"{tag}: the healed member was back in the cluster view after {back_s:.1f} s"
            stored = [b for b in _read_all(namesrv, "part") if b.startswith(f"{tag}-")]
            lost = {b for _, b in acked} - set(stored)
            assert not lost, f"{tag}: {len(lost)} acked sends lost, e.g. {sorted(lost)[:5]}"
            assert len(stored) == len(set(stored)), f"{tag}: stored twice: {len(stored) - len(set(stored))}"
            after_cut = [t for t, _ in acked if t > cut_at]
            assert after_cut and after_cut[0] - cut_at < 10, f"{tag}: no send acked within 10 s of the cut"
            assert len(acked) > 500, f"{tag}: only {len(acked)} sends acked ({len(failed)} failed)"
    finally:
        group.stop_all()
