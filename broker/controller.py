"""`BrokerController`: wires config → (DLedger server) → commit log → message store → role changes.

It owns the broker's one role object (`broker.role.BrokerRoleState`): the store reads it, the
role-change handler switches it. The HTTP app and the name-server registration plug in from
outside: they read `role`, `broker_id`, `master_addr`, `store`, and subscribe to role changes with
`add_role_listener` (re-register with the name servers at once when the role changes).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker.config import BrokerConfig
from broker.role import BrokerRole, BrokerRoleState, slave_broker_id
from broker.role_change import DLedgerRoleChangeHandler
from broker.store.base import CommitLog
from broker.store.commitlog import LocalCommitLog
from broker.store.message_store import DefaultMessageStore
from dledger.config import parse_peers

if TYPE_CHECKING:
    from dledger.server import DLedgerServer

log = logging.getLogger(__name__)

RoleListener = Callable[["BrokerController"], Awaitable[None] | None]


class BrokerController:
    """One broker. Local mode: always master with the configured brokerId. DLedger mode: the role
    follows the member's Raft role (master = leader, brokerId 0; slaves n0 → 1, n1 → 2, ...)."""

    def __init__(self, config: BrokerConfig, *, dledger_server: DLedgerServer | None = None) -> None:
        config.validate()
        self.config = config
        self.server: DLedgerServer | None = None
        commit_log: CommitLog
        if config.enable_dledger_commit_log:
            # The consensus package, imported only in DLedger mode.
            from broker.store.dledger_commitlog import DLedgerCommitLog
            from dledger.server import DLedgerServer

            if dledger_server is None:
                dledger_server = DLedgerServer(config.to_dledger_config())  # validates it
            self.server = dledger_server
            commit_log = DLedgerCommitLog(config, dledger_server)
            peers = list(parse_peers(config.dledger_peers))
            self.role_state = BrokerRoleState.dledger_member(slave_broker_id(config.dledger_self_id, peers))
        else:
            commit_log = LocalCommitLog(config)
            self.role_state = BrokerRoleState.master(config.broker_id)
        self.dledger_server = self.server  # the name the HTTP context looks for
        self.store = DefaultMessageStore(config, commit_log, self.role_state)
        self.role_change_handler: DLedgerRoleChangeHandler | None = None
        if self.server is not None:
            self.role_change_handler = DLedgerRoleChangeHandler(config, self.role_state, self.store,
                                                                self.server.member_state)
        self._listeners: list[RoleListener] = []
        self._listener_tasks: set[asyncio.Task[Any]] = set()
        self.role_state.add_listener(self._role_changed)

    # ---- queries ------------------------------------------------------------------------------

    @property
    def role(self) -> BrokerRole:
        return self.role_state.role

    @property
    def broker_id(self) -> int:
        return self.role_state.broker_id

    @property
    def term(self) -> int:
        return self.role_state.term

    @property
    def role_changes(self) -> int:
        """Role changes since start (exported as a metric by the HTTP layer)."""
        return self.role_state.role_changes

    @property
    def is_master(self) -> bool:
        return self.role_state.is_master

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
        if self.server is not None and self.role_change_handler is not None:
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

    # ---- role changes ---------------------------------------------------------------------------

    def _role_changed(self, state: BrokerRoleState, old_role: BrokerRole, old_id: int, why: str) -> None:
        log.info("event=broker_role_change broker=%s selfId=%s term=%d dledgerRole=%s role=%s->%s "
                 "brokerId=%d->%d masterAddr=%s", self.config.broker_name, self.config.dledger_self_id,
                 state.term, why, old_role.value, state.role.value, old_id, state.broker_id, self.master_addr)
        for listener in self._listeners:
            try:
                res = listener(self)
                if inspect.isawaitable(res):
                    task = asyncio.ensure_future(res)
                    self._listener_tasks.add(task)
                    task.add_done_callback(self._listener_tasks.discard)
            except Exception:
                log.exception("event=role_listener_failed broker=%s", self.config.broker_name)
