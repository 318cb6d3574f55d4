"""The ``ledgermq`` Spark data source: streaming and batch readers over the broker's consume queues.

Usage (after ``pipeline.register(spark)``)::

    df = (spark.readStream.format("ledgermq").option("namesrvAddr", "127.0.0.1:9876")
          .option("topic", "orders").option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", 10000).load())

Where things run (see ../shared/reference/pyspark-source.md §2): the reader's planning methods
(``initialOffset``, ``latestOffset``, ``partitions``, ``commit``) run in a long-lived driver-side
Python process, so the route resolver kept on ``self`` survives between micro-batches there;
``read()`` runs on executors from a pickled copy of the reader, so ``__init__`` keeps only small
option data and ``__getstate__`` drops the resolver.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import httpx
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from client.errors import LedgerMQError
from pipeline.access import Access
from pipeline.fetch import FetchOptions, QueuePartition, read_partition
from pipeline.offsets import (
    DataLossError,
    Offsets,
    QueueState,
    backlog,
    find_data_loss,
    find_rewound,
    merge_latest,
    plan_ranges,
    rate_limit,
    resolve_spec,
    sort_offsets,
    states_to_offsets,
)
from pipeline.routes import RouteResolver, option_addrs
from pipeline.schema import source_schema
from pipeline.worker import freeze_worker_heap

log = logging.getLogger("ledgermq.pipeline.source")


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name!r} must be 'true' or 'false', got {raw!r}")
    return value == "true"


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int = 1) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError as exc:
        raise ValueError(f"option {name!r} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise ValueError(f"option {name!r} must be >= {minimum}, got {value}")
    return value


def _filter_type(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return None
    kind = raw.strip().upper()
    if kind not in ("TAG", "SQL92"):
        raise ValueError(f"ledgermq: option 'filterType' must be TAG or SQL92, got {raw!r}")
    return kind


@dataclass(frozen=True)
class SourceOptions:
    """The reader options, validated once on the driver (Spark hands them over as strings)."""

    namesrv_addrs: tuple[str, ...]
    broker_addrs: tuple[str, ...]
    topics: tuple[str, ...]
    topic_pattern: str | None
    starting_offsets: str
    ending_offsets: str
    starting_timestamp: int | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    page_size: int
    include_properties: bool
    consumer_group: str | None
    filter_type: str | None
    filter_expression: str | None
    access: Access

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Validate the user's options; raises ValueError naming the option on any mistake."""
        namesrv = option_addrs(options, "namesrvAddr", "ledgermq")
        brokers = option_addrs(options, "brokerAddr", "ledgermq")
        if not namesrv and not brokers:
            raise ValueError("ledgermq: set option 'namesrvAddr' (or 'brokerAddr')")
        topics = tuple(t.strip() for t in (options.get("topic") or "").split(",") if t.strip())
        pattern = options.get("topicPattern") or None
        if bool(topics) == bool(pattern):
            raise ValueError(
                "ledgermq: set exactly one of options 'topic' (name or comma list) and 'topicPattern'"
            )
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"ledgermq: option 'topicPattern' is not a valid regex: {exc}") from exc
        ending = options.get("endingOffsets")
        if streaming and ending is not None:
            raise ValueError("ledgermq: option 'endingOffsets' is for batch queries only")
        return cls(
            namesrv_addrs=namesrv,
            broker_addrs=brokers,
            topics=topics,
            topic_pattern=pattern,
            starting_offsets=options.get("startingOffsets") or ("latest" if streaming else "earliest"),
            ending_offsets=ending or "latest",
            starting_timestamp=_int(options, "startingTimestamp", None, minimum=0),
            max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", None),
            min_offsets_per_trigger=_int(options, "minOffsetsPerTrigger", None),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            poll_timeout_ms=_int(options, "pollTimeoutMs", 120_000) or 120_000,
            page_size=_int(options, "pageSize", 1000) or 1000,
            include_properties=_bool(options, "includeProperties", False),
            consumer_group=options.get("consumerGroup") or None,
            filter_type=_filter_type(options.get("filterType")),
            filter_expression=options.get("filterExpression") or None,
            access=Access.parse(options, "ledgermq"),
        )

    def fetch_options(self) -> FetchOptions:
        """The subset executors need."""
        return FetchOptions(
            self.namesrv_addrs,
            self.broker_addrs,
            self.page_size,
            self.poll_timeout_ms,
            self.fail_on_data_loss,
            self.include_properties,
            self.filter_type,
            self.filter_expression,
            self.access,
        )


