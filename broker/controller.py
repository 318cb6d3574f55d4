"""`BrokerController`: wires config → (DLedger server) → message store → role changes.

The HTTP app and the name-server registration plug in from outside: they read `role`,
`broker_id`, `master_addr`, `store`, and subscribe to role changes with `add_role_listener`
(re-register with the name servers at once when the role changes).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.config import BrokerConfig
from broker.role_change import BrokerRole, DLedgerRoleChangeHandler, slave_broker_id
from broker.store.message_store import DefaultMessageStore
from dledger.config import parse_peers

log = logging.getLogger(__name__)

RoleListener = Callable[["BrokerController"], Awaitable[None] | None]


class BrokerController:
    """One broker. Local mode: always master with the configured brokerId. DLedger mode: the role
    follows the member's Raft role (master = leader, brokerId 0; slaves n0 → 1, n1 → 2, ...)."""

    def __init__(self, config: BrokerConfig, *, dledger_server: Any | None = None) -> None:
        config.validate()
        self.config = config
        self.server: Any | None = None
        if config.enable_dleger_commit_log:
            if dledger_server is None:
                from dledger.server import DLedgerServer

                dconf = config.to_dledger_config()
                dconf.validate()
                dledger_server = DLedgerServer(dconf)
            self.server = dledger_server
        self.dledger_server = self.server  # the name the HTTP context looks for
        self.store = DefaultMessageStore(config, self.server)
        self.role_changes = 0  # exported as a metric by the HTTP layer
        self.term = -1
        self._listeners: list[RoleListener] = []
        self._listener_tasks: set[asyncio.Task[Any]] = set()
        if self.server is not None:
            self.role = BrokerRole.SLAVE
            self.broker_id = self._slave_id()
            self.role_change_handler: DLedgerRoleChangeHandler | None = DLedgerRoleChangeHandler(self)
        else:
            self.role = BrokerRole.MASTER
            self.broker_id = config.broker_id
            self.role_change_handler = None

    # ---- queries ------------------------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        return self.role == BrokerRole.MASTER

    @property
    def master_addr(self) -> str | None:
        """HTTP address of this broker set's master (None while unknown, e.g. during an election)."""
        return self.store.master_addr

    def status(self) -> dict[str, Any]:
        """The `/status` document (`dledger` is the server's metadata in DLedger mode)."""
        doc: dict[str, Any] = {"brokerName": self.config.broker_name, "brokerId": self.broker_id,
                               "role": self.role.value, "masterAddr": self.master_addr,
                               "brokerAddr": self.config.broker_addr, "roleChanges": self.role_changes}
        if self.server is not None:
            doc["dledger"] = self.server.metadata()
        return doc

    # ---- lifecycle ----------------------------------------------------------------------------

    def add_role_listener(self, listener: RoleListener) -> None:
        """`listener(controller)` runs after every role change (a coroutine function is scheduled)."""
        self._listeners.append(listener)

    async def start(self) -> None:
        if self.server is not None:
            self.server.register_role_change_handler(self.role_change_handler)
        await self.store.start()
        log.info("event=broker_started broker=%s role=%s brokerId=%d addr=%s", self.config.broker_name,
                 self.role.value, self.broker_id, self.config.broker_addr)

    async def shutdown(self) -> None:
        if self.role_change_handler is not None:
            await self.role_change_handler.stop()
        for t in list(self._listener_tasks):
            t.cancel()
        await self.store.shutdown()
        log.info("event=broker_stopped broker=%s", self.config.broker_name)

    # ---- role transitions (called by DLedgerRoleChangeHandler) ----------------------------------

    def change_to_master(self, term: int) -> None:
        """Become master: brokerId 0, writes accepted."""
        old = (self.role, self.broker_id)
        self.term = term
        self.role, self.broker_id = BrokerRole.MASTER, 0
        self.store.is_master = True
        self._changed(old, term, "LEADER")

    def change_to_slave(self, term: int, dledger_role: str) -> None:
        """Become slave: brokerId = member number + 1, writes refused with NOT_MASTER."""
        old = (self.role, self.broker_id)
        self.term = term
        self.store.is_master = False
        self.role = BrokerRole.SLAVE
        self.broker_id = self._slave_id()
        self._changed(old, term, dledger_role)

    def _slave_id(self) -> int:
        return slave_broker_id(self.config.dleger_self_id, list(parse_peers(self.config.dleger_peers)))

    def _changed(self, old: tuple[BrokerRole, int], term: int, dledger_role: str) -> None:
        if old == (self.role, self.broker_id):
            return
        self.role_changes += 1
        log.info("event=broker_role_change broker=%s selfId=%s term=%d dledgerRole=%s role=%s->%s "
                 "brokerId=%d->%d masterAddr=%s", self.config.broker_name, self.config.dleger_self_id, term,
                 dledger_role, old[0].value, self.role.value, old[1], self.broker_id, self.master_addr)
        for listener in self._listeners:
            try:
                res = listener(self)
                if inspect.isawaitable(res):
                    task = asyncio.ensure_future(res)
                    self._listener_tasks.add(task)
                    task.add_done_callback(self._listener_tasks.discard)
            except Exception:
                log.exception("event=role_listener_failed broker=%s", self.config.broker_name)
