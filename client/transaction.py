"""Transactional messages, as RocketMQ's transaction producer: a half message is stored but not
delivered until its producer commits it (or never, after a rollback); a producer that dies in
between is asked back by the master (`transactionTimeOut` after the send, then every
`transactionCheckInterval`, up to `transactionCheckMax` times) through its producer group.

`AsyncProducer.send_transactional` returns a `Transaction` (`commit()` / `rollback()`, both
idempotent on the broker); a producer created with `transaction_checker=` long-polls every
master's check-backs for its `producer_group` (`CheckLoop`) and answers each with the checker's
`TransactionResolution` (UNKNOWN: ask again later). Wire: docs/INTERFACES.md, "Transactions".
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from client.errors import LedgerMQError, NotMasterError
from client.message import SendResult
from client.received import ReceivedMessage
from client.transport import AsyncTransport, RouteCache, base_url, seg

log = logging.getLogger(__name__)

# A check-back long poll: how long one waits, and the pause after a failed one.
CHECK_WAIT_MS = 20_000
CHECK_RETRY_S = 1.0
# How often the masters are looked up again (a failover moves a set's check-backs).
MASTERS_WATCH_S = 20.0


class TransactionalProducer(Protocol):
    """What a transaction and the check loop use of their producer (`AsyncProducer`)."""

    producer_group: str | None
    send_timeout_s: float
    request_timeout_s: float
    routes: RouteCache
    transport: AsyncTransport


class TransactionResolution(enum.Enum):
    """A transaction checker's answer (RocketMQ's `TransactionResolution`)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


TransactionChecker = Callable[[ReceivedMessage], "TransactionResolution | Awaitable[TransactionResolution]"]


@dataclass
class Transaction:
    """One sent half message: `commit()` delivers it, `rollback()` discards it (each idempotent:
    a repeat answers the same state; the opposite one after it fails with TRANSACTION_CONFLICT)."""

    producer: TransactionalProducer
    topic: str
    result: SendResult

    @property
    def transaction_id(self) -> str:
        assert self.result.transaction_id is not None
        return self.result.transaction_id

    async def commit(self) -> str:
        """Make the message visible to consumers; returns the state (COMMITTED)."""
        return await end_transaction(self.producer, self.topic, self.transaction_id, self.result.broker_name,
                                     commit=True)

    async def rollback(self) -> str:
        """Discard the message; returns the state (ROLLED_BACK)."""
        return await end_transaction(self.producer, self.topic, self.transaction_id, self.result.broker_name,
                                     commit=False)


class BlockingTransaction:
    """The blocking `Producer`'s `Transaction`: the same, with `commit()` and `rollback()` that block."""

    def __init__(self, tx: Transaction, call: Callable[[Any], Any]) -> None:
        self._tx = tx
        self._call = call

    @property
    def result(self) -> SendResult:
        return self._tx.result

    @property
    def transaction_id(self) -> str:
        return self._tx.transaction_id

    def commit(self) -> str:
        return self._call(self._tx.commit())

    def rollback(self) -> str:
        return self._call(self._tx.rollback())


async def end_transaction(p: TransactionalProducer, topic: str, transaction_id: str, broker_name: str, *,
                          commit: bool, master_url: str | None = None, from_check: bool = False) -> str:
    """Commit or roll back on the master of `broker_name` (or `master_url`), retrying while the set
    has no master or is unreachable, up to the producer's `send_timeout_s` (an end is idempotent,
    so a retry of one that was applied answers the same state)."""
    action = "commit" if commit else "rollback"
    body: dict[str, Any] = {"fromTransactionCheck": from_check}
    if p.producer_group:
        body["producerGroup"] = p.producer_group
    path = f"/topics/{seg(topic)}/transactions/{seg(transaction_id)}/{action}"
    deadline = time.monotonic() + p.send_timeout_s
    delay = 0.05
    url = master_url
    while True:
        try:
            if url is None:
                url = await p.routes.master_url(topic, broker_name, refresh=delay > 0.05)
            doc = await p.transport.request("POST", url + path, json=body)
            return str(doc["state"])
        except LedgerMQError as exc:
            hint = exc.master_addr if isinstance(exc, NotMasterError) else None
            if not exc.retryable or time.monotonic() + delay > deadline or not (hint or broker_name):
                raise  # (an answer to a check names no set: the new master asks again itself)
            url = base_url(hint) if hint else None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


class CheckLoop:
    """Answers the masters' check-backs for one producer group with `checker` (a function, run in
    a worker thread, or a coroutine function). One long poll per master; the masters are looked
    up again every `MASTERS_WATCH_S`."""

    def __init__(self, producer: TransactionalProducer, group: str, checker: TransactionChecker) -> None:
        self.producer = producer
        self.group = group
        self.checker = checker
        self.is_async = inspect.iscoroutinefunction(checker)
        self.stats = {"checked": 0, "committed": 0, "rolled_back": 0, "unknown": 0, "failed": 0}
        self._polls: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name=f"tx-checks-{self.group}")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._polls.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            try:
                masters = await self.producer.routes.masters()
            except LedgerMQError as exc:
                log.warning("transaction checks: no master list for group=%s: %s", self.group, exc)
                masters = list(self._polls)
            for url in masters:
                if url not in self._polls or self._polls[url].done():
                    self._polls[url] = asyncio.get_running_loop().create_task(self._poll(url))
            for url in [u for u in self._polls if u not in masters]:
                self._polls.pop(url).cancel()  # no longer a master: its successor holds the checks
            await asyncio.sleep(MASTERS_WATCH_S)

    async def _poll(self, url: str) -> None:
        p = self.producer
        path = f"{url}/producers/{seg(self.group)}/transaction-checks"
        while True:
            try:
                doc = await p.transport.request(
                    "GET", path, params={"waitMs": CHECK_WAIT_MS, "maxChecks": 32},
                    timeout_s=CHECK_WAIT_MS / 1000 + p.request_timeout_s,
                )
            except LedgerMQError as exc:
                if isinstance(exc, NotMasterError):
                    return  # the watch finds the new master
                log.debug("transaction checks poll failed url=%s: %s", url, exc)
                await asyncio.sleep(CHECK_RETRY_S)
                continue
            for check in doc.get("checks", []):
                await self._answer(url, check)

    async def _answer(self, url: str, check: dict[str, Any]) -> None:
        msg = ReceivedMessage.from_json(check["message"])
        self.stats["checked"] += 1
        try:
            if self.is_async:
                resolution = await self.checker(msg)  # type: ignore[misc]
            else:
                resolution = await asyncio.to_thread(self.checker, msg)
        except Exception as exc:  # the checker's failure: the master asks again later
            self.stats["failed"] += 1
            log.warning("transaction checker failed group=%s transactionId=%s: %r", self.group,
                        check["transactionId"], exc)
            return
        if resolution not in (TransactionResolution.COMMIT, TransactionResolution.ROLLBACK):
            self.stats["unknown"] += 1
            return
        commit = resolution is TransactionResolution.COMMIT
        try:
            await end_transaction(self.producer, check["topic"], check["transactionId"], "", commit=commit,
                                  master_url=url, from_check=True)
        except LedgerMQError as exc:
            self.stats["failed"] += 1
            log.warning("transaction check answer failed group=%s transactionId=%s: %s", self.group,
                        check["transactionId"], exc)
            return
        self.stats["committed" if commit else "rolled_back"] += 1
