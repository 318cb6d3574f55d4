"""The settings of an HTTP listener (TLS, read deadlines, connection caps) and of a process's
outgoing TLS, with the `.properties` keys that set them: ONE table shared by the broker, the name
server and the broker container.

TLS keys keep RocketMQ's `TlsSystemConfig` spelling (`tls.server.certPath`, …). RocketMQ's
`permissive` mode (TLS and plaintext on one port) and its test mode (a throwaway self-signed
certificate, nothing verified) are refused: a listener either speaks HTTPS with the operator's
certificate or plain HTTP. Client certificates, when asked for, are always verified against
`tls.server.trustCertPath`; a server certificate is always verified by our clients.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TLS_MODES = ("disabled", "enforcing")
CLIENT_AUTH_MODES = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


class ListenerConfigError(ValueError):
    """A listener key with a bad value or a file that cannot serve; names the key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in ("true", "yes", "1", "on"):
        return True
    if low in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def _positive(v: str) -> int:
    try:
        n = int(v.strip())
    except ValueError:
        raise ValueError(f"expected a positive integer, got {v!r}") from None
    if n <= 0:
        raise ValueError(f"expected a positive integer, got {n}")
    return n


def _path(v: str) -> str:
    return os.path.expanduser(v.strip())


def _tls_mode(v: str) -> str:
    mode = v.strip().lower()
    if mode == "permissive":
        raise ValueError(
            "permissive (TLS and plaintext on one port) is not offered: use enforcing or disabled"
        )
    if mode not in TLS_MODES:
        raise ValueError(f"expected one of {', '.join(TLS_MODES)}, got {v!r}")
    return mode


def _client_auth(v: str) -> str:
    mode = v.strip().lower()
    if mode not in CLIENT_AUTH_MODES:
        raise ValueError(f"expected one of {', '.join(CLIENT_AUTH_MODES)}, got {v!r}")
    return mode


def _test_mode(v: str) -> bool:
    if _bool(v):
        raise ValueError(
            "true is not offered (a throwaway certificate that verifies nothing): "
            "give tls.server.certPath and tls.server.keyPath"
        )
    return False


