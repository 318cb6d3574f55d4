"""Executor side of the source: read exactly ``[start, end)`` of one consume queue as Arrow batches.

Runs inside Spark's Python workers. Everything it needs arrives in the pickled ``QueuePartition``
and ``FetchOptions`` (small, plain data); the HTTP client is opened here, inside ``read()``, never
carried over from the driver.

Reading pages through ``GET /topics/{t}/queues/{q}/messages?offset=&maxMessages=`` until ``end``.
Replicas are tried in the partition's order (master first); a member that is down, is not yet
caught up, or does not know the topic is skipped for the next one, and when all fail the route is
asked again from the name server (after a failover the new master is registered there). The same
range always yields the same rows, which is what a re-run micro-batch relies on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from client.errors import LedgerMQError, ServerError
from pipeline.access import Access
from pipeline.binpull import (
    PULL_BINARY_CONTENT_TYPE,
    PullFormatError,
    PullPage,
    decode_pull_page,
    first_keys,
    parse_properties,
)
from pipeline.offsets import DataLossError
from pipeline.pullclient import TRANSPORT_ERRORS, PageClient
from pipeline.routes import RouteResolver, base_url, problem_of
from pipeline.schema import source_arrow_schema
from wire.limits import MAX_PULL_MESSAGES

log = logging.getLogger("ledgermq.pipeline.fetch")

_BINARY_ACCEPT = {"accept": PULL_BINARY_CONTENT_TYPE}


@dataclass
class QueuePartition(InputPartition):
    """One Spark input partition: ``[start, end)`` of ``topic``'s queue ``queue_id`` on ``broker_name``."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int
    addrs: tuple[str, ...]


@dataclass(frozen=True)
class FetchOptions:
    """Reader settings shipped to executors with the pickled reader."""

    namesrv_addrs: tuple[str, ...]
    broker_addrs: tuple[str, ...]
    page_size: int = 1000
    poll_timeout_ms: int = 120_000
    fail_on_data_loss: bool = True
    include_properties: bool = False
    # A broker-side filter (issue 15): TAG or SQL92 and its expression; None = every message.
    filter_type: str | None = None
    filter_expression: str | None = None
    access: Access = field(default_factory=Access)  # token and TLS (pipeline/access.py)


