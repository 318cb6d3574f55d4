"""`TransactionService`: transactional messages as RocketMQ's, with the end replicated atomically.

**Half** (the produce path, master): a transactional message (`TRAN_MSG=true`, a producer group in
`PGROUP`) is stored in `RMQ_SYS_TRANS_HALF_TOPIC`/0 with `REAL_TOPIC`/`REAL_QID` and
`__transactionId__` = its UNIQ_KEY (RocketMQ's `TransactionalMessageBridge`); consumers cannot see
it. The send answer carries the transaction id.

**End** (`end`, master): COMMIT writes ONE log entry with the real message (its topic and queue,
transaction properties removed) and the op record `{"op": "end", "outcome": "COMMIT"}`; ROLLBACK
writes the op record alone. The transaction table (`state.py`) applies the first end and ignores
later ones, so a repeated end answers the first outcome and the opposite one is a conflict —
RocketMQ's EndTransaction writes a second copy on a repeated commit (#5574) and commits after a
rollback check (#8158). Concurrent ends of one transaction on the master wait for each other.

**Check-back** (master): every second the service looks for open transactions older than
`transactionTimeOut` (or their `CHECK_IMMUNITY_TIME_IN_SECONDS`) not asked within
`transactionCheckInterval`; it replicates `{"op": "check", "times": n}` and then offers a check to
the producer group (`TransactionCheckHub`: HTTP producers long-poll it, the gRPC endpoint pushes it
over Telemetry as RecoverOrphanedTransactionCommand, group = topic there). After
`transactionCheckMax` checks the transaction is discarded (`outcome: DISCARD`). The counts are in
the log, so a failover neither resets nor repeats them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from broker.errors import BrokerCode, BrokerError
from broker.message import PROPERTY_UNIQ_KEY, DispatchInfo, Message, MessageExt, new_uniq_key
from broker.message_type import PROPERTY_TRANSACTION_PREPARED
from broker.transaction.state import (
    OUTCOME_STATE,
    HalfMessage,
    Resolution,
    TransactionState,
    TransactionTable,
)

if TYPE_CHECKING:
    from broker.store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
MAX_IMMUNITY_S = 3600  # gRPC's orphaned_transaction_recovery_duration bound
MAX_TRANSACTION_ID_LENGTH = 128
_HALF_ONLY = frozenset({PROPERTY_TRANSACTION_PREPARED, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
                        PROPERTY_CHECK_IMMUNITY_S, "TAGS", "KEYS", "IDEMPOTENCY_KEY"})
_CHECK_PERIOD_S = 1.0
# A resolved transaction answers a repeated end for this long (then TRANSACTION_NOT_FOUND): what
# every member keeps of it is bounded by the transaction rate times this window.
_RESOLVED_KEEP_MS = 300_000
_PRUNE_EVERY_MS = 10_000
_MAX_QUEUED_CHECKS = 10_000  # per producer group, waiting for a producer to ask
_CHECKS_PER_ROUND = 2_000  # transactions asked about in one round (one record)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """One check-back offered to a producer group: resolve `transaction_id` (commit or roll
    back). `message` is the half as stored (its REAL_TOPIC names the topic)."""

    transaction_id: str
    topic: str
    producer_group: str
    check_times: int
    message: MessageExt


class TransactionCheckHub:
    """Checks waiting for the producers of each group. HTTP producers long-poll `poll`; the gRPC
    endpoint takes them with `poll` too, per connected producer. A check is handed to one caller;
    if nobody resolves it, the next round offers it again."""

    def __init__(self) -> None:
        self._queues: dict[str, OrderedDict[str, TransactionCheck]] = {}
        self._events: dict[str, asyncio.Event] = {}

    def offer(self, check: TransactionCheck) -> None:
        q = self._queues.setdefault(check.producer_group, OrderedDict())
        q[check.transaction_id] = check  # a newer round replaces an unanswered older one
        q.move_to_end(check.transaction_id)
        while len(q) > _MAX_QUEUED_CHECKS:
            q.popitem(last=False)
        ev = self._events.get(check.producer_group)
        if ev is not None:
            ev.set()

    def forget(self, producer_group: str, transaction_id: str) -> None:
        q = self._queues.get(producer_group)
        if q is not None:
            q.pop(transaction_id, None)

    async def poll(self, producer_group: str, max_checks: int, wait_s: float) -> list[TransactionCheck]:
        """Up to `max_checks` checks for the group, waiting up to `wait_s` for the first."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            q = self._queues.get(producer_group)
            if q:
                out = []
                while q and len(out) < max_checks:
                    out.append(q.popitem(last=False)[1])
                return out
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return []
            ev = self._events.setdefault(producer_group, asyncio.Event())
            ev.clear()
            try:
                async with asyncio.timeout(left):
                    await ev.wait()
            except TimeoutError:
                return []

    def pending(self, producer_group: str) -> int:
        return len(self._queues.get(producer_group, ()))


