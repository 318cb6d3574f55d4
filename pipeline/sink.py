"""The ``ledgermq`` sink: ``df.writeStream.format("ledgermq")`` and ``df.write.format("ledgermq")``.

Input columns: ``value`` (binary or string, required), ``key``, ``tags`` (strings), ``properties``
(map<string,string>), ``topic`` (string; or option ``topic``, which wins). Rows are produced in
batches with ``POST /topics/{topic}/messages`` to the master of a broker set chosen from the route.

Exactly-once writes, past Kafka's at-least-once sink: every row carries an ``idempotencyKey``
``{queryId}/{batchId}/{partitionId}/{seq}`` (batch writes: ``{writeId}/batch/{partitionId}/{seq}``)
and the broker drops a key it has already stored. A retried task, or a query restarted from its
checkpoint that replays the batch, re-sends the same keys to the same broker set, so each row is
stored once. This needs the replayed input to be deterministic (it is for the ``ledgermq`` source,
which re-reads the same offset ranges in the same order).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import httpx
import orjson
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from client.errors import (
    BrokerUnreachableError,
    LedgerMQError,
    OutcomeUnknownError,
    SendOutcomeUnknownError,
    TopicNotExistError,
)
from client.outcome import Delivery, RequestPhase, delivery_of_answer, phase_of
from client.producer import Message
from pipeline.access import Access
from pipeline.routes import PERM_WRITE, BrokerSetRoute, RouteResolver, base_url, option_addrs, problem_of
from pipeline.worker import freeze_worker_heap

log = logging.getLogger("ledgermq.pipeline.sink")

_RETRYABLE_CODES = {"NOT_MASTER", "SERVICE_UNAVAILABLE", "TIMEOUT", "TOPIC_NOT_EXIST"}


@dataclass
class LedgerMQCommitMessage(WriterCommitMessage):
    """What one sink task wrote; collected on the driver for ``commit``/``abort``."""

    partition_id: int
    attempt: int
    batch_id: int | None
    rows: int = 0
    body_bytes: int = 0
    requests: int = 0
    rows_per_topic: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SinkOptions:
    """Validated sink options."""

    namesrv_addrs: tuple[str, ...]
    broker_addrs: tuple[str, ...]
    topic: str | None
    batch_size: int
    produce_timeout_ms: int
    write_id: str
    access: Access = field(default_factory=Access)  # token and TLS (pipeline/access.py)

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        """Check options and the input columns; raises ValueError with the offending name."""
        namesrv = option_addrs(options, "namesrvAddr", "ledgermq sink")
        brokers = option_addrs(options, "brokerAddr", "ledgermq sink")
        if not namesrv and not brokers:
            raise ValueError("ledgermq sink: set option 'namesrvAddr' (or 'brokerAddr')")
        names = {f.name: f.dataType for f in schema.fields}
        if "value" not in names:
            raise ValueError("ledgermq sink: the DataFrame needs a 'value' column (binary or string)")
        if not isinstance(names["value"], BinaryType | StringType):
            raise ValueError(f"ledgermq sink: column 'value' must be binary or string, not {names['value']}")
        for col in ("key", "tags", "topic"):
            if col in names and not isinstance(names[col], StringType):
                raise ValueError(f"ledgermq sink: column {col!r} must be a string, not {names[col]}")
        if "properties" in names and not (
            isinstance(names["properties"], MapType) and isinstance(names["properties"].keyType, StringType)
        ):
            raise ValueError("ledgermq sink: column 'properties' must be map<string,string>")
        topic = options.get("topic") or None
        if topic is None and "topic" not in names:
            raise ValueError("ledgermq sink: set option 'topic' or provide a 'topic' column")
        batch_size = int(options.get("batchSize") or 500)
        timeout_ms = int(options.get("produceTimeoutMs") or 60_000)
        if batch_size < 1 or timeout_ms < 1:
            raise ValueError("ledgermq sink: 'batchSize' and 'produceTimeoutMs' must be positive")
        # Batch writes have no query/batch id: one id per write job (set it to make re-runs idempotent).
        write_id = options.get("writeId") or uuid.uuid4().hex
        access = Access.parse(options, "ledgermq sink")
        return cls(namesrv, brokers, topic, batch_size, timeout_ms, write_id, access)


class _Producer:
    """Produces one task's rows with idempotency keys; owns an HTTP client for the task's lifetime.

    A task writes to one broker set, its "home" (``partition % number of sets`` in the route, so a
    replayed task finds the same one), and never leaves it: the broker drops a repeated key only
    within one set, so once an attempt may have stored a batch there, only that set can be asked
    again. Whether an attempt may have stored it follows the SDK's classification
    (``client.outcome``): a refused connection never did, a request written and not answered,
    a 504 or another 5xx may have."""

    def __init__(self, opts: SinkOptions, key_prefix: str, partition_id: int) -> None:
        self.opts = opts
        self.key_prefix = key_prefix
        self.partition_id = partition_id
        self.http = opts.access.http_client(httpx.Timeout(30.0, connect=5.0))
        self.resolver = RouteResolver(opts.namesrv_addrs, opts.broker_addrs, access=opts.access)
        self.homes: dict[str, BrokerSetRoute] = {}  # topic → this task's broker set

    def close(self) -> None:
        self.http.close()
        self.resolver.close()

    def _writable_sets(self, topic: str) -> list[BrokerSetRoute]:
        sets = [s for s in self.resolver.broker_sets(topic) if s.perm & PERM_WRITE]
        if not sets and self.opts.broker_addrs:
            sets = self.resolver._static_sets()
        return sets

    def _home(self, topic: str, refresh: bool = False) -> BrokerSetRoute:
        """The task's broker set for ``topic``; ``refresh`` re-reads its members' addresses (a new
        master), keeping the set even if the route no longer lists it."""
        home = self.homes.get(topic)
        if home is not None and not refresh:
            return home
        try:
            sets = self._writable_sets(topic)
        except LedgerMQError:
            if home is not None:
                return home  # name server unreachable: keep the addresses we have
            raise
        if home is None:
            if not sets:
                raise TopicNotExistError(f"ledgermq sink: topic {topic!r} has no writable broker")
            home = sets[self.partition_id % len(sets)]
        else:
            home = next((s for s in sets if s.broker_name == home.broker_name), home)
        self.homes[topic] = home
        return home

    def produce(self, topic: str, messages: list[dict]) -> int:
        """POST one batch to the task's broker set, retrying with the same keys (safe: the set
        stores each key once) until ``produceTimeoutMs``. Returns the requests made.

        Fails with a ``LedgerMQError`` whose ``code`` is ``SEND_OUTCOME_UNKNOWN`` when an attempt
        may have stored the batch (a replay of the task re-sends the same keys to the same set and
        stores each row once), else with the last refusal's code (nothing of the batch stored)."""
        body = orjson.dumps({"messages": messages})
        deadline = time.monotonic() + self.opts.produce_timeout_ms / 1000.0
        home = self._home(topic)
        addrs = home.urls()
        attempt = 0
        last: LedgerMQError | None = None
        maybe: LedgerMQError | None = None  # the first attempt that may have stored the batch
        while True:
            addr = addrs[0]
            try:
                resp = self.http.post(
                    f"{addr}/topics/{topic}/messages",
                    content=body,
                    headers={"content-type": "application/json"},
                )
            except httpx.TransportError as exc:
                phase = phase_of(exc)
                failed = BrokerUnreachableError if phase is RequestPhase.CONNECT else OutcomeUnknownError
                last = failed(f"produce to {topic} at {addr}: {exc!r} (failed in phase {phase})")
                maybe = maybe or (None if phase is RequestPhase.CONNECT else last)
                addrs = self._next_addrs(topic, addrs, attempt)
            else:
                if resp.status_code == 200:
                    return attempt + 1
                last = problem_of(resp, f"produce to {topic} at {addr}")
                if delivery_of_answer(resp.status_code, last.problem) is Delivery.MAYBE:
                    maybe = maybe or last
                if last.code not in _RETRYABLE_CODES and resp.status_code not in (502, 503, 504):
                    raise self._failure(topic, home, messages, last, maybe, attempt + 1)
                master = last.problem.get("masterAddr")
                if last.code == "NOT_MASTER" and master:
                    addrs = [base_url(master)] + [a for a in addrs if a != base_url(master)]
                else:
                    addrs = self._next_addrs(topic, addrs, attempt)
            attempt += 1
            if time.monotonic() > deadline:
                raise self._failure(topic, home, messages, last, maybe, attempt)
            log.warning("event=produce_retry topic=%s attempt=%d error=%s", topic, attempt, last)
            time.sleep(min(1.0, 0.05 * attempt))

    def _next_addrs(self, topic: str, addrs: list[str], attempt: int) -> list[str]:
        """The next member to try: rotate, and every third attempt re-read the home set's members."""
        if attempt % 3 == 2:
            return self._home(topic, refresh=True).urls() or addrs
        return addrs[1:] + addrs[:1]

    def _failure(
        self,
        topic: str,
        home: BrokerSetRoute,
        messages: list[dict],
        last: LedgerMQError | None,
        maybe: LedgerMQError | None,
        attempts: int,
    ) -> LedgerMQError:
        keys = f"{messages[0]['idempotencyKey']} .. {messages[-1]['idempotencyKey']}"
        where = f"{len(messages)} rows to {topic!r} on broker set {home.broker_name}"
        if maybe is not None:
            return SendOutcomeUnknownError(
                f"ledgermq sink: outcome unknown for {where} (keys {keys}) after {attempts} attempts: "
                f"an attempt may have stored them ({maybe}); last: {last}. A retry of this task "
                "re-sends the same keys to the same set, which stores each row once",
                topic=topic,
                broker_name=home.broker_name,
                messages=[_as_message(row) for row in messages],
                cause=maybe,
            )
        assert last is not None
        return type(last)(
            f"ledgermq sink: {where} refused after {attempts} attempts, nothing stored (keys {keys}): {last}",
            status=last.status,
            problem=last.problem,
        )


