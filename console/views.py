"""What each console page shows, gathered through the SDK's admin client (no HTML here).

Every view asks each broker set once (bulk endpoints) and every member once at most, all at the
same time, so a page costs a handful of requests whatever the number of topics or groups, and a
member that does not answer becomes an error on its own row, never a failed page.
Callers: `console.app` routes; each function returns plain data for a template."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from client.admin import AsyncAdmin, decode_message_id
from client.errors import BadRequestError, LedgerMQError, TopicNotExistError, UnauthorizedError
from console.throughput import Throughput, TopicRate, parse_counters

# A member's /status must answer within this, or the row shows it as unreachable: the cluster
# page refreshes every second and must notice a killed master at once.
STATUS_TIMEOUT_S = 1.5

PERM_READ = 4
PERM_WRITE = 2


def perm_label(perm: int) -> str:
    """RocketMQ's PermName as operators read it: R, W, RW or '-' (neither)."""
    label = ("R" if perm & PERM_READ else "") + ("W" if perm & PERM_WRITE else "")
    return label or "-"


def error_text(exc: BaseException) -> str:
    """One line an operator can act on, from an SDK error (code first)."""
    if isinstance(exc, LedgerMQError):
        return str(exc)  # "CODE: detail"
    return f"{type(exc).__name__}: {exc}"


async def gather_pages(*views: Any) -> list[Any]:
    """Several views of one page at once (each handles its own errors)."""
    return list(await asyncio.gather(*views))


