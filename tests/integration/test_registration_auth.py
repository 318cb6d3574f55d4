"""Authenticated broker registration on real processes (`registrationSecretFile`, wire.regauth): a
broker holding the name server's secret registers and unregisters; a fake registration (unsigned,
wrong secret, tampered, replayed, stale) and a broker without the secret are refused with 401 and a
clear log line, and the routes never show them."""

from __future__ import annotations

import os
import signal
import time

import httpx
import orjson
import pytest

from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_broker, start_namesrv
from wire.regauth import sign

SECRET = "3f1b0c9e2a7d4c58b6e1f0a9d8c7b6a5f4e3d2c1b0a99887766554433221100f"
FAKE = {
    "clusterName": "DefaultCluster",
    "brokerName": "broker-evil",
    "brokerId": 0,
    "brokerAddr": "10.6.6.6:10911",
    "topics": {"orders": {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6}},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("regauth")
    secret = d / "registration.secret"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, 0o600)
    group = ProcessGroup(d)
    try:
        ns = start_namesrv(group, d, registrationSecretFile=str(secret))
        good = start_broker(
            group, d, CONF / "broker-single.conf", "good", ns, brokerName="broker-good",
            registrationSecretFile=str(secret), registerNameServerPeriod="1000",
        )
        bad = start_broker(
            group, d, CONF / "broker-single.conf", "nosecret", ns, brokerName="broker-nosecret",
            registerNameServerPeriod="1000",
        )
        yield {"group": group, "ns": ns, "good": good, "bad": bad}
    finally:
        group.stop_all()


def _brokers(ns: str) -> dict:
    return httpx.get(f"http://{ns}/cluster", timeout=5).json()["brokers"]


def test_only_a_broker_holding_the_secret_is_registered(cluster):
    ns, group = cluster["ns"], cluster["group"]
    deadline = time.monotonic() + 20
    while "broker-good" not in _brokers(ns) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _brokers(ns)["broker-good"]["masterAddr"] == cluster["good"]
    deadline = time.monotonic() + 10
    while "event=register_refused" not in group.log_text("nosecret") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "status=401" in group.log_text("nosecret")
    assert "broker-nosecret" not in _brokers(ns)
    ns_log = group.log_text("namesrv")
    assert "event=registration_refused reason=missing_signature" in ns_log
    assert "brokerName=broker-nosecret" in ns_log


def test_fake_registrations_are_refused_with_the_reason(cluster):
    ns, group = cluster["ns"], cluster["group"]
    url = f"http://{ns}/brokers/register"
    body = orjson.dumps(FAKE)
    json_type = {"content-type": "application/json"}

    def post(headers: dict[str, str], content: bytes = body) -> httpx.Response:
        return httpx.post(url, content=content, headers={**json_type, **headers}, timeout=5)

    cases = {
        "missing_signature": post({}),
        "bad_signature": post(sign(b"w" * 64, "POST", "/brokers/register", body)),
        "stale_date": post(
            sign(SECRET.encode(), "POST", "/brokers/register", body, now_ms=int(time.time() * 1000) - 600_000)
        ),
    }
    tampered = sign(SECRET.encode(), "POST", "/brokers/register", body)
    cases["tampered body"] = post(tampered, body.replace(b"10.6.6.6", b"10.6.6.7"))
    for what, r in cases.items():
        assert r.status_code == 401, (what, r.text)
        assert r.headers["content-type"] == "application/problem+json" and r.json()["code"] == "UNAUTHORIZED"
    # A genuine registration recorded on the wire and sent again: refused the second time.
    genuine = dict(FAKE, brokerName="broker-replay", brokerAddr="127.0.0.1:1", topics={})
    gbody = orjson.dumps(genuine)
    headers = sign(SECRET.encode(), "POST", "/brokers/register", gbody)
    assert post(headers, gbody).status_code == 200
    replay = post(headers, gbody)
    assert replay.status_code == 401 and "replayed_nonce" in replay.json()["detail"]
    # An unsigned unregister cannot take the genuine broker out of the routes.
    r = httpx.post(f"http://{ns}/brokers/unregister", json={"brokerAddr": cluster["good"]}, timeout=5)
    assert r.status_code == 401
    assert "broker-evil" not in _brokers(ns) and "broker-good" in _brokers(ns)
    assert httpx.get(f"http://{ns}/routes/orders", timeout=5).status_code == 404
    ns_log = group.log_text("namesrv")
    for reason in ("missing_signature", "bad_signature", "stale_date", "replayed_nonce"):
        assert f"event=registration_refused reason={reason} remote=127.0.0.1" in ns_log, reason
    assert "brokerName=broker-evil brokerAddr=10.6.6.6:10911" in ns_log
    metrics = httpx.get(f"http://{ns}/metrics", timeout=5).text
    assert 'ledgermq_namesrv_registrations_refused_total{reason="bad_signature"}' in metrics


def test_a_signed_unregister_removes_the_broker_at_shutdown(cluster):
    ns, group = cluster["ns"], cluster["group"]
    assert "broker-good" in _brokers(ns)
    group.kill("good", signal.SIGTERM)  # graceful: the broker unregisters, signed, before it exits
    assert "broker-good" not in _brokers(ns)
    refused = "path=/brokers/unregister brokerName=? brokerAddr=" + cluster["good"]
    assert group.log_text("namesrv").count(refused) == 1  # the unsigned attempt of the test above only