@dataclass
class ListenerConfig:
    """One HTTP listener's protections. Defaults: plain HTTP, every read bounded in time,
    connections capped per listener and per client IP."""

    tls_mode: str = "disabled"
    cert_path: str = ""
    key_path: str = ""
    key_password: str = ""
    trust_cert_path: str = ""
    need_client_auth: str = "none"
    # From the connection's accept (or a keep-alive request's first byte) to the end of its headers;
    # also the TLS handshake's bound.
    request_header_timeout_ms: int = 10_000
    # From the end of the headers to the end of the body: this much plus Content-Length at
    # request_body_min_bytes_per_sec (a 1 MiB body: 10 s + 16 s).
    request_body_timeout_ms: int = 10_000
    request_body_min_bytes_per_sec: int = 64 * 1024
    # Idle keep-alive between two requests (RocketMQ's key; uvicorn's default of 5 s, not Netty's
    # 120: an idle HTTP connection is cheap to reopen and is what exhausts descriptors).
    idle_timeout_s: int = 5
    max_connections: int = 4096
    max_connections_per_ip: int = 1024  # never more than max_connections in effect

    @property
    def tls(self) -> bool:
        return self.tls_mode == "enforcing"

    def validate(self) -> None:
        """Cross-key checks; ListenerConfigError names the key."""
        if self.tls:
            for key, path in (("tls.server.certPath", self.cert_path), ("tls.server.keyPath", self.key_path)):
                if not path:
                    raise ListenerConfigError(key, "required with tls.server.mode=enforcing")
                _readable(key, path)
        if self.need_client_auth != "none":
            if not self.tls:
                raise ListenerConfigError(
                    "tls.server.need.client.auth", "client certificates need tls.server.mode=enforcing"
                )
            if not self.trust_cert_path:
                raise ListenerConfigError(
                    "tls.server.trustCertPath",
                    f"required with tls.server.need.client.auth={self.need_client_auth} "
                    "(the CA that signs client certificates)",
                )
        if self.trust_cert_path:
            _readable("tls.server.trustCertPath", self.trust_cert_path)
        self.ssl_context()  # a certificate that does not load fails at start, naming its key

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server-side TLS context (None with TLS disabled). TLS 1.2 at least."""
        if not self.tls:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_path, self.key_path, self.key_password or None)
        except (OSError, ssl.SSLError) as exc:
            raise ListenerConfigError(
                "tls.server.certPath", f"{self.cert_path} with key {self.key_path} does not load: {exc}"
            ) from None
        _warn_if_shared("tls.server.keyPath", self.key_path)
        if self.trust_cert_path:
            try:
                ctx.load_verify_locations(cafile=self.trust_cert_path)
            except (OSError, ssl.SSLError) as exc:
                raise ListenerConfigError(
                    "tls.server.trustCertPath", f"{self.trust_cert_path} does not load: {exc}"
                ) from None
        ctx.verify_mode = CLIENT_AUTH_MODES[self.need_client_auth]
        return ctx

    def plain_key_pem(self) -> bytes:
        """The key's PEM, unencrypted, for the broker's gRPC port (`unencrypted_key`)."""
        keys = ("tls.server.keyPath", "tls.server.keyPassword")
        return unencrypted_key(*keys, self.key_path, self.key_password)


@dataclass
class ClientTlsConfig:
    """TLS of a process's outgoing HTTP calls (a broker's registrations with the name servers):
    RocketMQ's `tls.enable` and `tls.client.*`. The server's certificate is always verified (against
    `tls.client.trustCertPath`, else the system's CAs)."""

    enable: bool = False
    trust_cert_path: str = ""
    cert_path: str = ""
    key_path: str = ""
    key_password: str = ""

    def validate(self) -> None:
        if bool(self.cert_path) != bool(self.key_path):
            missing = "tls.client.keyPath" if self.cert_path else "tls.client.certPath"
            raise ListenerConfigError(missing, "tls.client.certPath and tls.client.keyPath go together")
        files = (("tls.client.trustCertPath", self.trust_cert_path), ("tls.client.certPath", self.cert_path))
        for key, path in files:
            if path:
                _readable(key, path)
        self.ssl_context()

    @property
    def scheme(self) -> str:
        return "https" if self.enable else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context to verify servers with (None with `tls.enable=false`)."""
        if not self.enable:
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.trust_cert_path or None)
            if self.cert_path:
                ctx.load_cert_chain(self.cert_path, self.key_path, self.key_password or None)
        except (OSError, ssl.SSLError) as exc:
            raise ListenerConfigError("tls.client.trustCertPath", f"does not load: {exc}") from None
        return ctx

    def plain_key_pem(self) -> bytes:
        """The client key's PEM, unencrypted, for a member's gRPC calls (`unencrypted_key`)."""
        keys = ("tls.client.keyPath", "tls.client.keyPassword")
        return unencrypted_key(*keys, self.key_path, self.key_password)


# RocketMQ-style key -> (which config, attribute, parser). The one table.
SERVER_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "tls.server.mode": ("tls_mode", _tls_mode),
    "tls.server.certPath": ("cert_path", _path),
    "tls.server.keyPath": ("key_path", _path),
    "tls.server.keyPassword": ("key_password", str.strip),
    "tls.server.trustCertPath": ("trust_cert_path", _path),
    "tls.server.need.client.auth": ("need_client_auth", _client_auth),
    "tls.test.mode.enable": ("", _test_mode),
    "requestHeaderTimeoutMs": ("request_header_timeout_ms", _positive),
    "requestBodyTimeoutMs": ("request_body_timeout_ms", _positive),
    "requestBodyMinBytesPerSec": ("request_body_min_bytes_per_sec", _positive),
    "serverChannelMaxIdleTimeSeconds": ("idle_timeout_s", _positive),
    "maxConnections": ("max_connections", _positive),
    "maxConnectionsPerIp": ("max_connections_per_ip", _positive),
}
CLIENT_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "tls.enable": ("enable", _bool),
    "tls.client.trustCertPath": ("trust_cert_path", _path),
    "tls.client.certPath": ("cert_path", _path),
    "tls.client.keyPath": ("key_path", _path),
    "tls.client.keyPassword": ("key_password", str.strip),
}

assert {a for a, _ in SERVER_KEYS.values() if a} <= {f.name for f in fields(ListenerConfig)}
assert {a for a, _ in CLIENT_KEYS.values()} <= {f.name for f in fields(ClientTlsConfig)}


def apply_key(target: ListenerConfig | ClientTlsConfig, key: str, raw: str) -> bool:
    """Set `key` on `target` if it is one of its table's keys (True), else False. ValueError for a
    bad value (the caller names the file and line)."""
    table = SERVER_KEYS if isinstance(target, ListenerConfig) else CLIENT_KEYS
    entry = table.get(key)
    if entry is None:
        return False
    attr, parse = entry
    value = parse(raw)
    if attr:
        setattr(target, attr, value)
    return True


def read_pem(key: str, path: str) -> bytes:
    """The file `key` names, as bytes; ListenerConfigError naming the key when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ListenerConfigError(key, f"{path} cannot be read: {exc.strerror}") from None


def unencrypted_key(path_key: str, password_key: str, path: str, password: str) -> bytes:
    """A private key's PEM for the broker's gRPC port (broker/grpc/tls.py): grpcio takes it as it
    is, with no password, so an encrypted one stops the broker at start rather than leave the gRPC
    port in plaintext while the HTTP port is TLS."""
    pem = read_pem(path_key, path)
    if password or b"ENCRYPTED" in pem:
        raise ListenerConfigError(
            password_key,
            f"the gRPC port (grpcServerPort) needs an unencrypted key and {path} is encrypted: give an "
            "unencrypted key (chmod 600) or set grpcServerPort=0",
        )
    return pem


def _readable(key: str, path: str) -> None:
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ListenerConfigError(key, f"{path} is not a readable file")


def _warn_if_shared(key: str, path: str) -> None:
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("event=key_file_readable_by_others key=%s path=%s mode=%o", key, path, mode & 0o777)
