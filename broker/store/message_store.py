"""`DefaultMessageStore`: the broker's store — one façade over a commit log and the services on it.

The commit log (`broker.store.base.CommitLog`) is the local `LocalCommitLog` or, with
`enableDLegerCommitLog`, a `DLedgerCommitLog`; nothing here asks which. Around it, one idea each:

- `PutMessageService` (`put_service.py`): validation, idempotency, append, answer after commit.
- `ReputMessageService` (`reput.py`): committed messages → consume queues, in log order, on every
  member; applies system records (`SystemRecords`), fills the idempotency table, wakes waiters.
- `GetMessageService` (`get_service.py`): reads by queue offset, by commit-log offset, by time.
- `LongPollingService` (`long_polling.py`): pulls that wait for a queue to grow.
- `ConsumeQueueStore` (`consume_queue_store.py`): the consume queues under
  `{storePathRootDir}/consumequeue/{topic}/{queueId}/`.
- `SystemRecords` (`system_state.py`) and `StateSnapshotService` (`state_snapshot.py`): broker
  state replicated as records in the log, re-written as a snapshot ahead of retention.

This class owns the lifecycle: recovery at start (consume queues cut past the end of the log,
dispatch resumed at the least advanced queue or the dispatch checkpoint, the topic-queue table
rebuilt from the queues, the last state snapshot and the system records after it replayed, the
idempotency table rebuilt), the once-a-second flush of the consume queues with the checkpoint
after it, state snapshots and retention housekeeping (nothing deleted at or after `keep_from()`).
Its public methods are what the layers above call; see `docs/INTERFACES.md` (broker store).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError
from broker.message import KeyRun, Message, MessageExt
from broker.role import BrokerRoleState
from broker.store import store_recovery
from broker.store.base import CommitLog, DispatchHook
from broker.store.commitlog import LocalCommitLog
from broker.store.consume_queue import ConsumeQueue
from broker.store.consume_queue_store import ConsumeQueueStore, QueueKey
from broker.store.get_service import DEFAULT_PULL_BYTES, BuildMessage, GetMessageService, GetResult
from broker.store.long_polling import LongPollingService
from broker.store.offsets import ConsumerOffsetManager, IdempotencyTable, PutResult
from broker.store.put_service import PutMessageService
from broker.store.reput import ReputMessageService
from broker.store.state_snapshot import StateSnapshotService
from broker.store.system_state import BrokerMembers, ReplicatedState, SystemRecords
from broker.topics import (
    SYS_BROKER_MEMBERS,
    SYS_CONSUMER_OFFSETS,
    SYS_TOPIC_CONFIG,
    TopicConfigManager,
    validate_topic,
)

if TYPE_CHECKING:
    from broker.filter import MessageFilter

log = logging.getLogger(__name__)

__all__ = ["DefaultMessageStore", "GetResult", "PutResult"]

_FLUSH_INTERVAL_S = 1.0

RetentionFloor = Callable[[], int | None]
"""floor(): retention keeps the log from this position on (None: no constraint now)."""


class DefaultMessageStore:
    """The broker's store. Callers: the controller (lifecycle), the HTTP routes and the services
    above (puts, reads, long polls, topics, offsets), the role-change handler (catch-up)."""

    def __init__(self, config: BrokerConfig, commit_log: CommitLog | None = None,
                 role: BrokerRoleState | None = None) -> None:
        self.config = config
        self.commit_log: CommitLog = commit_log if commit_log is not None else LocalCommitLog(config)
        self.role = role if role is not None else BrokerRoleState.master(config.broker_id)
        self.dledger = bool(config.enable_dledger_commit_log)  # for /status; nothing here branches on it
        self.topics = TopicConfigManager(config.default_topic_queue_nums, config.auto_create_topic_enable)
        self.offsets = ConsumerOffsetManager()
        self.idempotency = IdempotencyTable(config.idempotency_window_ms, config.idempotency_max_keys)
        self.members = BrokerMembers()
        self.system = SystemRecords()
        self.system.register_state(SYS_TOPIC_CONFIG, self.topics, self._apply_topic_record)
        self.system.register_state(SYS_CONSUMER_OFFSETS, self.offsets)
        self.system.register_state(SYS_BROKER_MEMBERS, self.members)
        self.queues = ConsumeQueueStore(os.path.join(config.store_path_root_dir, "consumequeue"),
                                        config.mapped_file_size_consume_queue)
        self.long_polling = LongPollingService(self.queues)
        self.reput = ReputMessageService(self.queues, self.topics, self.system, self.idempotency,
                                         self.long_polling, self.commit_log.topic_queue_table)
        self.gets = GetMessageService(self.topics, self.queues, self.commit_log)
        self.puts = PutMessageService(config, self.topics, self.idempotency, self.commit_log, self.reput,
                                      self.role, self.not_master_error)
        self.snapshots = StateSnapshotService(config, self.system, self.puts, self.reput, self.commit_log,
                                              self.role)
        self.topics.set_writer(self.puts.append_system_record)
        self.topics.on_delete = self._drop_topic
        self.offsets.set_writer(self.puts.append_system_record)
        self.checkpoint_path = os.path.join(config.store_path_root_dir, "dispatchcheckpoint")
        self._retention_floors: list[RetentionFloor] = []
        self._flush_task: asyncio.Task[None] | None = None
        self._checkpointed = -1
        self._stopping = asyncio.Event()
        self._recovery_hooks: list[Callable[[], None]] = []
        self.started = False

    # ---- lifecycle ----------------------------------------------------------------------------

    def register_system_state(self, sys_topic: str, state: ReplicatedState) -> None:
        """Keep `state` as records of `sys_topic` (JSON bodies written with `append_system_record`):
        applied on every member in log order and on replay at start, and in every state snapshot,
        so it outlives retention. Register before `start()`."""
        self.system.register_state(sys_topic, state)

    def register_retention_floor(self, floor: RetentionFloor) -> None:
        """Retention keeps the log from `floor()` on as well (state a layer above keeps in it)."""
        self._retention_floors.append(floor)

    def keep_from(self) -> int:
        """Retention deletes no log data at or after this: undispatched messages, the last state
        snapshot and the records after it, and what registered floors ask for."""
        keep = min(self.reput.reput_offset, self.snapshots.keep_from())
        for floor in self._retention_floors:
            pos = floor()
            if pos is not None:
                keep = min(keep, pos)
        return keep

    def register_dispatch_hook(self, topic: str, hook: DispatchHook) -> None:
        """Let `hook` index the messages of `topic` (a broker topic) as they are dispatched, on
        every member in log order, and choose their consume-queue tags code. Register before
        `start()`; units already in the consume queue at start are the recovery hook's to read."""
        validate_topic(topic, allow_system=True)
        self.reput.hooks[topic] = hook

    def register_recovery_hook(self, hook: Callable[[], None]) -> None:
        """Call `hook()` at start once the consume queues are recovered and the system records
        replayed, before dispatch resumes (a service rebuilds its index from its queues there)."""
        self._recovery_hooks.append(hook)

    async def start(self) -> None:
        """Recover consume queues and the commit log, replay system records, start dispatching."""
        self.queues.load()
        await self.commit_log.prepare(self.reput, self.keep_from)
        data_end = self.commit_log.data_end
        self.queues.truncate_dirty(data_end)
        self._resume_dispatch(data_end)
        # Every unit a consume queue still holds was dispatched, so committed: readable (system
        # record replay, pulls) up to the furthest queue's end before the leader is known again.
        self.reput.recovered_end = self.queues.max_phys_end()
        self.queues.correct_min_offsets(self.commit_log.min_offset)
        self.recover_topic_queue_table()
        read = self.commit_log.get_data
        store_recovery.replay_system_records(self.queues, read, self.system)
        self._register_topics_of_queues()
        store_recovery.rebuild_idempotency(self.queues, read, self.gets.store_time_of,
                                           self.config.idempotency_window_ms, self.reput.remember_idempotency)
        self.reput.end_key_run()
        for hook in self._recovery_hooks:
            hook()
        try:
            await self.commit_log.start()
        except BaseException:
            self.queues.close_all()
            raise
        self._flush_task = asyncio.get_running_loop().create_task(self._flush_loop())
        self.puts.started = self.started = True
        log.info("event=store_started broker=%s mode=%s reput_offset=%d queues=%d topics=%d",
                 self.config.broker_name, "dledger" if self.dledger else "local", self.reput.reput_offset,
                 len(self.queues.queues), len(self.topics.all()))

    def _register_topics_of_queues(self) -> None:
        # A queue on disk whose topic no record names (system topics; data older than the records
        # left) is served under a default config — unless all it holds predates the topic's delete.
        for (topic, queue_id), cq in self.queues.items():
            if topic not in self.topics and cq.max_phys_end > self.topics.deleted_at.get(topic, -1):
                self.topics.ensure_from_data(topic, queue_id)

    def _resume_dispatch(self, data_end: int) -> None:
        # Resume at the queue that is furthest behind: after a power loss each consume queue keeps
        # only what it fsynced (once a second), so units below another queue's end may be gone.
        # Units still present are skipped by put_unit (found by the fault suite, row 8). But an
        # idle queue would pin that point far back (a restart re-dispatched everything since its
        # last message), so the checkpoint written after each flush of all queues moves it up:
        # every unit below it is on disk.
        min_offset = self.commit_log.min_offset
        resume = max(self.queues.min_phys_end(default=min_offset), min_offset)
        checkpoint = store_recovery.read_dispatch_checkpoint(self.checkpoint_path)
        if checkpoint is not None:
            resume = max(resume, min(checkpoint, data_end))
        self.reput.reput_offset = resume
        log.info("event=dispatch_resume broker=%s from=%d checkpoint=%s data_end=%d",
                 self.config.broker_name, resume, checkpoint, data_end)

    async def shutdown(self) -> None:
        self._stopping.set()
        await self.snapshots.stop()
        await self.commit_log.shutdown()
        if self._flush_task is not None:
            await self._flush_task
        self.reput.fail_waiters(BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "store shut down"))
        queues = list(self.queues.values())
        store_recovery.flush_queues(queues, (self.checkpoint_path, self.reput.reput_offset))
        self.queues.close_all()
        log.info("event=store_shutdown broker=%s reput_offset=%d", self.config.broker_name,
                 self.reput.reput_offset)

    async def _flush_loop(self) -> None:
        """Consume queues are page cache between fsyncs: flush them once a second. Also a state
        snapshot when one is due, and a retention pass every `cleanResourceInterval`."""
        loop = asyncio.get_running_loop()
        next_clean = loop.time() + self.config.clean_resource_interval / 1000
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), _FLUSH_INTERVAL_S)
            except TimeoutError:
                pass
            self.snapshots.maybe_write()
            if loop.time() >= next_clean:
                next_clean = loop.time() + self.config.clean_resource_interval / 1000
                await self.clean_expired()
            mark = self.reput.reput_offset  # before the flush: every unit below it is in a map now
            dirty = self.queues.dirty()
            if dirty or mark != self._checkpointed:
                await asyncio.to_thread(store_recovery.flush_queues, dirty, (self.checkpoint_path, mark))
                self._checkpointed = mark

    async def clean_expired(self) -> None:
        """One retention pass: a due state snapshot is written first (the state in the files about
        to go is re-written ahead of them), expired commit-log files go (a DLedger log deletes its
        own), then consume-queue units pointing below the log's first byte are no longer served."""
        await self.snapshots.write_if_due()
        self.commit_log.delete_expired()
        self.queues.correct_min_offsets(self.commit_log.min_offset)

    def recover_topic_queue_table(self) -> None:
        """The next queue offset of every queue = its consume queue's max offset (a new master
        calls this once everything committed is dispatched)."""
        table = self.commit_log.topic_queue_table
        table.clear()
        table.update({key: cq.max_offset for key, cq in self.queues.items()})

    # ---- role -----------------------------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        return self.role.is_master

    @property
    def master_addr(self) -> str | None:
        """HTTP address of the master of this broker set, when known."""
        if self.role.is_master:
            return self.config.broker_addr
        leader = self.commit_log.leader_id
        return self.members.addrs.get(leader) if leader else None

    @property
    def member_addrs(self) -> dict[str, str]:
        """DLedger selfId → HTTP address of every member that has been master."""
        return self.members.addrs

    def not_master_error(self) -> BrokerError:
        """Why this broker refuses a write: its disk (DISK_FULL, naming no one else), or NOT_MASTER
        naming the master's address when known."""
        refusal = self.commit_log.write_refusal()
        if refusal is not None:
            return refusal
        addr = self.master_addr
        return BrokerError(BrokerCode.NOT_MASTER,
                           f"broker {self.config.broker_name} ({self.config.broker_addr}) is a slave; "
                           f"write to the master{' at ' + addr if addr else ' (being elected)'}",
                           masterAddr=addr)

    def dispatch_caught_up(self) -> bool:
        """Everything committed is dispatched (and nothing uncommitted is in the local log) — the
        condition RocketMQ's role-change handler waits for."""
        return self.commit_log.dispatch_caught_up()

    # ---- producing ------------------------------------------------------------------------------

    # The awaitables of the services, handed out as they are (no coroutine of ours around them:
    # a single produce is ~15 us, and each layer of coroutine costs several percent of it).

    def put_messages(self, topic: str, msgs: list[Message], queue_id: int | None = None,
                     *, _system: bool = False, await_dispatch: bool = True,
                     key_run: KeyRun | None = None) -> Awaitable[list[PutResult]]:
        """See `PutMessageService.put_messages`."""
        return self.puts.put_messages(topic, msgs, queue_id, _system=_system, await_dispatch=await_dispatch,
                                      key_run=key_run)

    def put_messages_atomic(self, items: list[tuple[str, int | None, Message]]) -> Awaitable[list[PutResult]]:
        """See `PutMessageService.put_atomic`."""
        return self.puts.put_atomic(items)

    def append_system_record(self, sys_topic: str, record: dict[str, Any], *,
                             force: bool = False) -> Awaitable[None]:
        """See `PutMessageService.append_system_record`."""
        return self.puts.append_system_record(sys_topic, record, force=force)

    def wait_dispatched(self, phys_end: int, timeout_s: float = 10.0) -> Awaitable[None]:
        """Return once the dispatcher has passed commit-log position `phys_end`."""
        return self.reput.wait_dispatched(phys_end, timeout_s)

    @property
    def reput_offset(self) -> int:
        """Everything below this commit-log offset is dispatched."""
        return self.reput.reput_offset

    # ---- reading --------------------------------------------------------------------------------

    @property
    def consume_queues(self) -> dict[QueueKey, ConsumeQueue]:
        return self.queues.queues

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.gets.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.gets.max_offset(topic, queue_id)

    def queue_offsets(self, topic: str) -> list[tuple[int, int, int]]:
        """[(queueId, minOffset, maxOffset)] of every queue of `topic`."""
        return self.gets.queue_offsets(topic)

    def get_messages(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
                     max_bytes: int = DEFAULT_PULL_BYTES,
                     message_filter: MessageFilter | None = None) -> GetResult:
        """See `GetMessageService.get_messages`."""
        return self.gets.get_messages(topic, queue_id, offset, max_messages, max_bytes, message_filter)

    def read_messages(self, topic: str, queue_id: int, offset: int, max_messages: int,
                      max_bytes: int, message_filter: MessageFilter | None,
                      build: BuildMessage) -> GetResult:
        """See `GetMessageService.read_messages`."""
        return self.gets.read_messages(topic, queue_id, offset, max_messages, max_bytes, message_filter,
                                       build)

    def look_message_by_offset(self, commit_log_offset: int, size: int | None = None) -> MessageExt:
        """See `GetMessageService.look_message_by_offset`."""
        return self.gets.look_message_by_offset(commit_log_offset, size)

    def store_time_of(self, phys: int, size: int) -> int | None:
        return self.gets.store_time_of(phys, size)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """First queue offset stored at or after `ts_ms` (max offset if none)."""
        return self.gets.offset_for_timestamp(topic, queue_id, ts_ms)

    def wait_for_message(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> Awaitable[bool]:
        """Long polling: True once the queue's max offset passes `offset`, False after `timeout_s`."""
        return self.long_polling.wait_for_message(topic, queue_id, offset, timeout_s)

    # ---- replicated state -----------------------------------------------------------------------

    def _apply_topic_record(self, record: dict[str, Any]) -> None:
        self.topics.apply_record(record, self.system.record_phys)

    def _drop_topic(self, topic: str) -> None:
        """A topic was deleted: drop its committed offsets and its queues. While replaying at start
        the queues stay (those on disk may belong to a later re-creation); the offsets go, as the
        records are replayed in log order and a re-creation's commits come after the delete."""
        self.offsets.drop_topic(topic)
        if self.system.replaying:
            return
        table = self.commit_log.topic_queue_table
        for key in self.queues.drop_topic(topic):
            table.pop(key, None)

