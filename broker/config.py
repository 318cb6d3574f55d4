"""Broker configuration: RocketMQ `.properties` files → a typed `BrokerConfig`.

Keys keep RocketMQ's spelling at the edge (`dLegerPeers`) and become snake_case attributes inside,
mapped in ONE table (`KEYS`). An operator's existing RocketMQ file loads: keys RocketMQ knows but we
do not implement (`UNIMPLEMENTED_KEYS`) are accepted with one warning each. A key nobody knows (a
typo) or a bad value is refused at start with the file, the key, the reason and the nearest known
key.
"""

from __future__ import annotations

import difflib
import enum
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from broker.topics import PERM_READ, PERM_WRITE
from dledger.config import DLedgerConfig, parse_peers
from dledger.rpc.auth import load_peer_keys
from dledger.rpc.tls import check_peer_tls_files
from listener.config import (
    CLIENT_KEYS,
    SERVER_KEYS,
    ClientTlsConfig,
    ListenerConfig,
    ListenerConfigError,
    apply_key,
)
from wire.names import BROKER_NAME_RE
from wire.regauth import load_secrets

log = logging.getLogger(__name__)



class ConfigError(ValueError):
    """A config file that cannot start a broker: names the file, key, reason and nearest key."""

    def __init__(self, source: str, key: str, reason: str, nearest: str | None = None) -> None:
        self.source, self.key, self.reason, self.nearest = source, key, reason, nearest
        hint = f" (did you mean {nearest!r}?)" if nearest else ""
        super().__init__(f"{source}: key {key!r}: {reason}{hint}")


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in ("true", "yes", "1", "on"):
        return True
    if low in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def _int(v: str) -> int:
    try:
        return int(v.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None


def _pos_int(v: str) -> int:
    n = _int(v)
    if n <= 0:
        raise ValueError(f"expected a positive integer, got {n}")
    return n


def _nonneg_int(v: str) -> int:
    n = _int(v)
    if n < 0:
        raise ValueError(f"expected an integer >= 0, got {n}")
    return n


def _port(v: str) -> int:
    n = _int(v)
    if not 0 <= n < 65536:
        raise ValueError(f"expected a port 0..65535, got {n}")
    return n


def _ratio_percent(v: str) -> int:
    n = _int(v)
    if not 10 <= n <= 95:
        raise ValueError(f"expected a percentage 10..95, got {n}")
    return n


def _forcibly_percent(v: str) -> int:
    n = _int(v)
    if not 1 <= n <= 90:
        raise ValueError(f"expected a percentage 1..90 (writes are refused at it + 5), got {n}")
    return n


def _str(v: str) -> str:
    return v.strip()


def _broker_name(v: str) -> str:
    # The name servers refuse a registration whose brokerName breaks this pattern, which would
    # leave the broker running but out of every route: refuse it here, at start.
    s = v.strip()
    if not BROKER_NAME_RE.match(s):  # the name servers' rule (wire.names)
        raise ValueError(f"expected 1-127 of letters, digits, '%', '_', '-', '|', got {v!r}")
    return s


def _flush_type(v: str) -> str:
    s = v.strip().upper()
    if s not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        raise ValueError(f"expected ASYNC_FLUSH or SYNC_FLUSH, got {v!r}")
    return s


def _delete_when(v: str) -> str:
    for part in v.strip().split(";"):
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise ValueError(f"expected hours of day like 04 or 04;16, got {v!r}")
    return v.strip()


def _peers(v: str) -> str:
    parse_peers(v)  # raises ValueError with the reason
    return v.strip()


def _register_period(v: str) -> int:
    n = _int(v)
    if not 100 <= n <= 600_000:
        raise ValueError(f"expected milliseconds 100..600000, got {n}")
    return n


def _clean_interval(v: str) -> int:
    n = _int(v)
    if not 100 <= n <= 3_600_000:
        raise ValueError(f"expected milliseconds 100..3600000, got {n}")
    return n
def _delay_levels(v: str) -> str:
    from broker.timer.levels import parse_delay_levels  # the one parser of the levels

    parse_delay_levels(v)
    return v.strip()


def _path(v: str) -> str:
    return os.path.expanduser(v.strip())


_BROKER_PERMISSIONS = {6: "read and write", 4: "read only", 2: "write only", 0: "neither"}


def _broker_permission(v: str) -> int:
    n = _int(v)
    if n not in _BROKER_PERMISSIONS:
        raise ValueError("expected 6 (read and write), 4 (read only: producers are routed elsewhere), "
                         f"2 (write only) or 0, got {n}")
    return n


# RocketMQ key -> (attribute, parser). The one table; BrokerConfig below holds the defaults.
KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "brokerClusterName": ("broker_cluster_name", _str),
    "brokerName": ("broker_name", _broker_name),
    "brokerId": ("broker_id", _nonneg_int),
    "brokerIP1": ("broker_ip1", _str),
    "listenPort": ("listen_port", _port),
    "namesrvAddr": ("namesrv_addr", _str),
    "storePathRootDir": ("store_path_root_dir", _path),
    "enableDLegerCommitLog": ("enable_dledger_commit_log", _bool),
    "dLegerGroup": ("dledger_group", _str),
    "dLegerPeers": ("dledger_peers", _peers),
    "dLegerSelfId": ("dledger_self_id", _str),
    "preferredLeaderIds": ("preferred_leader_ids", _str),
    "preferredLeaderId": ("preferred_leader_ids", _str),  # RocketMQ 4.x spelling
    "enableBatchPush": ("enable_batch_push", _bool),
    "maxPendingRequestsNum": ("max_pending_requests_num", _pos_int),  # DLedger's; entries, not calls
    "peerSecretFile": ("peer_secret_file", _path),  # DLedger peer authentication (dledger/rpc/auth.py)
    "peerHandshakeTimeoutMs": ("peer_handshake_timeout_ms", _pos_int),
    # DLedger peer TLS (dledger/rpc/tls.py): this member's certificate and key, the set's CA.
    "peerTlsCertPath": ("peer_tls_cert_path", _path),
    "peerTlsKeyPath": ("peer_tls_key_path", _path),
    "peerTlsTrustCertPath": ("peer_tls_trust_cert_path", _path),
    "autoCreateTopicEnable": ("auto_create_topic_enable", _bool),
    "defaultTopicQueueNums": ("default_topic_queue_nums", _pos_int),
    "maxMessageSize": ("max_message_size", _pos_int),
    "mappedFileSizeCommitLog": ("mapped_file_size_commit_log", _pos_int),
    "mappedFileSizeConsumeQueue": ("mapped_file_size_consume_queue", _pos_int),
    "flushDiskType": ("flush_disk_type", _flush_type),
    "deleteWhen": ("delete_when", _delete_when),
    "fileReservedTime": ("file_reserved_time", _pos_int),
    "diskMaxUsedSpaceRatio": ("disk_max_used_space_ratio", _ratio_percent),
    "diskSpaceCleanForciblyRatio": ("disk_space_clean_forcibly_ratio", _forcibly_percent),
    "cleanResourceInterval": ("clean_resource_interval", _clean_interval),
    "longPollingEnable": ("long_polling_enable", _bool),
    "brokerSuspendMaxTimeMillis": ("broker_suspend_max_time_millis", _pos_int),
    "maxReconsumeTimes": ("max_reconsume_times", _nonneg_int),
    # message model (issue 15)
    "messageDelayLevel": ("message_delay_level", _delay_levels),
    "timerWheelEnable": ("timer_wheel_enable", _bool),
    "timerMaxDelaySec": ("timer_max_delay_sec", _pos_int),
    "timerResidentMax": ("timer_resident_max", _pos_int),
    "recallMessageEnable": ("recall_message_enable", _bool),
    "transactionTimeOut": ("transaction_time_out", _pos_int),
    "transactionCheckMax": ("transaction_check_max", _pos_int),
    "transactionCheckInterval": ("transaction_check_interval", _pos_int),
    "enablePropertyFilter": ("enable_property_filter", _bool),
    "idempotencyWindowMs": ("idempotency_window_ms", _nonneg_int),
    "idempotencyMaxKeys": ("idempotency_max_keys", _pos_int),
    "aclEnable": ("acl_enable", _bool),
    "aclConfigFile": ("acl_config_file", _path),
    "registerNameServerPeriod": ("register_name_server_period", _register_period),
    "grpcServerPort": ("grpc_server_port", _port),
    "brokerPermission": ("broker_permission", _broker_permission),
    "registrationSecretFile": ("registration_secret_file", _path),
}

