"""DLedger's `FlushDataService` for the mmap store, with group commit for SYNC_FLUSH.

Every `flush_file_interval_ms`, or as soon as a `wait_flushed` caller asks, one flush round runs:
it notes the end index, fdatasyncs the dirty data and index files in worker threads (the two in
parallel; one round in flight at a time) and then releases every waiter whose index that round
covers — so concurrent appenders share one fsync. Every `check_point_interval_ms` it also writes
the `checkpoint` file, whose committedIndex never exceeds the flushed index.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from typing import NamedTuple, Protocol

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.store.checkpoint import Checkpoint, write_checkpoint
from dledger.store.file_list import MmapFileList

log = logging.getLogger(__name__)


class FlushedStore(Protocol):
    """What the service reads and moves (the mmap store)."""

    config: DLedgerConfig
    data_file_list: MmapFileList
    index_file_list: MmapFileList
    checkpoint_path: str
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int

    @property
    def flushed_index(self) -> int: ...
    @property
    def truncate_epoch(self) -> int: ...
    def set_flushed_index(self, index: int) -> None: ...


class _Waiter(NamedTuple):
    """A `wait_flushed` caller in the heap, ordered by index then arrival."""

    index: int
    seq: int
    future: asyncio.Future[None]


class FlushDataService:
    """Flushing, flush waiters and checkpoints of one store."""

    def __init__(self, store: FlushedStore) -> None:
        self.store = store
        self.flush_rounds = 0  # fsync rounds done (observability: group commit shares them)
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._wakeup: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._checkpoint_lock = threading.Lock()
        self._last_checkpoint: Checkpoint | None = None

    @property
    def started(self) -> bool:
        return self._lock is not None

    def start(self) -> asyncio.Task[None]:
        """Create the loop-bound primitives and the service task (called by `store.start`)."""
        self._wakeup = asyncio.Event()
        self._lock = asyncio.Lock()
        return asyncio.create_task(self.run(), name=f"dledger-flush-{self.store.config.self_id}")

    async def stop(self, task: asyncio.Task[None] | None) -> None:
        """Cancel the service after a round in flight has finished its fsync."""
        if task is None:
            return
        if self._lock is not None:
            async with self._lock:
                task.cancel()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    # ---- flushing -------------------------------------------------------------------------------

    def flush_now(self) -> None:
        """fdatasync dirty data and index files on this thread (blocking)."""
        store = self.store
        target, epoch = store.ledger_end_index, store.truncate_epoch
        targets = store.data_file_list.dirty_files() + store.index_file_list.dirty_files()
        MmapFileList.fsync_files(targets)
        MmapFileList.mark_flushed(targets)
        self._advance(target, epoch)

    def _advance(self, target: int, epoch: int) -> None:
        store = self.store
        # A truncate during the fsync may have rewritten entries <= target that it did not cover.
        if epoch == store.truncate_epoch and target > store.flushed_index:
            store.set_flushed_index(target)
        flushed = store.flushed_index
        waiters = self._waiters
        while waiters and waiters[0].index <= flushed:
            fut = heapq.heappop(waiters).future
            if not fut.done():
                fut.set_result(None)

    async def flush_round(self) -> None:
        """One fsync of everything written so far, in worker threads; one round at a time."""
        assert self._lock is not None
        store = self.store
        async with self._lock:
            target, epoch = store.ledger_end_index, store.truncate_epoch
            data_targets = store.data_file_list.dirty_files()
            index_targets = store.index_file_list.dirty_files()
            if data_targets or index_targets:
                self.flush_rounds += 1
                try:
                    if self._waiters and data_targets and index_targets:
                        # Data and index in parallel: the round's latency is what waiters feel.
                        await asyncio.gather(asyncio.to_thread(MmapFileList.fsync_files, data_targets),
                                             asyncio.to_thread(MmapFileList.fsync_files, index_targets))
                    else:
                        # A periodic (ASYNC_FLUSH) round nobody waits for: one worker-thread call.
                        await asyncio.to_thread(MmapFileList.fsync_files, data_targets + index_targets)
                except OSError as e:
                    log.error("event=flush_failed group=%s selfId=%s error=%r", store.config.group,
                              store.config.self_id, e)
                    self.fail_waiters(DLedgerException(DLedgerResponseCode.DISK_ERROR, f"fsync failed: {e}"))
                    return
                MmapFileList.mark_flushed(data_targets)
                MmapFileList.mark_flushed(index_targets)
            self._advance(target, epoch)

    async def wait_flushed(self, index: int) -> None:
        """Return once entries up to `index` are fsynced, sharing rounds with concurrent callers."""
        store = self.store
        if index <= store.flushed_index:
            return
        if self._wakeup is None:  # service not started: flush inline
            self.flush_now()
            if index > store.flushed_index:
                raise DLedgerException(DLedgerResponseCode.INDEX_OUT_OF_RANGE,
                                       f"index {index} > end {store.ledger_end_index}")
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, _Waiter(index, next(self._seq), fut))
        self._wakeup.set()
        await fut

    def fail_waiters(self, exc: DLedgerException, above: int = -2) -> None:
        """Fail the waiters for indexes above `above` (all by default)."""
        keep = []
        for item in self._waiters:
            if item.index > above:
                if not item.future.done():
                    item.future.set_exception(exc)
            else:
                keep.append(item)
        heapq.heapify(keep)
        self._waiters = keep

    async def run(self) -> None:
        """The service loop."""
        assert self._wakeup is not None
        cfg = self.store.config
        interval_s = cfg.flush_file_interval_ms / 1000
        checkpoint_s = cfg.check_point_interval_ms / 1000
        last_checkpoint = time.monotonic()
        wakeup = self._wakeup
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiters and not wakeup.is_set():
                timer = loop.call_later(interval_s, wakeup.set)  # cheaper than wait_for per round
                await wakeup.wait()
                timer.cancel()
            wakeup.clear()
            try:
                await self.flush_round()
                if time.monotonic() - last_checkpoint >= checkpoint_s:
                    last_checkpoint = time.monotonic()
                    await asyncio.to_thread(self.write_checkpoint)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event=flush_service_error group=%s selfId=%s", cfg.group, cfg.self_id)
                await asyncio.sleep(interval_s)

    def write_checkpoint(self) -> None:
        """Write `checkpoint` if it changed (blocking; the service runs it in a worker thread)."""
        store = self.store
        # A cancelled service's write may still be running in its thread at shutdown.
        with self._checkpoint_lock:
            # committedIndex is never recorded above what is on disk, so recovery may rely on it.
            cp = Checkpoint(store.ledger_end_index, min(store.committed_index, store.flushed_index))
            if store.ledger_begin_index > store.ledger_end_index:
                cp = Checkpoint()  # no entry stored (the log starts after a snapshot): nothing to vouch for
            if cp != self._last_checkpoint:
                write_checkpoint(store.checkpoint_path, cp)
                self._last_checkpoint = cp
