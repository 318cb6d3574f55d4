"""`DefaultMessageStore`: commit log + consume queues + the reput dispatcher + replicated state.

The commit log is a local `CommitLog` or, with `enableDLegerCommitLog`, a `DLedgerCommitLog`.
Either way the store works the same:

- `put_messages` validates, encodes (RocketMQ v1 layout), assigns queue offsets from the
  topic-queue table and appends; it returns once the batch is committed (local: written; DLedger:
  on a majority). In DLedger mode the queue offset and PHYSICALOFFSET are stamped by the append
  hook as the leader writes each entry, so queue offsets follow log order exactly.
- The **reput dispatcher** feeds only committed messages, in log order, into the consume queues
  (`{storePathRootDir}/consumequeue/{topic}/{queueId}/`), applies system records (topic configs,
  consumer offsets, broker members), fills the idempotency table and wakes long-polling consumers.
  Local mode: driven by the committed (= written) position after each put. DLedger mode: the
  store is the DLedger server's `StateMachine` (`on_apply` of committed entries, on every member).
- Recovery: consume queues are cut past the end of the commit log, dispatch resumes after the last
  message any consume queue holds, the topic-queue table is rebuilt from the consume queues, and
  the system topics are replayed to rebuild topics, offsets and the idempotency table.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError
from broker.message import (
    BODY_LENGTH_POSITION,
    FIXED_OVERHEAD,
    IDEMPOTENCY_MARK,
    MESSAGE_MAGIC_CODE,
    PHY_POS_POSITION,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    STORE_TIMESTAMP_POSITION,
    TAGS_MARK,
    DispatchInfo,
    Message,
    MessageExt,
    bytes_to_properties,
    decode_message,
    encode_batch,
    keyed_plain_key,
    message_ext_from,
    message_id_prefix,
    new_uniq_key,
    parse_message,
    plain_tail_signature,
    tags_hash_code,
    unpack_host,
)
from broker.store import store_recovery
from broker.store.commitlog import CommitLog
from broker.store.consume_queue import ConsumeQueue
from broker.store.offsets import ConsumerOffsetManager, IdempotencyTable, PutResult
from broker.topics import (
    SYS_BROKER_MEMBERS,
    SYS_CONSUMER_OFFSETS,
    SYS_TOPIC_CONFIG,
    TopicConfigManager,
    validate_topic,
)
from dledger.codes import DLedgerResponseCode

log = logging.getLogger(__name__)

_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")
# The header fields dispatch_packed checks: total size, magic, queue id, queue offset, physical
# offset, body length (offsets 0, 4, 12, 20, 28, 84 of broker.message.HEAD).
_RUN_HEAD = struct.Struct(">ii4xi4xqq48xi")
_STORE_STAMP = struct.Struct(">q4sI")  # store timestamp, store host IPv4 and port
MAX_PULL_MESSAGES = 1024
DEFAULT_PULL_BYTES = 4 * 1024 * 1024
__all__ = ["DefaultMessageStore", "GetResult", "PutResult"]


@dataclass(slots=True)
class GetResult:
    """Messages read from one queue; `next_offset` is where the next pull starts."""

    messages: list[MessageExt]
    next_offset: int
    min_offset: int
    max_offset: int


def _expire_waiter(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(BrokerError(BrokerCode.TIMEOUT, "committed record was not dispatched in time",
                                      outcome="committed"))


def _decode_ext(view: memoryview, head: tuple, topic_at: int, props_at: int) -> MessageExt:
    return message_ext_from(view, head, topic_at, props_at, head[6])  # checked by read_messages


def _stored_tag(view: memoryview, props_at: int, total: int) -> str | None:
    return bytes_to_properties(view[props_at + 2:total]).get(PROPERTY_TAGS)


@dataclass(slots=True)
class _Pending:
    """A put in flight for an idempotency key: later duplicates wait on `future`."""

    future: asyncio.Future[PutResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class DefaultMessageStore:
    """The broker's store. See `docs/INTERFACES.md` (broker store) for the contract."""

    def __init__(self, config: BrokerConfig, dledger_server: Any | None = None) -> None:
        self.config = config
        self.topics = TopicConfigManager(config.default_topic_queue_nums, config.auto_create_topic_enable)
        self.offsets = ConsumerOffsetManager()
        self.idempotency = IdempotencyTable(config.idempotency_window_ms, config.idempotency_max_keys)
        self.member_addrs: dict[str, str] = {}  # DLedger selfId -> HTTP addr, from SYS_BROKER_MEMBERS
        self.cq_root = os.path.join(config.store_path_root_dir, "consumequeue")
        self.checkpoint_path = os.path.join(config.store_path_root_dir, "dispatchcheckpoint")
        self.consume_queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.queue_offset_table: dict[tuple[str, int], int] = {}
        self.dledger = bool(config.enable_dleger_commit_log)
        if self.dledger:
            from broker.store.dledger_commitlog import DLedgerCommitLog

            self.commit_log: Any = DLedgerCommitLog(self, config, dledger_server)
        else:
            self.commit_log = CommitLog(config.store_path_root_dir, config.mapped_file_size_commit_log,
                                        config.flush_disk_type == "SYNC_FLUSH")
        # Role state, owned by BrokerController / DLedgerRoleChangeHandler; local mode is always master.
        self.is_master = not self.dledger
        self.reput_offset = 0  # everything below this commit-log offset is dispatched
        self.recovered_end = 0  # end of the furthest consume queue at start (all of it committed)
        self._system_handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            SYS_TOPIC_CONFIG: lambda record: self.topics.apply_record(record, self.record_phys),
            SYS_CONSUMER_OFFSETS: self.offsets.apply_record,
            SYS_BROKER_MEMBERS: self._apply_member_record,
        }
        self.record_phys = -1  # log position of the system record being applied
        self.topics.set_writer(self.append_system_record)
        self.topics.on_delete = self._drop_topic
        self.offsets.set_writer(self.append_system_record)
        self._replaying = False
        self._topic_names: dict[bytes, str] = {}
        self._arrivals: dict[tuple[str, int], asyncio.Event] = {}
        # Puts/records waiting for the dispatcher to pass their end: a min-heap on the commit-log
        # end position, popped as reput_offset advances (no per-put polling, no list scans).
        self._dispatch_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_seq = itertools.count()
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._round_robin: dict[str, int] = {}
        self._flush_task: asyncio.Task[None] | None = None
        self._retention_tick = 0
        self._checkpointed = -1
        self._stopping = asyncio.Event()
        self.started = False

    # ---- lifecycle ----------------------------------------------------------------------------

    def register_system_handler(self, sys_topic: str, handler: Callable[[dict[str, Any]], None]) -> None:
        """Apply records of `sys_topic` (JSON bodies written with `append_system_record`) on every
        member, in log order, and on replay at start. Register before `start()`."""
        validate_topic(sys_topic, allow_system=True)
        self._system_handlers[sys_topic] = handler

    async def start(self) -> None:
        """Recover consume queues and the commit log, replay system records, start dispatching."""
        store_recovery.load_consume_queues(self)
        await self.commit_log.prepare()
        data_end = self.commit_log.data_end
        for cq in self.consume_queues.values():
            cq.truncate_dirty(data_end)
        # Resume at the queue that is furthest behind: after a power loss each consume queue keeps
        # only what it fsynced (once a second), so units below another queue's end may be gone.
        # Units still present are skipped by put_unit (found by the fault suite, row 8). But an
        # idle queue would pin that point far back (a restart re-dispatched everything since its
        # last message), so the checkpoint written after each flush of all queues moves it up:
        # every unit below it is on disk.
        self.reput_offset = max(min((cq.max_phys_end for cq in self.consume_queues.values()),
                                    default=self.commit_log.min_offset), self.commit_log.min_offset)
        checkpoint = store_recovery.read_dispatch_checkpoint(self.checkpoint_path)
        if checkpoint is not None:
            self.reput_offset = max(self.reput_offset, min(checkpoint, data_end))
        log.info("event=dispatch_resume broker=%s from=%d checkpoint=%s data_end=%d",
                 self.config.broker_name, self.reput_offset, checkpoint, data_end)
        # Every unit a consume queue still holds was dispatched, so committed: readable (system
        # record replay, pulls) up to the furthest queue's end before the leader is known again.
        self.recovered_end = max((cq.max_phys_end for cq in self.consume_queues.values()), default=0)
        store_recovery.correct_min_offsets(self)
        self.recover_topic_queue_table()
        store_recovery.replay_system_records(self)
        store_recovery.rebuild_idempotency(self)
        try:
            await self.commit_log.start()
        except BaseException:
            for cq in self.consume_queues.values():
                cq.close()
            raise
        self._flush_task = asyncio.get_running_loop().create_task(self._flush_loop())
        if not self.dledger:
            self.reput_local()
        self.started = True
        log.info("event=store_started broker=%s mode=%s reput_offset=%d queues=%d topics=%d",
                 self.config.broker_name, "dledger" if self.dledger else "local", self.reput_offset,
                 len(self.consume_queues), len(self.topics.all()))

    async def shutdown(self) -> None:
        self._stopping.set()
        await self.commit_log.shutdown()
        if self._flush_task is not None:
            await self._flush_task
        for _, _, fut in self._dispatch_waiters:
            if not fut.done():
                fut.set_exception(BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "store shut down"))
        self._dispatch_waiters.clear()
        queues = list(self.consume_queues.values())
        store_recovery.flush_queues(queues, (self.checkpoint_path, self.reput_offset))
        for cq in queues:
            cq.close()
        log.info("event=store_shutdown broker=%s reput_offset=%d", self.config.broker_name, self.reput_offset)

    async def _flush_loop(self) -> None:
        """Consume queues are page cache between fsyncs: flush them once a second."""
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), 1.0)
            except TimeoutError:
                pass
            self._retention_tick += 1
            if self._retention_tick % 10 == 0:
                self._clean_expired()
            mark = self.reput_offset  # before the flush: every unit below it is in a map now
            dirty = [cq for cq in self.consume_queues.values() if cq.files.dirty_files()]
            if dirty or mark != self._checkpointed:
                await asyncio.to_thread(store_recovery.flush_queues, dirty, (self.checkpoint_path, mark))
                self._checkpointed = mark

    def _clean_expired(self) -> None:
        store_recovery.clean_expired(self)

    def recover_topic_queue_table(self) -> None:
        """The next queue offset of every queue = its consume queue's max offset (a new master
        calls this once everything committed is dispatched)."""
        self.queue_offset_table = {key: cq.max_offset for key, cq in self.consume_queues.items()}

    # ---- role (set by the role-change handler) ------------------------------------------------

    @property
    def master_addr(self) -> str | None:
        """HTTP address of the master of this broker set, when known."""
        if self.is_master:
            return self.config.broker_addr
        leader = self.commit_log.leader_id if self.dledger else None
        return self.member_addrs.get(leader) if leader else None

    def not_master_error(self) -> BrokerError:
        if self.dledger and self.commit_log.server.write_refusal() == DLedgerResponseCode.DISK_FULL:
            # We are the DLedger leader but cannot write (not even the no-op / member record):
            # the disk is the cause, so say so instead of sending the client round to ourselves.
            return BrokerError(BrokerCode.DISK_FULL, f"broker {self.config.broker_name}: the DLedger "
                               "store's disk is over diskFullRatio; writes resume once space is freed")
        addr = self.master_addr
        return BrokerError(BrokerCode.NOT_MASTER,
                           f"broker {self.config.broker_name} ({self.config.broker_addr}) is a slave; "
                           f"write to the master{' at ' + addr if addr else ' (being elected)'}",
                           masterAddr=addr)

    def dispatch_caught_up(self) -> bool:
        """Everything committed is dispatched (and, in DLedger mode, nothing uncommitted is in
        the local log) — the condition RocketMQ's role-change handler waits for."""
        return self.commit_log.dispatch_caught_up() if self.dledger else True

    def _apply_member_record(self, record: dict[str, Any]) -> None:
        sid, addr = record.get("selfId"), record.get("addr")
        if isinstance(sid, str) and isinstance(addr, str):
            self.member_addrs[sid] = addr

    # ---- producing ----------------------------------------------------------------------------

    def assign_queue_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset of (topic, queueId), in log order (local put; the DLedger append hook
        advances `queue_offset_table` itself, a run of messages at a time)."""
        key = (topic, queue_id)
        off = self.queue_offset_table.get(key, 0)
        self.queue_offset_table[key] = off + 1
        return off

    def _choose_queue(self, topic: str, nums: int) -> int:
        n = self._round_robin.get(topic, 0)
        self._round_robin[topic] = n + 1
        return n % nums

    async def put_messages(self, topic: str, msgs: list[Message], queue_id: int | None = None,
                           *, _system: bool = False) -> list[PutResult]:
        """Store a batch (all to one queue) and return once committed. A message whose idempotency
        key was stored within `idempotencyWindowMs` is not stored again: its first result is
        returned. Raises BrokerError; on an error nothing of the batch is stored."""
        validate_topic(topic, allow_system=_system)
        if not msgs:
            raise BrokerError(BrokerCode.INVALID_REQUEST, "no messages to store", field="messages")
        if not _system and not self.is_master:
            raise self.not_master_error()
        if not self.started:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "store is starting")
        cfg = self.topics.get(topic)
        if cfg is None:
            if _system:
                self.topics.ensure_from_data(topic, 0)
                cfg = self.topics.get(topic)
            else:
                cfg = await self.topics.auto_create(topic)
        assert cfg is not None
        if not cfg.is_writeable():
            raise BrokerError(BrokerCode.NO_PERMISSION, f"topic {topic!r} is not writeable (perm {cfg.perm})",
                              topic=topic)
        if queue_id is None:
            queue_id = self._choose_queue(topic, cfg.write_queue_nums)
        elif not isinstance(queue_id, int) or not 0 <= queue_id < cfg.write_queue_nums:
            raise BrokerError(BrokerCode.QUEUE_NOT_EXIST, f"queue {queue_id!r} does not exist: topic "
                              f"{topic!r} has {cfg.write_queue_nums} write queues",
                              topic=topic, queueId=queue_id)
        results: list[PutResult | None] = [None] * len(msgs)
        waits: list[tuple[int, asyncio.Future[PutResult]]] = []
        to_store: list[int] = []
        mine: dict[tuple[str, str], _Pending] = {}
        for i, m in enumerate(msgs):
            key = m.idempotency_key
            if key:
                hit = self.idempotency.get(topic, key)
                if hit is not None:
                    results[i] = hit
                    continue
                pending = self._pending.get((topic, key)) or mine.get((topic, key))
                if pending is not None:
                    waits.append((i, pending.future))
                    continue
                mine[(topic, key)] = _Pending()
            to_store.append(i)
        try:
            batch = msgs if len(to_store) == len(msgs) else [msgs[i] for i in to_store]
            for m in batch:
                if not isinstance(m.body, bytes | bytearray):
                    raise BrokerError(BrokerCode.INVALID_REQUEST, "message body must be bytes", field="body")
            bufs = encode_batch(batch, queue_id=queue_id, store_host=self.config.broker_addr,
                                max_message_size=self.config.max_message_size)
        except BrokerError:
            for p in mine.values():
                p.future.cancel()
            raise
        self._pending.update(mine)
        try:
            stored = await self._append(bufs, topic, queue_id) if bufs else []
        except BaseException as exc:
            for k, p in mine.items():
                self._pending.pop(k, None)
                if not p.future.done():
                    p.future.set_exception(exc if isinstance(exc, BrokerError) else BrokerError(
                        BrokerCode.TIMEOUT, f"the first put with this idempotency key was interrupted "
                        f"({type(exc).__name__}); the outcome is unknown, retry", outcome="unknown"))
                    p.future.exception()  # retrieved: a failure nobody waited for is not "never retrieved"
            raise
        now = int(time.time() * 1000)
        for i, res in zip(to_store, stored, strict=True):
            results[i] = res
            key = msgs[i].idempotency_key
            if key:
                self.idempotency.remember(topic, key, res, now)
                p = self._pending.pop((topic, key), None)
                if p is not None and not p.future.done():
                    p.future.set_result(res)
        for i, fut in waits:
            results[i] = await fut
        return [r for r in results if r is not None]

    async def _append(self, bufs: list[bytearray], topic: str, queue_id: int) -> list[PutResult]:
        if self.dledger:
            placed = await self.commit_log.put(bufs)
            # Committed; also wait (briefly) for our own dispatcher so a pull right after the
            # answer sees the messages, as in local mode. A slow dispatch never fails the put.
            phys, size = placed[-1][0], placed[-1][1]
            if self.reput_offset < phys + size:
                try:
                    await self.wait_dispatched(phys + size, timeout_s=2.0)
                except BrokerError:
                    log.warning("event=dispatch_lagging phys=%d reput_offset=%d", phys, self.reput_offset)
        else:
            placed = self._put_local(bufs, topic, queue_id)
            if self.commit_log.sync_flush:
                await self.commit_log.flush()
        prefix = message_id_prefix(self.config.broker_addr)
        return [PutResult(f"{prefix}{phys:016X}", qid, qoff, phys, size)  # create_message_id, inlined
                for (phys, size, qid, qoff) in placed]

    def _put_local(self, bufs: list[bytearray], topic: str, queue_id: int) -> list[tuple[int, int, int, int]]:
        """Local mode: assign queue offsets and physical offsets and write — no await in between,
        so concurrent puts cannot interleave — then dispatch what is now committed."""
        limit = self.commit_log.files.file_size - 8
        for b in bufs:
            if len(b) > limit:
                raise BrokerError(BrokerCode.MESSAGE_TOO_LARGE,
                                  f"message of {len(b)} bytes exceeds a commit-log file ({limit} usable)")
        placed = []
        for b in bufs:
            qoff = self.assign_queue_offset(topic, queue_id)
            phys = self.commit_log.next_position(len(b))
            _LONG.pack_into(b, 20, qoff)
            _LONG.pack_into(b, 28, phys)
            at = self.commit_log.append(b)
            assert at == phys, (at, phys)
            placed.append((phys, len(b), queue_id, qoff))
        self.reput_local()
        return placed

    async def append_system_record(self, sys_topic: str, record: dict[str, Any], *,
                                   force: bool = False) -> None:
        """Write a JSON record into a system topic (queue 0), wait until it is committed AND
        dispatched (so the caller reads its own write). Master only unless `force` (the
        role-change handler writes before it accepts user writes)."""
        if not self.is_master and not force:
            raise self.not_master_error()
        msg = Message(sys_topic, orjson.dumps(record), properties={PROPERTY_UNIQ_KEY: new_uniq_key()})
        res = await self.put_messages(sys_topic, [msg], 0, _system=True)
        await self.wait_dispatched(res[0].commit_log_offset + res[0].store_size)

    async def wait_dispatched(self, phys_end: int, timeout_s: float = 10.0) -> None:
        """Return once the dispatcher has passed commit-log position `phys_end`; TIMEOUT
        (outcome committed) after `timeout_s`. One future and one timer handle per call."""
        if self.reput_offset >= phys_end:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._dispatch_waiters, (phys_end, next(self._waiter_seq), fut))
        timer = loop.call_later(timeout_s, _expire_waiter, fut)
        try:
            await fut
        finally:
            timer.cancel()

    # ---- dispatching --------------------------------------------------------------------------

    def reput_local(self) -> None:
        """Local mode: dispatch everything between reput_offset and the commit log's end."""
        pos = self.reput_offset
        while True:
            pos, size = self.commit_log.next_record(pos)
            if size <= 0:
                break
            self.dispatch(self.commit_log.get_data(pos, size), pos)
            pos += size
        self.reput_offset = max(self.reput_offset, pos)
        self.dispatch_done()

    def topic_name(self, raw: bytes) -> str:
        """The topic whose stored UTF-8 bytes are `raw` (cached: a store sees few topics)."""
        name = self._topic_names.get(raw)
        if name is None:
            if len(self._topic_names) > 10_000:
                self._topic_names.clear()
            name = self._topic_names[raw] = str(raw, "utf-8", "replace")
        return name

    def dispatch(self, data: memoryview | bytes, phys: int) -> bool:
        """Dispatch one committed message (in log order) whose bytes start at `phys`. False if it
        was skipped: already dispatched, unreadable, or of a deleted incarnation of its topic."""
        if phys < self.reput_offset:
            return False  # already dispatched (replay after restart)
        try:
            head, topic_at, props_at = parse_message(data, phys, check_crc=False)
        except BrokerError as exc:
            log.error("event=dispatch_skipped phys=%d reason=%s", phys, exc.detail)
            self.reput_offset = phys + max(len(data), 1)
            return False
        size = head[0]
        queue_id = head[3]
        queue_offset = head[5]
        topic = self.topic_name(bytes(data[topic_at + 1:props_at]))
        if phys < self.topics.deleted_at.get(topic, -1):
            self.reput_offset = phys + size  # stored before the topic was deleted: not re-indexed
            return False
        if head[6] != phys:
            log.error("event=phys_offset_mismatch stored=%d actual=%d topic=%s", head[6], phys, topic)
        props_raw = bytes(data[props_at + 2:size])
        info = None
        tags_code = 0
        if TAGS_MARK in props_raw or IDEMPOTENCY_MARK in props_raw:  # else: neither is there
            info = DispatchInfo(topic, queue_id, queue_offset, head[6], size, head[11],
                                unpack_host(head[12], head[13]), props_raw)
            tags_code = info.tags_code
        self.topics.ensure_from_data(topic, queue_id)
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        if cq is None:
            cq = self._create_cq(*key)
        written = cq.put_unit(queue_offset, phys, size, tags_code)
        if not self.is_master and self.queue_offset_table.get(key, 0) <= queue_offset:
            self.queue_offset_table[key] = queue_offset + 1
        handler = self._system_handlers.get(topic)
        if handler is not None and written:  # a unit already present was applied by the start-up replay
            try:
                self.record_phys = phys
                handler(orjson.loads(decode_message(data, phys).body))
            except (BrokerError, orjson.JSONDecodeError) as exc:
                log.error("event=system_record_unreadable topic=%s phys=%d reason=%s", topic, phys, exc)
        if info is not None and info.idempotency_key:
            self.remember_idempotency(info)
        self.reput_offset = phys + size
        ev = self._arrivals.pop(key, None)
        if ev is not None:
            ev.set()
        return True

    def dispatch_packed(self, data: memoryview | bytes, base: int) -> None:
        """Dispatch, in order, the messages stored back to back in `data` (one committed DLedger
        entry body), the first at commit-log position `base`.

        The bulk of a produced batch takes a short path: a message of the same topic and queue as
        the one before it, with the next queue offset and no property but its UNIQ_KEY, gets its
        layout checked by one comparison and one consume-queue unit (a fifth of what `dispatch`
        costs); one whose only other property is an IDEMPOTENCY_KEY (what the SDK sends) gets a few
        more comparisons and its key remembered. The first message of each run, and every other
        message, goes through `dispatch`."""
        end = len(data)
        off = 0
        unpack_head = _RUN_HEAD.unpack_from
        run_sig = b""  # plain_tail_signature of the current run's topic; b"": no run
        run_topic, run_topic_f = "", b""  # the run's topic, and its field as stored
        run_tail = run_qid = first_qoff = next_qoff = sig_len = -1
        run_cq: ConsumeQueue | None = None
        units: list[tuple[int, int]] = []
        while end - off >= FIXED_OVERHEAD:
            phys = base + off
            total, magic, queue_id, queue_offset, stored_phys, body_len = unpack_head(data, off)
            msg_end = off + total
            if magic != MESSAGE_MAGIC_CODE or total < FIXED_OVERHEAD or msg_end > end:
                self._end_run(run_cq, first_qoff, units)
                log.error("event=dispatch_skipped phys=%d reason=no message at this position of the entry "
                          "at %d (magic %#010x, size %d)", phys, base, magic & 0xFFFFFFFF, total)
                self.reput_offset = max(self.reput_offset, base + end)
                return
            if phys < self.reput_offset:
                off = msg_end  # already dispatched (replay after restart)
                continue
            topic_at = off + BODY_LENGTH_POSITION + 4 + body_len
            if queue_offset == next_qoff and queue_id == run_qid and stored_phys == phys and body_len >= 0:
                if msg_end - topic_at == run_tail and data[topic_at:topic_at + sig_len] == run_sig:
                    units.append((phys, total))
                    next_qoff += 1
                    off = msg_end
                    continue
                key = keyed_plain_key(data, topic_at, msg_end, run_topic_f)
                if key is not None:  # the SDK's shape: the same, plus an idempotency key
                    ts, ip, port = _STORE_STAMP.unpack_from(data, off + STORE_TIMESTAMP_POSITION)
                    self.idempotency.remember_parts(run_topic, key, message_id_prefix(unpack_host(ip, port)),
                                                    queue_id, queue_offset, phys, total, ts)
                    units.append((phys, total))
                    next_qoff += 1
                    off = msg_end
                    continue
            self._end_run(run_cq, first_qoff, units)
            run_sig, run_cq, units, next_qoff = b"", None, [], -1
            if self.dispatch(data[off:msg_end], phys) and body_len >= 0:
                raw = bytes(data[topic_at + 1:topic_at + 1 + data[topic_at]])
                topic = self.topic_name(raw)
                run_cq = self.consume_queues.get((topic, queue_id))
                if run_cq is not None and topic not in self._system_handlers:
                    run_sig, run_tail = plain_tail_signature(raw)
                    sig_len = len(run_sig)
                    run_topic, run_topic_f = topic, run_sig[:1 + len(raw)]
                    run_qid = queue_id
                    first_qoff = next_qoff = queue_offset + 1
            off = msg_end
        self._end_run(run_cq, first_qoff, units)
        # Long polls: `dispatch` woke a run's waiters at its first message; they run after this
        # synchronous loop and read the whole run.

    def _end_run(self, cq: ConsumeQueue | None, first_qoff: int, units: list[tuple[int, int]]) -> None:
        if cq is None or not units:
            return
        cq.put_units(first_qoff, units)
        next_qoff = first_qoff + len(units)
        key = (cq.topic, cq.queue_id)
        if not self.is_master and self.queue_offset_table.get(key, 0) < next_qoff:
            self.queue_offset_table[key] = next_qoff
        phys, size = units[-1]
        self.reput_offset = phys + size

    def dispatch_done(self) -> None:
        """After a batch of dispatches: release `wait_dispatched` callers that are covered."""
        heap = self._dispatch_waiters
        reput = self.reput_offset
        while heap and heap[0][0] <= reput:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        if len(heap) > 4096:  # waiters that timed out while dispatch was stuck: drop them
            self._dispatch_waiters = [w for w in heap if not w[2].done()]
            heapq.heapify(self._dispatch_waiters)

    def remember_idempotency(self, info: DispatchInfo) -> None:
        key = info.idempotency_key
        if key:
            self.idempotency.remember_parts(info.topic, key, message_id_prefix(info.store_host),
                                            info.queue_id, info.queue_offset, info.phys_offset,
                                            info.size, info.store_timestamp)

    def _create_cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = ConsumeQueue(self.cq_root, topic, queue_id, self.config.mapped_file_size_consume_queue)
        cq.load()
        self.consume_queues[(topic, queue_id)] = cq
        return cq

    def _drop_topic(self, topic: str) -> None:
        """A topic was deleted: drop its committed offsets and its queues. While replaying at start
        the queues stay (those on disk may belong to a later re-creation); the offsets go, as the
        records are replayed in log order and a re-creation's commits come after the delete."""
        self.offsets.drop_topic(topic)
        if self._replaying:
            return
        for key in [k for k in self.consume_queues if k[0] == topic]:
            self.consume_queues.pop(key).destroy()
            self.queue_offset_table.pop(key, None)

    # ---- reading ------------------------------------------------------------------------------

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        validate_topic(topic, allow_system=True)
        cfg = self.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if not isinstance(queue_id, int) or not 0 <= queue_id < cfg.queue_nums:
            raise BrokerError(BrokerCode.QUEUE_NOT_EXIST, f"queue {queue_id!r} does not exist: topic "
                              f"{topic!r} has {cfg.queue_nums} queues", topic=topic, queueId=queue_id)
        return self.consume_queues.get((topic, queue_id))

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queue(topic, queue_id)
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queue(topic, queue_id)
        return cq.max_offset if cq else 0

    def queue_offsets(self, topic: str) -> list[tuple[int, int, int]]:
        """[(queueId, minOffset, maxOffset)] of every queue of `topic`."""
        cfg = self.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        out = []
        for q in range(cfg.queue_nums):
            cq = self.consume_queues.get((topic, q))
            out.append((q, cq.min_offset if cq else 0, cq.max_offset if cq else 0))
        return out

    def get_messages(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
                     max_bytes: int = DEFAULT_PULL_BYTES, tags: set[str] | None = None) -> GetResult:
        """Read committed messages from `offset`. `tags` (None = all) filters by tag, first by hash
        code in the consume queue, then by the stored tag. OFFSET_OUT_OF_RANGE outside [min, max]."""
        return self.read_messages(topic, queue_id, offset, max_messages, max_bytes, tags, _decode_ext)

    def read_messages(self, topic: str, queue_id: int, offset: int, max_messages: int,
                      max_bytes: int, tags: set[str] | None,
                      build: Callable[[memoryview, tuple, int, int], Any]) -> GetResult:
        """`get_messages` with the per-message result made by `build(view, head, topic_at,
        props_at)` straight from the mapped bytes (the pull route builds its JSON there, with no
        `MessageExt` in between). Every message is checked (layout and body CRC) before `build`
        sees it; the view is only valid inside `build` (it aliases the mapped file).

        The CRC is checked on every read, not only at dispatch: the consume queue points at bytes
        in the page cache that can rot after they were dispatched, and a corrupt message must be
        reported (MESSAGE_CORRUPTED), never served. It costs ~1 us per KB."""
        cq = self._queue(topic, queue_id)
        if not isinstance(max_messages, int) or not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise BrokerError(BrokerCode.INVALID_REQUEST,
                              f"maxMessages must be in 1..{MAX_PULL_MESSAGES}, got {max_messages!r}",
                              field="maxMessages")
        lo, hi = (cq.min_offset, cq.max_offset) if cq else (0, 0)
        if not isinstance(offset, int) or not lo <= offset <= hi:
            raise BrokerError(BrokerCode.OFFSET_OUT_OF_RANGE, f"offset {offset!r} outside [{lo}, {hi}] of "
                              f"{topic}/{queue_id}", minOffset=lo, maxOffset=hi)
        if cq is None or offset == hi:
            return GetResult([], offset, lo, hi)
        codes = {tags_hash_code(t) for t in tags} if tags else None
        scan = max_messages if codes is None else min(MAX_PULL_MESSAGES, max_messages * 16)
        out: list[Any] = []
        size_sum = 0
        next_offset = offset
        get_data = self.commit_log.get_data
        for phys, size, code in cq.get_units(offset, scan):
            if out and (len(out) >= max_messages or size_sum + size > max_bytes):
                break
            if size > 0 and (codes is None or code in codes):
                try:
                    view = get_data(phys, size)
                    head, topic_at, props_at = parse_message(view, phys)
                except BrokerError:
                    if out:
                        break  # return what we have; the next pull meets the error
                    raise
                if tags is None or _stored_tag(view, props_at, head[0]) in tags:
                    out.append(build(view, head, topic_at, props_at))
                    size_sum += size
                del view
            next_offset += 1
        return GetResult(out, next_offset, lo, hi)

    def look_message_by_offset(self, commit_log_offset: int, size: int | None = None) -> MessageExt:
        """The message whose bytes start at `commit_log_offset` (a msgId's offset). Raises
        MESSAGE_NOT_FOUND / MESSAGE_CORRUPTED."""
        if not isinstance(commit_log_offset, int) or commit_log_offset < 0:
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"bad commit-log offset {commit_log_offset!r}")
        if size is None:
            # A message starts here only if the magic is there and its stamped PHYSICALOFFSET
            # names this very offset (a msgId pointing into the middle of something is "not found").
            head = self.commit_log.get_data(commit_log_offset, PHY_POS_POSITION + 8)
            size, magic = struct.unpack_from(">ii", head, 0)
            stamped = _LONG.unpack_from(head, PHY_POS_POSITION)[0]
            if magic != MESSAGE_MAGIC_CODE or stamped != commit_log_offset or size < FIXED_OVERHEAD:
                raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND,
                                  f"no message starts at commit-log offset {commit_log_offset}",
                                  commitLogOffset=commit_log_offset)
        return decode_message(self.commit_log.get_data(commit_log_offset, size), commit_log_offset)

    def store_time_of(self, phys: int, size: int) -> int | None:
        try:
            return _LONG.unpack_from(self.commit_log.get_data(phys + STORE_TIMESTAMP_POSITION, 8))[0]
        except BrokerError:
            return None

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """First queue offset stored at or after `ts_ms` (max offset if none)."""
        cq = self._queue(topic, queue_id)
        return cq.offset_for_timestamp(ts_ms, self.store_time_of) if cq else 0

    async def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Long polling: True once the queue's max offset passes `offset`, False after `timeout_s`."""
        key = (topic, queue_id)
        deadline = asyncio.get_running_loop().time() + max(0.0, timeout_s)
        while True:
            cq = self.consume_queues.get(key)
            if cq is not None and cq.max_offset > offset:
                return True
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            ev = self._arrivals.get(key)
            if ev is None:
                ev = self._arrivals[key] = asyncio.Event()
            try:
                async with asyncio.timeout(left):  # no extra task per waiter, unlike wait_for in 3.11
                    await ev.wait()
            except TimeoutError:
                return False
