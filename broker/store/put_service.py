"""`PutMessageService`: storing messages — validation, queue choice, idempotency, append, answer.

A put checks the topic (auto-created when `autoCreateTopicEnable`), its write permission and the
queue; answers a repeated idempotency key with its first result (a key whose first put is still in
flight waits for it); encodes the rest (RocketMQ's v1 layout) and appends them through the commit
log, all to one queue; and answers once they are committed and dispatched here, so a pull right
after the answer sees them. System records (replicated broker state) are written the same way.
Callers: the produce routes and the services above through `DefaultMessageStore`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from operator import attrgetter
from typing import Any

import orjson

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError
from broker.message import (
    MAX_KEY_COUNTER,
    PROPERTY_IDEMPOTENCY_KEY,
    PROPERTY_IDEMPOTENCY_KEY_RUN,
    PROPERTY_UNIQ_KEY,
    KeyRun,
    Message,
    encode_batch,
    encode_message,
    key_sequence,
    message_id_prefix,
    new_uniq_key,
)
from broker.role import BrokerRoleState
from broker.store.base import CommitLog, Placed
from broker.store.offsets import IdempotencyTable, PutResult
from broker.store.reput import ReputMessageService
from broker.topics import TopicConfig, TopicConfigManager, is_system_topic, validate_topic

log = logging.getLogger("broker.store.message_store")

_OWN_DISPATCH_WAIT_S = 2.0
_idempotency_key = attrgetter("idempotency_key")
# Puts whose keys stay claimed until the dispatcher passes them; past this many it is stuck (its
# failure is logged) and keys go to the table at once, which bounds the memory they hold.
_MAX_PUTS_AWAITING_DISPATCH = 10_000


class _Claim:
    """The new idempotency keys of one put in flight (one object per put, not per key): a later
    put of one of them waits on `future`, which resolves to the claiming put's stored results,
    `keys[j]` being the key of result j (None: a message without a key) — or, for a put of a key
    run, `run`'s key j, for `n` messages."""

    __slots__ = ("future", "keys", "n", "run", "topic")

    def __init__(self, topic: str, keys: list[str | None], run: KeyRun | None = None, n: int = 0) -> None:
        self.topic = topic
        self.keys = keys
        self.run = run
        self.n = n
        self.future: asyncio.Future[list[PutResult]] = asyncio.get_running_loop().create_future()

    def holds(self, prefix: str, first: int, last: int) -> bool:
        """Whether this run claim's keys include one of `prefix` + `first` … `last`."""
        run = self.run
        return run is not None and run.prefix == prefix and run.first <= last and first < run.first + self.n

    async def result_of(self, key: str) -> PutResult:
        """The claiming put's result for `key` (raises what that put raised)."""
        results = await self.future
        if self.run is not None:
            seq = key_sequence(key)
            assert seq is not None
            return results[seq[1] - self.run.first]
        return results[self.keys.index(key)]


# A message of a put whose key another put (or an earlier message of this one) is storing: its
# index, the claim, and the key.
_Wait = tuple[int, _Claim, str]


class SystemWriteGate:
    """System-record writes in flight, and a way to hold them all back: a state snapshot must
    be written with none in flight, so it holds exactly the state at its place in the log."""

    def __init__(self) -> None:
        self._inflight = 0
        self._drained = asyncio.Event()
        self._open = asyncio.Event()
        self._open.set()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        """One system-record write (waits while the gate is held)."""
        while not self._open.is_set():
            await self._open.wait()
        self._inflight += 1
        try:
            yield
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """No system-record write in flight or started until the block ends (one holder at a time)."""
        self._open.clear()
        try:
            while self._inflight:
                self._drained.clear()
                await self._drained.wait()
            yield
        finally:
            self._open.set()


