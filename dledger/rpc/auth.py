"""Peer authentication on the DLedger port: an HMAC-SHA256 challenge/response over a shared
secret of the group, run on every connection before a single request frame is read.

Why a shared secret and not mutual TLS: the threat is "anyone who can reach a member's port can
vote, push or truncate"; a secret the group's members share closes it for a few hundred
microseconds per connection and nothing per byte afterwards (peer links are few, long-lived and
carry the whole replication stream: TLS would cost CPU on every pushed byte of a 2-core member),
with no certificate authority to run. What it does not give: confidentiality (nothing is
encrypted) and protection from an attacker *on the path* who can inject into an authenticated
connection; a leaked secret lets its holder act as any member. Put the links on a private network,
or switch on peer TLS (dledger/rpc/tls.py; the handshake then runs inside it) where those matter
(docs/PERFORMANCE.md has the measured cost of both).

Handshake (each message: u16 length, then the body; at most `MAX_MESSAGE` bytes)::

    C -> S  HELLO      "LMQA" ver=1 type=1 | group | from_id | to_id (u16 length + UTF-8 each)
                       | key_id (8) | nonce_c (32)
    S -> C  CHALLENGE  "LMQA" ver=1 type=2 | nonce_s (32) | proof_s (32)
    C -> S  AUTH       "LMQA" ver=1 type=3 | proof_c (32)
    S -> C  OK         "LMQA" ver=1 type=4

    proof_X = HMAC-SHA256(key, "LMQ-PEER-v1|" X | group | from_id | to_id | key_id | nonce_c | nonce_s)

The acceptor's fresh nonce makes every connection's proof different, so a recorded handshake
replayed on a new connection fails; the connector's nonce and proof_s let the connector check it
reached a member holding the secret; the direction tag (S/C) stops a proof being reflected back.
The acceptor checks group and to_id (itself) and the key id; nothing is answered on a refusal, the
connection is closed and one line is logged (at most one per source host every few seconds, with
the count of those left out). After OK the connection is bound to from_id: a request frame whose
sender (`local_id`) is another member is refused and the connection closed.

The secret file holds one key per line (32 characters or more; `#` comments); the first is used to
connect, every one is accepted (rotation: add the new key to every member, then move it first,
then drop the old one). It must not be readable by group or others (like an ssh key).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import struct
import time
from dataclasses import dataclass

log = logging.getLogger("dledger.rpc.auth")

MAGIC = b"LMQA"
VERSION = 1
HELLO, CHALLENGE, AUTH, OK = 1, 2, 3, 4
MAX_MESSAGE = 512
NONCE_SIZE = 32
KEY_ID_SIZE = 8
MIN_KEY_CHARS = 32
_LABEL = b"LMQ-PEER-v1|"
_PREFIX = struct.Struct(">4sBB")  # magic, version, type
_U16 = struct.Struct(">H")
_REFUSAL_LOG_INTERVAL_S = 5.0


class HandshakeError(Exception):
    """The other side failed the handshake; the message says why (for the log, never the wire)."""


def load_peer_keys(path: str) -> list[bytes]:
    """The keys of a peer secret file (first: the one to connect with). Raises ValueError naming
    the file for a missing file, a file readable by group or others, or a key that is too short."""
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ValueError(f"peer secret file {path}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"peer secret file {path} is accessible by group or others "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 it")
    keys = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"peer secret file {path} holds no key")
    for n, key in enumerate(keys, 1):
        if len(key) < MIN_KEY_CHARS:
            raise ValueError(f"peer secret file {path}: key {n} has {len(key)} characters, "
                             f"at least {MIN_KEY_CHARS} needed (e.g. `openssl rand -hex 32`)")
    return [k.encode() for k in keys]


def key_id(key: bytes) -> bytes:
    """Names a key on the wire without revealing it."""
    return hashlib.sha256(b"LMQ-PEER-key-id|" + key).digest()[:KEY_ID_SIZE]


def _lp(s: str) -> bytes:
    raw = s.encode()
    return _U16.pack(len(raw)) + raw


def _message(mtype: int, body: bytes) -> bytes:
    payload = _PREFIX.pack(MAGIC, VERSION, mtype) + body
    return _U16.pack(len(payload)) + payload


@dataclass(frozen=True, slots=True)
class _Transcript:
    group: str
    from_id: str
    to_id: str
    key_id: bytes
    nonce_c: bytes
    nonce_s: bytes

    def proof(self, key: bytes, tag: bytes) -> bytes:
        data = b"".join((_LABEL, tag, _lp(self.group), _lp(self.from_id), _lp(self.to_id), self.key_id,
                         self.nonce_c, self.nonce_s))
        return hmac.new(key, data, hashlib.sha256).digest()


class PeerAuth:
    """The group's keys, and one handshake per connection (`acceptor()` / `connector()`)."""

    def __init__(self, group: str, self_id: str, keys: list[bytes]) -> None:
        if not keys:
            raise ValueError("peer authentication needs at least one key")
        self.group = group
        self.self_id = self_id
        self.keys = {key_id(k): k for k in keys}
        self.current_id = key_id(keys[0])
        # A connection we refused (`peer_auth_refused`) or one of ours that was refused (`peer_auth_failed`).
        self.log_refusal = RefusalLog(group, self_id, "peer_auth_refused", "peer_auth_failed")

    @classmethod
    def from_file(cls, group: str, self_id: str, path: str) -> PeerAuth:
        return cls(group, self_id, load_peer_keys(path))

    def acceptor(self) -> Acceptor:
        return Acceptor(self)

    def connector(self, to_id: str) -> Connector:
        return Connector(self, to_id)



