"""`StateSnapshotService`: the master re-writes the replicated broker state ahead of retention.

Once the log has grown one commit-log file past the end of the last state snapshot (or
`SNAPSHOT_EVERY_RECORDS` system records were applied since, which bounds the replay at start), the
master writes a new one (`SystemRecords` says what a snapshot is and how it is applied):

1. hold every system-record write (`SystemWriteGate`) and wait for those in flight;
2. wait until the dispatcher has applied everything in the log so far;
3. capture every state and append the snapshot's parts (one put: consecutive in the log);
4. release the writes once the parts are committed and applied.

So a snapshot holds exactly the state at its place in the log. Retention keeps every file from
the first part of the last complete snapshot on (`keep_from`): the state before it is in it.
Callers: the store's housekeeping (`maybe_write`, every second), its retention pass
(`write_if_due` first, then `keep_from`).
"""

from __future__ import annotations

import asyncio
import logging

from broker.config import BrokerConfig
from broker.errors import BrokerError
from broker.message import new_uniq_key
from broker.role import BrokerRoleState
from broker.store.base import CommitLog
from broker.store.put_service import PutMessageService
from broker.store.reput import ReputMessageService
from broker.store.system_state import SystemRecords
from broker.topics import SYS_STATE_SNAPSHOT

log = logging.getLogger("broker.store.message_store")

SNAPSHOT_EVERY_RECORDS = 100_000  # bounds the replay at start (~1 s of records)
_CATCH_UP_TIMEOUT_S = 5.0
_RETRY_AFTER_FAILURE_S = 10
_PART_OVERHEAD_BYTES = 1024  # message header, topic and properties of a part


class StateSnapshotService:
    """Writes state snapshots on the master; says where retention must stop."""

    def __init__(self, config: BrokerConfig, system: SystemRecords, puts: PutMessageService,
                 reput: ReputMessageService, commit_log: CommitLog, role: BrokerRoleState) -> None:
        self.config = config
        self.system = system
        self.puts = puts
        self.reput = reput
        self.commit_log = commit_log
        self.role = role
        # A part fits one DLedger entry of packed messages, and one local commit-log file.
        self.part_bytes = max(1024, min(256 * 1024, config.mapped_file_size_commit_log // 8,
                                        config.max_message_size) - _PART_OVERHEAD_BYTES)
        self._task: asyncio.Task[None] | None = None
        self._retry_at = 0.0  # after a failure, the next try waits (a full disk fails every time)
        self._lock = asyncio.Lock()  # one snapshot at a time: each holds the system writes alone

    def keep_from(self) -> int:
        """Retention keeps every byte of the log at or after this position (the first part of the
        last complete snapshot; the whole log until there is one)."""
        first = self.system.snapshot_first
        return first if first >= 0 else self.commit_log.min_offset

    def due(self) -> bool:
        grown = self.commit_log.max_offset - self.system.snapshot_end
        return (grown >= self.config.mapped_file_size_commit_log
                or self.system.records_since_snapshot >= SNAPSHOT_EVERY_RECORDS)

    def maybe_write(self) -> None:
        """Start writing a snapshot if this member is master and one is due."""
        if (self.role.is_master and (self._task is None or self._task.done()) and self.due()
                and asyncio.get_running_loop().time() >= self._retry_at):
            self._task = asyncio.get_running_loop().create_task(self.write_if_due(), name="state-snapshot")

    async def write_if_due(self) -> None:
        """Write a snapshot if this member is master and one is due."""
        async with self._lock:
            if self.role.is_master and self.due():
                await self._write()

    async def write(self) -> None:
        """Write a snapshot now (master only; a failure is logged, the next due one retries)."""
        async with self._lock:
            await self._write()

    async def _write(self) -> None:
        try:
            async with self.puts.system_gate.hold():
                await self.reput.wait_dispatched(self.commit_log.data_end, _CATCH_UP_TIMEOUT_S)
                if not self.role.is_master:
                    return
                document = self.system.capture()
                parts = self.system.snapshot_messages(document, new_uniq_key(), self.part_bytes)
                res = await self.puts.put_messages(SYS_STATE_SNAPSHOT, parts, 0, _system=True)
                await self.reput.wait_dispatched(res[-1].commit_log_offset + res[-1].store_size)
            log.info("event=state_snapshot_written broker=%s first=%d parts=%d bytes=%d",
                     self.config.broker_name, res[0].commit_log_offset, len(parts), len(document))
        except BrokerError as exc:
            self._retry_at = asyncio.get_running_loop().time() + _RETRY_AFTER_FAILURE_S
            log.warning("event=state_snapshot_failed broker=%s retryInS=%d reason=%s",
                        self.config.broker_name, _RETRY_AFTER_FAILURE_S, exc)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
