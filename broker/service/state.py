"""`BrokerState`: what every service asks of the broker itself — role, master address, term,
broker id, the write guard (`require_master`), the `/status` view, topic-table change listeners
and leadership transfer. The one place the services touch the `BrokerController`."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.errors import BrokerCode, BrokerError
from broker.role import slave_broker_id
from broker.store.message_store import DefaultMessageStore
from dledger.codes import DLedgerException

if TYPE_CHECKING:
    from dledger.server import DLedgerServer


class BrokerState:
    """Role and identity of one broker. Callers: every service (reads, `require_master`), the
    runtime (role and topic listeners), the front-ends (`status`)."""

    def __init__(self, controller: BrokerController) -> None:
        self.controller = controller
        self.config: BrokerConfig = controller.config
        self.store: DefaultMessageStore = controller.store
        # The DLedgerServer in DLedger mode, else None.
        self.dledger: DLedgerServer | None = controller.server
        self.started_at = time.time()
        self._topic_listeners: list[Callable[[], None]] = []

    # -- topic table ---------------------------------------------------------------------------
    def on_topics_changed(self, listener: Callable[[], None]) -> None:
        """Call `listener` when this broker's topic table changes (e.g. to re-register at once)."""
        self._topic_listeners.append(listener)

    def topics_changed(self) -> None:
        """Tell the listeners the topic table changed (a service created, updated or deleted one)."""
        for listener in self._topic_listeners:
            listener()

    # -- role ------------------------------------------------------------------------------------
    def is_master(self) -> bool:
        """Whether this broker takes writes. The controller flips it once a new master has caught
        up (RocketMQ's changeToMaster), so it is the authority, not the raw DLedger role."""
        return self.controller.is_master

    def master_addr(self) -> str | None:
        """HTTP address of the master of this broker set (ours when we are it), or None if unknown."""
        if self.is_master():
            return self.config.broker_addr
        return self.controller.master_addr or None

    def live_slave_ids(self) -> set[int] | None:
        """brokerIds of the slaves that answered this master within an election timeout (a DLedger
        master's view; None elsewhere: not known here). Routes leave out members that are gone."""
        server = self.dledger
        if server is None or not self.is_master():
            return None
        elector = server.elector
        now = elector.clock()
        peers = list(server.member_state.peer_map)
        return {
            slave_broker_id(sid, peers)
            for sid, at in elector.peer_last_ack.items()
            if now - at < elector.election_timeout_s
        }

    def term(self) -> int:
        """The DLedger term (0 in local mode)."""
        server = self.dledger
        return int(server.member_state.curr_term) if server is not None else 0

    def broker_id(self) -> int:
        """0 on the master; in DLedger mode a slave's id follows its member number (selfId + 1)."""
        return int(self.controller.broker_id)

    def require_master(self) -> None:
        """NOT_MASTER (421) naming the master, for every write on a slave — except on the DLedger
        leader that cannot write because its disk is full (it would name itself): 507 DISK_FULL."""
        if self.is_master():
            return
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
        """Role, identity, uptime and (DLedger mode) the member's metadata with `followerLag`."""
        server = self.dledger
        meta: dict[str, Any] | None = None
        if server is not None:
            meta = dict(server.metadata())
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
            "diskUsedRatio": self.disk_used_ratio(),
            "dledger": meta,
        }

    def disk_used_ratio(self) -> float | None:
        """Used fraction of the disk holding the store (None when it cannot be read)."""
        try:
            usage = shutil.disk_usage(self.config.store_path_root_dir)
        except OSError:
            return None
        return usage.used / usage.total if usage.total else None

    async def transfer_leadership(self, transferee_id: str) -> dict[str, Any] | None:
        """Hand DLedger leadership to `transferee_id` (master only); the member's metadata after."""
        server = self.dledger
        if server is None:
            raise BrokerError(
                BrokerCode.INVALID_REQUEST, "not a DLedger broker (enableDLegerCommitLog=false)"
            )
        self.require_master()
        peers = server.metadata().get("peers") or {}
        if peers and transferee_id not in peers:
            raise BrokerError(
                BrokerCode.INVALID_REQUEST,
                f"transfereeId {transferee_id!r} is not one of {sorted(peers)}",
                field="transfereeId",
            )
        try:
            await server.leadership_transfer(transferee_id)
        except DLedgerException as exc:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, f"leadership transfer failed: {exc}") from None
        return self.status()["dledger"]
