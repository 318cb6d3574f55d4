"""`DLedgerCommitLog`: the commit log as a Raft-replicated DLedger log (RocketMQ's DLedgerCommitLog).

It embeds a `DLedgerServer` built from the broker config (`dLegerGroup`, `dLegerPeers`,
`dLegerSelfId`, `storePathRootDir`, `mappedFileSizeCommitLog`, `deleteWhen`, `fileReservedTime`),
or uses the one it is given. A put packs its messages back to back into DLedger entry bodies of up
to 256 KiB (a larger message is an entry of its own), so a message's bytes start at `entry.pos +
BODY_OFFSET` plus the sizes of the messages before it in the entry — identical on every member.
RocketMQ appends one entry per message; packing divides the per-entry work of the leader and the
followers (index record, CRC, push, apply) by the batch size, and a batch commits as one.

The **append hook** runs on the leader as each entry is written into the data file (in log order):
for each message in it, it writes the message's own position at `PHY_POS_POSITION` and assigns the
queue offset (QUEUEOFFSET) from the topic-queue table, so queue offsets follow log order exactly
however many puts run at once. Followers store the leader's bytes unchanged.

`put` appends a batch through `server.append` and returns after commit. Reads go straight to
the DLedger data files by (physical offset, size), bounded by the committed position. The
dispatcher is fed through the server's `StateMachine` (`BrokerStateMachine`): `on_apply` gets
committed entries in index order, on every member, and their messages are dispatched (skipping the
no-op entry, magic 2, and anything that is not a message).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError, from_dledger
from broker.message import (
    BODY_LENGTH_POSITION,
    FIXED_OVERHEAD,
    MESSAGE_MAGIC_CODE,
    PHY_POS_POSITION,
    QUEUE_ID_POSITION,
    QUEUE_OFFSET_POSITION,
    topic_name,
)
from broker.store.base import Dispatcher, KeepFrom, Placed, TopicQueueTable
from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import BODY_OFFSET, MAGIC_NORMAL, DLedgerEntry
from dledger.statemachine import StateMachine

if TYPE_CHECKING:
    from dledger.server import DLedgerServer

log = logging.getLogger(__name__)

_INT = struct.Struct(">i")
# The fields the append hook reads: total size, magic, queue id, body length (offsets 0, 4, 12, 84
# of broker.message.HEAD); and the two it writes, adjacent: QUEUEOFFSET (20), PHYSICALOFFSET (28).
_HOOK_HEAD = struct.Struct(">ii4xi68xi")
_STAMP = struct.Struct(">qq")
assert PHY_POS_POSITION == QUEUE_OFFSET_POSITION + 8
_LONG = struct.Struct(">q")
_E = DLedgerResponseCode
# Messages packed into one entry: up to 256 KiB, or an eighth of a data file when files are small
# (an entry never spans files, and a file's unused tail is at most one entry).
_PACK_BYTES = 256 * 1024


class BrokerStateMachine(StateMachine):
    """The broker's reput dispatcher as a DLedger `StateMachine`: committed entries → consume
    queues, on every member."""

    def __init__(self, commit_log: DLedgerCommitLog) -> None:
        self.commit_log = commit_log

    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        self.commit_log.apply(entries)

    def last_applied_index(self) -> int:
        return self.commit_log.applied_index

    def retained_from_index(self) -> int | None:
        return self.commit_log.retained_from_index()


class DLedgerCommitLog:
    """Commit log over an embedded DLedger server (a `broker.store.base.CommitLog`). Caller:
    `DefaultMessageStore`; the server is the controller's."""

    def __init__(self, config: BrokerConfig, server: DLedgerServer) -> None:
        self.config = config
        self.server = server
        self.dstore = server.store
        self.topic_queue_table: TopicQueueTable = {}
        self.applied_index = -1
        self.pack_bytes = max(1, min(_PACK_BYTES, config.mapped_file_size_commit_log // 8))
        self._dispatcher: Dispatcher | None = None
        self._keep_from: KeepFrom | None = None
        self.dstore.add_append_hook(self._append_hook)
        self._ctx = f"group={config.dledger_group or config.broker_name} selfId={config.dledger_self_id}"

    # ---- lifecycle ----------------------------------------------------------------------------

    async def prepare(self, dispatcher: Dispatcher, keep_from: KeepFrom) -> None:
        """Recover the DLedger store now, so consume queues can be checked against its data
        before the server (and the state machine caller) start."""
        self._dispatcher = dispatcher
        self._keep_from = keep_from
        await asyncio.to_thread(self.dstore.recover)

    async def start(self) -> None:
        """Resume dispatch at the entry holding the last dispatched message, then start the server."""
        dispatcher = self._require_dispatcher()
        self.applied_index = self._index_of_last_dispatched(dispatcher)
        self.server.set_state_machine(BrokerStateMachine(self))
        await self.server.start()
        log.info("event=dledger_commitlog_started %s applied_index=%d reput_offset=%d", self._ctx,
                 self.applied_index, dispatcher.reput_offset)

    async def shutdown(self) -> None:
        await self.server.shutdown()

    def _require_dispatcher(self) -> Dispatcher:
        assert self._dispatcher is not None, "prepare() first"
        return self._dispatcher

    def _index_of_last_dispatched(self, dispatcher: Dispatcher) -> int:
        """Index of the entry before the one holding the last dispatched byte, so that entry is
        applied again: its other messages may not have been dispatched before a stop (-1: start
        from the beginning; messages below reput_offset are skipped by `dispatch`)."""
        found = self.entry_index_at(dispatcher.reput_offset - 1)
        return found - 1 if found >= 0 else -1

    def retained_from_index(self) -> int | None:
        """The first entry retention must keep: the one holding `keep_from()` (broker state and
        undispatched messages start there); None before `prepare`."""
        if self._keep_from is None:
            return None
        found = self.entry_index_at(self._keep_from())
        if found < 0:  # the floor is before the first entry: keep them all (none, in an empty log)
            begin = self.dstore.ledger_begin_index
            return begin if begin >= 0 else None
        return found

    def entry_index_at(self, phys: int) -> int:
        """Index of the entry whose body holds commit-log position `phys` (-1: none, or unreadable):
        a binary search over the index records, as an entry packs several messages."""
        d = self.dstore
        lo, hi = max(d.ledger_begin_index, 0), d.ledger_end_index
        found = -1
        try:
            while lo <= hi:
                mid = (lo + hi) // 2
                if d.get_entry_pos_and_size(mid)[0] <= phys - BODY_OFFSET:
                    found, lo = mid, mid + 1
                else:
                    hi = mid - 1
        except DLedgerException:
            return -1
        return found


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
        return self.dstore.data_end_pos

    @property
    def leader_id(self) -> str | None:
        return self.server.member_state.leader_id

    def write_refusal(self) -> BrokerError | None:
        if self.server.write_refusal() == _E.DISK_FULL:
            # We are the DLedger leader but cannot write (not even the no-op / member record):
            # the disk is the cause, so say so instead of sending the client round to ourselves.
            return BrokerError(BrokerCode.DISK_FULL, f"broker {self.config.broker_name}: the DLedger "
                               "store's disk is over diskFullRatio; writes resume once space is freed")
        return None

    def delete_expired(self) -> int:
        return 0  # DLedger's CleanSpaceService deletes expired data files (up to retained_from_index)

    def dispatch_caught_up(self) -> bool:
        """RocketMQ's condition before a new leader serves: the ledger is empty, or its end is
        committed and every committed entry is applied (dispatched)."""
        d = self.dstore
        if d.ledger_end_index == -1:
            return True
        return d.ledger_end_index == d.committed_index and self.applied_index >= d.committed_index

    # ---- the append hook ------------------------------------------------------------------------

    def _append_hook(self, entry: DLedgerEntry, view: memoryview, body_offset: int) -> None:
        """Stamp PHYSICALOFFSET and assign QUEUEOFFSET of each message the entry packs, in log order.
        Messages of one topic and queue in a row (a produced batch) take the next offsets of a run
        held here: one table read and one write per run."""
        if entry.magic != MAGIC_NORMAL:
            return
        end = len(view)
        off = body_offset
        base = entry.pos
        table = self.topic_queue_table
        key: tuple[str, int] | None = None
        run_topic = b""
        run_qid = next_qoff = -1
        unpack_head = _HOOK_HEAD.unpack_from
        stamp = _STAMP.pack_into
        try:
            while end - off >= FIXED_OVERHEAD:
                size, magic, queue_id, body_len = unpack_head(view, off)
                topic_at = off + BODY_LENGTH_POSITION + 4 + body_len
                if magic != MESSAGE_MAGIC_CODE or size < FIXED_OVERHEAD or off + size > end \
                        or body_len < 0 or topic_at >= off + size:
                    return  # not a message we encoded; the dispatcher reports it
                topic_end = topic_at + 1 + view[topic_at]
                if queue_id != run_qid or view[topic_at + 1:topic_end] != run_topic:
                    if key is not None:
                        table[key] = next_qoff
                    # Topic bytes copied out (no view kept: the store unmaps files only without views).
                    run_topic, run_qid = bytes(view[topic_at + 1:topic_end]), queue_id
                    key = (topic_name(run_topic), queue_id)
                    next_qoff = table.get(key, 0)
                stamp(view, off + QUEUE_OFFSET_POSITION, next_qoff, base + off)
                next_qoff += 1
                off += size
        finally:
            if key is not None:
                table[key] = next_qoff

    # ---- writing --------------------------------------------------------------------------------

    async def put(self, topic: str, queue_id: int, bufs: list[bytearray],
                  entry_starts: list[int] | None = None) -> list[Placed]:
        """Append a batch through the DLedger server (leader only); returns after commit. The
        append hook assigns the queue offsets (it reads topic and queue from the bytes)."""
        groups: list[list[bytearray]] = []
        if entry_starts is not None:
            groups = [bufs[a:b] for a, b in zip(entry_starts, [*entry_starts[1:], len(bufs)], strict=True)]
        else:
            limit = self.pack_bytes
            size = limit
            for b in bufs:
                if size + len(b) > limit:
                    groups.append([])
                    size = 0
                groups[-1].append(b)
                size += len(b)
        try:
            results = await self.server.append([b"".join(g) for g in groups])
        except DLedgerException as exc:
            # One mapping (broker.errors); the store names the master in a NOT_MASTER (it knows the members).
            raise from_dledger(exc) from None
        out = []
        for res, group in zip(results, groups, strict=True):
            phys = res.pos + BODY_OFFSET
            first = self._stamped(phys)
            last = self._stamped(phys + sum(len(b) for b in group[:-1]))
            if last[0] == first[0] and last[1] == first[1] + len(group) - 1:
                qid, qoff = first
                for i, b in enumerate(group):
                    out.append(Placed(phys, len(b), qid, qoff + i))
                    phys += len(b)
            else:
                for b in group:
                    qid, qoff = self._stamped(phys)
                    out.append(Placed(phys, len(b), qid, qoff))
                    phys += len(b)
        return out

    async def put_many(self, bufs: list[bytearray]) -> list[Placed]:
        """Messages of any topics and queues in ONE entry (the append hook stamps each from its
        own bytes): committed together or not at all, on every member."""
        try:
            (result,) = await self.server.append([b"".join(bufs)])
        except DLedgerException as exc:
            raise self._broker_error(exc) from None
        out = []
        phys = result.pos + BODY_OFFSET
        for b in bufs:
            qid, qoff = self._stamped(phys)
            out.append(Placed(phys, len(b), qid, qoff))
            phys += len(b)
        return out

    def _stamped(self, phys: int) -> tuple[int, int]:
        """(QUEUEID, QUEUEOFFSET) of the message at `phys`, as the append hook stamped them."""
        head = self.dstore.get_data(phys, QUEUE_OFFSET_POSITION + 8)
        return _INT.unpack_from(head, QUEUE_ID_POSITION)[0], _LONG.unpack_from(head, QUEUE_OFFSET_POSITION)[0]

    # ---- reading --------------------------------------------------------------------------------

    def get_data(self, phys: int, size: int) -> memoryview:
        """Bytes of a committed message straight from the DLedger data files. Readable: below the
        committed position, or below what was dispatched (committed earlier, including what any
        consume queue held at start; after a restart the committed position is learnt again from
        the leader)."""
        end = self.dstore.committed_pos
        if phys + size > end:  # not known committed (yet, after a restart): dispatched before?
            end = max(end, self._require_dispatcher().readable_end)
        if size <= 0 or phys + size > end or phys < self.dstore.data_begin_pos + BODY_OFFSET:
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
            self._require_dispatcher().dispatch_done()

    def _apply(self, entries: list[DLedgerEntry]) -> None:
        dispatcher = self._require_dispatcher()
        for entry in entries:
            if entry.index <= self.applied_index:
                continue
            if entry.magic == MAGIC_NORMAL and entry.size - BODY_OFFSET >= FIXED_OVERHEAD \
                    and entry.pos + entry.size > dispatcher.reput_offset:
                base = entry.pos + BODY_OFFSET
                data: bytes | memoryview | None = entry.body
                if data is None or len(data) != entry.size - BODY_OFFSET:
                    try:
                        data = self.dstore.get_data(base, entry.size - BODY_OFFSET)
                    except DLedgerException as exc:
                        log.error("event=dispatch_read_failed %s index=%d pos=%d reason=%s", self._ctx,
                                  entry.index, entry.pos, exc)
                        data = None
                if data is not None and _INT.unpack_from(data, 4)[0] == MESSAGE_MAGIC_CODE:
                    dispatcher.dispatch_packed(data, base)
            # Past the whole entry, no-op or not: "everything before this is applied" then reads
            # straight off the position (a state snapshot waits for the log's end).
            dispatcher.skip_to(entry.pos + entry.size)
            self.applied_index = entry.index