def _as_message(row: dict) -> Message:
    """A produced row as the SDK's Message (what SendOutcomeUnknownError reports)."""
    return Message(
        body=base64.b64decode(row["body"]),
        tags=row.get("tags"),
        keys=row.get("keys", []),
        properties=row.get("properties", {}),
        idempotency_key=row["idempotencyKey"],
    )


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx).to_pylist()


def write_batches(
    batches: Iterator[pa.RecordBatch],
    opts: SinkOptions,
    *,
    key_prefix: str,
    partition_id: int,
    attempt: int,
    batch_id: int | None,
) -> LedgerMQCommitMessage:
    """Produce all rows of one task; the idempotency key of row ``seq`` is ``{key_prefix}/{partition}/{seq}``.

    Public so a task can be replayed outside Spark (tests, tools); Spark calls it through the writers.
    """
    result = LedgerMQCommitMessage(partition_id=partition_id, attempt=attempt, batch_id=batch_id)
    producer = _Producer(opts, key_prefix, partition_id)
    pending: dict[str, list[dict]] = {}
    seq = 0
    try:
        for batch in batches:
            values = _column(batch, "value") or []
            keys, tags = _column(batch, "key"), _column(batch, "tags")
            props, topics = _column(batch, "properties"), _column(batch, "topic")
            for i, value in enumerate(values):
                if value is None:
                    raise ValueError(
                        f"ledgermq sink: row {seq} of partition {partition_id} has a null 'value'"
                    )
                topic = opts.topic or (topics[i] if topics else None)
                if not topic:
                    raise ValueError(f"ledgermq sink: row {seq} of partition {partition_id} has no topic")
                raw = value if isinstance(value, bytes) else value.encode()
                msg: dict = {
                    "body": base64.b64encode(raw).decode(),
                    "bodyEncoding": "base64",
                    "idempotencyKey": f"{key_prefix}/{partition_id}/{seq}",
                }
                if keys and keys[i] is not None:
                    msg["keys"] = [keys[i]]
                if tags and tags[i] is not None:
                    msg["tags"] = tags[i]
                if props and props[i]:
                    msg["properties"] = dict(props[i])
                seq += 1
                result.body_bytes += len(raw)
                queue = pending.setdefault(topic, [])
                queue.append(msg)
                if len(queue) >= opts.batch_size:
                    result.requests += producer.produce(topic, queue)
                    result.rows_per_topic[topic] = result.rows_per_topic.get(topic, 0) + len(queue)
                    pending[topic] = []
        for topic, queue in pending.items():
            if queue:
                result.requests += producer.produce(topic, queue)
                result.rows_per_topic[topic] = result.rows_per_topic.get(topic, 0) + len(queue)
    finally:
        producer.close()
    result.rows = seq
    return result


