"""HTTPS on real processes: a name server and a broker with `tls.server.mode=enforcing`, the broker
registering over HTTPS (`tls.enable`, `tls.client.trustCertPath`); the SDK (its `ca_file` option),
mqadmin and curl produce and consume over HTTPS; plaintext and unverified clients get nothing."""

from __future__ import annotations

import io
import json
import shutil
import ssl
import subprocess
import time

import httpx
import pytest

from client import PullConsumer, SimpleConsumer
from client.mqadmin import main as mqadmin
from client.producer import Producer
from tests.integration._ledgermq_procs import ProcessGroup, free_port
from tests.tls_certs import (
    make_pki,
    reissue_server_cert,
    served_certificate,
    start_https_namesrv_and_broker,
    wait_https,
)

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    pki = make_pki(d / "pki")
    group = ProcessGroup(d)
    try:
        ns, broker = start_https_namesrv_and_broker(group, d, pki)
        c_port = free_port()
        console = group.start(
            "console", "console", "-n", ns, "--port", str(c_port),
            "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--ca-file", str(pki.ca),
        )
        wait_https(f"https://127.0.0.1:{c_port}/health", str(pki.ca), console)
        yield {
            "group": group,
            "pki": pki,
            "ns": ns,
            "broker": broker,
            "console": f"127.0.0.1:{c_port}",
        }
    finally:
        group.stop_all()


def test_the_broker_registers_over_https_and_the_sdk_produces_and_consumes(tls_cluster):
    ns, ca = tls_cluster["ns"], str(tls_cluster["pki"].ca)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        brokers = httpx.get(f"https://{ns}/cluster", verify=ssl.create_default_context(cafile=ca)).json()[
            "brokers"
        ]
        if brokers.get("broker-s", {}).get("masterAddr"):
            break
        time.sleep(0.1)
    assert brokers["broker-s"]["masterAddr"] == tls_cluster["broker"]
    assert "event=register_failed" not in tls_cluster["group"].log_text("broker")

    with Producer(ns, ca_file=ca) as producer:
        sent = [producer.send("tls-sdk", f"secret-{i}", queue_id=0) for i in range(3)]
    with PullConsumer(ns, ca_file=ca) as consumer:
        got = consumer.pull("tls-sdk", 0, 0, 32)
    assert [m.body for m in got.messages] == [b"secret-0", b"secret-1", b"secret-2"]
    assert [m.msg_id for m in got.messages] == [r.msg_id for r in sent]
    with SimpleConsumer("g-tls", "tls-sdk", ns, ca_file=ca) as group_consumer:
        received = group_consumer.receive(max_messages=8, wait_ms=2000)
        assert sorted(m.body for m in received) == [b"secret-0", b"secret-1", b"secret-2"]
        assert all(r["status"] == "OK" for r in group_consumer.ack(*received)["results"])

    out = io.StringIO()
    assert mqadmin(["topicStatus", "-n", ns, "-t", "tls-sdk", "--ca-file", ca, "--json"], out=out) == 0
    assert sum(row["maxOffset"] for row in json.loads(out.getvalue())) == 3


def _curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", "--max-time", "10", *args], capture_output=True, text=True)


def test_curl_produces_and_consumes_over_https(tls_cluster):
    b, ca = tls_cluster["broker"], str(tls_cluster["pki"].ca)
    r = _curl(
        "--cacert", ca, "-X", "POST", f"https://{b}/topics/tls-curl/messages",
        "-H", "Content-Type: application/json", "-d", '{"messages": [{"body": "over tls", "queueId": 0}]}',
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["queueOffset"] == 0
    r = _curl("--cacert", ca, f"https://{b}/topics/tls-curl/queues/0/messages?offset=0")
    assert r.returncode == 0, r.stderr
    assert [m["body"] for m in json.loads(r.stdout)["messages"]] == ["over tls"]


def test_plaintext_and_unverified_clients_get_no_answer(tls_cluster):
    b, pki = tls_cluster["broker"], tls_cluster["pki"]
    plain = _curl(f"http://{b}/health")
    assert plain.returncode != 0 and plain.stdout == "", plain  # no HTTP answer to plaintext
    unverified = _curl(f"https://{b}/health")  # the system CAs do not know ours
    assert unverified.returncode == 60, unverified
    wrong_ca = _curl("--cacert", str(pki.rogue_ca), f"https://{b}/health")
    assert wrong_ca.returncode == 60, wrong_ca
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"https://{b}/health", verify=ssl.create_default_context(cafile=str(pki.rogue_ca)))


def test_the_console_serves_https_and_reads_the_https_cluster(tls_cluster):
    ctx = ssl.create_default_context(cafile=str(tls_cluster["pki"].ca))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        page = httpx.get(f"https://{tls_cluster['console']}/cluster", verify=ctx, timeout=10)
        if page.status_code == 200 and "broker-s" in page.text:
            break
        time.sleep(0.2)
    assert page.status_code == 200 and "broker-s" in page.text, page.text[:500]
    assert _curl(f"http://{tls_cluster['console']}/health").stdout == ""  # HTTPS only


def _pem(text: str) -> str:
    return ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(text))


def test_a_rotated_certificate_is_served_without_a_restart(tls_cluster):
    """The operator replaces the certificate, then its key (RocketMQ's brokers watch the files): until
    the key follows, the pair does not load and the old certificate stays in force; then every
    port — the name server's, the broker's HTTP and gRPC ports — shows the new one to new
    connections, and clients verifying against the CA notice nothing. Runs last: it rotates the
    files the other tests' processes use."""
    pki, group = tls_cluster["pki"], tls_cluster["group"]
    ports = {name: ("127.0.0.1", int(addr.rsplit(":", 1)[1])) for name, addr in
             (("namesrv", tls_cluster["ns"]), ("broker", tls_cluster["broker"]))}
    ports["broker-grpc"] = ("127.0.0.1", 18811)  # conf/broker-single.conf's grpcServerPort
    old = _pem(pki.server_cert.read_text())
    assert {_pem(served_certificate(*hp)) for hp in ports.values()} == {old}
    new_cert, new_key = reissue_server_cert(pki, "server-rotated")
    new = _pem(new_cert.read_text())

    shutil.copyfile(new_cert, pki.server_cert)  # the certificate alone: it does not match the key
    deadline = time.monotonic() + 10
    while "event=tls_reload_failed" not in group.log_text("broker"):
        assert time.monotonic() < deadline, "a certificate without its key was not reported"
        time.sleep(0.1)
    assert _pem(served_certificate(*ports["broker"])) == old

    shutil.copyfile(new_key, pki.server_key)
    deadline = time.monotonic() + 10
    while {name for name, hp in ports.items() if _pem(served_certificate(*hp)) != new}:
        assert time.monotonic() < deadline, "the new certificate is not served"
        time.sleep(0.2)
    for name in ("broker", "namesrv"):
        assert "event=tls_reloaded" in group.log_text(name), name
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    assert httpx.get(f"https://{tls_cluster['broker']}/health", verify=ctx, timeout=5).status_code == 200
