"""`DLedgerConfig`: DLedger's settings with DLedger's names (snake_case) and defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dledger.rpc.auth import PeerAuth, load_peer_keys
from dledger.rpc.tls import PeerTls, check_peer_tls_files


def parse_peers(peers: str) -> dict[str, str]:
    """Parse `n0-host:port;n1-host:port` into {"n0": "host:port", ...} (id split at the first `-`)."""
    result: dict[str, str] = {}
    for item in peers.split(";"):
        item = item.strip()
        if not item:
            continue
        member_id, sep, addr = item.partition("-")
        if not sep or not member_id or ":" not in addr:
            raise ValueError(f"bad peer {item!r}: expected id-host:port, e.g. n0-127.0.0.1:40911")
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad peer address {addr!r} in {item!r}")
        if member_id in result:
            raise ValueError(f"peer id {member_id!r} appears twice in {peers!r}")
        result[member_id] = addr
    if not result:
        raise ValueError("peers is empty: expected n0-host:port;n1-host:port;...")
    return result


@dataclass
class DLedgerConfig:
    """DLedger configuration. Field names are DLedger's in snake_case; defaults are DLedger's
    unless a comment says why ours differ."""

    group: str = "default"
    self_id: str = "n0"
    peers: str = "n0-localhost:20911"
    store_base_dir: str = "/tmp/dledgerstore"
    store_type: str = "FILE"  # FILE or MEMORY

    peer_push_throttle_point: int = 300 * 1024 * 1024
    peer_push_quota: int = 20 * 1024 * 1024
    max_pending_requests_num: int = 10000  # entries appended and not committed yet (DLedger: futures)
    max_wait_ack_time_ms: int = 2500
    max_push_time_out_ms: int = 1000
    enable_leader_elector: bool = True
    # DLedger's 2 s x 3 gives ~6-10 s failover; we promise a new leader within 3 s of a kill.
    heart_beat_time_interval_ms: int = 300
    max_heart_beat_leak: int = 3
    min_vote_interval_ms: int = 100
    max_vote_interval_ms: int = 400
    file_reserved_hours: int = 72
    delete_when: str = "04"
    disk_space_ratio_to_check_expired: float = 0.70
    disk_space_ratio_to_force_clean: float = 0.85
    enable_disk_force_clean: bool = True
    flush_file_interval_ms: int = 10
    check_point_interval_ms: int = 3000
    mapped_file_size_for_entry_data: int = 1024 * 1024 * 1024
    mapped_file_size_for_entry_index: int = 32 * 5 * 1024 * 1024
    enable_push_to_follower: bool = True
    preferred_leader_ids: str | None = None
    max_leadership_transfer_wait_index: int = 1000
    min_take_leadership_vote_interval_ms: int = 30
    max_take_leadership_vote_interval_ms: int = 100
    leadership_transfer_wait_timeout_ms: int = 1000
    # Batched, pipelined pushes are on from day one (DLedger added them later, off by default).
    enable_batch_push: bool = True
    max_batch_push_size: int = 1024 * 1024
    max_batch_push_count: int = 1024
    max_pending_push_batches: int = 32
    # ASYNC_FLUSH (DLedger's behaviour: ack from page cache) or SYNC_FLUSH (ack after fsync on a majority).
    flush_disk_type: str = "ASYNC_FLUSH"
    # Test-only: ack before quorum/fsync so the fault suite can prove its checkers catch losses.
    unsafe_ack_before_quorum: bool = False
    # State-machine snapshots (dledger/snapshot.py), DLedger 0.3's, off by default as there: every
    # snapshot_threshold applied entries; retention keeps the log after the newest one; a member
    # that needs entries the leader no longer has gets the snapshot (InstallSnapshot).
    enable_snapshot: bool = False
    snapshot_threshold: int = 1000
    max_snapshot_reserved_num: int = 3
    # Peer authentication (dledger/rpc/auth.py): a file of the group's shared keys; None = off
    # (loopback, or a network nobody else reaches). Broker keys peerSecretFile / peerHandshakeTimeoutMs.
    peer_secret_file: str | None = None
    peer_handshake_timeout_ms: int = 5000
    # Peer TLS (dledger/rpc/tls.py): this member's certificate and key, and the group's CA; all
    # three or none (plaintext links). Broker keys peerTlsCertPath / peerTlsKeyPath / peerTlsTrustCertPath.
    peer_tls_cert_file: str | None = None
    peer_tls_key_file: str | None = None
    peer_tls_ca_file: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def disk_full_ratio(self) -> float:
        """DLedger derives it: force-clean ratio + 0.05, capped at 0.95."""
        return min(self.disk_space_ratio_to_force_clean + 0.05, 0.95)

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type.upper() == "SYNC_FLUSH"

    @property
    def peer_map(self) -> dict[str, str]:
        return parse_peers(self.peers)

    @property
    def preferred_leader_id_list(self) -> list[str]:
        return [p.strip() for p in (self.preferred_leader_ids or "").split(";") if p.strip()]

    def default_path(self) -> str:
        """`{storeBaseDir}/dledger-{selfId}`, DLedger's store location."""
        return os.path.join(self.store_base_dir, f"dledger-{self.self_id}")

    def snapshot_store_path(self) -> str:
        return os.path.join(self.default_path(), "snapshot")

    def data_store_path(self) -> str:
        return os.path.join(self.default_path(), "data")

    def index_store_path(self) -> str:
        return os.path.join(self.default_path(), "index")

    def validate(self) -> None:
        """Refuse a config that cannot work, naming the field."""
        peers = self.peer_map
        if self.self_id not in peers:
            raise ValueError(f"selfId {self.self_id!r} is not in peers {self.peers!r}")
        if self.flush_disk_type.upper() not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise ValueError(f"flushDiskType {self.flush_disk_type!r}: expected ASYNC_FLUSH or SYNC_FLUSH")
        if self.store_type not in ("FILE", "MEMORY"):
            raise ValueError(f"storeType {self.store_type!r}: expected FILE or MEMORY")
        if self.mapped_file_size_for_entry_index % 32:
            raise ValueError("mappedFileSizeForEntryIndex must be a multiple of 32")
        if self.peer_secret_file:
            load_peer_keys(self.peer_secret_file)  # raises ValueError naming the file and the problem
        if self.peer_handshake_timeout_ms <= 0:
            raise ValueError(f"peerHandshakeTimeoutMs {self.peer_handshake_timeout_ms}: expected > 0")
        tls_files = (self.peer_tls_cert_file, self.peer_tls_key_file, self.peer_tls_ca_file)
        if any(tls_files):
            if not all(tls_files):
                got = (f"certificate={self.peer_tls_cert_file!r}, key={self.peer_tls_key_file!r}, "
                       f"CA={self.peer_tls_ca_file!r}")
                raise ValueError(f"peer TLS needs the certificate, its key and the CA, all three (got {got})")
            check_peer_tls_files(*tls_files)  # type: ignore[arg-type]

    def peer_tls(self) -> PeerTls | None:
        """This member's TLS on its peer links (None: plaintext)."""
        if not (self.peer_tls_cert_file and self.peer_tls_key_file and self.peer_tls_ca_file):
            return None
        return PeerTls(self.group, self.self_id, self.peer_tls_cert_file, self.peer_tls_key_file,
                       self.peer_tls_ca_file)

    def peer_auth(self) -> PeerAuth | None:
        """The handshake of this member's connections (None when peer authentication is off)."""
        if not self.peer_secret_file:
            return None
        return PeerAuth.from_file(self.group, self.self_id, self.peer_secret_file)