# Keys RocketMQ knows that LedgerMQ does not implement: accepted, one warning each.
UNIMPLEMENTED_KEYS = frozenset("""
fetchNamesrvAddrByAddressServer sendMessageThreadPoolNums pullMessageThreadPoolNums
queryMessageThreadPoolNums adminBrokerThreadPoolNums clientManageThreadPoolNums
consumerManageThreadPoolNums heartbeatThreadPoolNums endTransactionThreadPoolNums
litePullMessageThreadPoolNums ackMessageThreadPoolNums processReplyMessageThreadPoolNums
putMessageFutureThreadPoolNums flushConsumerOffsetInterval flushConsumerOffsetHistoryInterval
rejectTransactionMessage storePathCommitLog storePathConsumeQueue storePathIndex storeCheckpoint
abortFile storePathDLedgerCommitLog brokerRole haListenPort haMasterAddress haSendHeartbeatInterval
haHousekeepingInterval haTransferBatchSize flushIntervalCommitLog flushCommitLogTimed
flushIntervalConsumeQueue deleteCommitLogFilesInterval
deleteConsumeQueueFilesInterval destroyMapedFileIntervalForcibly redeleteHangedFileInterval
cleanFileForciblyEnable maxTransferBytesOnMessageInMemory maxTransferCountOnMessageInMemory
maxTransferBytesOnMessageInDisk maxTransferCountOnMessageInDisk accessMessageInMemoryMaxRatio
messageIndexEnable maxHashSlotNum maxIndexNum maxMsgsNumBatch messageIndexSafe
transientStorePoolEnable transientStorePoolSize fastFailIfNoBufferInStorePool
useReentrantLockWhenPutMessage warmMapedFileEnable offsetCheckInSlave debugLockEnable
duplicationEnable diskFallRecorded osPageCacheBusyTimeOutMills defaultQueryMaxNum
enableConsumeQueueExt mappedFileSizeConsumeQueueExt bitMapLengthConsumeQueueExt rocketmqHome
kvConfigPath configStorePath clusterTopicEnable brokerTopicEnable traceTopicEnable msgTraceTopicName
serverWorkerThreads serverCallbackExecutorThreads serverSelectorThreads
serverOnewaySemaphoreValue serverAsyncSemaphoreValue
serverSocketSndBufSize serverSocketRcvBufSize serverPooledByteBufAllocatorEnable
useEpollNativeSelector clientWorkerThreads clientCallbackExecutorThreads brokerIP2
waitTimeMillsInSendQueue waitTimeMillsInPullQueue filterServerNums notifyConsumerIdsChangedEnable
highSpeedMode commercialEnable transferMsgByHeap maxDelayTime regionId registerBrokerTimeoutMills
shortPollingTimeMills compressedRegister forceRegister readUnCommitted
syncFlushTimeout putMsgIndexHightWater flushLeastPagesWhenWarmMapedFile enableScheduleMessageStats
autoCreateSubscriptionGroup traceOn enableControllerMode controllerAddr enableSlaveActingMaster
enablePopLog enableCalcFilterBitMap storeReplyMessageEnable mappedFileSizeTimerLog
timerPrecisionMs deleteFileBatchMax isEnableBatchPush enableDLegerCommitLogReadonly slaveReadEnable
totalReplicas inSyncReplicas minInSyncReplicas enableAutoInSyncReplicas supportActingMaster
brokerHeartbeatInterval brokerNotActiveTimeoutMillis sendHeartbeatTimeoutMillis isolateLogEnable
""".split())


