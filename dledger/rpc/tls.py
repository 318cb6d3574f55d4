"""TLS on the peer links (mutual, TLS 1.3): replication traffic encrypted, and only holders of a
certificate from the group's CA connect — etcd's peer TLS (`--peer-cert-file`, `--peer-key-file`,
`--peer-trusted-ca-file`, `--peer-client-cert-auth`), which DLedger lacks.

Every member uses one certificate both ways: as the server of its own port and as the client of
the others', so it must allow both (extendedKeyUsage serverAuth and clientAuth, or none), and name
the host of its `peers` entry (checked by the connecting side, as HTTPS checks a server's name).
The CA check proves "one of the group's machines"; to also bind each connection to one member id,
add the shared-secret handshake (`peerSecretFile`), which then runs inside TLS.

The files are looked at every second (`reload_into`, by the transport): a rotated certificate
serves new connections once it loads with its key, with no restart.

A connection of ours that fails its handshake — the peer's certificate from another CA or naming
another host, ours refused by the peer — is one log line with the reason, at most one per peer every
few seconds (`event=peer_tls_failed`). A connection to us that fails it — a plaintext client, a
certificate from another CA or none, no handshake within the timeout — is closed and logged the
same way (`event=peer_tls_refused`: the transport builds the loop's server-side TLS protocol itself
and watches its handshake, which `create_server(ssl=...)` drops without a word when it fails).
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass, field

from dledger.rpc.auth import RefusalLog

log = logging.getLogger(__name__)

_Stamp = tuple[tuple[int, int, int] | None, ...]


@dataclass
class PeerTls:
    """The member's certificate and key, and the CA every peer's certificate must chain to."""

    group: str
    self_id: str
    cert_file: str
    key_file: str
    ca_file: str
    log_refusal: RefusalLog = field(init=False, repr=False)
    _accepted: _Stamp = field(init=False, repr=False)
    _refused: _Stamp | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.log_refusal = RefusalLog(self.group, self.self_id, "peer_tls_refused", "peer_tls_failed")
        self._accepted = self._stamp()

    def _stamp(self) -> _Stamp:
        out = []
        for path in (self.cert_file, self.key_file, self.ca_file):
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
                continue
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def reload_into(self, *contexts: ssl.SSLContext | None) -> bool:
        """When the files changed and load together (checked in a scratch context first), load
        them into the running contexts: new connections get the rotated certificate, etcd's peer
        TLS rotation. A version that does not load (a certificate whose key is not replaced yet)
        keeps the one in force and is logged once; True when the contexts were reloaded."""
        stamp = self._stamp()
        if stamp == self._accepted or stamp == self._refused:
            return False
        try:
            self.server_context()
        except (OSError, ssl.SSLError) as exc:
            self._refused = stamp
            log.error("event=peer_tls_reload_failed group=%s selfId=%s certFile=%s error=%s keeping=the "
                      "certificate in force", self.group, self.self_id, self.cert_file, exc)
            return False
        for ctx in contexts:
            if ctx is not None:
                ctx.load_cert_chain(self.cert_file, self.key_file)
                ctx.load_verify_locations(cafile=self.ca_file)
        self._accepted, self._refused = stamp, None
        log.info("event=peer_tls_reloaded group=%s selfId=%s certFile=%s", self.group, self.self_id,
                 self.cert_file)
        return True

    def server_context(self) -> ssl.SSLContext:
        """Our port's side: our certificate, and a client certificate from the CA required."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._common(ctx)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """Our connections' side: the peer's certificate from the CA, naming its host; ours shown."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED by default
        self._common(ctx)
        return ctx

    def _common(self, ctx: ssl.SSLContext) -> None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.load_verify_locations(cafile=self.ca_file)


def check_peer_tls_files(cert_file: str, key_file: str, ca_file: str) -> None:
    """ValueError naming what is wrong with the files (read as `PeerTls` would)."""
    tls = PeerTls("check", "check", cert_file, key_file, ca_file)
    try:
        tls.server_context()
    except FileNotFoundError as exc:
        raise ValueError(f"{exc.filename}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the certificate, key or CA: {exc}") from None
