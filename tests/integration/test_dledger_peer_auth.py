"""DLedger peer authentication on real processes: three `python -m dledger` members sharing a
secret file elect a leader and replicate; a connection to a member's port that does not complete
the HMAC handshake — no handshake at all, a wrong secret, or a recorded handshake replayed — is
closed before any request frame is read, with one log line, and the group's term and log are
untouched. Reference: docs/ARCHITECTURE.md §5, dledger/rpc/auth.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.client import DLedgerClient
from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import DLedgerEntry
from dledger.rpc import auth, protocol
from tests.ports import free_ports

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
GROUP = "authg"
IDS = ("n0", "n1", "n2")


def write_secret(path: Path, key: str) -> Path:
    path.write_text(f"# the set's peer key\n{key}\n")
    path.chmod(0o600)
    return path


class Group:
    """Three authenticated members; every process started is killed by PID at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ports = dict(zip(IDS, free_ports(3), strict=True))
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in self.ports.items())
        self.secret = write_secret(base / "peer.secret", "k" * 16 + os.urandom(16).hex())
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, member: str) -> str:
        return (self.base / f"{member}.log").read_text()

    def start(self, member: str, secret: Path | None = None) -> subprocess.Popen[bytes]:
        with open(self.base / f"{member}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", member, "--peers",
                 self.peers, "--store-dir", str(self.base / member),
                 "--peer-secret-file", str(secret or self.secret)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        self.procs[member] = proc
        return proc

    def client(self, secret: Path | None = None, timeout_s: float = 10.0) -> DLedgerClient:
        return DLedgerClient(GROUP, self.peers, timeout_s=timeout_s,
                             peer_secret_file=str(secret or self.secret))

    def teardown(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    g = Group(tmp_path_factory.mktemp("peerauth"))
    try:
        for m in IDS:
            g.start(m)
        asyncio.run(_first_entries(g))
        yield g
    finally:
        g.teardown()


async def _first_entries(g: Group) -> None:
    async with g.client() as c:
        await c.find_leader()
        for i in range(10):
            await c.append([f"before-{i}".encode()])


async def state(g: Group) -> dict[str, tuple[int, int, int]]:
    """(term, ledgerEndIndex, committedIndex) of every member, asked through `g.client()` (authenticated
    links here, TLS ones in test_dledger_peer_tls.py)."""
    async with g.client() as c:
        out = {}
        for m in IDS:
            md = await c.metadata(m)
            out[m] = (md["term"], md["ledgerEndIndex"], md["committedIndex"])
        return out


def recv_all(s: socket.socket, timeout_s: float = 3.0) -> bytes:
    """Everything the member sends until it closes the connection (or the timeout)."""
    s.settimeout(timeout_s)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        return out + b"<still open>"
    except ConnectionResetError:  # closed with our unread bytes in its buffer
        pass
    return out


def send_frames(s: socket.socket, frames: list[bytes]) -> None:
    """Send what the member may already have refused (it closes as soon as it sees them)."""
    with contextlib.suppress(OSError):
        for frame in frames:
            s.sendall(frame)


def hostile_frames(target: str, term: int) -> list[bytes]:
    """A vote with a far higher term and a TRUNCATE push at index 0 from a made-up leader."""
    vote = protocol.VoteRequest(group=GROUP, remote_id=target, local_id="n1", term=term + 100,
                                ledger_end_index=10**9, ledger_end_term=term + 100)
    truncate = protocol.PushEntryRequest(group=GROUP, remote_id=target, local_id="n1", leader_id="n1",
                                         term=term + 100, type=protocol.PushType.TRUNCATE,
                                         entries=[DLedgerEntry(body=b"evil", index=0, term=term + 100,
                                                               pos=0)])
    return [protocol.encode_frame(protocol.KIND_REQUEST, 1, vote),
            protocol.encode_frame(protocol.KIND_REQUEST, 2, truncate)]


async def test_authenticated_members_elect_and_replicate(group: Group) -> None:
    async with group.client() as c:
        await c.append([b"after-auth"])
        leader = await c.find_leader()
        entries = await c.get(0, 100, member_id=leader)
    assert any(e.body == b"after-auth" for e in entries)
    for m in IDS:
        assert "peerAuth=hmac" in group.log(m)


async def test_frames_without_a_handshake_are_refused_and_change_nothing(group: Group) -> None:
    before = await state(group)
    term = max(t for t, _, _ in before.values())
    target = "n0"
    with socket.create_connection(("127.0.0.1", group.ports[target])) as s:
        send_frames(s, hostile_frames(target, term))
        answer = recv_all(s)
    assert answer == b"", f"the member answered an unauthenticated peer: {answer[:64]!r}"
    after = await state(group)
    assert {m: v[:2] for m, v in after.items()} == {m: v[:2] for m, v in before.items()}  # term, end
    assert f"event=peer_auth_refused group={GROUP} selfId={target}" in group.log(target)
    assert "not a peer handshake" in group.log(target)


async def test_a_client_with_a_wrong_secret_is_refused(group: Group, tmp_path: Path) -> None:
    wrong = write_secret(tmp_path / "wrong.secret", "w" * 64)
    async with group.client(secret=wrong, timeout_s=2.0) as c:
        with pytest.raises(DLedgerException) as ex:
            await c.metadata("n1")
    assert ex.value.code in (DLedgerResponseCode.NETWORK_ERROR, DLedgerResponseCode.TIMEOUT)
    assert "unknown key id" in group.log("n1")  # the refusal names the reason in one line
    async with DLedgerClient(GROUP, group.peers, timeout_s=2.0) as plain:  # no secret at all
        with pytest.raises(DLedgerException):
            await plain.metadata("n1")


async def test_a_replayed_handshake_is_refused(group: Group) -> None:
    """Record a good handshake's client bytes (HELLO, AUTH) and send them again on a new
    connection: the member's fresh nonce makes the recorded proof wrong."""
    target = "n2"
    keys = auth.load_peer_keys(str(group.secret))
    connector = auth.PeerAuth(GROUP, "n0", keys).connector(target)
    sent = [connector.hello()]
    with socket.create_connection(("127.0.0.1", group.ports[target]), timeout=3) as s:
        s.sendall(sent[0])
        buf = b""
        while (msg := auth.read_message(buf)) is None:
            buf += s.recv(4096)
        mtype, body, used = msg
        reply = connector.on_message(mtype, body)
        sent.append(reply)
        s.sendall(reply)
        buf = buf[used:]
        while (msg := auth.read_message(buf)) is None:
            buf += s.recv(4096)
        assert msg[0] == auth.OK  # the recorded handshake was a good one
    before = await state(group)
    term = max(t for t, _, _ in before.values())
    with socket.create_connection(("127.0.0.1", group.ports[target])) as s:
        s.sendall(b"".join(sent))
        answer = recv_all(s)
        send_frames(s, hostile_frames(target, term))
    # The member sends its challenge (to the replayed hello), then closes: no OK, no response.
    mtype, _, used = auth.read_message(answer)  # type: ignore[misc]
    assert mtype == auth.CHALLENGE and answer[used:] == b"", answer
    assert "wrong proof from 'n0'" in group.log(target)
    after = await state(group)
    assert {m: v[:2] for m, v in after.items()} == {m: v[:2] for m, v in before.items()}


async def test_a_stalled_handshake_is_closed_at_the_deadline(group: Group) -> None:
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", group.ports["n0"])) as s:
        s.sendall(b"\x00")  # one byte of a handshake, then nothing
        answer = recv_all(s, timeout_s=10.0)
    assert answer == b"" and time.monotonic() - t0 < 8  # peerHandshakeTimeoutMs = 5000


def test_a_secret_file_readable_by_others_stops_the_member(group: Group, tmp_path: Path) -> None:
    loose = tmp_path / "loose.secret"
    loose.write_text("x" * 64 + "\n")
    loose.chmod(0o644)
    proc = subprocess.run(
        [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", "n0", "--peers", group.peers,
         "--store-dir", str(tmp_path / "s"), "--peer-secret-file", str(loose)],
        cwd=REPO, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2 and "chmod 600" in proc.stderr, proc.stderr
