"""`StateMachine` and `StateMachineCaller`: committed entries, in index order, on every member.

The caller wakes when the commit index moves (no polling), reads the newly committed entries from
the store in batches and hands them to `on_apply`. It starts after the machine's own
`last_applied_index()`, so a restarted member resumes where its machine left off. The broker's
reput dispatcher is one such machine.

Snapshots (DLedger 0.3's, `dledger.snapshot`; with `enable_snapshot`): every `snapshot_threshold`
applied entries the caller asks the machine to write its whole state (`on_snapshot_save`) and
stores it; retention then never deletes an entry after the newest snapshot. At start, a stored
snapshot ahead of the machine is loaded first (`on_snapshot_load`), and a member that received
one from the leader (InstallSnapshot) loads it through `install`. Applies, saves and loads are
serialized: a machine never sees `on_apply` while it saves or loads.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Any

from dledger.codes import DLedgerException
from dledger.entry import DLedgerEntry
from dledger.snapshot import SnapshotReader, SnapshotStore, SnapshotWriter
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

    async def on_snapshot_save(self, writer: SnapshotWriter) -> None:
        """Write the machine's whole state as of `writer.index` into `writer` (`write_file`).
        Nothing is applied until this returns: capture the state first, write it after. The
        default: this machine takes no snapshots (do not enable them for it)."""
        raise NotImplementedError(f"{type(self).__name__} does not take snapshots")

    async def on_snapshot_load(self, reader: SnapshotReader) -> None:
        """Replace the machine's whole state by the snapshot's; afterwards its last applied index
        is `reader.index` and the next `on_apply` starts at `reader.index + 1`."""
        raise NotImplementedError(f"{type(self).__name__} does not load snapshots")

    def status(self) -> dict[str, Any] | None:
        """What the member's metadata shows of this machine (None: nothing)."""
        return None

    async def on_shutdown(self) -> None:  # noqa: B027 - optional hook
        """The server is stopping (after the last on_apply)."""


class StateMachineCaller:
    """Feeds one `StateMachine` as the store's committed index advances (and snapshots it when
    `snapshots` is given)."""

    def __init__(self, store: DLedgerStore, machine: StateMachine, name: str = "",
                 snapshots: SnapshotStore | None = None, snapshot_threshold: int = 1000) -> None:
        self.store = store
        self.machine = machine
        self.name = name
        self.snapshots = snapshots
        self.snapshot_threshold = max(1, snapshot_threshold)
        self.applied_index = -1
        self.applied_term = -1
        self.last_snapshot_index = -1
        self._gap_logged = False
        self._lock = asyncio.Lock()  # one of apply / save / load at a time
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
        """The machine's retention floor; with snapshots, also nothing after the newest one."""
        floor = self.machine.retained_from_index()
        if self.snapshots is not None:
            after_snapshot = self.last_snapshot_index + 1
            floor = after_snapshot if floor is None else min(floor, after_snapshot)
        return floor

    async def _run(self) -> None:
        if self.snapshots is not None:
            await self._load_stored_snapshot()
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                async with self._lock:
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
            if start > self.applied_index + 1 and not self._gap_logged:
                # Entries the machine never saw are gone from the log (retention) and no snapshot
                # brought their state: say so once (with snapshots on, the install path avoids it).
                self._gap_logged = True
                log.warning("event=state_machine_gap %s applied=%d logBegin=%d: entries %d..%d are not in "
                            "the log any more", self.name, self.applied_index, store.ledger_begin_index,
                            self.applied_index + 1, start - 1)
            stop = min(store.committed_index, start + _APPLY_BATCH - 1)
            entries = store.get_range(start, stop)  # one contiguous read, not a lookup per entry
            await self.machine.on_apply(entries)
            self.applied_index = stop
            self.applied_term = entries[-1].term
            if self.snapshots is not None and stop - self.last_snapshot_index >= self.snapshot_threshold:
                await self._save_snapshot()

    async def _save_snapshot(self) -> None:
        assert self.snapshots is not None
        pos, size = self.store.get_entry_pos_and_size(self.applied_index)
        writer = SnapshotWriter(self.applied_index, self.applied_term, pos + size)
        try:
            await self.machine.on_snapshot_save(writer)
            saved = await self.snapshots.save_async(writer)
        except NotImplementedError as exc:
            log.error("event=snapshot_disabled %s: %s", self.name, exc)
            self.snapshots = None
            return
        except (OSError, DLedgerException) as exc:
            log.error("event=snapshot_save_failed %s index=%d: %s", self.name, writer.index, exc)
            return
        self.last_snapshot_index = saved.index
        log.info("event=snapshot_taken %s index=%d term=%d", self.name, saved.index, saved.term)

    async def _load_stored_snapshot(self) -> None:
        """At start: the newest stored snapshot, loaded when it is ahead of the machine."""
        assert self.snapshots is not None
        latest = await self.snapshots.latest_async()
        if latest is None:
            return
        self.last_snapshot_index = latest.index
        if latest.index > self.applied_index:
            await self.install(latest)

    async def install(self, reader: SnapshotReader) -> None:
        """Load `reader` into the machine (a stored snapshot at start, or one the leader sent)."""
        async with self._lock:
            await self.machine.on_snapshot_load(reader)
            self.applied_index, self.applied_term = reader.index, reader.term
            self.last_snapshot_index = max(self.last_snapshot_index, reader.index)
            self._gap_logged = False
        log.info("event=snapshot_loaded %s index=%d term=%d from=%s", self.name, reader.index, reader.term,
                 reader.where)
        self._wake.set()

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
                async with self._lock:
                    await self._apply_available()
            except DLedgerException:
                log.exception("final apply failed %s", self.name)
        await self.machine.on_shutdown()
