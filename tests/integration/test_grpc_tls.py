"""The gRPC port under `tls.server.mode=enforcing`: TLS with the HTTP port's certificate, as the
official Python client speaks it (`tls_enable=True`), a slave forwarding master calls over TLS,
plaintext refused; client certificates with `need.client.auth=require`; an encrypted key stops the
broker at start naming the key (grpcio takes no key password).

QA: with TLS switched on, the HTTP ports served HTTPS and the gRPC port went on in plaintext."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from broker.grpc.protocol import Code, pb, spb, spb_grpc
from tests.integration._grpc_harness import NODE_DIR, SCRIPTS, node_client, run_client
from tests.integration._ledgermq_procs import (
    CONF,
    ProcessGroup,
    start_broker,
    start_namesrv,
    wait_http,
    write_conf,
)
from tests.ports import free_ports
from tests.tls_certs import Pki, make_pki

pytestmark = pytest.mark.slow


@dataclass
class TlsSet:
    pki: Pki
    client_cert: bool  # the HTTP ports want the client certificate too
    http: dict[str, str] = field(default_factory=dict)
    grpc: dict[str, str] = field(default_factory=dict)

    def master(self, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for sid, addr in self.http.items():
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    status = httpx.get(f"https://{addr}/status", timeout=2, **self.tls).json()
                    if status["role"] == "MASTER":
                        return sid
            time.sleep(0.1)
        raise AssertionError("no master")

    @property
    def tls(self) -> dict:
        """httpx's arguments to reach the HTTP ports."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        if self.client_cert:
            ctx.load_cert_chain(self.pki.client_cert, self.pki.client_key)
        return {"verify": ctx}


def _tls_keys(pki: Pki, **extra: str) -> dict[str, str]:
    return {
        "tls.server.mode": "enforcing",
        "tls.server.certPath": str(pki.server_cert),
        "tls.server.keyPath": str(pki.server_key),
        "tls.client.trustCertPath": str(pki.ca),  # the forwarder verifies its master with it
        **extra,
    }


@contextlib.contextmanager
def _tls_set(workdir: Path, pki: Pki, **extra: str) -> Iterator[TlsSet]:
    group = ProcessGroup(workdir)
    try:
        ns = start_namesrv(group, workdir)
        peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(free_ports(3)))
        s = TlsSet(pki, "tls.server.need.client.auth" in extra)
        for i, port in enumerate(free_ports(3)):
            sid = f"n{i}"
            s.http[sid] = start_broker(
                group, workdir, CONF / "dledger" / f"broker-{sid}.conf", sid, ns, wait=False,
                dLegerPeers=peers, grpcServerPort=str(port), registerNameServerPeriod="1000",
                **_tls_keys(pki, **extra),
            )
            s.grpc[sid] = f"127.0.0.1:{port}"
        master = s.http[s.master()]
        r = httpx.put(f"https://{master}/topics/tls-demo", json={"readQueueNums": 2, "writeQueueNums": 2},
                      timeout=10, **s.tls)
        assert r.status_code == 200, r.text

        def routed(r: httpx.Response) -> bool:
            return r.status_code == 200 and all(b.get("masterGrpcAddr") for b in r.json()["brokers"])

        wait_http(f"http://{ns}/routes/tls-demo", timeout_s=15, ok=routed)
        yield s
    finally:
        group.stop_all()


@pytest.fixture(scope="module")
def tls_set(tmp_path_factory) -> Iterator[TlsSet]:
    workdir = tmp_path_factory.mktemp("grpc-tls")
    with _tls_set(workdir, make_pki(workdir / "pki")) as s:
        yield s


def test_the_official_python_client_sends_and_receives_over_tls(tls_set: TlsSet) -> None:
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tls_set.pki.ca)}
    # One access point: the 5.1.2 client checks the certificate against its whole endpoints string
    # ("127.0.0.1:a,127.0.0.1:b"), which no certificate names. A slave's, so the route's master is
    # reached from there.
    slave = next(sid for sid in tls_set.grpc if sid != tls_set.master())
    script = str(SCRIPTS / "py_roundtrip.py")
    out = run_client([sys.executable, script, tls_set.grpc[slave], "tls-demo", "tls-group", "20", "tls"],
                     timeout_s=180, env=env)
    assert len(out["sent"]) == 20
    assert set(out["received"]) == set(out["sent"])
    assert sorted(m["body"] for m in out["received"].values()) == sorted(f"py-{i}" for i in range(20))


