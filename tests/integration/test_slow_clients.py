"""Slow and idle clients cannot take a broker off the air (listener/guard.py), on a real broker
process: more slow and partial connections than the caps, opened from other loopback addresses,
while a client on 127.0.0.1 keeps producing and consuming.

- connections over `maxConnectionsPerIp` (from one address) and over `maxConnections` (the
  listener) are answered 503 "too many connections" naming the cap, and closed at once;
- a connection that never sends a request, or never finishes its headers, is answered 408 and
  closed at `requestHeaderTimeoutMs`; one that trickles its body is cut at `requestBodyTimeoutMs` +
  Content-Length / `requestBodyMinBytesPerSec` — never before;
- every produce and pull of the client meanwhile succeeds; once the slow ones are gone the
  address that held them is admitted again;
- HTTP/1.1 pipelining is answered in order, but a connection that pipelines without reading is
  no longer read (not queued in memory), one that queues more than `MAX_PIPELINED` in one read is
  closed (`event=pipeline_overflow`), and a client gone mid-answer logs no error;
- the gRPC port keeps the same bounds: a connection that has not finished its HTTP/2 handshake is
  closed at `requestHeaderTimeoutMs`, and connections over `maxConnections` are closed at once.

Latency under this load is a bench figure (bench/slow_clients_bench.py), not asserted here."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time

import grpc
import httpx
import pytest

from broker.grpc.protocol import Code, pb, spb, spb_grpc
from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_broker
from tests.ports import free_port

HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 3.0
BODY_RATE = 1024 * 1024  # bytes/s: a 1 MiB body gets 1 s on top of BODY_TIMEOUT_S
BODY_BYTES = 1024 * 1024
MAX_CONNECTIONS = 200
MAX_PER_IP = 150
SLACK_S = 2.5  # a loaded 2-core machine: a timer may fire late, never early


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slow-clients")
    group = ProcessGroup(workdir)
    grpc_port = free_port()
    try:
        addr = start_broker(
            group,
            workdir,
            CONF / "broker-single.conf",
            "slow",
            None,
            requestHeaderTimeoutMs=str(int(HEADER_TIMEOUT_S * 1000)),
            requestBodyTimeoutMs=str(int(BODY_TIMEOUT_S * 1000)),
            requestBodyMinBytesPerSec=str(BODY_RATE),
            maxConnections=str(MAX_CONNECTIONS),
            maxConnectionsPerIp=str(MAX_PER_IP),
            serverChannelMaxIdleTimeSeconds="2",
            grpcServerPort=str(grpc_port),
        )
        yield group, addr, f"127.0.0.1:{grpc_port}"
    finally:
        group.stop_all()


def _connect(addr: str, source: str) -> socket.socket:
    host, _, port = addr.rpartition(":")
    s = socket.socket()
    s.bind((source, 0))
    s.connect((host, int(port)))
    return s


class Client(threading.Thread):
    """Produce one message, pull it back, repeat, over one keep-alive connection from 127.0.0.1."""

    def __init__(self, addr: str) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{addr}"
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10, limits=httpx.Limits(max_connections=1)) as http:
            while not self.stop.is_set():
                try:
                    body = {"messages": [{"body": f"m{self.ok}", "queueId": 0}]}
                    r = http.post("/topics/slow/messages", json=body)
                    if r.status_code != 200:
                        self.failures.append(f"produce {r.status_code} {r.text[:200]}")
                        continue
                    offset = r.json()["results"][0]["queueOffset"]
                    params = {"offset": offset, "maxMessages": 1}
                    r = http.get("/topics/slow/queues/0/messages", params=params)
                    if r.status_code != 200 or r.json()["messages"][0]["body"] != f"m{self.ok}":
                        self.failures.append(f"pull {r.status_code} {r.text[:200]}")
                        continue
                    self.ok += 1
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                time.sleep(0.01)


def _read_refusal(s: socket.socket) -> bytes:
    s.settimeout(5)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            return data
        data += chunk


def _watch_closes(socks: dict[socket.socket, float]) -> dict[socket.socket, tuple[float, bytes]]:
    """Wait until the server closes each socket: {sock: (seconds after its start, bytes it sent)}."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    got: dict[socket.socket, bytes] = {s: b"" for s in socks}
    closed: dict[socket.socket, tuple[float, bytes]] = {}
    deadline = time.monotonic() + HEADER_TIMEOUT_S + BODY_TIMEOUT_S + BODY_BYTES / BODY_RATE + 3 * SLACK_S
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            s = key.fileobj
            try:
                chunk = s.recv(4096)
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if chunk:
                got[s] += chunk
                continue
            closed[s] = (time.monotonic() - socks[s], got[s])
            sel.unregister(s)
    sel.close()
    return closed


