"""`Admin` / `AsyncAdmin`: the operations behind `mqadmin` (topics, cluster, offsets, messages,
leadership transfer), over the name servers' and brokers' HTTP APIs."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any

from client.errors import (
    BadRequestError,
    BrokerUnreachableError,
    ForbiddenError,
    LedgerMQError,
    MessageNotFoundError,
    NotFoundError,
    TopicNotExistError,
    UnauthorizedError,
)
from client.transport import AsyncTransport, base_url, seg, split_addrs
from wire.msgid import MessageIdError
from wire.msgid import decode_message_id as wire_decode_message_id


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """(store host `ip:port`, commit-log offset) of an offset message id (`wire.msgid`: 32 hex
    digits, the store host's IPv4 address and port, then the offset). BadRequestError for
    anything else."""
    try:
        return wire_decode_message_id(msg_id)
    except MessageIdError as exc:
        raise BadRequestError(str(exc)) from None


def _host_port(addr: str) -> str:
    """`http://h:p/` or `h:p` → `h:p` (how brokers register and message ids name them)."""
    return addr.split("://", 1)[-1].rstrip("/")


@dataclass
class BrokerSet:
    """A broker set as the cluster view lists it."""

    broker_name: str
    cluster: str
    addrs: dict[int, str]
    master_addr: str | None

    @property
    def master_url(self) -> str | None:
        addr = self.master_addr or self.addrs.get(0)
        return base_url(addr) if addr else None

    def urls(self) -> list[str]:
        first = [self.master_addr] if self.master_addr else []
        return [
            base_url(a) for a in first + [a for _, a in sorted(self.addrs.items()) if a != self.master_addr]
        ]


class AsyncAdmin:
    """Admin operations. With name servers, broker sets come from `GET /cluster`; with only
    `broker_addr`, each address is its own set."""

    def __init__(
        self,
        namesrv_addr: str | list[str] | None = None,
        *,
        broker_addr: str | list[str] | None = None,
        token: str | None = None,
        request_timeout_s: float = 10.0,
        transport: AsyncTransport | None = None,
        ca_file: str | None = None,
        client_cert: str | tuple[str, str] | None = None,
    ) -> None:
        # A caller may pass its own transport (e.g. the console's, which counts its requests).
        self.transport = transport or AsyncTransport(
            token=token, timeout_s=request_timeout_s, ca_file=ca_file, client_cert=client_cert
        )
        self.namesrv_urls = split_addrs(namesrv_addr)
        self.broker_urls = split_addrs(broker_addr)
        if not self.namesrv_urls and not self.broker_urls:
            raise LedgerMQError("give a name server address (-n) or a broker address (-b)")

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _namesrv(self, path: str) -> Any:
        last: Exception | None = None
        for url in self.namesrv_urls:
            try:
                return await self.transport.request("GET", url + path)
            except BrokerUnreachableError as exc:
                last = exc
        raise BrokerUnreachableError(f"no name server answered {path}: {last}")

    async def cluster(self) -> dict[str, Any]:
        """The name server's cluster view (`GET /cluster`)."""
        if not self.namesrv_urls:
            return {
                "clusters": {"static": self.broker_urls},
                "brokers": {
                    u: {"cluster": "static", "addrs": {"0": u}, "masterAddr": u} for u in self.broker_urls
                },
            }
        return await self._namesrv("/cluster")

    async def broker_sets(
        self, cluster: str | None = None, broker_name: str | None = None
    ) -> list[BrokerSet]:
        view = await self.cluster()
        sets = [
            BrokerSet(name, b["cluster"], {int(k): v for k, v in b["addrs"].items()}, b.get("masterAddr"))
            for name, b in view["brokers"].items()
        ]
        sets = [s for s in sets if (cluster is None or s.cluster == cluster)]
        sets = [s for s in sets if (broker_name is None or s.broker_name == broker_name)]
        if not sets:
            raise NotFoundError(f"no live broker set (cluster={cluster}, brokerName={broker_name})")
        return sets

    @staticmethod
    def _master(s: BrokerSet) -> str:
        if s.master_url is None:
            raise BrokerUnreachableError(f"broker set {s.broker_name} has no master right now")
        return s.master_url

    # -- topics ----------------------------------------------------------------------------------
    async def update_topic(
        self,
        topic: str,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = 6,
        cluster: str | None = None,
        broker_name: str | None = None,
        attributes: dict[str, str | None] | None = None,
    ) -> dict[str, Any]:
        """Create or update a topic on the master of every matching broker set; `attributes`
        (e.g. {"message.type": "FIFO"}; None removes one) are merged into the topic's."""
        body: dict[str, Any] = {"readQueueNums": read_queue_nums, "writeQueueNums": write_queue_nums,
                                "perm": perm}
        if attributes:
            body["attributes"] = attributes
        out = {}
        for s in await self.broker_sets(cluster, broker_name):
            out[s.broker_name] = await self.transport.request(
                "PUT", f"{self._master(s)}/topics/{seg(topic)}", json=body
            )
        return out

    async def delete_topic(self, topic: str, cluster: str | None = None) -> list[str]:
        """Delete `topic` from the master of every matching broker set; the names of the sets
        that had it."""
        deleted = []
        for s in await self.broker_sets(cluster):
            try:
                await self.transport.request("DELETE", f"{self._master(s)}/topics/{seg(topic)}")
                deleted.append(s.broker_name)
            except NotFoundError:
                pass
        return deleted

    async def topic_list(self) -> list[str]:
        """Topics of the name servers' live brokers (or of every `broker_addr`)."""
        if self.namesrv_urls:
            return (await self._namesrv("/topics"))["topics"]
        names: set[str] = set()
        for url in self.broker_urls:
            names.update((await self.transport.request("GET", f"{url}/topics"))["topics"])
        return sorted(names)

    async def topic_route(self, topic: str) -> dict[str, Any]:
        """The name servers' route of `topic` (`GET /routes/{topic}`)."""
        if not self.namesrv_urls:
            raise LedgerMQError("topicRoute needs a name server (-n)")
        return await self._namesrv(f"/routes/{seg(topic)}")

    async def topic_status(self, topic: str) -> list[dict[str, Any]]:
        """Per broker set and queue: min and max offsets (from any member, master first). A set
        no member of which answers gets one row `{"brokerName", "error": "UNREACHABLE"}`; the call
        fails only when no set answered."""
        rows = []
        down = []
        for s in await self.broker_sets():
            try:
                doc = await self._first(s, "GET", f"/topics/{seg(topic)}")
            except NotFoundError:
                continue
            except BrokerUnreachableError as exc:
                down.append({"brokerName": s.broker_name, "error": exc.code})
                continue
            for q in doc["queues"]:
                rows.append({"brokerName": s.broker_name, **q})
        if not rows:
            if down:
                raise BrokerUnreachableError(f"topic {topic!r}: no member of {down} answered")
            raise NotFoundError(f"topic {topic!r} is on no live broker set")
        return rows + down

    async def _first(self, s: BrokerSet, method: str, path: str, **kw: Any) -> Any:
        last: Exception | None = None
        for url in s.urls():
            try:
                return await self.transport.request(method, url + path, **kw)
            except BrokerUnreachableError as exc:
                last = exc
        raise BrokerUnreachableError(f"no member of {s.broker_name} answered: {last}")

    async def topics_of_set(self, broker_set: BrokerSet) -> list[dict[str, Any]]:
        """Every topic of one broker set, with config and each queue's min/max offsets, in one
        request (`GET /admin/topics`, from any member, master first); with access control, only
        the topics the token may read."""
        return (await self._first(broker_set, "GET", "/admin/topics"))["topics"]

    # -- cluster -------------------------------------------------------------------------------
    async def cluster_list(self) -> list[dict[str, Any]]:
        """Every member of every broker set with its `/status` (role, term, commit index)."""
        rows = []
        for s, bid, addr, st in await self.member_statuses():
            row: dict[str, Any] = {"cluster": s.cluster, "brokerName": s.broker_name, "brokerId": bid,
                                   "addr": addr}
            if isinstance(st, LedgerMQError):
                row.update(role="UNREACHABLE", error=st.code)
            else:
                dl = st.get("dledger") or {}
                row.update(role=st.get("role"), term=dl.get("term"), leaderId=dl.get("leaderId"),
                           selfId=dl.get("selfId"), committedIndex=dl.get("committedIndex"))
            rows.append(row)
        return rows

    async def members(self) -> list[tuple[BrokerSet, int, str]]:
        """(broker set, broker id, address) of every member of every set, in set and id order."""
        return [(s, bid, addr) for s in await self.broker_sets() for bid, addr in sorted(s.addrs.items())]

    async def member_statuses(self) -> list[tuple[BrokerSet, int, str, dict[str, Any] | LedgerMQError]]:
        """Every member with its `/status`, or the error it answered with (3 s each, one by one)."""
        out: list[tuple[BrokerSet, int, str, dict[str, Any] | LedgerMQError]] = []
        for s, bid, addr in await self.members():
            try:
                out.append((s, bid, addr, await self.member_status(addr, timeout_s=3.0)))
            except LedgerMQError as exc:
                out.append((s, bid, addr, exc))
        return out

    async def member_status(self, addr: str, timeout_s: float = 2.0) -> dict[str, Any]:
        """One broker member's `GET /status`: role, master address, DLedger metadata with
        `followerLag` on the leader."""
        return await self.transport.request("GET", f"{base_url(addr)}/status", timeout_s=timeout_s)

    async def member_config(self, addr: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """One broker member's settings (`GET /admin/config`): `properties` (every key LedgerMQ
        implements, as in a `.properties` file, key passwords masked), `source`, `ignored` (keys
        RocketMQ knows that LedgerMQ accepted without implementing)."""
        return await self.transport.request("GET", f"{base_url(addr)}/admin/config", timeout_s=timeout_s)

    async def update_member_config(self, addr: str, updates: dict[str, str | int],
                                   timeout_s: float = 5.0) -> dict[str, Any]:
        """One member's `PATCH /admin/config` (admin right): `updated` {key: {old, new}}, `savedTo`
        (the broker reads it again at start), and in a DLedger set `dLegerSelfId`/`dLegerPeers`."""
        return await self.transport.request("PATCH", f"{base_url(addr)}/admin/config", json=updates,
                                            timeout_s=timeout_s)

    async def update_broker_config(self, updates: dict[str, str | int], *, cluster: str | None = None,
                                   broker_name: str | None = None) -> list[dict[str, Any]]:
        """RocketMQ's updateBrokerConfig on every member of the chosen sets (a cluster's, or one
        set): a row per member and key (brokerName, addr, key, old, new), a row with `error` for a
        member that refused or did not answer, and one for each DLedger member the name servers
        do not list (it did not get the change: update it with its address once it is back)."""
        rows: list[dict[str, Any]] = []
        for s in await self.broker_sets(cluster, broker_name):
            peers: set[str] = set()
            reached: set[str] = set()
            for _, addr in sorted(s.addrs.items()):
                try:
                    doc = await self.update_member_config(addr, updates)
                except LedgerMQError as exc:
                    if isinstance(exc, BadRequestError | ForbiddenError | UnauthorizedError) and not rows:
                        raise  # the same answer from every member: say it once, nothing changed
                    rows.append({"brokerName": s.broker_name, "addr": addr, "error": exc.code,
                                 "detail": str(exc)})
                    continue
                peers.update(doc.get("dLegerPeers") or ())
                if doc.get("dLegerSelfId"):
                    reached.add(doc["dLegerSelfId"])
                rows += config_change_rows(doc)
            unlisted = len(peers) - len(s.addrs)
            if unlisted > 0:
                missing = ", ".join(sorted(peers - reached))
                rows.append({"brokerName": s.broker_name, "addr": "-", "error": "NOT_UPDATED",
                             "detail": f"{unlisted} of the set's {len(peers)} DLedger members are not listed "
                                       f"by the name servers (down?); not updated: {missing}. Run "
                                       "updateBrokerConfig -b with each one's address once it is back"})
        return rows

    async def member_metrics(self, addr: str, timeout_s: float = 2.0) -> str:
        """One member's Prometheus exposition (`GET /metrics`), as text."""
        return await self.transport.request("GET", f"{base_url(addr)}/metrics", timeout_s=timeout_s)

    async def client_list(self, group: str | None = None) -> list[dict[str, Any]]:
        """Clients every reachable member saw lately (`GET /clients`): HTTP consumers and RocketMQ 5
        gRPC producers and consumers, each row with its broker set and member; `group`'s only."""
        rows = []
        params = {"group": group} if group else None
        for s in await self.broker_sets():
            for addr in sorted(set(s.addrs.values())):
                try:
                    doc = await self.transport.request(
                        "GET", f"{base_url(addr)}/clients", params=params, timeout_s=3.0
                    )
                except LedgerMQError:
                    continue  # a member down: its clients have moved to the others
                rows += [
                    {"brokerName": s.broker_name, "brokerAddr": addr, **c} for c in doc.get("clients", [])
                ]
        return rows

    async def leadership_transfer(self, broker_name: str, transferee_id: str) -> dict[str, Any]:
        """Ask the master of `broker_name` to hand DLedger leadership to member `transferee_id`."""
        (s,) = await self.broker_sets(broker_name=broker_name)
        return await self.transport.request(
            "POST",
            f"{self._master(s)}/admin/leadership-transfer",
            json={"transfereeId": transferee_id},
            timeout_s=15.0,
        )

    # -- consumers -----------------------------------------------------------------------------
    async def update_sub_group(self, group: str, changes: dict[str, Any], cluster: str | None = None,
                               broker_name: str | None = None) -> dict[str, Any]:
        """Change a consumer group's settings (retryMaxTimes, retryPolicy, consumeMessageOrderly)
        on the master of every matching broker set; broker set → the settings now."""
        out = {}
        for s in await self.broker_sets(cluster, broker_name):
            out[s.broker_name] = await self.transport.request(
                "PUT", f"{self._master(s)}/consumers/{seg(group)}/config", json=changes
            )
        return out

    async def sub_group(self, group: str) -> dict[str, Any]:
        """A consumer group's settings on every broker set (broker set → settings)."""
        return {s.broker_name: await self._first(s, "GET", f"/consumers/{seg(group)}/config")
                for s in await self.broker_sets()}

    async def consumer_progress(
        self, group: str | None = None, topic: str | None = None
    ) -> list[dict[str, Any]]:
        """Per broker set, topic and queue: the group's committed offset, max offset and lag; a set
        that does not answer gets one row `{"brokerName", "error": "UNREACHABLE"}`. Without a
        `group`, every group of every set (RocketMQ's consumerProgress without -g), each row with
        its `group`."""
        rows = []
        down = []
        sets = await self.broker_sets()
        for s in sets:
            try:
                if group is not None:
                    offsets = await self.group_offsets_of_set(s, group, topic)
                    rows += [{"brokerName": s.broker_name, **o} for o in offsets]
                    continue
                for g in (await self._first(s, "GET", "/consumers"))["groups"]:
                    offsets = await self.group_offsets_of_set(s, g, topic)
                    rows += [{"group": g, "brokerName": s.broker_name, **o} for o in offsets]
            except BrokerUnreachableError as exc:
                down.append({"brokerName": s.broker_name, "error": exc.code})
        if len(down) == len(sets):
            raise BrokerUnreachableError(
                f"consumer progress of {group or 'every group'}: no broker set answered"
            )
        return rows + down

    async def groups_of_set(self, broker_set: BrokerSet) -> list[dict[str, Any]]:
        """Every consumer group of one broker set with its lag summed per topic, in one request
        (`GET /admin/consumers`); with access control, only what the token may read."""
        return (await self._first(broker_set, "GET", "/admin/consumers"))["groups"]

    async def acl_accounts_of_set(self, broker_set: BrokerSet) -> dict[str, Any]:
        """One broker set's ACL accounts and rights, without tokens (`GET /admin/acl`: every
        account for an admin token, else the token's own): `{"enabled", "accounts"}`."""
        return await self._first(broker_set, "GET", "/admin/acl")

    async def group_offsets_of_set(
        self, broker_set: BrokerSet, group: str, topic: str | None = None
    ) -> list[dict[str, Any]]:
        """One broker set's rows of `consumer_progress`: committed offset, max offset, lag per
        topic and queue."""
        params = {"topic": topic} if topic else None
        doc = await self._first(broker_set, "GET", f"/consumers/{seg(group)}/offsets", params=params)
        return doc["offsets"]

    async def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int) -> list[dict[str, Any]]:
        """Move the group's committed offset of each queue to the first message stored at or after
        `timestamp_ms` (RocketMQ's resetOffsetByTime)."""
        rows = []
        found = False
        for s in await self.broker_sets():
            try:
                info = await self._first(s, "GET", f"/topics/{seg(topic)}")
            except NotFoundError:
                continue
            found = True
            offsets = {}
            for q in info["queues"]:
                doc = await self._first(
                    s,
                    "GET",
                    f"/topics/{seg(topic)}/queues/{q['queueId']}/offset",
                    params={"timestamp": timestamp_ms},
                )
                offsets[str(q["queueId"])] = doc["offset"]
                rows.append({"brokerName": s.broker_name, "queueId": q["queueId"], "offset": doc["offset"]})
            await self.transport.request(
                "PUT",
                f"{self._master(s)}/consumers/{seg(group)}/offsets",
                json={"topic": topic, "offsets": offsets},
            )
        if not found:
            raise TopicNotExistError(f"topic {topic!r} is on no live broker set")
        return rows

    # -- messages ------------------------------------------------------------------------------
    async def query_msg_by_id(self, msg_id: str) -> dict[str, Any]:
        """The message with id `msg_id`, plus `brokerName`. An offset id names its store host and
        commit-log offset: the broker set with a member at that host is asked (master first);
        only when no set has it (an address that changed) is every set scanned. Any other id is
        a client's message id (the UNIQ_KEY a RocketMQ 5 client printed): every set is asked, and
        a broker knows it within its idempotency window. Two local broker sets hold different
        messages at the same offset, so for an offset id an answer whose own msgId (or messageId)
        differs is never returned. MessageNotFoundError when no set has it;
        BrokerUnreachableError when the set that should have it (or, scanning, every set) did not
        answer."""
        try:
            host: str | None = decode_message_id(msg_id)[0]
        except BadRequestError:
            host = None
        want = msg_id.upper()
        sets = await self.broker_sets()
        named = [s for s in sets if host is not None and host in {_host_port(a) for a in s.addrs.values()}]
        unreachable: list[str] = []
        for s in named or sets:
            try:
                doc = await self._first(s, "GET", f"/messages/{seg(want if host else msg_id)}")
            except (MessageNotFoundError, NotFoundError):
                continue
            except BrokerUnreachableError:
                unreachable.append(s.broker_name)
                continue
            # A client's id is matched by the broker itself (exactly, in its idempotency table).
            ids = (str(doc.get("msgId", "")).upper(), str(doc.get("messageId", "")).upper())
            if host is None or want in ids:
                return {"brokerName": s.broker_name, **doc}
        if unreachable and len(unreachable) == len(named or sets):
            raise BrokerUnreachableError(f"message {msg_id}: no member of {', '.join(unreachable)} answered")
        raise MessageNotFoundError(f"message {msg_id} not found on any broker set")

    async def search_messages_of_set(
        self,
        broker_set: BrokerSet,
        topic: str,
        *,
        key: str | None = None,
        queue_id: int | None = None,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_messages: int = 64,
    ) -> dict[str, Any]:
        """One broker set's messages of `topic` by key and/or store time (`GET /messages`, a
        bounded scan on the broker): `{"messages", "scanned", "truncated"}`."""
        params: dict[str, Any] = {"topic": topic, "begin": begin_ms, "maxMessages": max_messages}
        if key is not None:
            params["key"] = key
        if queue_id is not None:
            params["queueId"] = queue_id
        if end_ms is not None:
            params["end"] = end_ms
        return await self._first(broker_set, "GET", "/messages", params=params)

    async def query_msg_by_key(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None, max_messages: int = 64
    ) -> list[dict[str, Any]]:
        """Messages of `topic` carrying `key` (RocketMQ's queryMsgByKey) on every broker set, each
        with `brokerName`; sets without the topic are skipped."""
        rows = []
        for s in await self.broker_sets():
            try:
                doc = await self.search_messages_of_set(
                    s, topic, key=key, begin_ms=begin_ms, end_ms=end_ms, max_messages=max_messages
                )
            except TopicNotExistError:
                continue
            rows += [{"brokerName": s.broker_name, **m} for m in doc["messages"]]
        return rows

    async def _set_of_message(self, msg_id: str) -> BrokerSet:
        host, _ = decode_message_id(msg_id)
        for s in await self.broker_sets():
            if host in {_host_port(a) for a in s.addrs.values()}:
                return s
        raise MessageNotFoundError(f"message {msg_id}: no live broker set has its store host {host}")

    async def message_deliveries(self, msg_id: str) -> dict[str, Any]:
        """Per consumer group, where message `msg_id` stands (not received, in flight, acked,
        dead-lettered) and the delivery events its master saw (`GET /messages/{id}/deliveries`)."""
        s = await self._set_of_message(msg_id)
        url = f"{self._master(s)}/messages/{seg(msg_id.upper())}/deliveries"
        doc = await self.transport.request("GET", url)
        return {"brokerName": s.broker_name, **doc}

    async def resend_dead_letters(self, group: str, msg_ids: list[str]) -> list[dict[str, Any]]:
        """Store a copy of each dead letter (messages of `%DLQ%{group}`) in its original topic,
        on the broker set that holds it; the copies' ids."""
        by_set: dict[str, tuple[BrokerSet, list[str]]] = {}
        for msg_id in msg_ids:
            s = await self._set_of_message(msg_id)
            by_set.setdefault(s.broker_name, (s, []))[1].append(msg_id)
        out = []
        for s, ids in by_set.values():
            doc = await self.transport.request(
                "POST", f"{self._master(s)}/consumers/{seg(group)}/dlq/resend", json={"msgIds": ids}
            )
            out += [{"brokerName": s.broker_name, **r} for r in doc["results"]]
        return out


class Admin:
    """Blocking twin of `AsyncAdmin` (same methods, run on a private event loop)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self._runner = asyncio.Runner()
        self._a: AsyncAdmin = self._runner.run(_make(*args, **kw))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._a, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            return self._runner.run(attr(*args, **kw))

        return call

    def close(self) -> None:
        """Close the connections and the private event loop."""
        self._runner.run(self._a.close())
        self._runner.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def config_change_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One member's `PATCH /admin/config` answer as rows: brokerName, addr, key, old, new."""
    return [{"brokerName": doc["brokerName"], "addr": doc["brokerAddr"], "key": key, "old": change["old"],
             "new": change["new"]} for key, change in doc["updated"].items()]


async def _make(*args: Any, **kw: Any) -> AsyncAdmin:
    return AsyncAdmin(*args, **kw)