def test_the_official_node_client_sends_and_receives_over_tls(tls_set: TlsSet) -> None:
    node, why = node_client()
    if node is None:
        pytest.skip(why)
    # grpc-js takes its roots from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (NODE_EXTRA_CA_CERTS is not
    # used for a gRPC channel), and one access point: its target cannot list several.
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tls_set.pki.ca)}
    master = tls_set.master()
    r = httpx.put(f"https://{tls_set.http[master]}/topics/tls-node",
                  json={"readQueueNums": 1, "writeQueueNums": 1}, timeout=10, **tls_set.tls)
    assert r.status_code == 200, r.text
    slave = next(sid for sid in tls_set.grpc if sid != master)
    argv = [node, str(NODE_DIR / "roundtrip.js"), tls_set.grpc[slave], "tls-node", "tls-node", "20", "tls"]
    out = run_client(argv, timeout_s=180, env=env)
    assert len(out["sent"]) == 20
    assert set(out["received"]) == set(out["sent"])
    assert sorted(m["body"] for m in out["received"].values()) == sorted(f"node-{i}" for i in range(20))


def _send(channel: grpc.Channel, body: bytes, message_id: str) -> spb.SendMessageResponse:
    msg = pb.Message(
        topic=pb.Resource(name="tls-demo"),
        system_properties=pb.SystemProperties(message_id=message_id),
        body=body,
    )
    stub = spb_grpc.MessagingServiceStub(channel)
    return stub.SendMessage(spb.SendMessageRequest(messages=[msg]), metadata=(("x-mq-client-id", "tls"),),
                            timeout=10)


def test_a_slave_forwards_a_send_to_its_master_over_tls_and_plaintext_is_refused(tls_set: TlsSet) -> None:
    slave = next(sid for sid in tls_set.grpc if sid != tls_set.master())
    roots = tls_set.pki.ca.read_bytes()
    with grpc.secure_channel(tls_set.grpc[slave], grpc.ssl_channel_credentials(roots)) as channel:
        sent = _send(channel, b"via-slave", "0102FC000000016BC50B17DF61000000B1")
    assert sent.status.code == Code.OK, sent.status
    with grpc.insecure_channel(tls_set.grpc[slave]) as channel, pytest.raises(grpc.RpcError) as refused:
        _send(channel, b"plaintext", "0102FC000000016BC50B17DF61000000B2")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_certificates_are_required_when_the_broker_says_so(tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    extra = {
        "tls.server.need.client.auth": "require",
        "tls.server.trustCertPath": str(pki.ca),
        "tls.client.certPath": str(pki.client_cert),  # the forwarder's own certificate
        "tls.client.keyPath": str(pki.client_key),
    }
    with _tls_set(tmp_path, pki, **extra) as s:
        roots = pki.ca.read_bytes()
        cert, key = pki.client_cert.read_bytes(), pki.client_key.read_bytes()
        slave = next(sid for sid in s.grpc if sid != s.master())
        with grpc.secure_channel(s.grpc[slave], grpc.ssl_channel_credentials(roots, key, cert)) as channel:
            sent = _send(channel, b"with-cert", "0102FC000000016BC50B17DF61000000C1")
        assert sent.status.code == Code.OK, sent.status  # forwarded with the member's certificate
        with grpc.secure_channel(s.grpc[slave], grpc.ssl_channel_credentials(roots)) as channel, \
                pytest.raises(grpc.RpcError) as refused:
            _send(channel, b"no-cert", "0102FC000000016BC50B17DF61000000C2")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_an_encrypted_key_stops_the_broker_at_start_naming_the_key(tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(pki.server_key), "-out", str(encrypted), "-aes256",
                    "-passout", "pass:secret"], check=True, capture_output=True)
    encrypted.chmod(0o600)
    conf = write_conf(CONF / "dledger" / "broker-n0.conf", tmp_path / "n0.conf", {
        "storePathRootDir": str(tmp_path / "store"),
        "grpcServerPort": str(free_ports(1)[0]),
        **_tls_keys(pki, **{"tls.server.keyPath": str(encrypted), "tls.server.keyPassword": "secret"}),
    })
    out = subprocess.run([sys.executable, "-m", "broker", "-c", str(conf)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "tls.server.keyPassword" in out.stderr and "unencrypted key" in out.stderr, out.stderr[-2000:]