@dataclass
class BrokerConfig:
    """Typed broker settings (RocketMQ defaults unless a comment says why ours differ)."""

    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    broker_ip1: str = "127.0.0.1"
    listen_port: int = 10911  # the broker's HTTP port
    namesrv_addr: str = ""
    store_path_root_dir: str = field(default_factory=lambda: os.path.expanduser("~/store"))
    enable_dledger_commit_log: bool = False
    dledger_group: str = ""
    dledger_peers: str = ""
    dledger_self_id: str = ""
    preferred_leader_ids: str = ""
    enable_batch_push: bool = True
    max_pending_requests_num: int = 10_000  # entries the master may hold uncommitted (LEADER_PENDING_FULL)
    peer_secret_file: str = ""  # the set's shared keys for DLedger peer links; "" = no peer authentication
    peer_handshake_timeout_ms: int = 5000
    peer_tls_cert_path: str = ""  # "" (all three) = plaintext DLedger peer links
    peer_tls_key_path: str = ""
    peer_tls_trust_cert_path: str = ""
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 8
    max_message_size: int = 4 * 1024 * 1024
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    flush_disk_type: str = "ASYNC_FLUSH"
    delete_when: str = "04"
    file_reserved_time: int = 72  # hours
    disk_max_used_space_ratio: int = 75  # percent: expired files deleted whatever the hour
    disk_space_clean_forcibly_ratio: int = 85  # percent: files deleted whatever their age
    clean_resource_interval: int = 10_000  # ms between retention passes of the local commit log
    long_polling_enable: bool = True
    broker_suspend_max_time_millis: int = 15_000
    max_reconsume_times: int = 16
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    timer_wheel_enable: bool = True
    timer_max_delay_sec: int = 3 * 86_400  # RocketMQ 5's timerMaxDelaySec: 3 days
    # Pending timers kept in memory (16 B each); past it the furthest buckets spill to disk.
    timer_resident_max: int = 2_000_000
    # RocketMQ 5.3 ships recall off; on here, since a recall needs the handle its send returned.
    recall_message_enable: bool = True
    transaction_time_out: int = 6_000  # ms a half waits before its first check-back
    transaction_check_max: int = 15
    transaction_check_interval: int = 30_000  # ms between check-backs of one transaction
    enable_property_filter: bool = False  # SQL92 filters, as RocketMQ: off unless enabled
    idempotency_window_ms: int = 5 * 60 * 1000
    # ~150 bytes a key on every member: 1M keys bound the table near 150 MB whatever the rate.
    idempotency_max_keys: int = 1_000_000
    acl_enable: bool = False
    acl_config_file: str = ""
    register_name_server_period: int = 30_000  # ms between heartbeats to every name server
    grpc_server_port: int = 0  # the RocketMQ 5 gRPC endpoint's port (RocketMQ proxy's key); 0 = none
    registration_secret_file: str = ""  # signs registrations (wire.regauth; first secret of the file)
    # RocketMQ's PermName bits for the whole broker: 4 (read only) drains it of new writes, the way
    # an operator takes a set out of service (`mqadmin updateBrokerConfig -k brokerPermission -v 4`).
    broker_permission: int = PERM_READ | PERM_WRITE
    # The HTTP listener's TLS, read deadlines and connection caps, and the TLS of the calls to the
    # name servers: keys of listener.config's table (tls.server.*, tls.client.*, maxConnections …).
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    tls_client: ClientTlsConfig = field(default_factory=ClientTlsConfig)
    source: str = "<defaults>"  # where the config came from, for error messages
    extra: dict[str, str] = field(default_factory=dict)  # accepted-but-unimplemented RocketMQ keys

    def properties(self) -> dict[str, str]:
        """Every key LedgerMQ implements, with the value this broker runs with (defaults
        included), spelled as in a `.properties` file; key passwords masked. What
        `mqadmin getBrokerConfig` shows."""
        out: dict[str, str] = {}
        seen: set[str] = set()
        for key, (attr, _) in KEYS.items():
            if attr not in seen:  # one spelling per setting (preferredLeaderId is an alias)
                seen.add(attr)
                out[key] = _prop(getattr(self, attr))
        for table, target in ((SERVER_KEYS, self.listener), (CLIENT_KEYS, self.tls_client)):
            for key, (attr, _) in table.items():
                if attr:
                    value = getattr(target, attr)
                    out[key] = "******" if key.endswith("keyPassword") and value else _prop(value)
        return out

    @property
    def broker_writable(self) -> bool:
        return bool(self.broker_permission & PERM_WRITE)

    @property
    def broker_readable(self) -> bool:
        return bool(self.broker_permission & PERM_READ)

    def registered_perm(self, topic_perm: int) -> int:
        """A topic's perm as this broker registers it with the name servers: `brokerPermission`
        takes away reads or writes (RocketMQ registers `topic perm & brokerPermission` then)."""
        return topic_perm & ~((PERM_READ | PERM_WRITE) & ~self.broker_permission)

    @property
    def broker_addr(self) -> str:
        """This broker's HTTP address as clients reach it (brokerIP1:listenPort)."""
        return f"{self.broker_ip1}:{self.listen_port}"

    @property
    def grpc_addr(self) -> str | None:
        """This broker's gRPC address as clients reach it (brokerIP1:grpcServerPort), if any."""
        return f"{self.broker_ip1}:{self.grpc_server_port}" if self.grpc_server_port else None

    @property
    def namesrv_addr_list(self) -> list[str]:
        return [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]

    def validate(self) -> None:
        """Cross-key checks, raising ConfigError naming the key."""
        try:
            self.listener.validate()
            self.tls_client.validate()
            if self.grpc_server_port and self.listener.tls:  # the gRPC port's TLS: broker/grpc/tls.py
                self.listener.plain_key_pem()
                if self.tls_client.cert_path:
                    self.tls_client.plain_key_pem()
        except ListenerConfigError as exc:
            raise ConfigError(self.source, exc.key, exc.reason) from None
        if self.registration_secret_file:
            try:
                load_secrets(self.registration_secret_file)
            except ValueError as exc:
                raise ConfigError(self.source, "registrationSecretFile", str(exc)) from None
        if self.cq_unit_misaligned():
            raise ConfigError(self.source, "mappedFileSizeConsumeQueue", "must be a multiple of 20")
        if self.enable_dledger_commit_log:
            if not self.dledger_peers:
                raise ConfigError(self.source, "dLegerPeers", "required when enableDLegerCommitLog=true")
            peers = parse_peers(self.dledger_peers)
            if self.dledger_self_id not in peers:
                raise ConfigError(self.source, "dLegerSelfId",
                                  f"{self.dledger_self_id!r} is not one of dLegerPeers {sorted(peers)}")
            for pid in (p for p in self.preferred_leader_ids.split(";") if p.strip()):
                if pid.strip() not in peers:
                    raise ConfigError(self.source, "preferredLeaderIds", f"{pid!r} is not in dLegerPeers")
            if self.peer_secret_file:
                try:
                    load_peer_keys(self.peer_secret_file)
                except ValueError as exc:
                    raise ConfigError(self.source, "peerSecretFile", str(exc)) from None
            self._check_peer_tls()

    def _check_peer_tls(self) -> None:
        """All three peer TLS keys or none, each file loadable; ConfigError naming the key."""
        keys = {"peerTlsCertPath": self.peer_tls_cert_path, "peerTlsKeyPath": self.peer_tls_key_path,
                "peerTlsTrustCertPath": self.peer_tls_trust_cert_path}
        if not any(keys.values()):
            return
        for key, value in keys.items():
            if not value:
                raise ConfigError(self.source, key, "peer TLS needs peerTlsCertPath, peerTlsKeyPath and "
                                                    "peerTlsTrustCertPath together")
        try:
            check_peer_tls_files(*keys.values())
        except ValueError as exc:
            raise ConfigError(self.source, "peerTlsCertPath", str(exc)) from None

    @property
    def disk_full_ratio(self) -> float:
        """Writes are refused past this used ratio of the store's disk, in both modes (DLedger's
        rule: `diskSpaceCleanForciblyRatio` + 5 %, at most 95 %)."""
        forcibly = DLedgerConfig(disk_space_ratio_to_force_clean=self.disk_space_clean_forcibly_ratio / 100)
        return forcibly.disk_full_ratio

    def cq_unit_misaligned(self) -> bool:
        return self.mapped_file_size_consume_queue % 20 != 0

    def _dledger_retention(self) -> dict[str, Any]:
        return {
            "delete_when": self.delete_when,
            "file_reserved_hours": self.file_reserved_time + 1,  # RocketMQ passes fileReservedTime + 1
            "disk_space_ratio_to_check_expired": self.disk_max_used_space_ratio / 100,
            "disk_space_ratio_to_force_clean": self.disk_space_clean_forcibly_ratio / 100,
        }

    def retention_into(self, dledger_config: DLedgerConfig) -> None:
        """Set a running DLedger store's retention settings from this config (its clean-up and
        disk-full check read them every round)."""
        for attr, value in self._dledger_retention().items():
            setattr(dledger_config, attr, value)

    def to_dledger_config(self) -> DLedgerConfig:
        """The embedded DLedger server's config, as RocketMQ's DLedgerCommitLog builds it."""
        return DLedgerConfig(
            group=self.dledger_group or self.broker_name,
            self_id=self.dledger_self_id,
            peers=self.dledger_peers,
            store_base_dir=self.store_path_root_dir,
            mapped_file_size_for_entry_data=self.mapped_file_size_commit_log,
            **self._dledger_retention(),
            preferred_leader_ids=self.preferred_leader_ids or None,
            enable_batch_push=self.enable_batch_push,
            max_pending_requests_num=self.max_pending_requests_num,
            flush_disk_type=self.flush_disk_type,
            peer_secret_file=self.peer_secret_file or None,
            peer_handshake_timeout_ms=self.peer_handshake_timeout_ms,
            peer_tls_cert_file=self.peer_tls_cert_path or None,
            peer_tls_key_file=self.peer_tls_key_path or None,
            peer_tls_ca_file=self.peer_tls_trust_cert_path or None,
        )


