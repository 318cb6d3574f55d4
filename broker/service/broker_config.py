"""`BrokerConfigService`: the settings a broker runs with, and the ones an operator may change
while it runs (RocketMQ's getBrokerConfig / updateBrokerConfig).

An update is checked whole before anything changes (a key read at start only, an unknown key or a
bad value is refused, naming the key), saved under the store root (`broker.config.UPDATES_FILE`,
read again at start), then applied. After a `brokerPermission` change the broker registers with
the name servers at once: a `brokerPermission` of 4 takes the broker's topics out of the producers'
routes within one route refresh, which is how an operator drains a broker set before maintenance.
The retention keys (`RETENTION_KEYS`) reach the clean-up and the disk-full check at their next
round, in both store modes — how an operator frees disk now (`fileReservedTime`) without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from broker.config import (
    RETENTION_KEYS,
    ConfigError,
    apply_runtime_updates,
    parse_runtime_updates,
    save_runtime_updates,
)
from broker.errors import BrokerCode, BrokerError
from broker.service.acl import AccessControl, Account
from broker.service.state import BrokerState
from dledger.config import parse_peers

log = logging.getLogger(__name__)


class BrokerConfigService:
    """Reading and changing one broker's settings. Callers: the front-ends' admin routes."""

    def __init__(self, state: BrokerState, acl: AccessControl) -> None:
        self.state = state
        self.acl = acl
        self._lock = asyncio.Lock()  # one update at a time: each saves the merged file

    def view(self, account: Account) -> dict[str, Any]:
        """Every implemented key with the value this broker runs with (monitoring right)."""
        self.acl.authorize(account, monitor=True)
        cfg = self.state.config
        return {"brokerName": cfg.broker_name, "brokerAddr": cfg.broker_addr, "source": cfg.source,
                "properties": cfg.properties(), "ignored": dict(cfg.extra)}

    async def update(self, account: Account, updates: Mapping[str, Any]) -> dict[str, Any]:
        """Change the keys of `updates` (key -> value as text or number; admin right). Answers
        each key's old and new value and the file the change was saved in. INVALID_REQUEST naming
        the key when one cannot change; nothing changes then."""
        self.acl.authorize(account, admin=True)
        cfg = self.state.config
        if not updates:
            raise BrokerError(BrokerCode.INVALID_REQUEST, "no key to change: send an object of key: value",
                              field="body")
        text: dict[str, str] = {}
        for key, value in updates.items():
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise BrokerError(BrokerCode.INVALID_REQUEST, f"{key}: expected the value as a string or an "
                                  f"integer, got {type(value).__name__}", field=key)
            text[key] = str(value)
        try:
            parsed = parse_runtime_updates(text, "update")
        except ConfigError as exc:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"{exc.key}: {exc.reason}"
                              + (f" (did you mean {exc.nearest!r}?)" if exc.nearest else ""),
                              field=exc.key) from None
        async with self._lock:
            try:
                # Saved before applied: a broker that restarts runs with what it answered.
                path = await asyncio.to_thread(save_runtime_updates, cfg, parsed)
            except OSError as exc:
                log.error("event=config_update_not_saved broker=%s keys=%s error=%s", cfg.broker_name,
                          ",".join(parsed), exc)
                raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "the update could not be saved under "
                                  f"{cfg.store_path_root_dir}: {exc.strerror or exc}; nothing changed"
                                  ) from None
            changed = apply_runtime_updates(cfg, parsed)
            if self.state.dledger is not None and not changed.keys().isdisjoint(RETENTION_KEYS):
                cfg.retention_into(self.state.dledger.config)
        for key, (was, now) in changed.items():
            log.info("event=config_updated broker=%s key=%s old=%s new=%s account=%s file=%s",
                     cfg.broker_name, key, was, now, account.name, path)
        if "brokerPermission" in changed:
            # It changes the perm every topic registers with: register now.
            self.state.topics_changed()
        out: dict[str, Any] = {
            "brokerName": cfg.broker_name, "brokerAddr": cfg.broker_addr, "savedTo": path,
            "updated": {key: {"old": was, "new": now} for key, (was, now) in changed.items()},
        }
        if cfg.enable_dledger_commit_log:
            # So a caller updating a whole set can tell which members it did not reach.
            out["dLegerSelfId"] = cfg.dledger_self_id
            out["dLegerPeers"] = sorted(parse_peers(cfg.dledger_peers))
        return out
