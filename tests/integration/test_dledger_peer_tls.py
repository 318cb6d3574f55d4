"""DLedger peer TLS on real processes: three `python -m dledger` members with mutual TLS 1.3 on
their peer links elect a leader and replicate; what crosses the wire between them (through
recording relays) is TLS, with no entry body in the clear; a plaintext connection and a client
whose certificate comes from another CA are refused and change nothing (the refused client logs
why, and so does the member); a member given only part of the TLS files does not start.
Reference: dledger/rpc/tls.py.

QA: the peer links were authenticated (peerSecretFile) but never encrypted: every replicated
message body crossed the network in the clear."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.client import DLedgerClient
from dledger.codes import DLedgerException, DLedgerResponseCode
from tests.integration.test_dledger_peer_auth import hostile_frames, recv_all, send_frames, state
from tests.ports import free_ports
from tests.tls_certs import Pki, make_pki, reissue_server_cert, served_certificate

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
GROUP = "tlsg"
IDS = ("n0", "n1", "n2")
SECRET_BODY = b"card-number-4111-1111-1111-1111"


class Relay(threading.Thread):
    """Forwards one port to another, keeping every byte sent towards the target."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", listen_port))
        self.target_port = target_port
        self.seen = bytearray()
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the member is not listening yet: the connecting one tries again
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if record:
                    with self.lock:
                        self.seen += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


