"""Signed broker registrations: how a broker proves to a name server that it holds the cluster's
registration secret (`registrationSecretFile` on both sides), so nobody else can register a
broker, take a route or unregister one.

Every `POST /brokers/register` and `/brokers/unregister` carries three headers:

    X-LMQ-Date       the sender's clock, ms since the epoch (refused beyond ±MAX_SKEW_MS)
    X-LMQ-Nonce      32 random hex digits, never accepted twice within the skew window
    X-LMQ-Signature  hex HMAC-SHA256(secret, "LMQ-REGISTER-v1\\n" method "\\n" path "\\n" date "\\n"
                     nonce "\\n" hex SHA-256(body))

so the signature covers what is registered (the body), where (the path) and when (date + nonce:
a recorded registration cannot be replayed). A secret file holds one secret per line (at least 32
characters; `#` comments): the signer uses the first, the verifier accepts any, so a secret is
rotated by adding the new one to every name server, then moving brokers to it, then dropping the
old one. The file must not be readable by group or others.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

HEADER_DATE = "x-lmq-date"
HEADER_NONCE = "x-lmq-nonce"
HEADER_SIGNATURE = "x-lmq-signature"
MAX_SKEW_MS = 300_000
MIN_SECRET_CHARS = 32
_LABEL = b"LMQ-REGISTER-v1"


def load_secrets(path: str | Path) -> list[bytes]:
    """The secrets of a registration secret file (first = the one to sign with). ValueError names
    the file and what is wrong with it."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path}: readable by group or others (mode {mode & 0o777:o}); chmod 600 it")
    found = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not found:
        raise ValueError(f"{path}: no secret in it (one per line)")
    short = [i + 1 for i, s in enumerate(found) if len(s) < MIN_SECRET_CHARS]
    if short:
        raise ValueError(
            f"{path}: secret #{short[0]} is shorter than {MIN_SECRET_CHARS} characters "
            "(make one with: openssl rand -hex 32)"
        )
    return [s.encode() for s in found]


def signature(secret: bytes, method: str, path: str, date_ms: str, nonce: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of one request."""
    digest = hashlib.sha256(body).hexdigest()
    message = b"\n".join(
        [_LABEL, method.upper().encode(), path.encode(), date_ms.encode(), nonce.encode(), digest.encode()]
    )
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path: str, body: bytes, now_ms: int | None = None) -> dict[str, str]:
    """The three headers that sign a request."""
    date_ms = str(now_ms if now_ms is not None else int(time.time() * 1000))
    nonce = secrets.token_hex(16)
    return {
        HEADER_DATE: date_ms,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: signature(secret, method, path, date_ms, nonce, body),
    }


class RegistrationVerifier:
    """Checks signed registrations (the name server). `verify` answers None when the request is
    genuine and fresh, else the reason it is refused. Nonces are remembered only for signed
    requests, and only for the skew window, so memory is bounded by the genuine rate."""

    def __init__(
        self,
        secret_list: list[bytes],
        max_skew_ms: int = MAX_SKEW_MS,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.secrets = secret_list
        self.max_skew_ms = max_skew_ms
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._seen: OrderedDict[str, int] = OrderedDict()  # nonce -> when it may be forgotten

    @classmethod
    def from_file(cls, path: str | Path) -> RegistrationVerifier:
        return cls(load_secrets(path))

    def verify(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> str | None:
        date_ms, nonce, sig = (headers.get(h) for h in (HEADER_DATE, HEADER_NONCE, HEADER_SIGNATURE))
        if not (date_ms and nonce and sig):
            return "missing_signature"
        if not date_ms.isdigit() or len(nonce) > 64 or len(sig) != 64:
            return "malformed_signature"
        now = self.clock_ms()
        if abs(now - int(date_ms)) > self.max_skew_ms:
            return "stale_date"
        if not any(
            hmac.compare_digest(signature(s, method, path, date_ms, nonce, body), sig) for s in self.secrets
        ):
            return "bad_signature"
        self._forget_expired(now)
        if nonce in self._seen:
            return "replayed_nonce"
        self._seen[nonce] = now + 2 * self.max_skew_ms
        return None

    def _forget_expired(self, now: int) -> None:
        while self._seen:
            nonce, until = next(iter(self._seen.items()))
            if until > now:
                break
            del self._seen[nonce]

