"""The DLedger peer port of a real member (`python -m dledger`) under hostile input: frames for
another group or member are refused and logged, frames from a sender that is not a configured
peer are refused, an absurd frame length closes the connection before anything is allocated,
garbage closes the connection, and the member keeps serving its real peers throughout."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.codes import DLedgerResponseCode
from dledger.rpc import protocol
from tests.fault.cluster import REPO, free_ports

pytestmark = pytest.mark.timeout(60)
GROUP = "fuzzgroup"


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, subprocess.Popen]]:
    tmp = tmp_path_factory.mktemp("peerrpc")
    p0, p1, p2 = free_ports(3)
    log = tmp / "n0.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dledger", "--group", GROUP, "--self-id", "n0", "--peers",
             f"n0-127.0.0.1:{p0};n1-127.0.0.1:{p1};n2-127.0.0.1:{p2}", "--store-dir", str(tmp / "store")],
            cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", p0), timeout=0.5).close()
            break
        except OSError:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
    yield p0, log, proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)


def rpc(port: int, msg: protocol.RequestOrResponse, timeout_s: float = 5.0) -> protocol.RequestOrResponse:
    """One request over a fresh connection; returns the decoded response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(protocol.encode_frame(protocol.KIND_REQUEST, 77, msg))
        head = _recv_exact(s, protocol.FRAME_HEAD.size)
        length, kind, rtype, rid = protocol.FRAME_HEAD.unpack(head)
        body = _recv_exact(s, length + 4 - protocol.FRAME_HEAD.size)
    assert (kind, rid) == (protocol.KIND_RESPONSE, 77)
    return protocol.decode_frame_body(kind, rtype, memoryview(body))


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def closed_by_peer(s: socket.socket, timeout_s: float = 3.0) -> bool:
    s.settimeout(timeout_s)
    try:
        while s.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def vote(group: str = GROUP, remote: str = "n0", local: str = "n1") -> protocol.VoteRequest:
    return protocol.VoteRequest(group=group, remote_id=remote, local_id=local, term=1, pre_vote=True)


def test_a_configured_peer_is_answered(member: tuple) -> None:
    port, _, _ = member
    resp = rpc(port, vote())
    assert resp.code != DLedgerResponseCode.UNKNOWN_GROUP and resp.code != DLedgerResponseCode.UNKNOWN_MEMBER


def test_other_group_and_other_member_are_refused_and_logged(member: tuple) -> None:
    port, log, _ = member
    assert rpc(port, vote(group="intruders")).code == DLedgerResponseCode.UNKNOWN_GROUP
    assert rpc(port, vote(remote="n9")).code == DLedgerResponseCode.UNKNOWN_MEMBER
    time.sleep(0.2)
    text = log.read_text(errors="replace")
    assert "refusing frame for group='intruders'" in text and "member='n9'" in text


def test_a_sender_that_is_not_a_configured_peer_is_refused(member: tuple) -> None:
    port, _, _ = member
    resp = rpc(port, vote(local="mallory"))
    assert resp.code in (DLedgerResponseCode.UNKNOWN_MEMBER, DLedgerResponseCode.UNEXPECTED_MEMBER), resp


def test_absurd_frame_length_closes_before_allocation(member: tuple) -> None:
    port, _, proc = member
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((2**31).to_bytes(4, "big") + b"\x00" * 11)
        assert closed_by_peer(s), "a 2 GB frame length was not refused"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((3).to_bytes(4, "big") + b"\x00" * 3)  # shorter than a frame head
        assert closed_by_peer(s)
    assert proc.poll() is None
    assert rpc(port, vote()).code != DLedgerResponseCode.UNKNOWN_GROUP


@pytest.mark.parametrize("junk", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    (40).to_bytes(4, "big") + b"\x07" + b"\xff" * 39,      # unknown kind/type
    (30).to_bytes(4, "big") + b"\x00\xc7\x39" + b"\xff" * 27,  # a VOTE frame with garbage fields
])
def test_garbage_closes_the_connection_and_the_member_survives(member: tuple, junk: bytes) -> None:
    port, _, proc = member
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(junk)
        assert closed_by_peer(s)
    assert proc.poll() is None
    assert rpc(port, vote()).code != DLedgerResponseCode.UNKNOWN_GROUP


def test_many_idle_connections_do_not_block_a_peer(member: tuple) -> None:
    port, _, _ = member
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
    try:
        for s in socks[::2]:
            s.sendall((100).to_bytes(4, "big") + b"\x00" * 5)  # a frame that never completes
        t0 = time.monotonic()
        assert rpc(port, vote()).code != DLedgerResponseCode.UNKNOWN_GROUP
        assert time.monotonic() - t0 < 2
    finally:
        for s in socks:
            s.close()
