"""DLedger's `CleanSpaceService` for the mmap store: disk-full flag and deletion of old data files.

Every 100 ms: compute the used ratio of the disk holding the store dir; above `disk_full_ratio`
the store refuses appends (DISK_FULL). At a `deleteWhen` hour, or above
`diskSpaceRatioToCheckExpired`, data files older than `fileReservedHours` (by mtime) are deleted;
above `diskSpaceRatioToForceClean` (and with `enableDiskForceClean`) regardless of age. Only files
wholly at or below the committed position go — and below the store's retention floor, the first
entry a state machine still needs (`StateMachine.retained_from_index`) — the last file and one
holding data always stay, and the begin index is revised afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from typing import Protocol

from dledger.config import DLedgerConfig
from dledger.store.file_list import MmapFileList

log = logging.getLogger(__name__)

CLEAN_INTERVAL_S = 0.1  # DLedger's period


class CleanedStore(Protocol):
    """What the service reads and calls (the mmap store)."""

    config: DLedgerConfig
    data_file_list: MmapFileList
    committed_pos: int
    ledger_begin_index: int

    def retention_limit_pos(self) -> int: ...
    def set_disk_full(self, full: bool, ratio: float) -> None: ...
    def revise_ledger_begin_index(self) -> None: ...


class CleanSpaceService:
    """Disk checks for one store. `disk_used_ratio` replaces the probe (tests present a full disk
    with it); every decision taken on the ratio is the real one."""

    def __init__(self, store: CleanedStore, disk_used_ratio: Callable[[], float] | None = None) -> None:
        self.store = store
        self.disk_used_ratio = disk_used_ratio or self._store_disk_used_ratio

    def _store_disk_used_ratio(self) -> float:
        usage = shutil.disk_usage(self.store.config.default_path())
        return usage.used / usage.total if usage.total else 1.0

    def step(self, now: float | None = None) -> int:
        """Update the disk-full flag and delete what may go. Returns the number of data files deleted."""
        store, cfg = self.store, self.store.config
        ratio = self.disk_used_ratio()
        store.set_disk_full(ratio > cfg.disk_full_ratio, ratio)
        now = time.time() if now is None else now
        hours = {h.strip() for h in cfg.delete_when.split(";") if h.strip()}
        time_up = time.strftime("%H", time.localtime(now)) in hours
        force = cfg.enable_disk_force_clean and ratio > cfg.disk_space_ratio_to_force_clean
        if not (time_up or force or ratio > cfg.disk_space_ratio_to_check_expired):
            return 0
        limit = store.retention_limit_pos()
        if limit < 0:
            return 0
        count = store.data_file_list.delete_expired_files(
            cfg.file_reserved_hours * 3600 * 1000, int(now * 1000), force=force, max_end_offset=limit)
        if count:
            store.revise_ledger_begin_index()
            log.info("event=expired_files_deleted group=%s selfId=%s count=%d usedRatio=%.3f force=%s "
                     "begin=%d", cfg.group, cfg.self_id, count, ratio, force, store.ledger_begin_index)
        return count

    async def run(self) -> None:
        """The service loop (a task of the store)."""
        while True:
            await asyncio.sleep(CLEAN_INTERVAL_S)
            try:
                self.step()
            except Exception:
                log.exception("event=clean_space_error group=%s selfId=%s", self.store.config.group,
                              self.store.config.self_id)