def test_slow_and_partial_connections_over_the_caps_are_refused_or_cut_in_time(broker):
    group, addr, _ = broker
    client = Client(addr)
    client.start()
    attack: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 10
        while client.ok < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.ok >= 5, client.failures

        # 127.0.0.2: 240 connections, over its per-address cap of 150.
        slow_body, partial, idle, refused_per_ip = {}, {}, {}, []
        head = (
            f"POST /topics/slow/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BODY_BYTES}\r\n\r\n"
        ).encode()
        for i in range(240):
            s = _connect(addr, "127.0.0.2")
            attack.append(s)
            started = time.monotonic()
            if i < 120:
                s.sendall(head + b'{"message')  # headers and 10 bytes of a 1 MiB body
                slow_body[s] = started
            elif i < 180:
                s.sendall(b"POST /topics/slow/messages HTTP/1.1\r\nHost: x\r\nContent-Le")
                partial[s] = started
            else:
                idle[s] = started
        time.sleep(0.5)  # the refusals are written at accept
        for group_ in (slow_body, partial, idle):
            for s in list(group_):
                s.setblocking(False)
                try:
                    peek = s.recv(16, socket.MSG_PEEK)
                except BlockingIOError:
                    continue
                if peek.startswith(b"HTTP/1.1 503"):
                    s.setblocking(True)
                    refused_per_ip.append(_read_refusal(s))
                    del group_[s]
                s.setblocking(True)
        assert len(refused_per_ip) == 240 - MAX_PER_IP, len(refused_per_ip)
        assert all(b"too many connections (maxConnectionsPerIp=150)" in r for r in refused_per_ip)
        assert all(b'"outcome":"refused"' in r for r in refused_per_ip)

        # 127.0.0.3: 100 more, over the listener's cap of 200 (150 + the client's 1 already held).
        third, refused_total = [], []
        for _ in range(100):
            s = _connect(addr, "127.0.0.3")
            attack.append(s)
            third.append(s)
        time.sleep(0.5)
        for s in third:
            s.setblocking(False)
            try:
                if s.recv(16, socket.MSG_PEEK).startswith(b"HTTP/1.1 503"):
                    s.setblocking(True)
                    refused_total.append(_read_refusal(s))
            except BlockingIOError:
                pass
            s.setblocking(True)
        assert len(refused_total) >= 100 - (MAX_CONNECTIONS - MAX_PER_IP), len(refused_total)
        assert all(b"too many connections (maxConnections=200)" in r for r in refused_total)

        ok_before = client.ok
        closed = _watch_closes({**slow_body, **partial, **idle})
        assert len(closed) == len(slow_body) + len(partial) + len(idle), "a slow connection was never closed"
        for s, (after, data) in closed.items():
            if s in slow_body:
                limit = BODY_TIMEOUT_S + BODY_BYTES / BODY_RATE
                assert limit - 0.5 <= after <= limit + SLACK_S, ("body", after)
                assert not data  # aborted mid-body: no answer
            else:
                assert HEADER_TIMEOUT_S - 0.5 <= after <= HEADER_TIMEOUT_S + SLACK_S, ("headers", after)
                assert data.startswith(b"HTTP/1.1 408"), data[:100]
        assert client.ok > ok_before, "no produce/pull completed while the slow connections were open"

        # The address is admitted again once its connections are gone.
        fresh = _connect(addr, "127.0.0.2")
        attack.append(fresh)
        fresh.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_refusal(fresh).startswith(b"HTTP/1.1 200")
    finally:
        client.stop.set()
        client.join(15)
        for s in attack:
            s.close()
    assert not client.failures, client.failures[:5]
    log = group.log_text("slow")
    assert "reason=maxConnectionsPerIp " in log and "reason=maxConnections " in log
    assert "event=request_read_timeout" in log


