"""TLS of the gRPC port, from the broker's own TLS keys: with `tls.server.mode=enforcing` the gRPC
port serves TLS with the HTTP port's certificate (`tls.server.certPath`/`keyPath`), client
certificates required with `tls.server.need.client.auth=require` (against
`tls.server.trustCertPath`), so switching TLS on leaves no port of the broker in plaintext.
RocketMQ's proxy takes TLS and plaintext on one port by sniffing the first bytes; grpcio cannot,
so the port is one or the other.

A member forwards master-only calls to its master's gRPC port (`broker/grpc/forward.py`): over
TLS when its own port is TLS (the members of a set share their TLS keys), verifying the master
against `tls.client.trustCertPath` (else the system's CAs), with `tls.client.certPath`/`keyPath`
as its client certificate.
"""

from __future__ import annotations

import logging

import grpc

from listener.certs import TlsFiles
from listener.config import ClientTlsConfig, ListenerConfig, ListenerConfigError, read_pem

log = logging.getLogger(__name__)


def server_credentials(listener: ListenerConfig, name: str = "grpc") -> grpc.ServerCredentials | None:
    """The gRPC port's TLS (None: plaintext, as the HTTP port). ListenerConfigError names the key
    of a file that cannot serve it. The files are looked at on each new handshake: a rotated
    certificate is served without a restart (`listener.certs`)."""
    if not listener.tls:
        return None
    # grpcio's server either requires and verifies a client certificate or asks for none:
    # `optional` asks for none here (the official clients never present one).
    require = listener.need_client_auth == "require"
    files = TlsFiles(name, listener)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by grpc core before each handshake, on its own thread; None keeps the current one.
        try:
            return _certificate_configuration(listener, require) if files.changed() is not None else None
        except (ListenerConfigError, OSError) as exc:
            log.error("event=tls_reload_failed listener=%s error=%s keeping=the certificate in force",
                      name, exc)
            return None

    return grpc.dynamic_ssl_server_credentials(
        _certificate_configuration(listener, require), fetch, require_client_authentication=require)


def _certificate_configuration(
    listener: ListenerConfig, require: bool
) -> grpc.ServerCertificateConfiguration:
    key = listener.plain_key_pem()
    chain = read_pem("tls.server.certPath", listener.cert_path)
    roots = read_pem("tls.server.trustCertPath", listener.trust_cert_path) if require else None
    return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=roots)


def channel_credentials(listener: ListenerConfig, client: ClientTlsConfig) -> grpc.ChannelCredentials | None:
    """How this member reaches another member's gRPC port (None: plaintext): TLS when its own port
    serves TLS."""
    if not listener.tls:
        return None
    roots = read_pem("tls.client.trustCertPath", client.trust_cert_path) if client.trust_cert_path else None
    if client.cert_path:
        key = client.plain_key_pem()
        chain = read_pem("tls.client.certPath", client.cert_path)
        return grpc.ssl_channel_credentials(roots, key, chain)
    return grpc.ssl_channel_credentials(roots)