class RefusalLog:
    """One warning per failed peer handshake (ours refused: `refused_event`; a connection of ours
    refused: `failed_event`), at most one per host and direction every few seconds, naming how
    many were left out since the last line: a scan or a misconfigured member cannot flood the log."""

    def __init__(self, group: str, self_id: str, refused_event: str, failed_event: str) -> None:
        self.group = group
        self.self_id = self_id
        self.events = {False: refused_event, True: failed_event}
        self._last: dict[tuple[bool, str], tuple[float, int]] = {}  # -> (last logged, left out since)

    def __call__(self, peer: str, why: str, *, outgoing: bool = False) -> None:
        host = peer.rpartition(":")[0] or peer
        now = time.monotonic()
        last, skipped = self._last.get((outgoing, host), (0.0, 0))
        if now - last < _REFUSAL_LOG_INTERVAL_S:
            self._last[(outgoing, host)] = (last, skipped + 1)
            return
        if len(self._last) > 1024:  # bounded: a scan from many addresses cannot grow it
            self._last.clear()
        self._last[(outgoing, host)] = (now, 0)
        log.warning("event=%s group=%s selfId=%s %s=%s reason=%s leftOutSinceLastLine=%d",
                    self.events[outgoing], self.group, self.self_id, "to" if outgoing else "from", peer, why,
                    skipped)


def read_message(buf: bytes | bytearray | memoryview) -> tuple[int, memoryview, int] | None:
    """(type, body after the prefix, bytes used) of the handshake message at the start of `buf`;
    None while incomplete. Raises HandshakeError for anything that is not one."""
    if len(buf) < 2:
        return None
    (length,) = _U16.unpack_from(buf, 0)
    if length < _PREFIX.size or length > MAX_MESSAGE:
        raise HandshakeError(f"not a peer handshake (length {length})")
    if len(buf) < 2 + length:
        if len(buf) >= _PREFIX.size + 2 and bytes(buf[2:6]) != MAGIC:
            raise HandshakeError("not a peer handshake (bad magic)")
        return None
    magic, version, mtype = _PREFIX.unpack_from(buf, 2)
    if magic != MAGIC:
        raise HandshakeError("not a peer handshake (bad magic)")
    if version != VERSION:
        raise HandshakeError(f"handshake version {version}, expected {VERSION}")
    return mtype, memoryview(buf)[2 + _PREFIX.size:2 + length], 2 + length


