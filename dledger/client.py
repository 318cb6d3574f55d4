"""`DLedgerClient`: talks to a DLedger group over the TCP protocol, finds the leader and retries.

Appends go to the member believed to be leader; NOT_LEADER (which names the leader when known),
LEADER_TRANSFERRING and unreachable members make the client try again (the leader it was told
about, else the next member) until `timeout_s` is spent. A retry after a lost connection may
append a body twice (at-least-once); answers with an unknown outcome (TERM_CHANGED,
WAIT_QUORUM_ACK_TIMEOUT, TIMEOUT) are raised, not retried.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import orjson

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import parse_peers
from dledger.entry import DLedgerEntry
from dledger.member_state import Role
from dledger.rpc.auth import PeerAuth
from dledger.rpc.protocol import (
    AppendEntryRequest,
    AppendEntryResponse,
    GetEntriesRequest,
    LeadershipTransferRequest,
    MetadataRequest,
)
from dledger.rpc.tcp import TcpRpcService
from dledger.rpc.tls import PeerTls

_RETRY_CODES = frozenset(
    (
        DLedgerResponseCode.NOT_LEADER,
        DLedgerResponseCode.LEADER_TRANSFERRING,
        DLedgerResponseCode.NETWORK_ERROR,
    )
)
_RETRY_PAUSE_S = 0.05


class DLedgerClient:
    """Client of one DLedger group (`peers` as `n0-host:port;...` or a dict)."""

    def __init__(self, group: str, peers: str | dict[str, str], *, timeout_s: float = 5.0,
                 peer_secret_file: str | None = None, peer_tls: tuple[str, str, str] | None = None) -> None:
        self.group = group
        self.peers = parse_peers(peers) if isinstance(peers, str) else dict(peers)
        self.timeout_s = timeout_s
        self.client_id = f"client-{os.getpid()}-{id(self):x}"
        # A group whose members authenticate peers takes clients holding the same secret.
        auth = PeerAuth.from_file(group, self.client_id, peer_secret_file) if peer_secret_file else None
        # A group with peer TLS takes clients with a certificate from its CA: (cert, key, CA) files.
        tls = PeerTls(group, self.client_id, *peer_tls) if peer_tls else None
        self.rpc = TcpRpcService(group, self.client_id, self.peers, listen=False, auth=auth, tls=tls)
        self.leader_id: str | None = None
        self._rr = itertools.cycle(list(self.peers))

    async def close(self) -> None:
        await self.rpc.shutdown()

    async def __aenter__(self) -> DLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _target(self) -> str:
        return self.leader_id if self.leader_id is not None else next(self._rr)

    async def append(self, bodies: list[bytes]) -> AppendEntryResponse:
        """Append (a batch of) bodies; returns the leader's answer (index of the first, positions)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        last: DLedgerException | None = None
        while loop.time() < deadline:
            target = self._target()
            req = AppendEntryRequest(
                group=self.group, remote_id=target, local_id=self.client_id, bodies=bodies
            )
            try:
                resp: AppendEntryResponse = await self.rpc.append(
                    target, req, max(deadline - loop.time(), 0.01)
                )
            except DLedgerException as exc:
                if exc.code != DLedgerResponseCode.NETWORK_ERROR:
                    raise
                last, self.leader_id = exc, None
                await asyncio.sleep(_RETRY_PAUSE_S)
                continue
            code = DLedgerResponseCode.value_of(resp.code)
            if code == DLedgerResponseCode.SUCCESS:
                self.leader_id = target
                return resp
            if code not in _RETRY_CODES:
                raise DLedgerException(code, f"append at {target}")
            last = DLedgerException(code, f"append at {target}")
            self.leader_id = resp.leader_id if resp.leader_id and resp.leader_id != target else None
            if self.leader_id is None:
                await asyncio.sleep(_RETRY_PAUSE_S)
        raise last or DLedgerException(DLedgerResponseCode.TIMEOUT, "no leader answered")

    async def get(self, index: int, max_count: int = 1, member_id: str | None = None) -> list[DLedgerEntry]:
        """Committed entries from `index`, read from `member_id` (default: the leader)."""
        target = member_id or await self.find_leader()
        req = GetEntriesRequest(
            group=self.group,
            remote_id=target,
            local_id=self.client_id,
            begin_index=index,
            max_count=max_count,
        )
        resp = await self.rpc.get(target, req, self.timeout_s)
        if resp.code != DLedgerResponseCode.SUCCESS:
            raise DLedgerException(DLedgerResponseCode.value_of(resp.code), f"get {index} at {target}")
        return resp.entries

    async def metadata(self, member_id: str) -> dict[str, Any]:
        """One member's `DLedgerServer.metadata()`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:
            try:
                return await self._metadata_once(member_id)
            except DLedgerException as exc:
                # Unreachable (maybe starting up, or backing off after a failed connect): retry.
                if exc.code != DLedgerResponseCode.NETWORK_ERROR or loop.time() >= deadline:
                    raise
                await asyncio.sleep(_RETRY_PAUSE_S)

    async def _metadata_once(self, member_id: str) -> dict[str, Any]:
        req = MetadataRequest(group=self.group, remote_id=member_id, local_id=self.client_id)
        resp = await self.rpc.metadata(member_id, req, self.timeout_s)
        if resp.code != DLedgerResponseCode.SUCCESS:
            raise DLedgerException(DLedgerResponseCode.value_of(resp.code), f"metadata of {member_id}")
        return orjson.loads(resp.json)

    async def find_leader(self) -> str:
        """Ask members until one says it leads (or names the leader); retries until timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while loop.time() < deadline:
            for member in self.peers:
                try:
                    md = await self._metadata_once(member)
                except DLedgerException:
                    continue
                if Role(md["role"]) is Role.LEADER:
                    self.leader_id = member
                    return member
            await asyncio.sleep(_RETRY_PAUSE_S)
        raise DLedgerException(DLedgerResponseCode.TIMEOUT, f"no leader in {self.timeout_s}s")

    async def leadership_transfer(self, transferee_id: str) -> None:
        """Ask the leader to hand over to `transferee_id`; returns when it has."""
        leader = await self.find_leader()
        req = LeadershipTransferRequest(
            group=self.group, remote_id=leader, local_id=self.client_id, transferee_id=transferee_id
        )
        resp = await self.rpc.leadership_transfer(leader, req, self.timeout_s)
        if resp.code != DLedgerResponseCode.SUCCESS:
            raise DLedgerException(DLedgerResponseCode.value_of(resp.code), f"transfer to {transferee_id}")
        self.leader_id = transferee_id