def _task_identity() -> tuple[int, int, str | None, str | None]:
    """(partitionId, attemptNumber, streaming batch id, streaming query id) of the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, None, None
    return (
        ctx.partitionId(),
        ctx.attemptNumber(),
        ctx.getLocalProperty("streaming.sql.batchId"),
        ctx.getLocalProperty("sql.streaming.queryId"),
    )


def _log_commit(messages: list, batch_id: int | None, what: str) -> None:
    done = [m for m in messages if isinstance(m, LedgerMQCommitMessage)]
    rows = sum(m.rows for m in done)
    log.info(
        "event=sink_%s batchId=%s tasks=%d rows=%d bytes=%d",
        what,
        batch_id,
        len(done),
        rows,
        sum(m.body_bytes for m in done),
    )


class LedgerMQStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: keys ``{queryId}/{batchId}/{partition}/{seq}``; the query id survives restarts."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerMQCommitMessage:
        """Executor: produce this partition of the micro-batch."""
        freeze_worker_heap()  # PySpark's per-task gc.collect() would walk every imported object
        partition_id, attempt, batch_id, query_id = _task_identity()
        if batch_id is None or query_id is None:
            raise RuntimeError("ledgermq sink: no streaming batch/query id in the task context")
        return write_batches(
            iterator,
            self.opts,
            key_prefix=f"{query_id}/{batch_id}",
            partition_id=partition_id,
            attempt=attempt,
            batch_id=int(batch_id),
        )

    def commit(self, messages: list, batchId: int) -> None:
        """Driver: every task of the batch succeeded."""
        _log_commit(messages, batchId, "commit")

    def abort(self, messages: list, batchId: int) -> None:
        """Driver: a task failed; rows already produced stay, and the replay's keys dedupe them."""
        _log_commit(messages, batchId, "abort")


class LedgerMQBatchWriter(DataSourceArrowWriter):
    """Batch sink: keys ``{writeId}/batch/{partition}/{seq}`` (set ``writeId`` to make re-runs idempotent)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerMQCommitMessage:
        """Executor: produce this partition."""
        freeze_worker_heap()  # PySpark's per-task gc.collect() would walk every imported object
        partition_id, attempt, _, _ = _task_identity()
        return write_batches(
            iterator,
            self.opts,
            key_prefix=f"{self.opts.write_id}/batch",
            partition_id=partition_id,
            attempt=attempt,
            batch_id=None,
        )

    def commit(self, messages: list) -> None:
        """Driver: all tasks succeeded."""
        _log_commit(messages, None, "commit")

    def abort(self, messages: list) -> None:
        """Driver: a task failed."""
        _log_commit(messages, None, "abort")
