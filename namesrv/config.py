"""`NamesrvConfig`: the name server's settings, loaded from a RocketMQ-style `.properties` file."""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from listener.config import SERVER_KEYS, ListenerConfig, ListenerConfigError, apply_key
from wire.regauth import load_secrets

log = logging.getLogger(__name__)


def read_properties(path: str | Path) -> dict[str, str]:
    """Parse a Java `.properties` file: `key=value` or `key: value`, `#`/`!` comments, `\\` line
    continuation. Raises ValueError naming the file and line for a line with no key."""
    result: dict[str, str] = {}
    text = Path(path).read_text(encoding="utf-8")
    pending = ""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        sep_positions = [p for p in (line.find("="), line.find(":")) if p >= 0]
        if not sep_positions:
            # Java also allows `key value`; accept the first whitespace as the separator.
            parts = line.split(None, 1)
            key, value = parts[0], (parts[1] if len(parts) > 1 else "")
        else:
            pos = min(sep_positions)
            key, value = line[:pos].strip(), line[pos + 1 :].strip()
        if not key:
            raise ValueError(f"{path}:{lineno}: line has no key: {raw!r}")
        result[key] = value
    return result


# RocketMQ name server keys we accept without acting on them (warned once each).
_IGNORED_KEYS = {
    "rocketmqHome",
    "kvConfigPath",
    "configStorePath",
    "productEnvName",
    "clusterTest",
    "orderMessageEnable",
    "serverWorkerThreads",
    "serverCallbackExecutorThreads",
    "serverSelectorThreads",
    "serverOnewaySemaphoreValue",
    "serverAsyncSemaphoreValue",
    "serverSocketSndBufSize",
    "serverSocketRcvBufSize",
    "serverPooledByteBufAllocatorEnable",
    "useEpollNativeSelector",
    "defaultThreadPoolNums",
    "clientRequestThreadPoolNums",
    "enableAllTopicList",
    "enableTopicList",
}


@dataclass
class NamesrvConfig:
    """Name server settings (RocketMQ key names in the file, snake_case here)."""

    listen_host: str = "0.0.0.0"
    listen_port: int = 9876
    # RocketMQ's BROKER_CHANNEL_EXPIRED_TIME: a broker silent this long drops out of routes.
    broker_expired_ms: int = 120_000
    scan_not_active_broker_interval_ms: int = 5_000
    # Brokers must sign register/unregister with a secret of this file (wire.regauth); "" = open.
    registration_secret_file: str = ""
    # TLS, read deadlines and connection caps of the HTTP port (listener.config's keys).
    listener: ListenerConfig = field(default_factory=ListenerConfig)

    _KEYS = {
        "listenHost": ("listen_host", str),
        "listenPort": ("listen_port", int),
        "brokerExpiredMs": ("broker_expired_ms", int),
        "scanNotActiveBrokerInterval": ("scan_not_active_broker_interval_ms", int),
        "registrationSecretFile": ("registration_secret_file", str),
    }

    @classmethod
    def from_properties(cls, props: dict[str, str], source: str = "<properties>") -> NamesrvConfig:
        """Build from parsed properties; unknown keys are refused with the nearest known key."""
        cfg = cls()
        for key, value in props.items():
            if key in cls._KEYS:
                attr, conv = cls._KEYS[key]
                try:
                    setattr(cfg, attr, conv(value))
                except ValueError as exc:
                    raise ValueError(f"{source}: {key}={value!r}: {exc}") from None
            elif key in SERVER_KEYS:
                try:
                    apply_key(cfg.listener, key, value)
                except ValueError as exc:
                    raise ValueError(f"{source}: {key}={value!r}: {exc}") from None
            elif key in _IGNORED_KEYS:
                log.warning("namesrv config %s: key %s is accepted but not used by LedgerMQ", source, key)
            else:
                near = difflib.get_close_matches(key, [*cls._KEYS, *SERVER_KEYS, *_IGNORED_KEYS], n=1)
                hint = f" (did you mean {near[0]}?)" if near else ""
                raise ValueError(f"{source}: unknown key {key!r}{hint}")
        cfg.validate(source)
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> NamesrvConfig:
        return cls.from_properties(read_properties(path), str(path))

    def validate(self, source: str = "<config>") -> None:
        if not 0 <= self.listen_port < 65536:
            raise ValueError(f"{source}: listenPort {self.listen_port} out of range")
        if self.broker_expired_ms <= 0:
            raise ValueError(f"{source}: brokerExpiredMs must be > 0")
        if self.scan_not_active_broker_interval_ms <= 0:
            raise ValueError(f"{source}: scanNotActiveBrokerInterval must be > 0")
        try:
            self.listener.validate()
        except ListenerConfigError as exc:
            raise ValueError(f"{source}: {exc}") from None
        if self.registration_secret_file:
            try:
                load_secrets(self.registration_secret_file)
            except ValueError as exc:
                raise ValueError(f"{source}: registrationSecretFile: {exc}") from None
