"""`DLedgerRoleChangeHandler`: switches a DLedger-mode broker between master and slave.

Registered with the DLedger server (`register_role_change_handler`), it is called on every role
change of the member (synchronously, from the elector) and schedules the switch as a task:

- LEADER: wait until the member is still leader of that term AND everything committed is
  dispatched AND nothing uncommitted is left in the local log (RocketMQ's condition); rebuild the
  topic-queue table from the consume queues; write a broker-member record (this member's HTTP
  address) into the log — which also proves a quorum follows us — then become master
  (brokerId 0) and accept writes. The record is how slaves learn the master's HTTP address to
  name in NOT_MASTER redirects, with no extra configuration.
- FOLLOWER / CANDIDATE: become a slave at once (brokerId = member number + 1, RocketMQ's rule:
  n0 → 1), refuse writes with NOT_MASTER naming the master, keep serving committed reads.

The handler switches the controller's `BrokerRoleState`; every change is logged (old → new role,
term) and counted there.
"""

from __future__ import annotations

import asyncio
import logging

from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.role import BrokerRoleState
from broker.store.message_store import DefaultMessageStore
from broker.topics import SYS_BROKER_MEMBERS
from dledger.member_state import MemberState, Role

log = logging.getLogger(__name__)

CATCH_UP_POLL_S = 0.02
MEMBER_RECORD_RETRY_S = 0.1


class DLedgerRoleChangeHandler:
    """Callable registered on the DLedger server: `handler(term, role)`. Collaborators: the
    broker's role (switched here), its store (catch-up, the member record) and the DLedger
    member state (is this member still leader of the term?)."""

    def __init__(self, config: BrokerConfig, role: BrokerRoleState, store: DefaultMessageStore,
                 member_state: MemberState) -> None:
        self.config = config
        self.role = role
        self.store = store
        self.member_state = member_state
        self._task: asyncio.Task[None] | None = None

    def __call__(self, term: int, role: Role) -> None:
        """Called by the elector on every role change; the switch runs as a task (the newest
        change cancels a switch still in progress)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(self._handle(term, role),
                                                            name=f"role-change-{term}-{role.value}")

    async def _handle(self, term: int, role: Role) -> None:
        try:
            if role == Role.LEADER:
                await self._become_master(term)
            else:
                self.role.change_to_slave(term, role.value)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("event=role_change_failed broker=%s term=%d role=%s",
                          self.config.broker_name, term, role.value)

    def _still_leader(self, term: int) -> bool:
        ms = self.member_state
        return ms.is_leader() and ms.curr_term == term

    async def _become_master(self, term: int) -> None:
        store = self.store
        self.role.change_to_slave(term, "LEADER(catching up)")  # no writes until caught up
        while True:
            if not self._still_leader(term):
                return
            if store.dispatch_caught_up():
                break
            await asyncio.sleep(CATCH_UP_POLL_S)
        store.recover_topic_queue_table()
        record = {"selfId": self.config.dledger_self_id, "addr": self.config.broker_addr, "term": term}
        while True:
            if not self._still_leader(term):
                return
            try:
                await store.append_system_record(SYS_BROKER_MEMBERS, record, force=True)
                break
            except BrokerError as exc:
                log.warning("event=member_record_retry broker=%s term=%d reason=%s",
                            self.config.broker_name, term, exc)
                await asyncio.sleep(MEMBER_RECORD_RETRY_S)
                if self._still_leader(term) and store.dispatch_caught_up():
                    store.recover_topic_queue_table()
        if self._still_leader(term):
            self.role.change_to_master(term, Role.LEADER.value)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


async def wait_until_master(store: DefaultMessageStore, timeout_s: float = 10.0) -> None:
    """Wait until `store` accepts writes (tests and tools; TimeoutError otherwise)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not store.is_master:
        if loop.time() > deadline:
            raise TimeoutError(f"broker {store.config.broker_name} did not become master in {timeout_s}s")
        await asyncio.sleep(0.02)
