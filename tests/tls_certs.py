"""A throwaway PKI for TLS tests, made with the `openssl` command: a CA, a server certificate for
127.0.0.1/localhost and a client certificate signed by it, and a second CA nobody trusts."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

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
    return Pki(ca[0], *server, *client, rogue[0], *rogue_client)
