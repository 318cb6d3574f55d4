"""listener/: the shared key table refuses what it cannot honour, naming the key; a listener that
asks for client certificates serves only clients holding one from its CA (in this process, real
sockets)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from typing import Any

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


async def _app(scope, receive, send):
    """/ok: a 2-byte answer; /stream: the head, then two chunks 50 ms apart; /echo: the request
    body back (read first); /fail: the head, then an error before any body."""
    path = scope["path"]
    if path == "/echo":
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one,", "more_body": True})
        await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"two"})
    elif path == "/fail":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        raise RuntimeError("the handler failed after the head")
    else:
        await _ok(scope, receive, send)


def _data_segments_in(sock: Any) -> int:
    """The kernel's count of data-carrying segments this TCP socket received (Linux tcp_info's
    tcpi_data_segs_in, at byte 152)."""
    return struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160), 152)[0]


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    out = b""
    while chunk := await asyncio.wait_for(reader.read(65536), 5):
        out += chunk
    return out


async def test_each_response_leaves_in_one_write_and_every_shape_still_arrives_whole():
    """The head uvicorn writes at http.response.start waits for the first body write (one
    writev): a small answer arrives in one read; HEAD (no body write), a streamed body, an
    Expect: 100-continue upload and a handler failing after its head still get what they did."""
    port = free_port()
    listener = HttpListener(_app, name="one-write", host="127.0.0.1", port=port, config=ListenerConfig())
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sock = writer.get_extra_info("socket")
        before = _data_segments_in(sock)
        writer.write(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\nok"), 5)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert _data_segments_in(sock) - before == 1  # head and body in one segment: one write
        writer.write(b"HEAD /ok HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 2\r\n" in head
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        streamed = await _read_until_closed(reader)
        assert streamed.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in streamed
        assert streamed.endswith(b"4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n"), streamed
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        answer = await asyncio.wait_for(reader.readuntil(b"hello"), 5)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /fail HTTP/1.1\r\nhost: x\r\n\r\n")
        cut = await _read_until_closed(reader)
        assert cut.startswith(b"HTTP/1.1 200 OK\r\n") and cut.endswith(b"content-length: 10\r\n\r\n"), cut
        writer.close()
    finally:
        await listener.stop()