class TransactionService:
    """Transactions of one broker. Callers: the produce path (`half_message`), the end route/RPC
    (`end`), the check poll route / Telemetry (`hub.poll`), the dispatcher (`on_unit`, op records,
    `rebuild`), the broker's lifecycle (`start`, `stop`)."""

    def __init__(
        self,
        store: DefaultMessageStore,
        *,
        timeout_ms: int,
        check_interval_ms: int,
        check_max: int,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.store = store
        self.timeout_ms = timeout_ms
        self.check_interval_ms = check_interval_ms
        self.check_max = check_max
        self.clock_ms = clock_ms
        self.table = TransactionTable()
        self.hub = TransactionCheckHub()
        self.checks_sent = 0
        self.discarded = 0
        self._ending: dict[str, asyncio.Future[None]] = {}
        self.scan_from = 0  # the half queue's first offset to rebuild from (from a state snapshot)
        self._pruned_ms = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def install(self) -> None:
        """Hook into the store (before it starts): the half topic's dispatch, the op records (as
        replicated state, in the store's state snapshots), the start-up rebuild, and a retention
        floor at the oldest open half."""
        self.store.register_dispatch_hook(HALF_TOPIC, self)
        self.store.register_system_state(OP_TOPIC, self)
        self.store.register_recovery_hook(self.rebuild)
        self.store.register_retention_floor(self.retention_floor)

    # ---- replicated state (the store's ReplicatedState) -----------------------------------------

    def apply_record(self, record: dict[str, Any]) -> None:
        self.table.apply_record(record)

    def snapshot(self) -> dict[str, Any]:
        """The op-record state, and where the halves still to be read start: halves below are
        resolved and their op records may be gone once the snapshot replaces them."""
        return {**self.table.snapshot(), "halvesFrom": self.table.low_water_mark(self._half_queue_end())}

    def restore(self, snapshot: dict[str, Any] | None) -> None:
        self.table.restore(snapshot or {})
        if snapshot:
            self.scan_from = max(self.scan_from, int(snapshot.get("halvesFrom", 0)))

    def _half_queue_end(self) -> int:
        cq = self.store.consume_queues.get((HALF_TOPIC, 0))
        return cq.max_offset if cq is not None else 0

    def retention_floor(self) -> int | None:
        """Retention keeps the log from the oldest open half on (None: no transaction open)."""
        cq = self.store.consume_queues.get((HALF_TOPIC, 0))
        if cq is None:
            return None
        lwm = self.table.low_water_mark(cq.max_offset)
        return cq.get_unit(lwm)[0] if cq.min_offset <= lwm < cq.max_offset else None

    # ---- admission -----------------------------------------------------------------------------

    def half_message(self, msg: Message, topic: str, queue_id: int | None,
                     where: str = "messages") -> Message:
        """The half stored for a transactional message; its UNIQ_KEY is the transaction id."""
        props = dict(msg.properties)
        group = props.get(PROPERTY_PRODUCER_GROUP) or topic  # gRPC's rule: the group is the topic
        props[PROPERTY_PRODUCER_GROUP] = group
        immunity = props.get(PROPERTY_CHECK_IMMUNITY_S)
        if immunity is not None and not (immunity.isdigit() and int(immunity) <= MAX_IMMUNITY_S):
            raise BrokerError(BrokerCode.INVALID_REQUEST, f"{PROPERTY_CHECK_IMMUNITY_S} must be "
                              f"0..{MAX_IMMUNITY_S} seconds, got {immunity[:40]!r}",
                              field=f"{where}.properties")
        txid = props.setdefault(PROPERTY_UNIQ_KEY, new_uniq_key())
        props[PROPERTY_TRANSACTION_ID] = txid
        props[PROPERTY_REAL_TOPIC] = topic
        if queue_id is not None:
            props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        return Message(HALF_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props, flag=msg.flag,
                       idempotency_key=msg.idempotency_key, born_timestamp=msg.born_timestamp,
                       born_host=msg.born_host)

    # ---- the dispatcher (every member, log order) --------------------------------------------

    def tags_code(self, info: DispatchInfo) -> int:
        return info.tags_code

    def on_unit(self, info: DispatchInfo) -> None:
        """A half message was dispatched."""
        half = self._half_of(info.properties, info.queue_offset, info.phys_offset, info.size,
                             info.store_timestamp)
        if half is not None:
            self.table.add_half(half)

    @staticmethod
    def _half_of(props: dict[str, str], offset: int, phys: int, size: int,
                 store_ms: int) -> HalfMessage | None:
        txid = props.get(PROPERTY_TRANSACTION_ID)
        if not txid:
            log.error("event=half_without_transaction_id offset=%d", offset)
            return None
        immunity = props.get(PROPERTY_CHECK_IMMUNITY_S, "0")
        return HalfMessage(txid, offset, phys, size, props.get(PROPERTY_PRODUCER_GROUP, ""),
                           props.get(PROPERTY_REAL_TOPIC, ""), store_ms,
                           immunity_ms=int(immunity) * 1000 if immunity.isdigit() else 0)

    def rebuild(self) -> None:
        """At start (op records already replayed): the halves from the half queue."""
        cq = self.store.consume_queues.get((HALF_TOPIC, 0))
        found = 0
        if cq is not None:
            offset = max(cq.min_offset, min(self.scan_from, cq.max_offset))
            while offset < cq.max_offset:
                units = cq.get_units(offset, min(4096, cq.max_offset - offset))
                for i, (phys, size, _) in enumerate(units):
                    if size <= 0:
                        continue
                    try:
                        ext = self.store.look_message_by_offset(phys, size)
                    except BrokerError as exc:
                        log.error("event=half_unreadable offset=%d code=%s", offset + i, exc.code)
                        continue
                    half = self._half_of(ext.properties, offset + i, phys, size, ext.store_timestamp)
                    if half is not None:
                        self.table.add_half(half)
                        found += 1
                offset += len(units)
        gone = self.table.drop_unmatched()
        log.info("event=transactions_rebuilt halves=%d open=%d unmatched_ops=%d", found,
                 self.table.open_count(), gone)

    # ---- end -----------------------------------------------------------------------------------

    async def end(self, topic: str, transaction_id: str, resolution: Resolution | str, *,
                  producer_group: str | None = None, from_check: bool = False) -> TransactionState:
        """Commit or roll back; returns the transaction's final state. A repeated end of the same
        kind answers it again; the opposite one is TRANSACTION_CONFLICT."""
        if (not isinstance(transaction_id, str) or not transaction_id.strip()
                or len(transaction_id) > MAX_TRANSACTION_ID_LENGTH):
            raise BrokerError(BrokerCode.INVALID_TRANSACTION_ID, "transaction id must be a non-empty string "
                              f"of at most {MAX_TRANSACTION_ID_LENGTH} characters", field="transactionId")
        if str(resolution).upper() not in (Resolution.COMMIT.value, Resolution.ROLLBACK.value):
            raise BrokerError(BrokerCode.INVALID_REQUEST, "resolution must be COMMIT or ROLLBACK",
                              field="resolution")
        resolution = Resolution(str(resolution).upper())
        if not self.store.is_master:
            raise self.store.not_master_error()
        while (busy := self._ending.get(transaction_id)) is not None:
            await asyncio.shield(busy)
        half = self._lookup(topic, transaction_id, producer_group)
        wanted = OUTCOME_STATE[resolution]
        if half.state is not TransactionState.OPEN:
            if half.state is wanted:
                return half.state
            raise BrokerError(BrokerCode.TRANSACTION_CONFLICT, f"transaction {transaction_id} is already "
                              f"{half.state.value}", transactionId=transaction_id, state=half.state.value)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ending[transaction_id] = fut
        try:
            await self._write_end(half, resolution, from_check)
        finally:
            del self._ending[transaction_id]
            fut.set_result(None)
        self.hub.forget(half.producer_group, transaction_id)
        log.info("event=transaction_end txid=%s topic=%s outcome=%s fromCheck=%s", transaction_id, topic,
                 resolution.value, from_check)
        return half.state if half.state is not TransactionState.OPEN else wanted

    def find(self, transaction_id: str) -> tuple[HalfMessage, MessageExt] | None:
        """A transaction by its id (its message's UNIQ_KEY) and its half message, while this
        member knows it (open ones, resolved ones until pruned)."""
        half = self.table.get(transaction_id)
        if half is None:
            return None
        try:
            return half, self.store.look_message_by_offset(half.phys, half.size)
        except BrokerError as exc:
            log.error("event=half_unreadable offset=%d code=%s", half.offset, exc.code)
            return None

    def _lookup(self, topic: str, transaction_id: str, producer_group: str | None) -> HalfMessage:
        half = self.table.get(transaction_id)
        if half is None or half.topic != topic:
            raise BrokerError(BrokerCode.TRANSACTION_NOT_FOUND, f"no transaction {transaction_id} of topic "
                              f"{topic!r} on this broker", transactionId=transaction_id)
        if producer_group and half.producer_group and producer_group != half.producer_group:
            raise BrokerError(BrokerCode.TRANSACTION_NOT_FOUND, f"transaction {transaction_id} belongs to "
                              f"another producer group", transactionId=transaction_id)
        return half

    async def _write_end(self, half: HalfMessage, resolution: Resolution, from_check: bool) -> None:
        record = {"op": "end", "txid": half.txid, "outcome": resolution.value, "fromCheck": from_check,
                  "atMs": self.clock_ms()}
        if resolution is not Resolution.COMMIT:
            await self.store.append_system_record(OP_TOPIC, record)
            return
        ext = self.store.look_message_by_offset(half.phys, half.size)
        real = self.real_message(ext)
        op = Message(OP_TOPIC, orjson.dumps(record), properties={PROPERTY_UNIQ_KEY: new_uniq_key()})
        await self.store.put_messages_atomic([real, (OP_TOPIC, 0, op)])

    def real_message(self, ext: MessageExt) -> tuple[str, int | None, Message]:
        """The message a commit delivers (its topic, queue and properties), from its half `ext`."""
        props = {k: v for k, v in ext.properties.items() if k not in _HALF_ONLY}
        topic = ext.properties.get(PROPERTY_REAL_TOPIC, "")
        qid_raw = ext.properties.get(PROPERTY_REAL_QUEUE_ID)
        queue_id = int(qid_raw) if qid_raw is not None and qid_raw.isdigit() else None
        cfg = self.store.topics.get(topic)
        if queue_id is not None and cfg is not None and queue_id >= cfg.write_queue_nums:
            queue_id %= cfg.write_queue_nums
        # Its UNIQ_KEY (the transaction id) as its idempotency key, as a fired timer's message.
        return topic, queue_id, Message(topic, ext.body, tags=ext.tags, keys=ext.keys, properties=props,
                                        flag=ext.flag, idempotency_key=ext.uniq_key,
                                        born_timestamp=ext.born_timestamp, born_host=ext.born_host)

    # ---- check-back (master) --------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transaction-check")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), _CHECK_PERIOD_S)
                return
            except TimeoutError:
                pass
            self.prune(self.clock_ms())  # every member: resolved transactions leave memory
            if not self.store.is_master:
                continue
            try:
                await self.check_round()
            except BrokerError as exc:
                log.warning("event=transaction_check_round_failed code=%s detail=%s", exc.code, exc.detail)
            except Exception:
                log.exception("event=transaction_check_round_failed")

    async def check_round(self) -> None:
        """One round: discard those asked `transactionCheckMax` times, ask the others that are due."""
        now = self.clock_ms()
        plan = self.table.due_checks(now, self.timeout_ms, self.check_interval_ms, self.check_max)
        for half in plan.discard:
            if half.txid in self._ending:
                continue
            await self.store.append_system_record(OP_TOPIC, {"op": "end", "txid": half.txid,
                                                             "outcome": "DISCARD", "fromCheck": True,
                                                             "atMs": now})
            self.hub.forget(half.producer_group, half.txid)
            self.discarded += 1
            log.warning("event=transaction_discarded txid=%s topic=%s checks=%d", half.txid, half.topic,
                        half.check_times)
        asked = [h for h in plan.check if h.txid not in self._ending][:_CHECKS_PER_ROUND]
        if asked:  # counted in the log before anyone is asked
            times = {h.txid: h.check_times + 1 for h in asked}
            await self.store.append_system_record(OP_TOPIC, {"op": "checks", "atMs": now, "times": times})
        for half in asked:
            try:
                ext = self.store.look_message_by_offset(half.phys, half.size)
            except BrokerError as exc:
                log.error("event=half_unreadable txid=%s code=%s", half.txid, exc.code)
                continue
            check = TransactionCheck(half.txid, half.topic, half.producer_group, half.check_times, ext)
            self.hub.offer(check)
            self.checks_sent += 1

    def prune(self, now: int) -> None:
        """Now and then: forget transactions resolved `_RESOLVED_KEEP_MS` ago (below the oldest
        open half, so a start-up rescan from a state snapshot never meets them again)."""
        if now - self._pruned_ms < _PRUNE_EVERY_MS:
            return
        self._pruned_ms = now
        self.table.prune(self.table.low_water_mark(1 << 62), now - _RESOLVED_KEEP_MS)
