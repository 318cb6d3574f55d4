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

import grpc

from listener.config import ClientTlsConfig, ListenerConfig, read_pem


def server_credentials(listener: ListenerConfig) -> grpc.ServerCredentials | None:
    """The gRPC port's TLS (None: plaintext, as the HTTP port). ListenerConfigError names the key
    of a file that cannot serve it."""
    if not listener.tls:
        return None
    key = listener.plain_key_pem()
    chain = read_pem("tls.server.certPath", listener.cert_path)
    require = listener.need_client_auth == "require"
    # grpcio's server either requires and verifies a client certificate or asks for none:
    # `optional` asks for none here (the official clients never present one).
    roots = read_pem("tls.server.trustCertPath", listener.trust_cert_path) if require else None
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=roots, require_client_auth=require)


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
