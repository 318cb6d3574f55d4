"""`HttpContext`: what the routes need from a `BrokerController`, in one place.

The routes never reach into the controller directly; they ask this object for the store, the
role, the master's address and the limits, so the coupling to the controller is this file only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from broker.errors import BrokerCode, BrokerError
from broker.http.acl import AccessControl, Right
from broker.http.metrics import BrokerMetrics

log = logging.getLogger(__name__)

# JSON overhead allowance on top of maxMessageSize for one request (base64 grows 4/3).
_REQUEST_OVERHEAD_BYTES = 64 * 1024


class HttpContext:
    """Per-app state shared by the routes. Caller: `create_app`; affects nothing by itself."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self.config = controller.config
        self.metrics = BrokerMetrics(self.config.broker_name)
        self.acl: AccessControl | None = None
        if getattr(self.config, "acl_enable", False):
            if not self.config.acl_config_file:
                raise ValueError(f"{self.config.source}: aclEnable=true needs aclConfigFile")
            self.acl = AccessControl.load(self.config.acl_config_file)
        mms = self.config.max_message_size
        # A batch may carry several messages; bound the request, not just one message.
        self.request_limit_bytes = max(8 * 1024 * 1024, mms * 4 // 3 + _REQUEST_OVERHEAD_BYTES)
        self.born_host = self.config.broker_addr
        self.started_at = time.time()
        self._topic_listeners: list[Callable[[], None]] = []

    def on_topics_changed(self, listener: Callable[[], None]) -> None:
        """Call `listener` when this broker's topic table changes (e.g. to re-register at once)."""
        self._topic_listeners.append(listener)

    def topics_changed(self) -> None:
        for listener in self._topic_listeners:
            listener()

    @property
    def store(self) -> Any:
        return self.controller.store

    @property
    def dledger(self) -> Any | None:
        """The DLedgerServer in DLedger mode, else None."""
        server = getattr(self.controller, "dledger_server", None)
        if server is None:
            server = getattr(self.store, "dledger_server", None)
        return server

    # -- role ------------------------------------------------------------------------------------
    def is_master(self) -> bool:
        # The store's flag is flipped by the role-change handler once the new master has caught up
        # (RocketMQ's changeToMaster), so it is the authority, not the raw DLedger role.
        return bool(self.store.is_master)

    def master_addr(self) -> str | None:
        """HTTP address of the master of this broker set (ours when we are it), or None if unknown."""
        if self.is_master():
            return self.config.broker_addr
        return self.store.master_addr or None

    def term(self) -> int:
        server = self.dledger
        return int(server.member_state.curr_term) if server is not None else 0

    def require_master(self) -> None:
        """NOT_MASTER (421) naming the master, for every write on a slave — except on the DLedger
        leader that cannot write because its disk is full (it would name itself): 507 DISK_FULL."""
        if not self.is_master():
            if self.store.dledger:
                err = self.store.not_master_error()
                if err.code == BrokerCode.DISK_FULL:
                    raise err
            addr = self.master_addr()
            raise BrokerError(
                BrokerCode.NOT_MASTER,
                f"broker {self.config.broker_name} member {self.config.broker_addr} is not the "
                f"master; send writes to {addr or 'the master (unknown right now; retry)'}",
                masterAddr=addr,
            )

    def status(self) -> dict[str, Any]:
        server = self.dledger
        meta: dict[str, Any] | None = None
        if server is not None:
            meta = dict(server.metadata())
            if "role" in meta:
                meta["role"] = str(getattr(meta["role"], "name", meta["role"]))
            # Entries each follower is behind the leader's log end (leader only; {} elsewhere).
            end = meta.get("ledgerEndIndex", -1)
            meta["followerLag"] = {
                peer: max(0, end - mark)
                for peer, mark in (meta.get("peerWaterMarks") or {}).items()
                if peer != meta.get("selfId")
            }
        return {
            "clusterName": self.config.broker_cluster_name,
            "brokerName": self.config.broker_name,
            "brokerId": self.broker_id(),
            "brokerAddr": self.config.broker_addr,
            "role": "MASTER" if self.is_master() else "SLAVE",
            "masterAddr": self.master_addr(),
            "uptimeMs": int((time.time() - self.started_at) * 1000),
            "dledger": meta,
        }

    def broker_id(self) -> int:
        # The controller's id follows the role in DLedger mode (0 = master, slaves selfId + 1).
        return int(self.controller.broker_id)

    # -- access control --------------------------------------------------------------------------
    def authorize(
        self,
        headers: Any,
        *,
        topic: str | None = None,
        group: str | None = None,
        right: Right = Right.NONE,
        admin: bool = False,
    ) -> None:
        if self.acl is not None:
            self.acl.check(headers.get("authorization"), topic=topic, group=group, right=right, admin=admin)