def test_grpc_port_cuts_unfinished_handshakes_and_refuses_connections_over_the_cap(broker):
    _, _, grpc_addr = broker
    # Half an HTTP/2 preface each, never finished: held until requestHeaderTimeoutMs.
    partial: dict[socket.socket, float] = {}
    for _ in range(MAX_CONNECTIONS):
        s = _connect(grpc_addr, "127.0.0.3")
        s.sendall(b"PRI * HTTP/2.0\r\n")
        partial[s] = time.monotonic()
    time.sleep(0.5)  # every one accepted before the next: these are over the cap
    over = {_connect(grpc_addr, "127.0.0.4"): time.monotonic() for _ in range(5)}
    try:
        closed_over = _watch_closes(over)
        closed_partial = _watch_closes(partial)
        assert len(closed_over) == 5 and all(t < SLACK_S for t, _ in closed_over.values()), closed_over
        assert len(closed_partial) == MAX_CONNECTIONS, f"{MAX_CONNECTIONS - len(closed_partial)} never closed"
        times = sorted(t for t, _ in closed_partial.values())
        assert times[0] >= HEADER_TIMEOUT_S - 1.0, f"closed after {times[0]:.2f} s"
        assert times[-1] <= HEADER_TIMEOUT_S + SLACK_S + 0.5, f"closed after {times[-1]:.2f} s"
        with grpc.insecure_channel(grpc_addr) as channel:  # the port serves again once they are gone
            reply = spb_grpc.MessagingServiceStub(channel).Heartbeat(
                spb.HeartbeatRequest(client_type=pb.PRODUCER),
                metadata=(("x-mq-client-id", "slow@1"),),
                timeout=10,
            )
        assert reply.status.code == Code.OK
    finally:
        for s in [*partial, *over]:
            s.close()


def _rss_anon_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024


def test_pipelined_requests_are_bounded_and_a_client_gone_mid_answer_logs_no_error(broker):
    group, addr, _ = broker
    pid = group.procs["slow"].pid
    body = {"messages": [{"body": "x" * 1000, "queueId": 1} for _ in range(64)]}
    assert httpx.post(f"http://{addr}/topics/pipe/messages", json=body, timeout=10).status_code == 200
    get = b"GET /topics/pipe/queues/1/messages?offset=0&maxMessages=64 HTTP/1.1\r\nHost: x\r\n\r\n"

    # A pipelining client that reads its answers gets them all, in order.
    s = _connect(addr, "127.0.0.5")
    s.sendall(get * 10)
    s.settimeout(10)
    data = b""
    while data.count(b"HTTP/1.1 200") < 10:
        chunk = s.recv(1 << 16)
        assert chunk, f"closed after {data.count(b'HTTP/1.1 200')} answers"
        data += chunk
    s.close()

    # One that never reads: the broker stops reading it, or closes it once one read queues too
    # many, instead of queueing what it sends (uvicorn alone held ~100 MB of parsed requests for
    # such a connection).
    before = _rss_anon_mb(pid)
    s = _connect(addr, "127.0.0.5")
    s.settimeout(1.0)
    sent = 0
    try:
        for _ in range(60_000):
            s.sendall(get)
            sent += 1
    except (TimeoutError, ConnectionResetError, BrokenPipeError):
        pass
    time.sleep(1)
    grown = _rss_anon_mb(pid) - before
    s.close()  # gone with answers still being written
    assert grown < 40, f"the broker grew by {grown:.0f} MB for {sent} pipelined requests"

    # More than MAX_PIPELINED in one read: that connection is closed and logged, the rest served.
    s = _connect(addr, "127.0.0.5")
    s.sendall(get * 2000)
    s.settimeout(10)
    with contextlib.suppress(ConnectionResetError):
        while s.recv(1 << 16):
            pass
    s.close()
    params = {"offset": 0, "maxMessages": 1}
    r = httpx.get(f"http://{addr}/topics/pipe/queues/1/messages", params=params, timeout=10)
    assert r.status_code == 200
    time.sleep(0.5)
    log_text = group.log_text("slow")
    assert "event=pipeline_overflow" in log_text
    assert "Traceback" not in log_text and " ERROR " not in log_text, log_text[-3000:]