class _Planner:
    """Driver-side helper shared by the stream and batch readers: topics, queue states, partitions."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._resolver: RouteResolver | None = None
        self.addrs: dict[str, tuple[str, ...]] = {}

    @property
    def resolver(self) -> RouteResolver:
        if self._resolver is None:
            opts = self.opts
            self._resolver = RouteResolver(opts.namesrv_addrs, opts.broker_addrs, access=opts.access)
        return self._resolver

    def close(self) -> None:
        if self._resolver is not None:
            self._resolver.close()
            self._resolver = None

    def topics(self) -> list[str]:
        if self.opts.topic_pattern is None:
            return list(self.opts.topics)
        rx = re.compile(self.opts.topic_pattern)
        return [t for t in self.resolver.list_topics() if rx.fullmatch(t)]

    def states(self, attempts: int = 4) -> list[QueueState]:
        """Queue ranges of the subscribed topics; retried a few times so a blip (a name server
        restarting, a broker mid-failover) does not fail the query."""
        for attempt in range(attempts):
            try:
                states, addrs = self.resolver.queue_states(self.topics())
                self.addrs.update(addrs)
                return states
            except (LedgerMQError, httpx.TransportError) as exc:
                if attempt == attempts - 1:
                    raise
                log.warning("event=queue_states_retry attempt=%d error=%s", attempt + 1, exc)
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    def starting(self, states: list[QueueState]) -> Offsets:
        if self.opts.starting_timestamp is not None:
            return self.by_timestamp(states, self.opts.starting_timestamp)
        return resolve_spec(self.opts.starting_offsets, states, "startingOffsets", default_missing="earliest")

    def by_timestamp(self, states: list[QueueState], ts_ms: int) -> Offsets:
        out: dict[str, dict[str, int]] = {}
        for s in states:
            off = self.resolver.offset_for_timestamp(
                s.topic, self.addrs.get(s.broker_name, ()), s.queue_id, ts_ms
            )
            out.setdefault(s.topic, {})[s.key] = min(max(off, s.min_offset), s.max_offset)
        return sort_offsets(out)

    def check_data_loss(self, start: Offsets, states: list[QueueState]) -> None:
        for text in find_rewound(start, states):
            log.warning("event=queue_behind_start detail=%s", text)
        problems = find_data_loss(start, states)
        if not problems:
            return
        if self.opts.fail_on_data_loss:
            raise DataLossError(
                "ledgermq: data loss, offsets deleted before they were read: "
                + "; ".join(problems)
                + " (set failOnDataLoss=false to skip them)"
            )
        for p in problems:
            log.warning("event=data_loss_will_skip detail=%s", p)

    def partitions(self, start: Offsets, end: Offsets) -> list[QueuePartition]:
        ranges = plan_ranges(start, end)
        missing = {r.topic for r in ranges if r.broker_name not in self.addrs}
        for topic in sorted(missing):  # e.g. replaying the last batch right after a restart
            for bs in self.resolver.broker_sets(topic):
                self.addrs[bs.broker_name] = bs.addrs
        return [
            QueuePartition(
                r.topic, r.broker_name, r.queue_id, r.start, r.end, self.addrs.get(r.broker_name, ())
            )
            for r in ranges
        ]


def _read(partition: InputPartition, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    freeze_worker_heap()  # PySpark's per-task gc.collect() would walk every imported object
    if not isinstance(partition, QueuePartition):  # Spark's placeholder when a batch plan is empty
        return iter(())
    return read_partition(partition, opts.fetch_options())


class LedgerMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader: one partition per (broker set, queue), offsets ``{topic: {"broker:q": next}}``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._planner = _Planner(opts)
        self._target: Offsets | None = None  # Trigger.AvailableNow: never go past this
        self._latest: Offsets | None = None  # last seen broker max offsets, for lag reporting

    def __getstate__(self) -> dict:
        # Executors need only the options; the resolver's HTTP client must not be pickled.
        return {"opts": self.opts, "_planner": None, "_target": None, "_latest": None}

    def initialOffset(self) -> dict:
        """Offsets a brand-new query starts from (startingTimestamp, else startingOffsets)."""
        return self._planner.starting(self._planner.states())

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` → ReadMaxRows; ``minOffsetsPerTrigger`` → ReadMinRows."""
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Record what is available now; the run ends once it has read up to here."""
        self._target = states_to_offsets(self._planner.states(), use="latest")
        log.info("event=available_now_target offsets=%s", self._target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """End offsets of the next batch: what the brokers hold now, capped by ``limit`` (and the target)."""
        start = sort_offsets(start)
        states = self._planner.states()
        self._planner.check_data_loss(start, states)
        available = states_to_offsets(states, use="latest")
        self._latest = merge_latest(start, available)
        if self._target is not None:
            latest = merge_latest(start, self._target)
        else:
            latest = self._latest
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(start, latest, limit.max_rows)
        elif (
            isinstance(limit, ReadMinRows)
            and self._target is None
            and backlog(start, latest) < limit.min_rows
        ):
            return start
        return latest

    def reportLatestOffset(self) -> dict | None:
        """The brokers' max offsets at the last planning, shown in query progress (lag)."""
        return self._latest

    def partitions(self, start: dict, end: dict) -> list[QueuePartition]:
        """One partition per queue with messages in ``[start, end)``."""
        return self._planner.partitions(sort_offsets(start), sort_offsets(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: the partition's exact range as Arrow record batches."""
        return _read(partition, self.opts)

    def commit(self, end: dict) -> None:
        """The batch ending at ``end`` is durable in the sink: advance the consumer group, if any."""
        if self.opts.consumer_group:
            self._planner.resolver.commit_group_offsets(self.opts.consumer_group, sort_offsets(end))

    def stop(self) -> None:
        """Query ends: close the HTTP pool."""
        if self._planner is not None:
            self._planner.close()


class LedgerMQBatchReader(DataSourceReader):
    """Batch reader over ``[startingOffsets, endingOffsets)`` (defaults earliest → latest)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        """Plan once on the driver: one partition per queue with messages in range."""
        planner = _Planner(self.opts)
        try:
            states = planner.states()
            start = planner.starting(states)
            planner.check_data_loss(start, states)
            end = resolve_spec(self.opts.ending_offsets, states, "endingOffsets", default_missing="latest")
            return list(planner.partitions(start, merge_latest(start, end)))
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor: the partition's exact range as Arrow record batches."""
        return _read(partition, self.opts)


class LedgerMQDataSource(DataSource):
    """``format("ledgermq")``: read consume queues (stream/batch) and produce to topics (stream/batch)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "ledgermq"

    def schema(self) -> StructType:
        """Kafka-like row schema (``properties`` only with ``includeProperties=true``)."""
        return source_schema(_bool(self.options, "includeProperties", False))

    def streamReader(self, schema: StructType) -> LedgerMQStreamReader:
        """Micro-batch reader."""
        return LedgerMQStreamReader(SourceOptions.parse(self.options, streaming=True))

    def reader(self, schema: StructType) -> LedgerMQBatchReader:
        """Batch reader."""
        return LedgerMQBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool):
        """Streaming sink (see pipeline.sink)."""
        from pipeline.sink import LedgerMQStreamWriter, SinkOptions

        return LedgerMQStreamWriter(SinkOptions.parse(self.options, schema))

    def writer(self, schema: StructType, overwrite: bool):
        """Batch sink (see pipeline.sink)."""
        from pipeline.sink import LedgerMQBatchWriter, SinkOptions

        return LedgerMQBatchWriter(SinkOptions.parse(self.options, schema))


__all__ = [
    "LedgerMQBatchReader",
    "LedgerMQDataSource",
    "LedgerMQError",
    "LedgerMQStreamReader",
    "SourceOptions",
]
