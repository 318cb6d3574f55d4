"""`StateMachine` and `StateMachineCaller`: committed entries, in index order, on every member.

The caller wakes when the commit index moves (no polling), reads the newly committed entries from
the store in batches and hands them to `on_apply`. It starts after the machine's own
`last_applied_index()`, so a restarted member resumes where its machine left off. The broker's
reput dispatcher is one such machine.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

from dledger.codes import DLedgerException
from dledger.entry import DLedgerEntry
from dledger.store.base import DLedgerStore

log = logging.getLogger("dledger.statemachine")

_APPLY_BATCH = 1024
_RETRY_S = 0.1


class StateMachine(ABC):
    """What the log drives. No-op entries (magic 2) are passed too; machines skip them."""

    @abstractmethod
    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        """Apply committed entries (consecutive, in index order)."""

    @abstractmethod
    def last_applied_index(self) -> int:
        """Highest index this machine has applied (-1 for none): where the caller resumes."""

    def retained_from_index(self) -> int | None:
        """The lowest index whose entry this machine still needs in the log (a machine that keeps
        state in the log itself, re-written ahead of retention); expiry never deletes it or
        anything after it. None (the default): no requirement beyond the commit index."""
        return None

    async def on_shutdown(self) -> None:  # noqa: B027 - optional hook
        """The server is stopping (after the last on_apply)."""


class StateMachineCaller:
    """Feeds one `StateMachine` as the store's committed index advances."""

    def __init__(self, store: DLedgerStore, machine: StateMachine, name: str = "") -> None:
        self.store = store
        self.machine = machine
        self.name = name
        self.applied_index = -1
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.applied_index = self.machine.last_applied_index()
        self._wake.set()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def on_commit(self) -> None:
        """Called whenever the committed index may have moved."""
        self._wake.set()

    def retained_from_index(self) -> int | None:
        """The machine's retention floor (see `StateMachine.retained_from_index`)."""
        return self.machine.retained_from_index()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._apply_available()
            except asyncio.CancelledError:
                raise
            except DLedgerException:
                log.exception(
                    "state machine apply failed %s at %d; retrying", self.name, self.applied_index + 1
                )
                await asyncio.sleep(_RETRY_S)
                self._wake.set()

    async def _apply_available(self) -> None:
        store = self.store
        while self.applied_index < store.committed_index:
            start = max(self.applied_index + 1, store.ledger_begin_index)
            stop = min(store.committed_index, start + _APPLY_BATCH - 1)
            entries = store.get_range(start, stop)  # one contiguous read, not a lookup per entry
            await self.machine.on_apply(entries)
            self.applied_index = stop

    def abort(self) -> None:
        """Stop at once (a simulated crash): no final apply, no on_shutdown."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def shutdown(self) -> None:
        """Apply what is committed, stop, then tell the machine."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
            try:
                await self._apply_available()
            except DLedgerException:
                log.exception("final apply failed %s", self.name)
        await self.machine.on_shutdown()
