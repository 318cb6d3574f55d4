"""`DLedgerCommitLog`: the commit log as a Raft-replicated DLedger log (RocketMQ's DLedgerCommitLog).

It embeds a `DLedgerServer` built from the broker config (`dLegerGroup`, `dLegerPeers`,
`dLegerSelfId`, `storePathRootDir`, `mappedFileSizeCommitLog`, `deleteWhen`, `fileReservedTime`),
or uses the one it is given. Each message is the body of one DLedger entry, so its bytes start at
`entry.pos + BODY_OFFSET` in the DLedger data files — identical on every member.

The **append hook** runs on the leader as each entry is written into the data file (in log order):
it writes `entry.pos + BODY_OFFSET` at `PHY_POS_POSITION` of the message and assigns the queue
offset (QUEUEOFFSET) from the topic-queue table, so queue offsets follow log order exactly however
many puts run at once. Followers store the leader's bytes unchanged.

`put(bufs)` appends a batch through `server.append` and returns after commit. Reads go straight to
the DLedger data files by (physical offset, size), bounded by the committed position. The store is
the server's `StateMachine`: `on_apply` gets committed entries in index order and dispatches the
messages (skipping the no-op entry, magic 2, and anything that is not a message).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError
from broker.message import (
    BODY_LENGTH_POSITION,
    FIXED_OVERHEAD,
    MESSAGE_MAGIC_CODE,
    PHY_POS_POSITION,
    QUEUE_ID_POSITION,
    QUEUE_OFFSET_POSITION,
)
from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import BODY_OFFSET, HEADER, MAGIC_NORMAL, DLedgerEntry

if TYPE_CHECKING:
    from broker.store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_E = DLedgerResponseCode

# DLedger failure → broker error (RocketMQ maps these to SERVICE_NOT_AVAILABLE, IN_SYNC_REPLICAS_NOT_ENOUGH,
# OS_PAGE_CACHE_BUSY; we say precisely what a client should do).
_NOT_MASTER_CODES = {_E.NOT_LEADER, _E.LEADER_TRANSFERRING, _E.LEADER_NOT_READY, _E.INCONSISTENT_LEADER}
_OUTCOME_UNKNOWN_CODES = {_E.WAIT_QUORUM_ACK_TIMEOUT, _E.TERM_CHANGED, _E.TIMEOUT, _E.NETWORK_ERROR}


class BrokerStateMachine:
    """The broker's reput dispatcher as a DLedger `StateMachine` (duck-typed to the contract in
    `dledger/statemachine.py`): committed entries → consume queues, on every member."""

    def __init__(self, commit_log: DLedgerCommitLog) -> None:
        self.commit_log = commit_log

    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        self.commit_log.apply(entries)

    def last_applied_index(self) -> int:
        return self.commit_log.applied_index

    async def on_shutdown(self) -> None:
        return None


class DLedgerCommitLog:
    """Commit log over an embedded DLedger server. Callers: `DefaultMessageStore`."""

    def __init__(self, store: DefaultMessageStore, config: BrokerConfig, server: Any | None = None) -> None:
        self.store = store
        self.config = config
        if server is None:
            from dledger.server import DLedgerServer  # the consensus package; imported only in DLedger mode

            dconf = config.to_dledger_config()
            dconf.validate()
            server = DLedgerServer(dconf)
        self.server = server
        self.dstore = server.store
        self.applied_index = -1
        self.state_machine = BrokerStateMachine(self)
        self.dstore.add_append_hook(self._append_hook)
        self._ctx = f"group={config.dleger_group or config.broker_name} selfId={config.dleger_self_id}"

    # ---- lifecycle ----------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Recover the DLedger store now, so consume queues can be checked against its data
        before the server (and the state machine caller) start."""
        recover = getattr(self.dstore, "recover", None)
        if recover is not None:
            await asyncio.to_thread(recover)

    async def start(self) -> None:
        """Resume dispatch after the last message the consume queues hold, then start the server."""
        self.applied_index = self._index_of_last_dispatched()
        self.server.set_state_machine(self.state_machine)
        await self.server.start()
        log.info("event=dledger_commitlog_started %s applied_index=%d reput_offset=%d", self._ctx,
                 self.applied_index, self.store.reput_offset)

    async def shutdown(self) -> None:
        await self.server.shutdown()

    def _index_of_last_dispatched(self) -> int:
        """Index of the entry holding the message that ends at reput_offset (-1: start from the
        beginning; entries below reput_offset are skipped by `dispatch` anyway)."""
        end = self.store.reput_offset
        best = None
        for cq in self.store.consume_queues.values():
            if cq.max_phys_end == end and cq.max_offset > cq.min_offset:
                phys, _, _ = cq.get_unit(cq.max_offset - 1)
                best = phys
                break
        if best is None:
            return -1
        try:
            header = self.dstore.get_data(best - BODY_OFFSET, BODY_OFFSET)
            return HEADER.unpack_from(header, 0)[2]
        except DLedgerException:
            return -1

    # ---- positions ----------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        begin = self.dstore.data_begin_pos
        return begin + BODY_OFFSET if begin >= 0 else 0

    @property
    def max_offset(self) -> int:
        """The committed position: readers and the dispatcher never go past it."""
        return max(self.dstore.committed_pos, 0)

    @property
    def data_end(self) -> int:
        """End of the data actually in the files (recovery cuts consume queues beyond it)."""
        files = getattr(self.dstore, "data_file_list", None)
        return files.max_wrote_position if files is not None else self.max_offset

    @property
    def leader_id(self) -> str | None:
        return self.server.member_state.leader_id

    def dispatch_caught_up(self) -> bool:
        """RocketMQ's condition before a new leader serves: the ledger is empty, or its end is
        committed and every committed entry is applied (dispatched)."""
        d = self.dstore
        if d.ledger_end_index == -1:
            return True
        return d.ledger_end_index == d.committed_index and self.applied_index >= d.committed_index

    # ---- the append hook ------------------------------------------------------------------------

    def _append_hook(self, entry: DLedgerEntry, view: memoryview, body_offset: int) -> None:
        """Stamp PHYSICALOFFSET (= entry.pos + BODY_OFFSET) and assign QUEUEOFFSET, in log order."""
        if entry.magic != MAGIC_NORMAL or len(view) - body_offset < FIXED_OVERHEAD:
            return
        if _INT.unpack_from(view, body_offset + 4)[0] != MESSAGE_MAGIC_CODE:
            return
        # Topic bytes copied out by position (no view kept: the store unmaps files only without views).
        body_len = _INT.unpack_from(view, body_offset + BODY_LENGTH_POSITION)[0]
        topic_at = body_offset + BODY_LENGTH_POSITION + 4 + body_len
        if body_len < 0 or topic_at >= len(view):
            return  # not a message we encoded; the dispatcher reports it
        topic = self.store.topic_name(bytes(view[topic_at + 1:topic_at + 1 + view[topic_at]]))
        queue_id = _INT.unpack_from(view, body_offset + QUEUE_ID_POSITION)[0]
        queue_offset = self.store.assign_queue_offset(topic, queue_id)
        _LONG.pack_into(view, body_offset + QUEUE_OFFSET_POSITION, queue_offset)
        _LONG.pack_into(view, body_offset + PHY_POS_POSITION, entry.pos + body_offset)

    # ---- writing --------------------------------------------------------------------------------

    async def put(self, bufs: list[bytearray]) -> list[tuple[int, int, int, int]]:
        """Append a batch through the DLedger server (leader only); returns after commit with
        (phys offset, size, queue id, queue offset) of each message."""
        try:
            results = await self.server.append([bytes(b) for b in bufs])
        except DLedgerException as exc:
            raise self._broker_error(exc) from None
        first = self._stamped(results[0].pos + BODY_OFFSET)
        last = self._stamped(results[-1].pos + BODY_OFFSET)
        n = len(results)
        if last[0] == first[0] and last[1] == first[1] + n - 1:
            # One batch is appended in one synchronous call, so the hook numbered its messages
            # consecutively: two header reads instead of one per message.
            qid, qoff = first
            return [(r.pos + BODY_OFFSET, len(b), qid, qoff + i)
                    for i, (r, b) in enumerate(zip(results, bufs, strict=True))]
        out = []
        for res, buf in zip(results, bufs, strict=True):
            phys = res.pos + BODY_OFFSET
            qid, qoff = self._stamped(phys)
            out.append((phys, len(buf), qid, qoff))
        return out

    def _stamped(self, phys: int) -> tuple[int, int]:
        """(QUEUEID, QUEUEOFFSET) of the message at `phys`, as the append hook stamped them."""
        head = self.dstore.get_data(phys, QUEUE_OFFSET_POSITION + 8)
        return _INT.unpack_from(head, QUEUE_ID_POSITION)[0], _LONG.unpack_from(head, QUEUE_OFFSET_POSITION)[0]

    def _broker_error(self, exc: DLedgerException) -> BrokerError:
        code = exc.code
        if code in _NOT_MASTER_CODES:
            err = self.store.not_master_error()
            err.detail = f"{err.detail} (DLedger: {code.name})"
            return err
        if code in _OUTCOME_UNKNOWN_CODES:
            return BrokerError(BrokerCode.TIMEOUT, f"not confirmed by a majority ({code.name}); the outcome "
                               "is unknown: retry with the same idempotency key", outcome="unknown")
        if code == _E.DISK_FULL:
            return BrokerError(BrokerCode.DISK_FULL, f"DLedger store refused the append: {exc.detail}")
        if code == _E.LEADER_PENDING_FULL:
            return BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "too many appends pending; retry later")
        return BrokerError(BrokerCode.INTERNAL_ERROR, f"DLedger append failed: {exc}")

    # ---- reading --------------------------------------------------------------------------------

    def get_data(self, phys: int, size: int) -> memoryview:
        """Bytes of a committed message straight from the DLedger data files. Readable: below the
        committed position, or below what was dispatched (committed earlier, including what any
        consume queue held at start; after a restart the committed position is learnt again from
        the leader)."""
        end = max(self.max_offset, self.store.reput_offset, self.store.recovered_end)
        if size <= 0 or phys < self.min_offset or phys + size > end:
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"commit-log offset {phys} size {size} outside "
                              f"committed range [{self.min_offset}, {end})", commitLogOffset=phys)
        try:
            return self.dstore.get_data(phys, size)
        except DLedgerException as exc:
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, exc.detail, commitLogOffset=phys) from None

    # ---- dispatch (state machine) ---------------------------------------------------------------

    def apply(self, entries: list[DLedgerEntry]) -> None:
        """Dispatch committed entries in index order; no-op entries and non-messages are skipped.
        A failure is raised as DLedgerException so the caller retries from the first entry not
        applied (entries already applied are skipped by index and by reput offset)."""
        try:
            self._apply(entries)
        except DLedgerException:
            raise
        except Exception as exc:
            log.exception("event=dispatch_failed %s", self._ctx)
            raise DLedgerException(_E.INTERNAL_ERROR, f"broker dispatch failed: {exc}") from exc
        finally:
            self.store.dispatch_done()

    def _apply(self, entries: list[DLedgerEntry]) -> None:
        store = self.store
        for entry in entries:
            if entry.index <= self.applied_index:
                continue
            if entry.magic == MAGIC_NORMAL and entry.size - BODY_OFFSET >= FIXED_OVERHEAD:
                phys = entry.pos + BODY_OFFSET
                if phys >= store.reput_offset:
                    # The caller read the entry (index record, CRC) with its body: dispatch from
                    # it rather than reading the data file a second time.
                    data: bytes | memoryview | None = entry.body
                    if data is None or len(data) != entry.size - BODY_OFFSET:
                        try:
                            data = self.dstore.get_data(phys, entry.size - BODY_OFFSET)
                        except DLedgerException as exc:
                            log.error("event=dispatch_read_failed %s index=%d pos=%d reason=%s", self._ctx,
                                      entry.index, entry.pos, exc)
                            data = None
                    if data is not None and _INT.unpack_from(data, 4)[0] == MESSAGE_MAGIC_CODE:
                        store.dispatch(data, phys)
            self.applied_index = entry.index