def _read_str(body: memoryview, off: int) -> tuple[str, int]:
    if off + 2 > len(body):
        raise HandshakeError("truncated hello")
    (n,) = _U16.unpack_from(body, off)
    if off + 2 + n > len(body):
        raise HandshakeError("truncated hello")
    try:
        return str(body[off + 2:off + 2 + n], "utf-8"), off + 2 + n
    except UnicodeDecodeError:
        raise HandshakeError("hello string is not UTF-8") from None


class Acceptor:
    """The accepting side of one connection: HELLO in, CHALLENGE out, AUTH in, OK out."""

    def __init__(self, auth: PeerAuth) -> None:
        self.auth = auth
        self.transcript: _Transcript | None = None
        self.key = b""
        self.peer_id: str | None = None  # set once authenticated

    @property
    def complete(self) -> bool:
        return self.peer_id is not None

    def on_message(self, mtype: int, body: memoryview) -> bytes:
        """The reply to send; raises HandshakeError to refuse."""
        auth = self.auth
        if self.transcript is None:
            if mtype != HELLO:
                raise HandshakeError(f"expected hello, got message type {mtype}")
            group, off = _read_str(body, 0)
            from_id, off = _read_str(body, off)
            to_id, off = _read_str(body, off)
            if len(body) != off + KEY_ID_SIZE + NONCE_SIZE:
                raise HandshakeError("malformed hello")
            kid = bytes(body[off:off + KEY_ID_SIZE])
            nonce_c = bytes(body[off + KEY_ID_SIZE:])
            if group != auth.group:
                raise HandshakeError(f"hello for group {group!r}")
            if to_id != auth.self_id:
                raise HandshakeError(f"hello for member {to_id!r}")
            if not from_id:
                raise HandshakeError("hello without a sender id")
            key = auth.keys.get(kid)
            if key is None:
                raise HandshakeError(f"unknown key id {kid.hex()} (from {from_id!r}): secrets differ")
            self.key = key
            nonce_s = secrets.token_bytes(NONCE_SIZE)
            self.transcript = _Transcript(group, from_id, to_id, kid, nonce_c, nonce_s)
            return _message(CHALLENGE, self.transcript.nonce_s + self.transcript.proof(key, b"S"))
        if mtype != AUTH or len(body) != 32:
            raise HandshakeError(f"expected auth, got message type {mtype}")
        if not hmac.compare_digest(bytes(body), self.transcript.proof(self.key, b"C")):
            raise HandshakeError(f"wrong proof from {self.transcript.from_id!r} (wrong secret, or a replay)")
        self.peer_id = self.transcript.from_id
        return _message(OK, b"")


class Connector:
    """The connecting side of one connection: HELLO out, CHALLENGE in, AUTH out, OK in."""

    def __init__(self, auth: PeerAuth, to_id: str) -> None:
        self.auth = auth
        self.to_id = to_id
        self.nonce_c = secrets.token_bytes(NONCE_SIZE)
        self.sent_auth = False
        self.complete = False

    def hello(self) -> bytes:
        a = self.auth
        return _message(HELLO, b"".join((_lp(a.group), _lp(a.self_id), _lp(self.to_id), a.current_id,
                                         self.nonce_c)))

    def on_message(self, mtype: int, body: memoryview) -> bytes:
        """The reply to send (b"" once authenticated); raises HandshakeError."""
        a = self.auth
        if not self.sent_auth:
            if mtype != CHALLENGE or len(body) != NONCE_SIZE + 32:
                raise HandshakeError(f"expected challenge, got message type {mtype}")
            nonce_s = bytes(body[:NONCE_SIZE])
            t = _Transcript(a.group, a.self_id, self.to_id, a.current_id, self.nonce_c, nonce_s)
            key = a.keys[a.current_id]
            if not hmac.compare_digest(bytes(body[NONCE_SIZE:]), t.proof(key, b"S")):
                raise HandshakeError(f"{self.to_id} does not hold our secret")
            self.sent_auth = True
            return _message(AUTH, t.proof(key, b"C"))
        if mtype != OK or len(body):
            raise HandshakeError(f"expected ok, got message type {mtype}")
        self.complete = True
        return b""