class PutMessageService:
    """Puts. State: the idempotency keys in flight and the round-robin queue choice per topic."""

    def __init__(self, config: BrokerConfig, topics: TopicConfigManager, idempotency: IdempotencyTable,
                 commit_log: CommitLog, reput: ReputMessageService, role: BrokerRoleState,
                 not_master_error: Callable[[], BrokerError]) -> None:
        self.config = config
        self.topics = topics
        self.idempotency = idempotency
        self.commit_log = commit_log
        self.reput = reput
        self.role = role
        self.not_master_error = not_master_error
        self.started = False  # set by the store once it has recovered
        self.system_gate = SystemWriteGate()
        self._pending: dict[str, dict[str, _Claim]] = {}  # topic → {key: the claim of the put storing it}
        self._pending_runs: dict[str, list[_Claim]] = {}  # topic → the claims of puts storing key runs
        self._round_robin: dict[str, int] = {}

    async def put_messages(self, topic: str, msgs: list[Message], queue_id: int | None = None,
                           *, _system: bool = False, await_dispatch: bool = True,
                           key_run: KeyRun | None = None) -> list[PutResult]:
        """Store a batch (all to one queue) and return once committed and, with `await_dispatch`,
        dispatched here. A message whose idempotency key was stored within `idempotencyWindowMs`
        is not stored again: its first result is returned. Raises BrokerError; on an error nothing
        of the batch is stored.

        `key_run` gives the messages (which then carry no key of their own) the keys of a run:
        claimed, stored (on the first message of each log entry only: IDEMPOTENCY_KEY and
        IDEMPOTENCY_KEY_RUN) and remembered as one; if one of them is stored or in flight already
        (a retry), each message gets its key and the put goes on as for keys one by one.

        `await_dispatch=False` is for a front-end that only answers its client with the results:
        a committed entry's dispatch is then already queued on the loop and runs before anything
        the client sends after the answer is read (`DLedgerEntryPusher` wakes the appender, then
        the state machine, in one pass), so the client still reads its writes. Code that goes on
        to read what the dispatch builds (consume queues, system state) awaits it."""
        cfg = self._writable_topic(topic, msgs, _system)
        if cfg is None:  # the topic's first message (no coroutine on the common path)
            cfg = await self.topics.writable(topic)
        queue_id = self._choose_queue(cfg, queue_id)
        results: list[PutResult | None] = [None] * len(msgs)
        waits: list[_Wait] = []
        if key_run is not None:
            to_store, claim, key_run, msgs = self._claim_run(topic, msgs, key_run, results, waits)
        else:
            to_store, claim = self._claim_keys(topic, msgs, results, waits)
        try:
            bufs, entry_starts = self._encode(msgs, to_store, queue_id, key_run)
        except BrokerError:
            if claim is not None:
                self._release(claim)
                claim.future.cancel()
            raise
        stored = (await self._append(topic, queue_id, bufs, entry_starts, claim, await_dispatch)
                  if bufs else [])
        if claim is not None:
            # The dispatcher remembers every key as it dispatches; until it has passed this
            # batch the keys stay claimed, so a retry meanwhile gets this put's results.
            end = stored[-1].commit_log_offset + stored[-1].store_size if stored else 0
            if self.reput.reput_offset >= end:
                self._release(claim)
            elif self.reput.callbacks_waiting < _MAX_PUTS_AWAITING_DISPATCH:
                self.reput.when_dispatched(end, self._release, claim)
            elif key_run is not None:  # the dispatcher is stuck: the keys go to the table now
                first = stored[0]
                self.idempotency.remember_key_run(
                    topic, first.queue_id, int(time.time() * 1000), bytes.fromhex(first.msg_id[:16]),
                    key_run.prefix, key_run.first, first.queue_offset,
                    [(r.commit_log_offset, r.store_size) for r in stored],
                )
                self._release(claim)
            else:
                now = int(time.time() * 1000)
                for i, res in zip(to_store, stored, strict=True):
                    key = msgs[i].idempotency_key
                    if key:
                        self.idempotency.remember(topic, key, res, now)
                self._release(claim)
            claim.future.set_result(stored)
        if not waits and len(stored) == len(msgs):
            return stored
        for i, res in zip(to_store, stored, strict=True):
            results[i] = res
        for i, held, key in waits:
            results[i] = await held.result_of(key)
        return [r for r in results if r is not None]

    def _writable_topic(self, topic: str, msgs: list[Message], system: bool) -> TopicConfig | None:
        """The topic's config, once every reason to refuse the whole put is ruled out (None: a
        topic to create first)."""
        validate_topic(topic, allow_system=system)
        if not msgs:
            raise BrokerError(BrokerCode.INVALID_REQUEST, "no messages to store", field="messages")
        if not system and not self.role.is_master:
            raise self.not_master_error()
        if not self.started:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "store is starting", outcome="refused")
        cfg = self.topics.get(topic)
        if cfg is None:
            if not system:
                return None
            self.topics.ensure_from_data(topic, 0)
            cfg = self.topics.get(topic)
            assert cfg is not None
        return cfg.check_writable()

    def _choose_queue(self, cfg: TopicConfig, queue_id: int | None) -> int:
        """The caller's queue, checked; or the next one round-robin over the write queues."""
        if queue_id is None:
            n = self._round_robin.get(cfg.topic_name, 0)
            self._round_robin[cfg.topic_name] = n + 1
            return n % cfg.write_queue_nums
        return cfg.check_write_queue(queue_id)

    def _claim_run(
        self, topic: str, msgs: list[Message], run: KeyRun, results: list[PutResult | None],
        waits: list[_Wait],
    ) -> tuple[list[int], _Claim | None, KeyRun | None, list[Message]]:
        """`_claim_keys` for a key run: claimed whole (one check of the table, one of the runs in
        flight) when none of its keys is stored or in flight — the run is then stored as one —
        else copies of the messages, each with its key, are sorted one by one (returned, with
        the run None)."""
        n = len(msgs)
        if key_sequence(run.key(0)) != (run.prefix, run.first) or run.first + n - 1 > MAX_KEY_COUNTER:
            raise BrokerError(BrokerCode.INVALID_REQUEST, "an idempotency key run needs 16 lower-case hex "
                              "digits of prefix and room for every message's counter below 2^64",
                              field="firstIdempotencyKey")
        if any(map(_idempotency_key, msgs)):
            raise BrokerError(BrokerCode.INVALID_REQUEST, "a message of a key run carries its own "
                              "idempotency key", field="idempotencyKey")
        last = run.first + n - 1
        in_flight = self._pending_runs.get(topic)
        if (
            self.idempotency.run_first_results(topic, run.prefix, run.first, n) is None
            and (in_flight is None or not any(c.holds(run.prefix, run.first, last) for c in in_flight))
            and (topic not in self._pending or self._pending[topic].keys().isdisjoint(
                [run.key(i) for i in range(n)]
            ))
        ):
            claim = _Claim(topic, [], run, n)
            if in_flight is None:
                self._pending_runs[topic] = [claim]
            else:
                in_flight.append(claim)
            return list(range(n)), claim, run, msgs
        keyed = run.keyed(msgs)
        to_store, claim = self._claim_keys(topic, keyed, results, waits)
        return to_store, claim, None, keyed

    def _claim_keys(self, topic: str, msgs: list[Message], results: list[PutResult | None],
                    waits: list[_Wait]) -> tuple[list[int], _Claim | None]:
        """Sort the batch by idempotency key: a key already stored gets its first result, a key
        in flight (in another put, or earlier in this one) waits for it, a new key is claimed.
        Returns the indexes of the messages to store and this put's claim (None: no new key)."""
        keyed = [m.idempotency_key for m in msgs]
        if not any(keyed):
            return list(range(len(msgs))), None
        all_keyed = all(keyed)
        hits = self.idempotency.first_results(topic, keyed if all_keyed else [k or "" for k in keyed])
        pending = self._pending.get(topic)
        runs_in_flight = self._pending_runs.get(topic)
        if hits is None and all_keyed and runs_in_flight is None:
            # The SDK's batch, the common case: every message keyed, every key new, none twice
            # and none in flight — claimed in C loops.
            claim = _Claim(topic, keyed)
            fresh = dict.fromkeys(keyed, claim)
            if len(fresh) == len(keyed) and (pending is None or pending.keys().isdisjoint(fresh.keys())):
                if pending is None:
                    self._pending[topic] = fresh
                else:
                    pending.update(fresh)
                return list(range(len(msgs))), claim
        to_store: list[int] = []
        claim = _Claim(topic, [])
        order = claim.keys  # the key of each message to store, in order
        if pending is None:
            pending = self._pending[topic] = {}
        for i, key in enumerate(keyed):
            if key:
                if hits is not None and i in hits:
                    results[i] = hits[i]
                    continue
                held = pending.get(key)
                if held is None and runs_in_flight is not None and (seq := key_sequence(key)) is not None:
                    held = next((c for c in runs_in_flight if c.holds(seq[0], seq[1], seq[1])), None)
                if held is not None:
                    waits.append((i, held, key))
                    continue
                pending[key] = claim
            to_store.append(i)
            order.append(key)
        if not pending:
            del self._pending[topic]
        return to_store, claim

    def _encode(self, msgs: list[Message], to_store: list[int], queue_id: int,
                key_run: KeyRun | None) -> tuple[list[bytearray], list[int] | None]:
        """The messages to store, encoded, and where their log entries start (None: the log's
        own split)."""
        batch = msgs if len(to_store) == len(msgs) else [msgs[i] for i in to_store]
        for m in batch:
            if not isinstance(m.body, bytes | bytearray):
                raise BrokerError(BrokerCode.INVALID_REQUEST, "message body must be bytes", field="body")
        now = int(time.time() * 1000)
        bufs = encode_batch(batch, queue_id=queue_id, store_host=self.config.broker_addr,
                            max_message_size=self.config.max_message_size, store_timestamp=now)
        if key_run is None:
            return bufs, None
        # A key run: the first message of each log entry the put fills carries its key and how
        # many messages of the entry follow it in the run; the others are stored as plain
        # messages (the dispatcher gives them their keys, never past the entry, so a run is
        # never read into another put's messages). The entries are cut here, by the log's rule,
        # with each head's own size (its count is 5 digits, so its size is known before it).
        limit = self.commit_log.pack_bytes
        starts: list[int] = []
        size = limit
        for i, b in enumerate(bufs):
            if size + len(b) > limit:
                starts.append(i)
                bufs[i] = self._run_head(batch[i], key_run.key(i), 0, queue_id, now)
                size = len(bufs[i])
            else:
                size += len(b)
        for a, b in zip(starts, [*starts[1:], len(bufs)], strict=True):
            bufs[a] = self._run_head(batch[a], key_run.key(a), b - a, queue_id, now)
        return bufs, starts

    def _run_head(self, msg: Message, key: str, count: int, queue_id: int, now: int) -> bytearray:
        props = msg.all_properties()
        props[PROPERTY_IDEMPOTENCY_KEY] = key
        props[PROPERTY_IDEMPOTENCY_KEY_RUN] = f"{count:05d}"
        return encode_message(msg, queue_id=queue_id, queue_offset=0, phys_offset=0,
                              store_host=self.config.broker_addr, store_timestamp=now, props=props,
                              max_message_size=self.config.max_message_size)

    async def _append(self, topic: str, queue_id: int, bufs: list[bytearray], entry_starts: list[int] | None,
                      claim: _Claim | None, await_dispatch: bool) -> list[PutResult]:
        """Append; if it fails, the puts waiting on keys this one claimed fail with it."""
        try:
            placed = await self.commit_log.put(topic, queue_id, bufs, entry_starts)
        except BrokerError as exc:
            if exc.code != BrokerCode.NOT_MASTER:
                self._fail_claim(claim, exc)
                raise
            err = self.not_master_error()  # names the master: the store knows the members
            err.detail = f"{err.detail} ({exc.detail})"
            self._fail_claim(claim, err)
            raise err from None
        except BaseException as exc:
            self._fail_claim(claim, BrokerError(
                BrokerCode.TIMEOUT, f"the first put with this idempotency key was interrupted "
                f"({type(exc).__name__}); the outcome is unknown, retry", outcome="unknown"))
            raise
        if await_dispatch:
            await self._await_own_dispatch(placed)
        return self._answer(placed)

    async def put_atomic(self, items: list[tuple[str, int | None, Message]]) -> list[PutResult]:
        """Store messages of several topics and queues — (topic, queue id or None, message) — in
        ONE log entry: committed together or not at all, answered once committed and dispatched
        here. Every topic must exist (a broker topic is registered on first use): no
        auto-creation. No idempotency keys: the callers (a timer firing with its delete marker, a
        transaction's commit with its op record) guard against repeats with replicated state.
        Master only. Raises BrokerError; on an error nothing is stored."""
        if not items:
            raise BrokerError(BrokerCode.INVALID_REQUEST, "no messages to store", field="messages")
        if not self.role.is_master:
            raise self.not_master_error()
        if not self.started:
            raise BrokerError(BrokerCode.SERVICE_UNAVAILABLE, "store is starting")
        bufs = []
        for topic, queue_id, msg in items:
            system = is_system_topic(topic)
            validate_topic(topic, allow_system=system)
            cfg = self.topics.get(topic)
            if cfg is None and system:
                self.topics.ensure_from_data(topic, 0)
                cfg = self.topics.get(topic)
            if cfg is None:
                raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
            cfg.check_writable()
            bufs.append(encode_message(msg, queue_id=self._choose_queue(cfg, queue_id), queue_offset=0,
                                       phys_offset=0, store_host=self.config.broker_addr,
                                       max_message_size=self.config.max_message_size))
        if not any(topic in self.reput.system for topic, _, _ in items):
            placed = await self._put_many(bufs)
            await self._await_own_dispatch(placed)
            return self._answer(placed)
        # A system record among them (a transaction's op record): a system-record write, held
        # back while a state snapshot is taken, so the snapshot is the state at its place.
        async with self.system_gate.write():
            placed = await self._put_many(bufs)
            await self._await_own_dispatch(placed)
            await self.reput.wait_dispatched(placed[-1].phys + placed[-1].size)
            return self._answer(placed)

    async def _put_many(self, bufs: list[bytearray]) -> list[Placed]:
        try:
            return await self.commit_log.put_many(bufs)
        except BrokerError as exc:
            if exc.code != BrokerCode.NOT_MASTER:
                raise
            err = self.not_master_error()
            err.detail = f"{err.detail} ({exc.detail})"
            raise err from None

    async def _await_own_dispatch(self, placed: list[Placed]) -> None:
        """Committed; wait (briefly) for our own dispatcher too (the local log has dispatched
        already). A slow dispatch never fails the put."""
        last = placed[-1]
        if self.reput.reput_offset < last.phys + last.size:
            try:
                await self.reput.wait_dispatched(last.phys + last.size, timeout_s=_OWN_DISPATCH_WAIT_S)
            except BrokerError:
                log.warning("event=dispatch_lagging phys=%d reput_offset=%d", last.phys,
                            self.reput.reput_offset)

    def _answer(self, placed: list[Placed]) -> list[PutResult]:
        prefix = message_id_prefix(self.config.broker_addr)
        return [PutResult(f"{prefix}{phys:016X}", qid, qoff, phys, size)  # create_message_id, inlined
                for (phys, size, qid, qoff) in placed]

    def _release(self, claim: _Claim) -> None:
        """The claiming put is over: its keys are no longer in flight."""
        if claim.run is not None:
            runs = self._pending_runs.get(claim.topic)
            if runs is not None and claim in runs:
                runs.remove(claim)
                if not runs:
                    del self._pending_runs[claim.topic]
            return
        pending = self._pending.get(claim.topic)
        if pending is None:
            return
        deque(map(pending.__delitem__, filter(None, claim.keys)), maxlen=0)  # a C loop
        if not pending:
            del self._pending[claim.topic]

    def _fail_claim(self, claim: _Claim | None, error: BrokerError) -> None:
        """The put that claimed these keys failed: so do the puts waiting on them."""
        if claim is None:
            return
        self._release(claim)
        if not claim.future.done():
            claim.future.set_exception(error)
            claim.future.exception()  # retrieved: a failure nobody waited for is not "never retrieved"

    async def append_system_record(self, sys_topic: str, record: dict[str, Any], *,
                                   force: bool = False) -> None:
        """Write a JSON record into a system topic (queue 0), wait until it is committed AND
        dispatched (so the caller reads its own write). Master only unless `force` (the
        role-change handler writes before it accepts user writes)."""
        if not self.role.is_master and not force:
            raise self.not_master_error()
        msg = Message(sys_topic, orjson.dumps(record), properties={PROPERTY_UNIQ_KEY: new_uniq_key()})
        async with self.system_gate.write():
            res = await self.put_messages(sys_topic, [msg], 0, _system=True)
            await self.reput.wait_dispatched(res[0].commit_log_offset + res[0].store_size)
