"""`MessageQueryService`: look a stored message up by its id (store host + physical offset, or the
message id its producer was answered with: its UNIQ_KEY), or search a topic's queues by key and
store time.

A delayed or transactional message is stored twice: first its copy in the timer queue or the half
topic, then, at its time or commit, the message itself in its topic. Its producer knows it by its
UNIQ_KEY from send to delivery (RocketMQ keeps that one id), so `find` shows, for that id, the
delivered message once there is one, and until then the copy with its state (SCHEDULED, HALF, ...)
from the message model (`MessageModelService.typed_message`).

A search is a bounded scan, not an index (RocketMQ keeps an IndexFile per key; we do not yet):
each queue is read from the first offset stored at or after `begin_ms` until a message stored
after `end_ms`, and the whole request reads at most `MAX_SCAN_MESSAGES` messages, yielding to the
event loop between chunks. A scan that stops on that budget says so (`truncated`), so a caller
narrows the time range instead of trusting an empty answer (rocketmq-dashboard's unbounded scans
time out instead)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.errors import BrokerCode, BrokerError, invalid
from broker.message import MessageExt, decode_message_id
from broker.service.acl import AccessControl, Account, Right
from broker.service.message_model import MessageModelService, TypedMessage
from broker.service.state import BrokerState
from broker.service.topics import check_queue
from broker.service.validation import MAX_CLIENT_ID_LENGTH
from broker.topics import is_system_topic, validate_topic

# Messages one search may read, over all queues: ~20 ms of the loop per 4,000 on this machine.
MAX_SCAN_MESSAGES = 20_000
# Messages read per chunk; the loop serves other requests between chunks.
_SCAN_CHUNK = 256
MAX_SEARCH_RESULTS = 1_000
_OFFSET_ID = re.compile(r"[0-9A-Fa-f]{32}")
# How far before its due time (or its commit) a delivered message is searched for, once the
# idempotency table no longer holds it: the master that stored it may run behind the one that
# admitted it.
_DELIVERY_SKEW_MS = 10_000


class FoundMessage(NamedTuple):
    """A message looked up by id: the delivered (or plain) one with `state` None, or the stored copy
    of a delayed or transactional one not delivered (yet), with its state."""

    message: MessageExt
    state: str | None = None


class SearchResult(NamedTuple):
    """Matching messages in (queue, offset) order, how many were read, and whether the scan
    stopped on its budget before the end of the time range."""

    messages: list[MessageExt]
    scanned: int
    truncated: bool


class MessageQueryService:
    """Message queries for one broker. Callers: the front-ends (`GET /messages/{id}`, console)."""

    def __init__(self, state: BrokerState, acl: AccessControl, model: MessageModelService) -> None:
        self.store = state.store
        self.acl = acl
        self.model = model

    def by_id(self, account: Account, msg_id: str) -> MessageExt:
        """The stored message `msg_id` names (`lookup`), for a caller with SUB on its topic;
        MESSAGE_NOT_FOUND when no message of this store starts there (or it is another store
        host's id)."""
        msg = self.lookup(msg_id)
        self.acl.authorize(account, topic=msg.topic, right=Right.SUB)
        return msg

    async def find(self, account: Account, msg_id: str) -> FoundMessage:
        """The message `msg_id` names (see the module docstring), for a caller with SUB on its
        topic; MESSAGE_NOT_FOUND when none is known here."""
        try:
            found = FoundMessage(self.lookup(msg_id))
        except BrokerError as exc:
            if exc.code is not BrokerCode.MESSAGE_NOT_FOUND:
                raise
            typed = self._typed_message(msg_id)
            if typed is None:
                raise
            found = await self._delivered_or_pending(typed)
        self.acl.authorize(account, topic=found.message.topic, right=Right.SUB)
        return found

    def _typed_message(self, msg_id: str) -> TypedMessage | None:
        """A delayed or transactional message by its UNIQ_KEY, or by its copy's offset id (the
        `msgId` its send was answered with)."""
        if _OFFSET_ID.fullmatch(msg_id):
            copy = self._stored_at(msg_id)
            if copy is not None and copy.uniq_key and is_system_topic(copy.topic):
                return self.model.typed_message(copy.uniq_key)
        return self.model.typed_message(msg_id)

    async def _delivered_or_pending(self, typed: TypedMessage) -> FoundMessage:
        """A delivered typed message past the idempotency window is searched for in its topic
        from when it may have been stored; not found (or not delivered): its copy and state."""
        uniq = typed.message.uniq_key
        if typed.delivered and uniq:
            topic = typed.message.topic
            cfg = self.store.topics.get(topic)
            scan = _Scan(uniq, None, 1)
            for q in range(cfg.queue_nums if cfg is not None else 0):
                await self._scan_queue(topic, q, typed.delivered_from_ms - _DELIVERY_SKEW_MS, scan)
                if scan.found:
                    return FoundMessage(scan.found[0])
        return FoundMessage(typed.message, typed.state)

    def _stored_at(self, msg_id: str) -> MessageExt | None:
        """The message an offset id names, of any topic (None: none of this store starts there)."""
        try:
            return self._by_offset_id(msg_id, allow_system=True)
        except BrokerError as exc:
            if exc.code is BrokerCode.MESSAGE_NOT_FOUND:
                return None
            raise

    def lookup(self, msg_id: str) -> MessageExt:
        """The stored message `msg_id` names, without the access check (for services that make
        their own); never a broker topic's copy. An id that is not an offset id (32 hex digits)
        is taken as a client's message id: the UNIQ_KEY a RocketMQ 5 client sent the message with
        (34 hex digits), which is also its idempotency key, so the idempotency table finds it
        within `idempotencyWindowMs` — as it finds a fired timer's or committed transaction's
        message by its UNIQ_KEY. LedgerMQ's own UNIQ_KEYs are 32 hex digits like an offset id:
        one that names no message is tried as a client's id too."""
        if not _OFFSET_ID.fullmatch(msg_id):
            return self._by_offset_id(self._offset_id_of_client_id(msg_id))
        try:
            return self._by_offset_id(msg_id)
        except BrokerError as exc:
            if exc.code is not BrokerCode.MESSAGE_NOT_FOUND:
                raise
            hit = self._client_id_hit(msg_id)
            if hit is None:
                raise
            return self._by_offset_id(hit)

    def _by_offset_id(self, msg_id: str, *, allow_system: bool = False) -> MessageExt:
        _, phys = decode_message_id(msg_id)
        try:
            msg = self.store.look_message_by_offset(phys)
        except BrokerError as exc:
            if exc.code in (BrokerCode.MESSAGE_CORRUPTED, BrokerCode.INTERNAL_ERROR):
                raise
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id} ({exc.detail})") from None
        except Exception as exc:  # a position that is not a message start must be a 404, not a 500
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id}: {exc}") from None
        # The id names its store host too: a message of another broker that happens to start at
        # the same offset here is not the one asked for.
        if msg is None or (is_system_topic(msg.topic) and not allow_system) or msg.msg_id != msg_id.upper():
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id}")
        return msg

    def _offset_id_of_client_id(self, client_id: str) -> str:
        if not 0 < len(client_id) <= MAX_CLIENT_ID_LENGTH or not client_id.isprintable():
            raise invalid(
                "msgId",
                f"expected an offset id (32 hex characters) or a client's message id (1-"
                f"{MAX_CLIENT_ID_LENGTH} printable characters), got {client_id[:80]!r}",
            )
        hit = self._client_id_hit(client_id)
        if hit is not None:
            return hit
        raise BrokerError(
            BrokerCode.MESSAGE_NOT_FOUND,
            f"no message {client_id!r}: not an offset id, and no message was sent with it as its client "
            "id within idempotencyWindowMs (older ones: search the topic by key)",
        )

    def _client_id_hit(self, client_id: str) -> str | None:
        """The offset id of the message a client's id is the idempotency key of, in a user topic
        (a broker topic holds copies: the timer queue's, the half topic's)."""
        idempotency = self.store.idempotency
        for topic in self.store.topics.names():
            if is_system_topic(topic):
                continue
            hit = idempotency.get(topic, client_id)
            if hit is not None:
                return hit.msg_id
        return None

    async def search(
        self,
        account: Account,
        topic: str,
        *,
        key: str | None = None,
        queue_id: int | None = None,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_messages: int = 64,
    ) -> SearchResult:
        """Messages of `topic` (of one queue, or of every queue) stored in [begin_ms, end_ms]
        and, with `key`, carrying it among their KEYS (or as their message id / UNIQ_KEY), at most
        `max_messages`; a caller with SUB on the topic. RocketMQ's queryMessage by key and the
        dashboard's query by time."""
        validate_topic(topic, allow_system=True)
        if not 1 <= max_messages <= MAX_SEARCH_RESULTS:
            raise BrokerError(
                BrokerCode.INVALID_REQUEST,
                f"maxMessages: {max_messages} is outside 1..{MAX_SEARCH_RESULTS}",
                field="maxMessages",
            )
        if end_ms is not None and end_ms < begin_ms:
            detail = f"end: {end_ms} is before begin {begin_ms}"
            raise BrokerError(BrokerCode.INVALID_REQUEST, detail, field="end")
        self.acl.authorize(account, topic=topic, right=Right.SUB)
        cfg = self.store.topics.get(topic)
        if cfg is None:
            raise BrokerError(BrokerCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist", topic=topic)
        if queue_id is not None:
            check_queue(cfg, topic, queue_id)
        queues = [queue_id] if queue_id is not None else list(range(cfg.queue_nums))
        scan = _Scan(key, end_ms, max_messages)
        truncated = False
        for q in queues:
            reached_end = await self._scan_queue(topic, q, begin_ms, scan)
            if scan.full():
                break
            if not reached_end:
                truncated = True
                break
        return SearchResult(scan.found, scan.scanned, truncated)

    async def _scan_queue(self, topic: str, queue_id: int, begin_ms: int, scan: _Scan) -> bool:
        """Add one queue's matches to `scan`; True once the queue or the time range ended (False:
        the budget or `max_messages` stopped it)."""
        store = self.store
        offset = max(store.offset_for_timestamp(topic, queue_id, begin_ms), store.min_offset(topic, queue_id))
        while scan.scanned < MAX_SCAN_MESSAGES and not scan.full():
            if offset >= store.max_offset(topic, queue_id):
                return True
            chunk = min(_SCAN_CHUNK, MAX_SCAN_MESSAGES - scan.scanned)
            res = store.get_messages(topic, queue_id, offset, chunk)
            if not res.messages:
                return True
            for msg in res.messages:
                scan.scanned += 1
                if scan.end_ms is not None and msg.store_timestamp > scan.end_ms:
                    return True
                if scan.matches(msg):
                    scan.found.append(msg)
                    if scan.full():
                        return False
            offset = res.next_offset
            await asyncio.sleep(0)  # let other requests run between chunks
        return False


@dataclass
class _Scan:
    """One search's criteria and what it has found and read so far."""

    key: str | None
    end_ms: int | None
    max_messages: int
    found: list[MessageExt] = field(default_factory=list)
    scanned: int = 0

    def matches(self, msg: MessageExt) -> bool:
        if self.key is None:
            return True
        wanted = self.key.upper()
        return self.key in msg.keys or wanted == msg.msg_id or wanted == (msg.uniq_key or "").upper()

    def full(self) -> bool:
        return len(self.found) >= self.max_messages
