"""A throwaway PKI for TLS tests, made with the `openssl` command: a CA, a server certificate for
127.0.0.1/localhost, a client certificate and a DLedger peer's (both uses) signed by it, and a
second CA nobody trusts with a client and a peer certificate of its own; and
`wait_https`, for a process serving HTTPS to come up."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path  # a CA that signed nothing of ours
    rogue_cert: Path  # a client certificate from the rogue CA
    rogue_key: Path
    peer_cert: Path  # serverAuth and clientAuth: a DLedger member's certificate for peer TLS
    peer_key: Path
    rogue_peer_cert: Path  # the same from the rogue CA
    rogue_peer_key: Path

    def server_keys(self) -> dict[str, str]:
        """The `.properties` keys of a listener serving HTTPS only, with this PKI's certificate."""
        return {
            "tls.server.mode": "enforcing",
            "tls.server.certPath": str(self.server_cert),
            "tls.server.keyPath": str(self.server_key),
        }


def wait_https(
    url: str, ca: str, proc, timeout_s: float = 20, ok: Callable[[httpx.Response], bool] | None = None
) -> None:
    """Until `url` answers 200 (or `ok`) over TLS verified against `ca`; fails if `proc` exits."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            r = httpx.get(url, verify=ssl.create_default_context(cafile=ca), timeout=2)
            if (ok or (lambda r: r.status_code == 200))(r):
                return
            last = r.text[:200]
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{url}: {last}")


def start_https_namesrv_and_broker(group, d: Path, pki: Pki, **broker_keys: str) -> tuple[str, str]:
    """A name server and a single-node broker (`conf/broker-single.conf` + `broker_keys`) in
    `group`, both serving HTTPS only, the broker registering over HTTPS; their `host:port`."""
    from tests.integration._ledgermq_procs import CONF, free_port, write_conf

    ns_port, b_port = free_port(), free_port()
    ns_values = {"listenPort": str(ns_port), **pki.server_keys()}
    ns_conf = write_conf(CONF / "namesrv.conf", d / "namesrv.conf", ns_values)
    namesrv = group.start("namesrv", "namesrv", "-c", str(ns_conf))
    wait_https(f"https://127.0.0.1:{ns_port}/health", str(pki.ca), namesrv)
    b_conf = write_conf(CONF / "broker-single.conf", d / "broker.conf", {
        "listenPort": str(b_port),
        "storePathRootDir": str(d / "store"),
        "namesrvAddr": f"127.0.0.1:{ns_port}",
        **pki.server_keys(),
        "tls.enable": "true",
        "tls.client.trustCertPath": str(pki.ca),
        **broker_keys,
    })
    broker = group.start("broker", "broker", "-c", str(b_conf))
    wait_https(f"https://127.0.0.1:{b_port}/health", str(pki.ca), broker)
    return f"127.0.0.1:{ns_port}", f"127.0.0.1:{b_port}"


def reissue_server_cert(pki: Pki, name: str, usage: str = "serverAuth") -> tuple[Path, Path]:
    """A new server (or, with usage "serverAuth,clientAuth", peer) certificate and key from the
    same CA (a rotation), written beside the PKI."""
    d = pki.ca.parent
    return _leaf(d, name, (pki.ca, pki.ca.with_suffix(".key")), usage)


def served_certificate(host: str, port: int) -> str:
    """The PEM certificate a TLS port shows to a new connection."""
    return ssl.get_server_certificate((host, port), timeout=5)


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    _run(
        "req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d,
    )
    return d / f"{name}.pem", d / f"{name}.key"


def _leaf(d: Path, name: str, ca: tuple[Path, Path], usage: str) -> tuple[Path, Path]:
    _run("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        f"keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
    )
    _run(
        "x509", "-req", "-in", f"{name}.csr", "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-out", f"{name}.pem", "-days", "2", "-extfile", str(ext), cwd=d,
    )
    os.chmod(d / f"{name}.key", 0o600)
    return d / f"{name}.pem", d / f"{name}.key"


def make_pki(d: Path) -> Pki:
    """Write the PKI's files into `d`."""
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "ledgermq-test-ca")
    server = _leaf(d, "server", ca, "serverAuth")
    client = _leaf(d, "client", ca, "clientAuth")
    rogue = _ca(d, "rogue-ca")
    rogue_client = _leaf(d, "rogue-client", rogue, "clientAuth")
    peer = _leaf(d, "peer", ca, "serverAuth,clientAuth")
    rogue_peer = _leaf(d, "rogue-peer", rogue, "serverAuth,clientAuth")
    return Pki(ca[0], *server, *client, rogue[0], *rogue_client, *peer, *rogue_peer)