def _prop(value: Any) -> str:
    """A setting as a `.properties` value (true/false, an enum's value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


def parse_properties(text: str) -> list[tuple[int, str, str]]:
    """Java `.properties` syntax → [(line number, key, value)]: `#`/`!` comments, `=`, `:` or
    whitespace separators, backslash line continuation."""
    out: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno, line = i + 1, lines[i].strip()
        i += 1
        while line.endswith("\\") and not line.endswith("\\\\") and i < len(lines):
            line = line[:-1] + lines[i].strip()
            i += 1
        if not line or line[0] in "#!":
            continue
        cut = len(line)
        for j, ch in enumerate(line):
            if ch in "=: \t":
                cut = j
                break
        key, rest = line[:cut], line[cut:].lstrip()
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
        out.append((lineno, key, rest.strip()))
    return out


def _known_keys() -> list[str]:
    return [*KEYS, *SERVER_KEYS, *CLIENT_KEYS, *UNIMPLEMENTED_KEYS]


def _apply_listener_key(cfg: BrokerConfig, key: str, raw: str, where: str) -> bool:
    """A key of the shared listener table (HTTP listener, outgoing TLS): set it, True."""
    try:
        return apply_key(cfg.listener, key, raw) or apply_key(cfg.tls_client, key, raw)
    except ValueError as exc:
        raise ConfigError(where, key, f"bad value: {exc}") from None


def config_from_mapping(values: Mapping[str, str], source: str = "<mapping>",
                        lines: Mapping[str, int] | None = None) -> BrokerConfig:
    """Build and validate a BrokerConfig from RocketMQ key → string value."""
    cfg = BrokerConfig(source=source)
    for key, raw in values.items():
        where = f"{source}:{lines[key]}" if lines and key in lines else source
        if key in KEYS:
            attr, parse = KEYS[key]
            try:
                setattr(cfg, attr, parse(raw))
            except ValueError as exc:
                raise ConfigError(where, key, f"bad value: {exc}") from None
        elif _apply_listener_key(cfg, key, raw, where):
            pass
        elif key in UNIMPLEMENTED_KEYS:
            log.warning("event=config_key_ignored source=%s key=%s reason=not implemented by LedgerMQ",
                        where, key)
            cfg.extra[key] = raw
        else:
            nearest = difflib.get_close_matches(key, _known_keys(), n=1, cutoff=0.5)
            raise ConfigError(where, key, "unknown key", nearest[0] if nearest else None)
    cfg.validate()
    return cfg


# Keys that may change while the broker runs (`PATCH /admin/config`, `mqadmin updateBrokerConfig`):
# each is read where it is used, when it is used (the retention keys reach a DLedger store through
# `BrokerConfig.retention_into`). Every other key is read at start only.
RETENTION_KEYS = ("fileReservedTime", "deleteWhen", "diskMaxUsedSpaceRatio", "diskSpaceCleanForciblyRatio")
RUNTIME_KEYS = ("brokerPermission", *RETENTION_KEYS, "maxReconsumeTimes", "longPollingEnable",
                "brokerSuspendMaxTimeMillis")
# Where a broker keeps what `updateBrokerConfig` changed, under storePathRootDir: read at start
# after its .properties file, so a change outlives a restart without rewriting the operator's file.
UPDATES_FILE = os.path.join("config", "updateBrokerConfig.properties")


def parse_runtime_updates(updates: Mapping[str, str], source: str) -> dict[str, Any]:
    """{key: parsed value} for `updates` (RocketMQ key -> value text), every one checked before
    any is applied: ConfigError names a key that is unknown or read at start only, or its bad value."""
    parsed: dict[str, Any] = {}
    for key, raw in updates.items():
        if key not in RUNTIME_KEYS:
            if key in KEYS or key in SERVER_KEYS or key in CLIENT_KEYS:
                runtime = ", ".join(RUNTIME_KEYS)
                raise ConfigError(source, key, "read at start only: set it in the broker's .properties "
                                  f"file and restart the broker (changeable at runtime: {runtime})")
            if key in UNIMPLEMENTED_KEYS:
                raise ConfigError(source, key, "not implemented by LedgerMQ")
            nearest = difflib.get_close_matches(key, _known_keys(), n=1, cutoff=0.5)
            raise ConfigError(source, key, "unknown key", nearest[0] if nearest else None)
        try:
            parsed[key] = KEYS[key][1](raw)
        except ValueError as exc:
            raise ConfigError(source, key, f"bad value: {exc}") from None
    return parsed


def apply_runtime_updates(cfg: BrokerConfig, parsed: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Set `parse_runtime_updates`' values on `cfg`; {key: (old, new)} as `.properties` text."""
    changed: dict[str, tuple[str, str]] = {}
    for key, value in parsed.items():
        attr = KEYS[key][0]
        changed[key] = (_prop(getattr(cfg, attr)), _prop(value))
        setattr(cfg, attr, value)
    return changed