class QueueFetcher:
    """Pages through one queue range; one instance per ``read()`` call (owns its HTTP client)."""

    def __init__(self, part: QueuePartition, opts: FetchOptions) -> None:
        self.part = part
        self.opts = opts
        self.addrs = list(part.addrs) or []
        self.addr_index = 0
        self.schema = source_arrow_schema(opts.include_properties)
        self.page_size = max(1, min(opts.page_size, MAX_PULL_MESSAGES))
        # stdlib keep-alive client: a fraction of httpx's CPU per 1 MB page (pipeline/pullclient.py);
        # the TLS context is only built for https members, or for all with option caFile.
        access = opts.access
        self.http = PageClient(timeout_s=30.0, ssl_context=access.ssl_context(), headers=access.headers())

    def close(self) -> None:
        """Release the HTTP client."""
        self.http.close()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Yield one RecordBatch per page until the whole range has been read.

        The next page is requested as soon as its offset is known, in one helper thread, so the
        broker serves page N+1 while this worker converts page N and Spark consumes it (the broker
        is another process; a pull is mostly waiting on it). One pull is in flight at a time, so
        the member rotation state in ``_pull`` is never shared.
        """
        p = self.part
        offset = p.start
        timeout_s = self.opts.poll_timeout_ms / 1000.0
        deadline = time.monotonic() + timeout_s
        if offset >= p.end:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="ledgermq-prefetch") as pool:
            fut = pool.submit(self._pull, offset, min(self.page_size, p.end - offset), deadline)
            while True:
                page = fut.result()
                msgs: PullPage | None = None
                if page is None:  # this member has nothing at `offset` yet: wait / rotate
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"ledgermq: {p.topic}/{p.broker_name}:{p.queue_id} offsets [{offset}, {p.end}) "
                            f"not readable from any of {self.addrs} within "
                            f"pollTimeoutMs={self.opts.poll_timeout_ms}"
                        )
                else:
                    msgs, min_offset = page
                    if not len(msgs) and offset < min_offset:
                        offset = self._data_loss(offset, min(min_offset, p.end))
                        msgs = None
                    elif self.filtering:
                        msgs, offset = self._filtered(msgs, offset)
                        deadline = time.monotonic() + timeout_s
                    elif len(msgs):
                        qo = msgs.queue_offset_array
                        first, last = int(qo[0]), int(qo[-1])
                        if first != offset or last >= p.end or last - first != len(qo) - 1:
                            msgs = self._trim(msgs, offset, min_offset)  # rare: a gap, or more than asked
                        if len(msgs):
                            offset = int(msgs.queue_offset_array[-1]) + 1
                            deadline = time.monotonic() + timeout_s
                        else:
                            msgs = None
                if offset >= p.end:
                    if msgs:
                        yield self._to_arrow(msgs)
                    return
                fut = pool.submit(self._pull, offset, min(self.page_size, p.end - offset), deadline)
                if msgs:
                    yield self._to_arrow(msgs)

    @property
    def filtering(self) -> bool:
        return self.opts.filter_expression is not None

    def _filtered(self, msgs: PullPage, offset: int) -> tuple[PullPage | None, int]:
        """A filtered page: the broker skipped what did not match (queue offsets have gaps) and
        says where to go on (`next_offset`); keep what lies in this partition's range."""
        end = self.part.end
        if len(msgs):
            qo = msgs.queue_offset_array
            msgs = msgs.slice(_first_index(qo >= offset), _first_index(qo >= end))
        return (msgs if len(msgs) else None), min(max(msgs.next_offset, offset), end)

    def _trim(self, msgs: PullPage, offset: int, min_offset: int) -> PullPage:
        """Keep ``[offset, end)`` of a page, handling deleted offsets at its head (data loss)."""
        qo = msgs.queue_offset_array
        first = int(qo[0])
        if first > offset:
            offset = self._data_loss(offset, min(max(first, min_offset), self.part.end))
        end = self.part.end
        # The broker answers in queue order, so the kept rows are one run [lo, hi).
        lo = _first_index(qo >= offset)
        hi = lo + _first_index(qo[lo:] >= end)
        msgs = msgs.slice(lo, hi)
        self._check_contiguous(msgs.queue_offset_array, offset)
        return msgs

    def _data_loss(self, wanted: int, first: int) -> int:
        p = self.part
        text = (
            f"ledgermq: data loss in {p.topic}/{p.broker_name}:{p.queue_id}: offsets [{wanted}, {first}) "
            f"were deleted (retention?) before they were read"
        )
        if self.opts.fail_on_data_loss:
            raise DataLossError(text + "; set failOnDataLoss=false to skip them")
        log.warning(
            "event=data_loss_skipped topic=%s broker=%s queue=%d from=%d to=%d",
            p.topic,
            p.broker_name,
            p.queue_id,
            wanted,
            first,
        )
        return min(first, p.end)

    def _check_contiguous(self, queue_offsets: np.ndarray, offset: int) -> None:
        wrong = queue_offsets != np.arange(offset, offset + len(queue_offsets), dtype=np.int64)
        if wrong.any():
            i = _first_index(wrong)
            raise ServerError(
                f"ledgermq: broker returned non-contiguous offsets for {self.part.topic}/"
                f"{self.part.broker_name}:{self.part.queue_id}: expected {offset + i}, "
                f"got {int(queue_offsets[i])}"
            )

    def _pull(self, offset: int, count: int, deadline: float) -> tuple[PullPage, int] | None:
        """One page from the current member, or None (moving on to the next member) if it cannot serve it."""
        if not self.addrs:
            self._refresh_route()
            if not self.addrs:
                time.sleep(0.2)
                return None
        addr = self.addrs[self.addr_index % len(self.addrs)]
        wait_ms = max(0, min(500, int((deadline - time.monotonic()) * 1000)))
        p = self.part
        path = f"/topics/{quote(p.topic, safe='')}/queues/{p.queue_id}/messages"
        # The binary page (pipeline/binpull.py): raw bodies, no JSON or base64 on either end.
        params: dict[str, object] = {"offset": offset, "maxMessages": count, "waitMs": wait_ms}
        if self.filtering:
            params["filterType"] = self.opts.filter_type or "TAG"
            params["filterExpression"] = self.opts.filter_expression
        try:
            resp = self.http.get(base_url(addr), path, params, _BINARY_ACCEPT)
        except TRANSPORT_ERRORS as exc:
            log.warning(
                "event=pull_unreachable addr=%s topic=%s queue=%d error=%r", addr, p.topic, p.queue_id, exc
            )
            self._next_member(sleep_s=0.1)
            return None
        if resp.status_code == 200:
            ctype = resp.headers.get("content-type", "")
            if not ctype.startswith(PULL_BINARY_CONTENT_TYPE):
                raise PullFormatError(
                    f"{addr} answered a binary pull with {ctype!r}; "
                    f"the broker must support {PULL_BINARY_CONTENT_TYPE}"
                )
            msgs = decode_pull_page(resp.content)
            min_offset = msgs.min_offset
            if not len(msgs) and offset >= min_offset and msgs.next_offset <= offset:
                # Not there yet on this member (a slave catching up, or a new master replaying).
                self._next_member(sleep_s=0.0 if wait_ms else 0.05)
                return None
            return msgs, min_offset
        err = problem_of(resp.as_httpx(), f"pull {p.topic}/{p.broker_name}:{p.queue_id}@{offset}")
        if err.code == "OFFSET_OUT_OF_RANGE" and "minOffset" in err.problem:
            if offset < int(err.problem["minOffset"]):
                return PullPage.empty(int(err.problem["minOffset"])), int(err.problem["minOffset"])
            # Past this member's end: it is behind (a slave catching up, a new master replaying).
            self._next_member(sleep_s=0.05)
            return None
        if resp.status_code in (400, 401, 403, 422):
            raise err  # our request or token is wrong: retrying elsewhere will not help
        log.warning("event=pull_retry addr=%s error=%s", addr, err)
        self._next_member(sleep_s=0.1)
        return None

    def _next_member(self, sleep_s: float) -> None:
        self.addr_index += 1
        if self.addr_index % max(1, len(self.addrs)) == 0:
            # Went round every member: ask for the route again (failover re-registers the master).
            self._refresh_route()
            if sleep_s:
                time.sleep(sleep_s)

    def _refresh_route(self) -> None:
        if not self.opts.namesrv_addrs:
            return
        resolver = RouteResolver(self.opts.namesrv_addrs, (), timeout_s=5.0, access=self.opts.access)
        try:
            for bs in resolver.broker_sets(self.part.topic):
                if bs.broker_name == self.part.broker_name and bs.addrs:
                    fresh = bs.urls()
                    # Keep members we knew too: a slave missing from the route may still serve reads.
                    self.addrs = fresh + [a for a in self.addrs if a not in fresh]
                    self.addr_index = 0
        except (httpx.TransportError, LedgerMQError) as exc:
            log.warning("event=route_refresh_failed topic=%s error=%r", self.part.topic, exc)
        finally:
            resolver.close()

    def _to_arrow(self, page: PullPage) -> pa.RecordBatch:
        # Columns straight from the decoded page (numpy / Arrow, no per-row Python); bodies are
        # already one Arrow array over the page buffer.
        p = self.part
        n = len(page)
        s = self.schema
        cols = [
            first_keys(page.keys_array),
            page.bodies,
            pa.repeat(pa.scalar(p.topic, pa.string()), n),
            pa.repeat(pa.scalar(p.broker_name, pa.string()), n),
            pa.repeat(pa.scalar(p.queue_id, pa.int32()), n),
            pa.array(page.queue_offset_array, pa.int64()),
            pa.array(page.commit_log_offset_array, pa.int64()),
            page.msg_id_array,
            page.tags_array,
        ]
        if self.opts.include_properties:
            props = [parse_properties(raw) for raw in page.properties]
            cols.append(pa.array(props, s.field("properties").type))
        for name, ms in (
            ("bornTimestamp", page.born_timestamp_array),
            ("storeTimestamp", page.store_timestamp_array),
        ):
            # ms → µs in numpy, then reinterpret as Spark's timestamp[us, UTC] (no Arrow cast kernel).
            cols.append(pa.array(ms * 1000, pa.int64()).view(s.field(name).type))
        return pa.RecordBatch.from_arrays(cols, schema=s)


def _first_index(mask: np.ndarray) -> int:
    """Index of the first True in ``mask``, or ``len(mask)`` when there is none."""
    return int(mask.argmax()) if mask.any() else len(mask)


def read_partition(part: QueuePartition, opts: FetchOptions) -> Iterator[pa.RecordBatch]:
    """The body of the readers' ``read()``: open a client, page through the range, close."""
    fetcher = QueueFetcher(part, opts)
    try:
        yield from fetcher.batches()
    finally:
        fetcher.close()
