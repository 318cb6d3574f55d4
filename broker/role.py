"""The broker's role: one `BrokerRoleState` per broker, owned by its `BrokerController`.

Local mode: always MASTER with the configured brokerId. DLedger mode: the role follows the member's
Raft role, switched by `DLedgerRoleChangeHandler` — MASTER (brokerId 0) once a new leader has
caught up, SLAVE (brokerId = member number + 1, RocketMQ's rule: n0 → 1) otherwise. The store reads
`is_master` to refuse writes on a slave; the HTTP layer and the name-server registration read the
rest and subscribe to changes. The DLedger member's own Raft role (`dledger.member_state.Role`)
stays DLedger's: this is the broker's view of it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from enum import StrEnum

log = logging.getLogger(__name__)


class BrokerRole(StrEnum):
    MASTER = "MASTER"
    SLAVE = "SLAVE"


def slave_broker_id(self_id: str, peer_ids: list[str]) -> int:
    """brokerId of a slave: the member number in `selfId` + 1 (n0 → 1, n2 → 3), as RocketMQ does;
    for ids without a number, the member's position in the sorted peer list + 1."""
    m = re.search(r"(\d+)$", self_id)
    if m:
        return int(m.group(1)) + 1
    return sorted(peer_ids).index(self_id) + 1 if self_id in peer_ids else 1


RoleChangeListener = Callable[["BrokerRoleState", BrokerRole, int, str], None]
"""listener(state, old role, old brokerId, why): after every change (why: the DLedger role seen)."""


class BrokerRoleState:
    """Role, brokerId and term of one broker; transitions in `change_to_master` / `change_to_slave`."""

    def __init__(self, role: BrokerRole, broker_id: int, slave_id: int) -> None:
        self.role = role
        self.is_master = role == BrokerRole.MASTER  # read on every put: an attribute, not a property
        self.broker_id = broker_id
        self.slave_id = slave_id  # the brokerId this broker takes as a slave
        self.term = -1
        self.role_changes = 0  # exported as a metric by the HTTP layer
        self._listeners: list[RoleChangeListener] = []

    @classmethod
    def master(cls, broker_id: int) -> BrokerRoleState:
        """A local-mode broker: master for good."""
        return cls(BrokerRole.MASTER, broker_id, broker_id)

    @classmethod
    def dledger_member(cls, slave_id: int) -> BrokerRoleState:
        """A DLedger member: a slave until its role-change handler makes it master."""
        return cls(BrokerRole.SLAVE, slave_id, slave_id)

    def add_listener(self, listener: RoleChangeListener) -> None:
        self._listeners.append(listener)

    def change_to_master(self, term: int, why: str) -> None:
        """Become master: brokerId 0, writes accepted."""
        self._change(BrokerRole.MASTER, 0, term, why)

    def change_to_slave(self, term: int, why: str) -> None:
        """Become slave: brokerId = member number + 1, writes refused with NOT_MASTER."""
        self._change(BrokerRole.SLAVE, self.slave_id, term, why)

    def _change(self, role: BrokerRole, broker_id: int, term: int, why: str) -> None:
        old_role, old_id = self.role, self.broker_id
        self.term = term
        self.role, self.broker_id = role, broker_id
        self.is_master = role == BrokerRole.MASTER
        if (old_role, old_id) == (role, broker_id):
            return
        self.role_changes += 1
        for listener in self._listeners:
            listener(self, old_role, old_id, why)