async def _gather(calls: list[Any]) -> list[Any]:
    """Results or exceptions, in order. An UNAUTHORIZED anywhere is raised: the page asks for a
    token instead of showing rows of 401s."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for r in results:
        if isinstance(r, UnauthorizedError):
            raise r
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r
    return results


# -- cluster ---------------------------------------------------------------------------------------
@dataclass
class MemberRow:
    addr: str
    registered_id: int
    status: dict[str, Any] | None = None
    error: str | None = None
    follower_lag: int | None = None
    # The member's DLedger id from its last answer, while it does not answer.
    last_self_id: str | None = None

    @property
    def self_id(self) -> str | None:
        return self.dledger.get("selfId") or self.last_self_id

    @property
    def up(self) -> bool:
        return self.status is not None

    @property
    def role(self) -> str:
        return str(self.status.get("role")) if self.status else "UNREACHABLE"

    @property
    def dledger(self) -> dict[str, Any]:
        return (self.status or {}).get("dledger") or {}


@dataclass
class SetView:
    name: str
    cluster: str
    members: list[MemberRow]
    error: str | None = None

    @property
    def master(self) -> MemberRow | None:
        return next((m for m in self.members if m.role == "MASTER"), None)

    @property
    def leader_id(self) -> str | None:
        m = self.master
        return m.dledger.get("selfId") if m else None


@dataclass
class ClusterView:
    sets: list[SetView] = field(default_factory=list)
    error: str | None = None


async def cluster_view(admin: AsyncAdmin, last_ids: dict[str, str] | None = None) -> ClusterView:
    """Every broker set the name servers know, each member's /status (one request each).
    `last_ids` (address → DLedger id, kept by the caller across views) names members that stopped
    answering."""
    last_ids = {} if last_ids is None else last_ids
    try:
        doc = await admin.cluster()
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        return ClusterView(error=f"name server: {error_text(exc)}")
    sets = []
    for name, b in sorted(doc.get("brokers", {}).items()):
        members = b.get("members") or [{"brokerId": int(k), "addr": v} for k, v in b["addrs"].items()]
        rows = [MemberRow(m["addr"], int(m["brokerId"])) for m in members]
        sets.append(SetView(name, b.get("cluster", ""), rows))
    rows = [m for s in sets for m in s.members]
    results = await _gather([admin.member_status(m.addr, timeout_s=STATUS_TIMEOUT_S) for m in rows])
    for m, r in zip(rows, results, strict=True):
        if isinstance(r, Exception):
            m.error = error_text(r)
            m.last_self_id = last_ids.get(m.addr)
        else:
            m.status = r
            if m.self_id:
                last_ids[m.addr] = m.self_id
    for s in sets:
        leader = s.master
        lags = leader.dledger.get("followerLag", {}) if leader else {}
        for m in s.members:
            sid = m.dledger.get("selfId")
            if sid in lags:
                m.follower_lag = int(lags[sid])
            elif m is leader and sid is not None:
                m.follower_lag = 0
        s.members.sort(key=lambda m: (m.self_id or "", m.addr))
        if leader is None:
            s.error = "no master: writes to this set fail until one is elected"
    return ClusterView(sets)


# -- topics ----------------------------------------------------------------------------------------
@dataclass
class TopicRow:
    topic: str
    per_set: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return sum(q["maxOffset"] - q["minOffset"] for d in self.per_set.values() for q in d["queues"])

    @property
    def queues_label(self) -> str:
        shapes = {(d["readQueueNums"], d["writeQueueNums"]) for d in self.per_set.values()}
        return ", ".join(f"{r}/{w}" for r, w in sorted(shapes))

    @property
    def perm_label(self) -> str:
        return ", ".join(sorted({perm_label(d["perm"]) for d in self.per_set.values()}))

    @property
    def message_type(self) -> str:
        types = {d.get("messageType") or "NORMAL" for d in self.per_set.values()}
        return ", ".join(sorted(types))


@dataclass
class TopicsView:
    rows: list[TopicRow] = field(default_factory=list)
    set_names: list[str] = field(default_factory=list)
    set_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None


async def topics_view(admin: AsyncAdmin) -> TopicsView:
    """Every topic of every set: one `GET /admin/topics` per set."""
    try:
        sets = await admin.broker_sets()
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        return TopicsView(error=error_text(exc))
    results = await _gather([admin.topics_of_set(s) for s in sets])
    view = TopicsView(set_names=[s.broker_name for s in sets])
    rows: dict[str, TopicRow] = {}
    for s, r in zip(sets, results, strict=True):
        if isinstance(r, Exception):
            view.set_errors[s.broker_name] = error_text(r)
            continue
        for doc in r:
            rows.setdefault(doc["topic"], TopicRow(doc["topic"])).per_set[s.broker_name] = doc
    view.rows = [rows[t] for t in sorted(rows)]
    return view


@dataclass
class TopicView:
    topic: str
    per_set: dict[str, dict[str, Any]] = field(default_factory=dict)
    route: dict[str, Any] | None = None
    groups: list[dict[str, Any]] = field(default_factory=list)
    set_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None


async def topic_view(admin: AsyncAdmin, topic: str) -> TopicView:
    """One topic: its queues on each set, its route at the name servers, the groups reading it."""
    view = TopicView(topic)
    try:
        sets = await admin.broker_sets()
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        view.error = error_text(exc)
        return view
    calls = [admin.topics_of_set(s) for s in sets] + [admin.groups_of_set(s) for s in sets]
    results = await _gather([*calls, admin.topic_route(topic)])
    n = len(sets)
    for s, r in zip(sets, results[:n], strict=True):
        if isinstance(r, Exception):
            view.set_errors[s.broker_name] = error_text(r)
            continue
        doc = next((d for d in r if d["topic"] == topic), None)
        if doc is not None:
            view.per_set[s.broker_name] = doc
    for s, r in zip(sets, results[n : 2 * n], strict=True):
        if isinstance(r, Exception):
            continue
        for g in r:
            for t in g["topics"]:
                if t["topic"] == topic:
                    view.groups.append({"brokerName": s.broker_name, "group": g["group"], "lag": t["lag"]})
    route = results[-1]
    view.route = None if isinstance(route, Exception) else route
    if not view.per_set and not view.set_errors:
        view.error = f"TOPIC_NOT_EXIST: no broker set holds topic {topic!r}"
    return view


# -- consumer groups -------------------------------------------------------------------------------
@dataclass
class GroupRow:
    group: str
    lag: int = 0
    inflight: int = 0
    topics: set[str] = field(default_factory=set)
    sets: set[str] = field(default_factory=set)
    clients: list[dict[str, Any]] = field(default_factory=list)

    @property
    def clients_label(self) -> str:
        """How many consumers are connected, by protocol: "2 (HTTP 1, gRPC 1)"."""
        if not self.clients:
            return "none"
        counts: dict[str, int] = {}
        for c in self.clients:
            counts[c["protocol"]] = counts.get(c["protocol"], 0) + 1
        return f"{len(self.clients)} (" + ", ".join(f"{p} {n}" for p, n in sorted(counts.items())) + ")"


@dataclass
class GroupsView:
    rows: list[GroupRow] = field(default_factory=list)
    set_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None


async def groups_view(admin: AsyncAdmin) -> GroupsView:
    """Every group of every set with its lag: one `GET /admin/consumers` per set."""
    try:
        sets = await admin.broker_sets()
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        return GroupsView(error=error_text(exc))
    results = await _gather([admin.groups_of_set(s) for s in sets])
    view = GroupsView()
    rows: dict[str, GroupRow] = {}
    for s, r in zip(sets, results, strict=True):
        if isinstance(r, Exception):
            view.set_errors[s.broker_name] = error_text(r)
            continue
        for g in r:
            row = rows.setdefault(g["group"], GroupRow(g["group"]))
            row.lag += g["lag"]
            row.inflight += g.get("inflight", 0)
            row.clients += [{"brokerName": s.broker_name, **c} for c in g.get("clients", [])]
            row.topics.update(t["topic"] for t in g["topics"])
            row.sets.add(s.broker_name)
    view.rows = [rows[g] for g in sorted(rows)]
    return view


@dataclass
class GroupView:
    group: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    set_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    inflight: int = 0
    clients: list[dict[str, Any]] = field(default_factory=list)

    @property
    def lag(self) -> int:
        return sum(r["lag"] for r in self.rows)

    @property
    def topics(self) -> list[str]:
        return sorted({r["topic"] for r in self.rows})


async def group_view(admin: AsyncAdmin, group: str) -> GroupView:
    """One group's committed offset and lag per set, topic and queue."""
    view = GroupView(group)
    try:
        sets = await admin.broker_sets()
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        view.error = error_text(exc)
        return view
    n = len(sets)
    results = await _gather(
        [admin.group_offsets_of_set(s, group) for s in sets] + [admin.groups_of_set(s) for s in sets]
    )
    for s, r, summary in zip(sets, results[:n], results[n:], strict=True):
        if isinstance(r, Exception):
            view.set_errors[s.broker_name] = error_text(r)
            continue
        view.rows += [{"brokerName": s.broker_name, **o} for o in r]
        if not isinstance(summary, Exception):
            for g in summary:
                if g["group"] == group:
                    view.inflight += g.get("inflight", 0)
                    view.clients += [{"brokerName": s.broker_name, **c} for c in g.get("clients", [])]
    view.rows.sort(key=lambda r: (r["topic"], r["brokerName"], r["queueId"]))
    return view


