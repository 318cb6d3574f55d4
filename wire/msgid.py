"""Offset message ids (RocketMQ's `MessageDecoder.createMessageId`): 32 upper-case hex digits,

    0   4  store host IPv4 address
    4   4  store host port
    8   8  physical (commit-log) offset of the message, signed

so an id names the broker that stored the message and where. Written by the broker, read by the
broker's query, the SDK's query and the admin tool."""

from __future__ import annotations

import functools
import logging
import socket
import struct

log = logging.getLogger(__name__)

MESSAGE_ID_LENGTH = 32
_HOST_PORT = struct.Struct(">I")
_PORT_OFFSET = struct.Struct(">Iq")


class MessageIdError(ValueError):
    """A string that is no offset message id."""


@functools.lru_cache(maxsize=1024)
def pack_host(addr: str) -> tuple[bytes, int]:
    """'host:port' -> (4 IPv4 bytes, port). A host name (brokerIP1=broker-n0 in docker-compose) is
    resolved once (cached); one that does not resolve packs as 0.0.0.0, with a warning."""
    host, _, port = addr.rpartition(":")
    try:
        ip = socket.inet_aton(host or "0.0.0.0")
    except OSError:
        try:
            ip = socket.inet_aton(socket.gethostbyname(host))
        except OSError as exc:
            log.warning("event=store_host_unresolved host=%r error=%s msgIds carry 0.0.0.0", host, exc)
            ip = b"\0\0\0\0"
    return ip, int(port) if port.isdigit() else 0


@functools.lru_cache(maxsize=1024)
def unpack_host(ip: bytes, port: int) -> str:
    """(4 IPv4 bytes, port) -> 'a.b.c.d:port' (cached: a store sees few distinct hosts)."""
    return f"{socket.inet_ntoa(ip)}:{port}"


@functools.lru_cache(maxsize=1024)
def message_id_prefix(store_host: str) -> str:
    """The first 16 hex digits of the offset message ids of `store_host` (IPv4 4 + port 4)."""
    ip, port = pack_host(store_host)
    return (ip + _HOST_PORT.pack(port)).hex().upper()


def create_message_id(store_host: str, phys_offset: int) -> str:
    """Offset message id: store host (IPv4 4 + port 4) + physical offset 8, upper-case hex."""
    return f"{message_id_prefix(store_host)}{phys_offset & 0xFFFFFFFFFFFFFFFF:016X}"


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """(store host 'ip:port', physical offset) of an offset message id; MessageIdError otherwise."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raw = b""
    if len(raw) != MESSAGE_ID_LENGTH // 2:
        raise MessageIdError(f"bad msgId {msg_id[:80]!r}: expected {MESSAGE_ID_LENGTH} hex characters")
    port, offset = _PORT_OFFSET.unpack_from(raw, 4)
    return unpack_host(raw[:4], port), offset
