"""listener/: the shared key table refuses what it cannot honour, naming the key; a listener that
asks for client certificates serves only clients holding one from its CA (in this process, real
sockets)."""

from __future__ import annotations

import ssl

import httpx
import pytest

from broker.config import ConfigError, load_broker_config
from listener.config import ListenerConfig, ListenerConfigError, apply_key
from listener.server import HttpListener
from namesrv.config import NamesrvConfig
from tests.ports import free_port
from tests.tls_certs import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _config(**keys: str) -> ListenerConfig:
    cfg = ListenerConfig()
    for key, value in keys.items():
        assert apply_key(cfg, key.replace("_", "."), value)
    return cfg


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("tls.server.mode", "permissive", "not offered"),
        ("tls.server.mode", "on", "expected one of disabled, enforcing"),
        ("tls.test.mode.enable", "true", "throwaway certificate"),
        ("tls.server.need.client.auth", "maybe", "expected one of none, optional, require"),
        ("maxConnections", "0", "positive integer"),
        ("requestHeaderTimeoutMs", "soon", "positive integer"),
    ],
)
def test_a_bad_value_is_refused_with_the_reason(key, value, reason):
    with pytest.raises(ValueError, match=reason):
        apply_key(ListenerConfig(), key, value)


def test_cross_key_checks_name_the_missing_key(pki, tmp_path):
    cases = [
        ({"tls.server.mode": "enforcing"}, "tls.server.certPath"),
        (
            {"tls.server.mode": "enforcing", "tls.server.certPath": str(pki.server_cert)},
            "tls.server.keyPath",
        ),
        ({"tls.server.need.client.auth": "require"}, "tls.server.need.client.auth"),
        (
            {
                "tls.server.mode": "enforcing",
                "tls.server.certPath": str(pki.server_cert),
                "tls.server.keyPath": str(pki.server_key),
                "tls.server.need.client.auth": "require",
            },
            "tls.server.trustCertPath",
        ),
        (
            {
                "tls.server.mode": "enforcing",
                "tls.server.certPath": str(pki.server_cert),
                "tls.server.keyPath": str(pki.client_key),  # not the certificate's key
            },
            "tls.server.certPath",
        ),
    ]
    for keys, named in cases:
        cfg = ListenerConfig()
        for key, value in keys.items():
            apply_key(cfg, key, value)
        with pytest.raises(ListenerConfigError) as ei:
            cfg.validate()
        assert ei.value.key == named, (keys, ei.value)


def test_the_broker_and_name_server_files_carry_the_same_keys(pki, tmp_path):
    tls = (
        f"tls.server.mode=enforcing\ntls.server.certPath={pki.server_cert}\ntls.server.keyPath={pki.server_key}\n"
        "maxConnections=100\nrequestHeaderTimeoutMs=2500\nserverChannelMaxIdleTimeSeconds=7\n"
    )
    broker = tmp_path / "broker.conf"
    broker.write_text(f"brokerName=b\nstorePathRootDir={tmp_path}\n{tls}tls.enable=true\n")
    cfg = load_broker_config(str(broker))
    assert (cfg.listener.tls, cfg.listener.max_connections, cfg.listener.request_header_timeout_ms) == (
        True,
        100,
        2500,
    )
    assert cfg.listener.idle_timeout_s == 7 and cfg.tls_client.enable and cfg.tls_client.scheme == "https"
    ns = tmp_path / "namesrv.conf"
    ns.write_text(f"listenPort=9876\n{tls}")
    assert NamesrvConfig.load(ns).listener.max_connections == 100

    broker.write_text(f"brokerName=b\nstorePathRootDir={tmp_path}\ntls.server.mode=enforcing\n")
    with pytest.raises(ConfigError) as ei:
        load_broker_config(str(broker))
    assert ei.value.key == "tls.server.certPath" and "required" in str(ei.value)
    broker.write_text("brokerName=b\ntls.server.certpath=/x\n")
    with pytest.raises(ConfigError) as ei:
        load_broker_config(str(broker))
    assert ei.value.nearest == "tls.server.certPath"


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_client_certificates_from_the_trusted_ca_only(pki):
    port = free_port()
    listener = HttpListener(
        _ok,
        name="mtls",
        host="127.0.0.1",
        port=port,
        config=_config(
            **{
                "tls.server.mode": "enforcing",
                "tls.server.certPath": str(pki.server_cert),
                "tls.server.keyPath": str(pki.server_key),
                "tls.server.trustCertPath": str(pki.ca),
                "tls.server.need.client.auth": "require",
            }
        ),
    )
    await listener.start()
    try:

        def context(cert=None, key=None) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            if cert:
                ctx.load_cert_chain(str(cert), str(key))
            return ctx

        url = f"https://127.0.0.1:{port}/"
        async with httpx.AsyncClient(verify=context(pki.client_cert, pki.client_key)) as http:
            assert (await http.get(url)).text == "ok"
        for ctx in (context(), context(pki.rogue_cert, pki.rogue_key)):
            async with httpx.AsyncClient(verify=ctx) as http:
                with pytest.raises(httpx.TransportError):
                    await http.get(url)
    finally:
        await listener.stop()