# -- messages --------------------------------------------------------------------------------------
@dataclass
class SearchView:
    """Messages found on each set (each row carries `brokerName`), sets that did not answer, and
    sets whose scan stopped on its budget (the time range should be narrowed)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    set_errors: dict[str, str] = field(default_factory=dict)
    truncated: list[str] = field(default_factory=list)
    scanned: int = 0
    error: str | None = None


async def search_view(admin: AsyncAdmin, topic: str, **criteria: Any) -> SearchView:
    """`GET /messages` on every set at once (key, queue_id, begin_ms, end_ms, max_messages)."""
    view = SearchView()
    try:
        sets = await admin.broker_sets()
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        view.error = error_text(exc)
        return view
    results = await _gather([admin.search_messages_of_set(s, topic, **criteria) for s in sets])
    missing = 0
    for s, r in zip(sets, results, strict=True):
        if isinstance(r, TopicNotExistError):
            missing += 1
        elif isinstance(r, Exception):
            view.set_errors[s.broker_name] = error_text(r)
        else:
            view.rows += [{"brokerName": s.broker_name, **m} for m in r["messages"]]
            view.scanned += r["scanned"]
            if r["truncated"]:
                view.truncated.append(s.broker_name)
    if missing == len(sets):
        view.error = f"TOPIC_NOT_EXIST: no broker set holds topic {topic!r}"
    view.rows.sort(key=lambda m: (m["storeTimestamp"], m["brokerName"], m["queueId"], m["queueOffset"]))
    return view


@dataclass
class MessageView:
    message: dict[str, Any] | None = None
    deliveries: dict[str, Any] | None = None
    error: str | None = None
    deliveries_error: str | None = None


async def message_view(admin: AsyncAdmin, msg_id: str, topic: str | None = None) -> MessageView:
    """A message by id and its delivery state and history per group, asked at once.

    `msg_id` is the broker's offset id, or the id a RocketMQ 5 client was given (its UNIQ_KEY,
    what its logs print): brokers know those only for a while (their idempotency window), so with
    `topic` the topic is searched for it (the broker's key search matches UNIQ_KEY too). Either
    way the message is then shown by its broker id."""
    view = MessageView()
    if not is_offset_message_id(msg_id):
        offset_id, view.error = await _offset_id_of_client_id(admin, msg_id, topic)
        if offset_id is None:
            return view
        msg_id = offset_id
    message, deliveries = await _gather([admin.query_msg_by_id(msg_id), admin.message_deliveries(msg_id)])
    if isinstance(message, Exception):
        view.error = error_text(message)
        return view
    view.message = message
    if isinstance(deliveries, Exception):
        view.deliveries_error = error_text(deliveries)
    else:
        view.deliveries = deliveries
    return view


# A UNIQ_KEY names one message; a few more rows only when an application reused it as a key.
MAX_UNIQ_KEY_MATCHES = 4


def is_offset_message_id(msg_id: str) -> bool:
    """True for a broker's offset message id (32 hex digits: store host + commit-log offset)."""
    try:
        decode_message_id(msg_id)
    except BadRequestError:
        return False
    return True


async def _offset_id_of_client_id(
    admin: AsyncAdmin, msg_id: str, topic: str | None
) -> tuple[str | None, str | None]:
    """(the broker id of the message a client knows as `msg_id`, None) or (None, the error)."""
    if topic:
        found = await search_view(admin, topic, key=msg_id, max_messages=MAX_UNIQ_KEY_MATCHES)
        if found.error or not found.rows:
            return None, found.error or _not_found_by_key(msg_id, topic, found)
        return found.rows[0]["msgId"], None
    try:
        return (await admin.query_msg_by_id(msg_id))["msgId"], None
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        return None, f"{error_text(exc)} — for the id a RocketMQ 5 client printed, give its topic too"


def _not_found_by_key(msg_id: str, topic: str, found: SearchView) -> str:
    where = "; ".join(f"{name}: {err}" for name, err in sorted(found.set_errors.items()))
    text = f"MESSAGE_NOT_FOUND: no message of topic {topic!r} has id {msg_id!r}"
    if found.truncated:
        text += f" among the {found.scanned:,} messages scanned (the scan stopped: the topic holds more)"
    return f"{text} ({where})" if where else text


DLQ_PREFIX = "%DLQ%"
# Dead letters listed on a group's page, per broker set.
DLQ_PAGE_SIZE = 50


async def dead_letters_view(admin: AsyncAdmin, group: str) -> SearchView:
    """The first dead letters of `group` on each set (`%DLQ%{group}`; none when it has none)."""
    view = await search_view(admin, DLQ_PREFIX + group, max_messages=DLQ_PAGE_SIZE)
    if view.error and view.error.startswith("TOPIC_NOT_EXIST"):
        view.error = None
    return view


# -- access control --------------------------------------------------------------------------------
@dataclass
class AclView:
    """Per broker set: whether ACL is on and the accounts this token may see."""

    per_set: dict[str, dict[str, Any]] = field(default_factory=dict)
    set_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None


async def acl_view(admin: AsyncAdmin) -> AclView:
    view = AclView()
    try:
        sets = await admin.broker_sets()
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        view.error = error_text(exc)
        return view
    for s, r in zip(sets, await _gather([admin.acl_accounts_of_set(s) for s in sets]), strict=True):
        if isinstance(r, Exception):
            view.set_errors[s.broker_name] = error_text(r)
        else:
            view.per_set[s.broker_name] = r
    return view


# -- throughput ------------------------------------------------------------------------------------
@dataclass
class ThroughputView:
    rates: list[TopicRate] = field(default_factory=list)
    window_s: float = 0.0
    member_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None


async def throughput_view(admin: AsyncAdmin, throughput: Throughput, *, filtered: bool) -> ThroughputView:
    """Sample every member's counters now (one `/metrics` each) and the rates so far; with
    `filtered` (an ACL token), only the topics the token may read (one topic view per set)."""
    view = ThroughputView()
    try:
        doc = await admin.cluster()
        sets = await admin.broker_sets() if filtered else []
    except UnauthorizedError:
        raise
    except LedgerMQError as exc:
        view.error = error_text(exc)
        return view
    addrs = sorted({m["addr"] for b in doc.get("brokers", {}).values() for m in b.get("members", [])})
    calls = [admin.member_metrics(a, timeout_s=STATUS_TIMEOUT_S) for a in addrs]
    results = await _gather(calls + [admin.topics_of_set(s) for s in sets])
    counters: dict[tuple[str, str, str], float] = {}
    for addr, r in zip(addrs, results[: len(addrs)], strict=True):
        if isinstance(r, Exception):
            view.member_errors[addr] = error_text(r)
        else:
            counters.update(parse_counters(addr, r))
    throughput.add(time.monotonic(), counters)
    view.rates, view.window_s = throughput.rates(), throughput.window_s
    if filtered:
        readable = {t["topic"] for r in results[len(addrs) :] if not isinstance(r, Exception) for t in r}
        view.rates = [r for r in view.rates if r.topic in readable]
    return view