class Group:
    """Three members with peer TLS, each reaching the others through relays that record the bytes."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.pki: Pki = make_pki(base / "pki")
        ports = free_ports(6)
        self.ports = dict(zip(IDS, ports[:3], strict=True))
        self.relay_ports = dict(zip(IDS, ports[3:], strict=True))
        self.relays = {m: Relay(self.relay_ports[m], self.ports[m]) for m in IDS}
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in self.ports.items())
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def peers_of(self, member: str) -> str:
        """What `member` is told: itself at its port, the others at their relays."""
        return ";".join(f"{m}-127.0.0.1:{self.ports[m] if m == member else self.relay_ports[m]}" for m in IDS)

    def seen(self) -> bytes:
        """Every byte the relays carried towards a member."""
        out = b""
        for relay in self.relays.values():
            with relay.lock:
                out += bytes(relay.seen)
        return out

    def tls_args(self) -> list[str]:
        return ["--peer-tls-cert", str(self.pki.peer_cert), "--peer-tls-key", str(self.pki.peer_key),
                "--peer-tls-ca", str(self.pki.ca)]

    def log(self, member: str) -> str:
        return (self.base / f"{member}.log").read_text()

    def start(self, member: str) -> None:
        peers = self.peers_of(member)
        with open(self.base / f"{member}.log", "ab") as log:
            self.procs[member] = subprocess.Popen(
                [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", member, "--peers", peers,
                 "--store-dir", str(self.base / member), *self.tls_args()],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip

    def client(self, cert: Path | None = None, key: Path | None = None,
               timeout_s: float = 10.0) -> DLedgerClient:
        tls = (str(cert or self.pki.peer_cert), str(key or self.pki.peer_key), str(self.pki.ca))
        return DLedgerClient(GROUP, self.peers, timeout_s=timeout_s, peer_tls=tls)

    def teardown(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)
        for relay in self.relays.values():
            relay.close()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    g = Group(tmp_path_factory.mktemp("peertls"))
    for relay in g.relays.values():
        relay.start()
    try:
        for m in IDS:
            g.start(m)
        yield g
    finally:
        g.teardown()


async def test_members_replicate_over_tls_and_no_body_crosses_the_wire_in_the_clear(group: Group) -> None:
    async with group.client() as c:
        await c.find_leader()
        for _ in range(20):
            await c.append([SECRET_BODY])
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # every member has committed all of it
            ends = await state(group)
            if len({(end, committed) for _, end, committed in ends.values()}) == 1:
                break
            assert asyncio.get_running_loop().time() < deadline, ends
            await asyncio.sleep(0.1)
        entries = {m: await c.get(0, 100, member_id=m) for m in IDS}
    for m in IDS:
        assert sum(e.body == SECRET_BODY for e in entries[m]) == 20, m
    seen = group.seen()
    assert len(seen) > 20 * len(SECRET_BODY)  # the leader's pushes went through the relays
    assert seen[:1] == b"\x16" and seen[1:3] == b"\x03\x01", seen[:8]  # a TLS handshake record first
    assert SECRET_BODY not in seen and b"card-number" not in seen
    for m in IDS:
        assert "peerTls=on" in group.log(m)


async def test_a_plaintext_peer_is_refused_and_changes_nothing(group: Group) -> None:
    before = await state(group)
    term = max(t for t, _, _ in before.values())
    with socket.create_connection(("127.0.0.1", group.ports["n0"])) as s:
        send_frames(s, hostile_frames("n0", term))
        answer = recv_all(s, timeout_s=8.0)  # closed within the handshake timeout (5 s)
    assert not answer.endswith(b"<still open>"), answer[:32]
    assert not answer.startswith(b"\x00"), answer[:32]  # no DLedger frame came back (a TLS alert may)
    after = await state(group)
    assert {m: v[:2] for m, v in after.items()} == {m: v[:2] for m, v in before.items()}  # term, end
    # The refusing member says so, naming where the connection came from.
    refused = [line for line in group.log("n0").splitlines() if "event=peer_tls_refused" in line]
    assert refused and "from=127.0.0.1:" in refused[0], group.log("n0")[-2000:]


async def test_a_certificate_from_another_ca_is_refused(group: Group, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="dledger.rpc.auth")
    async with group.client(group.pki.rogue_peer_cert, group.pki.rogue_peer_key, timeout_s=2.0) as c:
        with pytest.raises(DLedgerException) as ex:
            await c.metadata("n1")
    assert ex.value.code in (DLedgerResponseCode.NETWORK_ERROR, DLedgerResponseCode.TIMEOUT)
    # The refused side says why, once: the member refused its certificate.
    failed = [r.getMessage() for r in caplog.records if "event=peer_tls_failed" in r.getMessage()]
    assert failed and "certificate" in failed[0].lower(), failed
    # ... and so does the member: why it refused the certificate.
    deadline = asyncio.get_running_loop().time() + 10
    while not (refused := [ln for ln in group.log("n1").splitlines() if "event=peer_tls_refused" in ln]):
        assert asyncio.get_running_loop().time() < deadline, group.log("n1")[-2000:]
        await asyncio.sleep(0.1)
    assert "certificate" in refused[0].lower(), refused
    async with DLedgerClient(GROUP, group.peers, timeout_s=2.0) as plain:  # no TLS at all
        with pytest.raises(DLedgerException):
            await plain.metadata("n1")


def test_part_of_the_tls_files_stops_the_member(group: Group, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", "n0", "--peers", group.peers,
         "--store-dir", str(tmp_path / "s"), "--peer-tls-cert", str(group.pki.peer_cert),
         "--peer-tls-ca", str(group.pki.ca)],
        cwd=REPO, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "peer TLS needs the certificate, its key and the CA" in proc.stderr, proc.stderr


async def test_a_rotated_peer_certificate_is_used_without_a_restart(group: Group) -> None:
    """Runs after the others: it rotates the files every member uses."""

    def served() -> set[str]:
        return {ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(served_certificate("127.0.0.1", port)))
                for port in group.ports.values()}

    old = ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(group.pki.peer_cert.read_text()))
    assert await asyncio.to_thread(served) == {old}
    new_cert, new_key = reissue_server_cert(group.pki, "peer-rotated", "serverAuth,clientAuth")
    new = ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(new_cert.read_text()))
    shutil.copyfile(new_key, group.pki.peer_key)
    shutil.copyfile(new_cert, group.pki.peer_cert)
    deadline = asyncio.get_running_loop().time() + 10
    while await asyncio.to_thread(served) != {new}:
        assert asyncio.get_running_loop().time() < deadline, "the rotated certificate is not served"
        await asyncio.sleep(0.2)
    for m in IDS:
        assert "event=peer_tls_reloaded" in group.log(m), m
    async with group.client() as c:  # a new client with the new certificate: the group takes it
        await c.append([b"after-rotation"])
    ends = await state(group)
    assert len({t for t, _, _ in ends.values()}) == 1  # no election from the rotation