def updates_path(cfg: BrokerConfig) -> str:
    return os.path.join(cfg.store_path_root_dir, UPDATES_FILE)


def _read_updates(path: str) -> list[tuple[int, str, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_properties(f.read())
    except FileNotFoundError:
        return []


def save_runtime_updates(cfg: BrokerConfig, parsed: Mapping[str, Any]) -> str:
    """Merge `parsed` into the broker's updates file (written aside, fsynced, then renamed over
    it: a crash leaves the old file or the new one); returns its path. Raises OSError."""
    path = updates_path(cfg)
    values = {key: value for _, key, value in _read_updates(path)}
    values.update({key: _prop(value) for key, value in parsed.items()})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = ("# What `mqadmin updateBrokerConfig` (PATCH /admin/config) changed on this broker; read at\n"
            "# start after the broker's .properties file, whose value for these keys it replaces.\n"
            + "".join(f"{key}={value}\n" for key, value in sorted(values.items())))
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_runtime_updates(cfg: BrokerConfig) -> dict[str, tuple[str, str]]:
    """At start: apply what earlier `updateBrokerConfig` calls saved over the config file's values;
    {key: (file's value, saved value)}. A bad line raises ConfigError naming the file and key."""
    path = updates_path(cfg)
    try:
        lines = _read_updates(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, "-", f"cannot read the saved config updates: {exc}") from None
    parsed: dict[str, Any] = {}
    for lineno, key, value in lines:
        parsed.update(parse_runtime_updates({key: value}, f"{path}:{lineno}"))
    return apply_runtime_updates(cfg, parsed)


def load_broker_config(path: str, overrides: Mapping[str, str] | None = None) -> BrokerConfig:
    """Load a RocketMQ broker `.properties` file (then `overrides`, RocketMQ key names)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(path, "-", f"cannot read config file: {exc.strerror}") from None
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    for lineno, key, value in parse_properties(text):
        values[key] = value
        lines[key] = lineno
    values.update(overrides or {})
    return config_from_mapping(values, path, lines)


assert {a for a, _ in KEYS.values()} <= {f.name for f in fields(BrokerConfig)}, "KEYS names unknown attrs"
