"""Where topics live: name-server routes, broker-set addresses and queue offset ranges (HTTP, sync).

Used on the Spark driver (planning micro-batches, committing consumer-group offsets) and by the
sink's executor tasks (finding the master to produce to). Plain httpx over the documented HTTP API
(docs/INTERFACES.md); the route shapes, addresses and errors are the SDK's (`client.transport`,
`client.errors`), so the pipeline and the SDK read answers the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import httpx
import orjson

from client.errors import (
    ForbiddenError,
    LedgerMQError,
    ServiceUnavailableError,
    UnauthorizedError,
    error_from_problem,
)
from client.transport import PERM_READ, PERM_WRITE, BrokerSetRoute, base_url, parse_route, split_addrs
from pipeline.access import Access
from pipeline.offsets import QueueState, parse_queue_key

__all__ = [
    "PERM_READ",
    "PERM_WRITE",
    "BrokerSetRoute",
    "LedgerMQError",
    "RouteResolver",
    "base_url",
    "option_addrs",
    "problem_of",
]

log = logging.getLogger("ledgermq.pipeline.routes")


def option_addrs(options: Mapping[str, str], key: str, who: str) -> tuple[str, ...]:
    """Option `key` (`host:port;host:port`) as base URLs; ValueError naming the option and the
    bad address."""
    try:
        return tuple(split_addrs(options.get(key)))
    except ValueError as exc:
        raise ValueError(f"{who}: option {key!r}: {exc}") from None


def problem_of(resp: httpx.Response, what: str) -> LedgerMQError:
    """A non-2xx answer as the SDK's typed exception for its problem ``code`` (or status), the
    detail naming what was asked."""
    try:
        body = orjson.loads(resp.content)
        if not isinstance(body, dict):
            body = {"detail": str(body)}
    except orjson.JSONDecodeError:
        body = {"detail": resp.text[:300]}
    err = error_from_problem(resp.status_code, body)
    hint = " (the brokers have ACL on: set option 'token')" if resp.status_code == 401 else ""
    text = f"{what}: HTTP {resp.status_code} {err.detail}{hint}"
    return type(err)(text, status=resp.status_code, problem=body)


# Answers no other member or retry would change (every member has the same ACL file): raised at
# once instead of moving on to the next member, which would leave a broker set out of the query.
ACCESS_ERRORS = (UnauthorizedError, ForbiddenError)


class RouteResolver:
    """Looks up topics, broker sets and queue ranges through a name server or fixed broker addresses.

    Caller: the source's driver-side reader (every micro-batch) and the sink's tasks (once per task).
    With ``namesrv_addrs`` routes come from ``GET /routes/{topic}``; with only ``broker_addrs`` the
    brokers are asked ``GET /health`` (open under ACL) for their broker name and role, and grouped
    into sets.
    """

    def __init__(
        self, namesrv_addrs: Sequence[str], broker_addrs: Sequence[str], *, timeout_s: float = 10.0,
        access: Access | None = None,
    ) -> None:
        if not namesrv_addrs and not broker_addrs:
            raise ValueError("set option 'namesrvAddr' (or 'brokerAddr')")
        self.namesrv_addrs = [base_url(a) for a in namesrv_addrs]
        self.broker_addrs = [base_url(a) for a in broker_addrs]
        self.access = access or Access()
        self._http = self.access.http_client(timeout_s)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    # -- name server / broker metadata ---------------------------------------------------------
    def _get_json(self, url: str, what: str) -> dict:
        resp = self._http.get(url)
        if resp.status_code != 200:
            raise problem_of(resp, what)
        return orjson.loads(resp.content)

    def _from_namesrv(self, path: str, what: str) -> dict:
        last: Exception | None = None
        for ns in self.namesrv_addrs:
            try:
                return self._get_json(ns + path, what)
            except httpx.TransportError as exc:
                last = exc
                log.warning("event=namesrv_unreachable addr=%s error=%r", ns, exc)
        hint = "" if self.access.tls else (
            " (a name server serving only HTTPS gives plaintext no answer: set option 'caFile')"
        )
        raise ServiceUnavailableError(
            f"{what}: no name server reachable ({self.namesrv_addrs}): {last!r}{hint}"
        )

    def broker_sets(self, topic: str) -> list[BrokerSetRoute]:
        """The broker sets holding ``topic`` (empty list when the topic does not exist)."""
        if self.namesrv_addrs:
            try:
                route = self._from_namesrv(f"/routes/{topic}", f"route of topic {topic!r}")
            except LedgerMQError as exc:
                if exc.code == "TOPIC_NOT_EXIST" or exc.status == 404:
                    return []
                raise
            route.setdefault("topic", topic)
            return sorted(parse_route(route).brokers, key=lambda s: s.broker_name)
        return self._static_sets()

    def _static_sets(self) -> list[BrokerSetRoute]:
        members: dict[str, list[tuple[int, str]]] = {}
        for addr in self.broker_addrs:
            try:
                # /health, open under ACL (/status needs the monitoring right)
                st = self._get_json(addr + "/health", f"health of broker {addr}")
            except ACCESS_ERRORS:
                raise
            except (httpx.TransportError, LedgerMQError) as exc:
                log.warning("event=broker_unreachable addr=%s error=%r", addr, exc)
                continue
            rank = 0 if st.get("role") == "MASTER" else 1 + int(st.get("brokerId", 1) or 1)
            members.setdefault(st["brokerName"], []).append((rank, addr))
        if not members:
            raise ServiceUnavailableError(f"no broker reachable at {self.broker_addrs}")
        return [_static_set(name, [a for _, a in sorted(m)]) for name, m in sorted(members.items())]

    def list_topics(self) -> list[str]:
        """All topic names known to the brokers (for ``topicPattern``)."""
        if self.namesrv_addrs:
            cluster = self._from_namesrv("/cluster", "cluster view")
            sets = []
            for name, info in sorted((cluster.get("brokers") or {}).items()):
                addrs = info.get("addrs") or {}
                sets.append(_static_set(name, [addrs[i] for i in sorted(addrs, key=int)]))
        else:
            sets = self._static_sets()
        names: set[str] = set()
        for bs in sets:
            for addr in bs.urls():
                try:
                    names.update(self._get_json(addr + "/topics", f"topics of {bs.broker_name}")["topics"])
                    break
                except ACCESS_ERRORS:
                    raise
                except (httpx.TransportError, LedgerMQError) as exc:
                    log.warning(
                        "event=broker_unreachable broker=%s addr=%s error=%r", bs.broker_name, addr, exc
                    )
        return sorted(n for n in names if not n.startswith(("%", "RMQ_SYS_")))

    def queue_states(self, topics: Iterable[str]) -> tuple[list[QueueState], dict[str, tuple[str, ...]]]:
        """Per consume queue ``[minOffset, maxOffset)`` of ``topics``, and each broker set's addresses.

        Each broker set is asked through its members in order (master first); a set none of whose
        members answers is left out (the caller keeps the queues' previous offsets) and logged.
        """
        states: list[QueueState] = []
        addrs_of: dict[str, tuple[str, ...]] = {}
        for topic in topics:
            for bs in self.broker_sets(topic):
                addrs_of[bs.broker_name] = tuple(bs.urls())
                info = self._topic_info(topic, bs)
                if info is None:
                    continue
                read_nums = int(info.get("readQueueNums", bs.read_queue_nums) or 0)
                for q in info.get("queues", []):
                    qid = int(q["queueId"])
                    if read_nums and qid >= read_nums:
                        continue
                    states.append(
                        QueueState(topic, bs.broker_name, qid, int(q["minOffset"]), int(q["maxOffset"]))
                    )
        states.sort(key=lambda s: (s.topic, s.broker_name, s.queue_id))
        return states, addrs_of

    def _topic_info(self, topic: str, bs: BrokerSetRoute) -> dict | None:
        for addr in bs.urls():
            try:
                return self._get_json(f"{addr}/topics/{topic}", f"topic {topic!r} on {bs.broker_name}")
            except httpx.TransportError as exc:
                log.warning("event=broker_unreachable broker=%s addr=%s error=%r", bs.broker_name, addr, exc)
            except ACCESS_ERRORS:
                raise
            except LedgerMQError as exc:
                log.warning("event=topic_info_failed broker=%s addr=%s error=%s", bs.broker_name, addr, exc)
        log.warning(
            "event=broker_set_unreachable broker=%s topic=%s addrs=%s", bs.broker_name, topic, bs.urls()
        )
        return None

    def offset_for_timestamp(self, topic: str, addrs: Sequence[str], queue_id: int, ts_ms: int) -> int:
        """First offset of the queue stored at/after ``ts_ms`` (``GET .../queues/{q}/offset?timestamp=``)."""
        last: Exception | None = None
        for addr in addrs:
            try:
                doc = self._get_json(
                    f"{addr}/topics/{topic}/queues/{queue_id}/offset?timestamp={ts_ms}",
                    f"offset for time {ts_ms} of {topic}/{queue_id}",
                )
                return int(doc["offset"])
            except ACCESS_ERRORS:
                raise
            except (httpx.TransportError, LedgerMQError) as exc:
                last = exc
                log.warning(
                    "event=offset_for_time_failed addr=%s topic=%s queue=%d error=%r",
                    addr,
                    topic,
                    queue_id,
                    exc,
                )
        raise ServiceUnavailableError(
            f"startingTimestamp: no member of {list(addrs)} answered for {topic}/{queue_id}: {last!r}"
        )

    def commit_group_offsets(self, group: str, offsets: dict[str, dict[str, int]]) -> None:
        """``PUT /consumers/{group}/offsets`` on each broker set's master so lag tools see progress.

        Advisory only (the checkpoint is the source of truth), so failures are logged, not raised,
        but for a token without the right (401/403): that would never heal, and the group would
        silently stay behind.
        """
        for topic, queues in offsets.items():
            per_broker: dict[str, dict[str, int]] = {}
            for key, off in queues.items():
                broker, qid = parse_queue_key(key)
                per_broker.setdefault(broker, {})[str(qid)] = int(off)
            sets = {bs.broker_name: bs for bs in self.broker_sets(topic)}
            for broker, offs in per_broker.items():
                bs = sets.get(broker)
                if bs is None:
                    continue
                self._put_offsets(group, topic, bs, offs)

    def _put_offsets(self, group: str, topic: str, bs: BrokerSetRoute, offs: dict[str, int]) -> None:
        body = {"topic": topic, "offsets": offs}
        for addr in bs.urls():
            try:
                resp = self._http.put(f"{addr}/consumers/{group}/offsets", json=body)
            except httpx.TransportError as exc:
                log.warning("event=commit_offsets_unreachable group=%s addr=%s error=%r", group, addr, exc)
                continue
            if resp.status_code in (200, 204):
                return
            err = problem_of(resp, f"commit offsets of {group}")
            if isinstance(err, ACCESS_ERRORS):
                raise err
            if err.code == "NOT_MASTER" and err.problem.get("masterAddr"):
                resp = self._http.put(
                    f"{base_url(err.problem['masterAddr'])}/consumers/{group}/offsets", json=body
                )
                if resp.status_code in (200, 204):
                    return
            log.warning(
                "event=commit_offsets_failed group=%s topic=%s broker=%s error=%s",
                group,
                topic,
                bs.broker_name,
                err,
            )
        log.warning("event=commit_offsets_gave_up group=%s topic=%s broker=%s", group, topic, bs.broker_name)


def _static_set(broker_name: str, addrs: list[str]) -> BrokerSetRoute:
    """A broker set known by its members' addresses alone, the master (when known) first."""
    return BrokerSetRoute(broker_name, dict(enumerate(addrs)), 0, 0, PERM_READ | PERM_WRITE)
