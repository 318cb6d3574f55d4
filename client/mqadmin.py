"""`mqadmin <command>`: the operator commands of RocketMQ's mqadmin, over LedgerMQ's HTTP APIs.

Global flags as RocketMQ's: `-n` name servers (`host:port;host:port`, default $NAMESRV_ADDR or
127.0.0.1:9876), `-b` a broker address (instead of the name servers). Tables go to stdout: on a
terminal as `rich` tables (borders, bold header, numbers right-aligned; NO_COLOR is honoured),
through a pipe as plain aligned columns like RocketMQ's mqadmin, so `grep`/`awk` keep working;
`--json` prints JSON for scripts. Exit status 0 on success, 1 on a server error, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from client.admin import Admin, config_change_rows
from client.consumer import PullConsumer
from client.errors import BadRequestError, LedgerMQError, MessageNotFoundError, TopicNotExistError
from client.producer import Message, Producer


def print_table(
    rows: list[dict[str, Any]], columns: list[str] | None = None, out=sys.stdout, fancy: bool | None = None
) -> None:
    """Print `rows` as a table: a rich table when `out` is a terminal (or `rich=True`), else aligned
    plain columns with the header first (RocketMQ's mqadmin prints that way); `fancy` forces either."""
    if not rows:
        print("(none)", file=out)
        return
    columns = columns or list(rows[0])
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    if fancy is None:
        fancy = bool(getattr(out, "isatty", lambda: False)())
    if fancy:
        table = Table(header_style="bold", show_lines=False)
        for c in columns:
            numeric = all(isinstance(r.get(c), int | float) for r in rows if r.get(c) is not None)
            table.add_column(c, justify="right" if numeric else "left", overflow="fold")
        for row in cells:
            table.add_row(*row)
        Console(file=out, force_terminal=True, soft_wrap=False).print(table)
        return
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(), file=out)
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _parse_time(value: str) -> int:
    """`now`, epoch milliseconds, or ISO-8601 → epoch ms (RocketMQ's -s accepts ms or 'now')."""
    if value == "now":
        return int(time.time() * 1000)
    if value.isdigit():
        return int(value)
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(value).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad time {value!r}: use epoch ms, 'now' or ISO-8601") from None


def _parse_attributes(value: str) -> dict[str, str | None]:
    """RocketMQ's `-a` syntax: `+k=v` sets an attribute, `-k` removes one, comma-separated."""
    out: dict[str, str | None] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        if part.startswith("+") and "=" in part:
            key, _, val = part[1:].partition("=")
            out[key] = val
        elif part.startswith("-") and "=" not in part:
            out[part[1:]] = None
        else:
            raise argparse.ArgumentTypeError(f"expected +key=value or -key, got {part!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mqadmin", description="LedgerMQ admin tool (RocketMQ mqadmin commands)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namesrvAddr", default=os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"))
    common.add_argument("-b", "--brokerAddr", help="talk to this broker directly instead of the name servers")
    common.add_argument("--token", default=os.environ.get("LEDGERMQ_TOKEN"), help="ACL bearer token")
    common.add_argument("--ca-file", help="CA bundle (PEM): talk TLS to every broker and name server")
    common.add_argument(
        "--client-cert", help="client certificate and key (PEM), for brokers that ask for one"
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    def cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text)

    c = cmd("updateTopic", "Create or update a topic on every broker set (or one with -B)")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-r", "--readQueueNums", type=int, default=8)
    c.add_argument("-w", "--writeQueueNums", type=int, default=8)
    c.add_argument("-p", "--perm", type=int, default=6, help="2=W, 4=R, 6=RW")
    c.add_argument("-c", "--clusterName")
    c.add_argument("-B", "--brokerName")
    c.add_argument("-a", "--attributes", type=_parse_attributes,
                   help="RocketMQ's syntax: +message.type=FIFO (comma-separated; -key removes one)")
    c = cmd("updateSubGroup", "Change a consumer group's retry and ordering settings on every broker set")
    c.add_argument("-g", "--groupName", required=True)
    c.add_argument("-r", "--retryMaxTimes", type=int)
    c.add_argument("-o", "--consumeMessageOrderly", choices=["true", "false"])
    c.add_argument("-p", "--groupRetryPolicy", type=json.loads,
                   help='JSON, e.g. {"type": "EXPONENTIAL", "initialMs": 5000, "maxMs": 7200000}')
    c.add_argument("-c", "--clusterName")
    c.add_argument("-B", "--brokerName")
    c = cmd("getSubGroup", "Show a consumer group's retry and ordering settings on every broker set")
    c.add_argument("-g", "--groupName", required=True)
    c = cmd("deleteTopic", "Delete a topic from every broker set")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-c", "--clusterName")
    cmd("topicList", "List topics")
    c = cmd("topicRoute", "Show a topic's route (broker sets, addresses, queue numbers)")
    c.add_argument("-t", "--topic", required=True)
    c = cmd("topicStatus", "Min/max offset of each queue of a topic")
    c.add_argument("-t", "--topic", required=True)
    cmd("clusterList", "Broker sets and members with role, term and commit index")
    cmd(
        "brokerStatus",
        "One broker's whole status with -b (role, uptime, disk, DLedger state); without it, every member",
    )
    c = cmd(
        "getBrokerConfig",
        "The settings a broker runs with (-b one member; without, every member), defaults included",
    )
    c.add_argument("-k", "--key", help="only keys containing this text (case-insensitive)")
    c = cmd(
        "updateBrokerConfig",
        "Change a setting while brokers run (-b one member, -B every member of a set, -c of a cluster's "
        "sets), e.g. -k brokerPermission -v 4 to drain a set of new writes, -k fileReservedTime -v 24 to "
        "keep a day of messages from the next clean-up on",
    )
    c.add_argument("-k", "--key", required=True)
    c.add_argument("-v", "--value", required=True)
    c.add_argument("-B", "--brokerName", help="every member of this broker set")
    c.add_argument("-c", "--clusterName", help="every member of every set of this cluster")
    for name, what in (
        ("wipeWritePerm", "Drain a broker set of new writes (brokerPermission 4 on every member: producers "
                          "leave it within a route refresh, consumers drain it)"),
        ("addWritePerm", "Give a drained broker set its writes back (brokerPermission 6 on every member)"),
    ):
        c = cmd(name, what)
        c.add_argument("-B", "--brokerName", required=True, help="the broker set (RocketMQ's -b brokerName)")
    c = cmd("consumerProgress", "A group's (or, without -g, every group's) committed offset, max offset, lag")
    c.add_argument("-g", "--consumerGroup")
    c.add_argument("-t", "--topic")
    c = cmd("queryMsgById", "Show a message by its id")
    c.add_argument("-i", "--msgId", required=True)
    c = cmd("queryMsgByKey", "Show the messages of a topic carrying a key, on every broker set")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-k", "--msgKey", required=True)
    c.add_argument("--beginTimestamp", type=_parse_time, default=0, help="epoch ms, 'now' or ISO-8601")
    c.add_argument("--endTimestamp", type=_parse_time, help="epoch ms, 'now' or ISO-8601")
    c.add_argument("--maxNum", type=int, default=64)
    c = cmd("queryMsgByUniqueKey", "Show a message by the id its client printed (RocketMQ 5's message id)")
    c.add_argument("-i", "--msgId", required=True)
    c.add_argument("-t", "--topic", help="searched by key when the brokers no longer know the id")
    c = cmd("queryMsgByOffset", "Show the message at one offset of one queue")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-B", "--brokerName", help="the broker set, when the topic spans several")
    c.add_argument("-i", "--queueId", type=int, required=True)
    c.add_argument("-o", "--offset", type=int, required=True)
    c = cmd("resetOffsetByTime", "Move a group's offsets to the first message at/after a time")
    c.add_argument("-g", "--group", required=True)
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-s", "--timestamp", required=True, type=_parse_time, help="epoch ms, 'now' or ISO-8601")
    c = cmd("sendMessage", "Send a message")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-p", "--body", required=True)
    c.add_argument("-g", "--tags")
    c.add_argument("-k", "--keys", help="comma-separated")
    c.add_argument("-q", "--queueId", type=int)
    c = cmd("consumeMessage", "Read messages of a topic (all queues, or one with -q)")
    c.add_argument("-t", "--topic", required=True)
    c.add_argument("-q", "--queueId", type=int)
    c.add_argument("-o", "--offset", type=int, default=0)
    c.add_argument("-c", "--count", type=int, default=32)
    c = cmd(
        "clientList",
        "Connected clients (HTTP and RocketMQ 5 gRPC): id, type, group, protocol, language, version, address",
    )
    c.add_argument("-g", "--group", help="one group's only (a gRPC producer's group is its topic)")
    c = cmd("leadershipTransfer", "Hand a DLedger broker set's leadership to another member")
    c.add_argument("-B", "--brokerName", required=True)
    c.add_argument("-i", "--transfereeId", required=True, help="DLedger member id, e.g. n1")
    return p


def _addrs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {"token": args.token, "ca_file": args.ca_file, "client_cert": args.client_cert}
    if args.brokerAddr:
        return {"broker_addr": args.brokerAddr, **kw}
    return {"namesrv_addr": args.namesrvAddr, **kw}


def _message_row(m: Any) -> dict[str, Any]:
    try:
        body = m.body.decode("utf-8")
    except UnicodeDecodeError:
        body = "base64:" + base64.b64encode(m.body).decode()
    return {
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "msgId": m.msg_id,
        "tags": m.tags,
        "keys": ",".join(m.keys),
        "storeTimestamp": m.store_timestamp,
        "body": body,
    }


Result = tuple[Any, "list[str] | None"]  # (data, table columns)


def _error_column(rows: list[dict[str, Any]]) -> list[str]:
    """["error"] when a row reports a broker set that did not answer."""
    return ["error"] if any("error" in r for r in rows) else []


def cmd_send_message(args: argparse.Namespace) -> Result:
    with Producer(**_addrs(args)) as p:
        keys = [k for k in (args.keys or "").split(",") if k]
        r = p.send(args.topic, Message(body=args.body, tags=args.tags, keys=keys, queue_id=args.queueId))
    row = {
        "brokerName": r.broker_name,
        "queueId": r.queue_id,
        "queueOffset": r.queue_offset,
        "msgId": r.msg_id,
    }
    return [row], None


def cmd_consume_message(args: argparse.Namespace) -> Result:
    with PullConsumer(**_addrs(args)) as c:
        queues = [q for q in c.queues(args.topic) if args.queueId is None or q.queue_id == args.queueId]
        rows = []
        for q in queues:
            res = c.pull(args.topic, q.queue_id, max(args.offset, 0), args.count, broker_name=q.broker_name)
            rows += [_message_row(m) for m in res.messages]
    return rows, None


def cmd_query_msg_by_offset(args: argparse.Namespace) -> Result:
    """RocketMQ's queryMsgByOffset (its -b brokerName is -B here: -b names a broker address)."""
    with PullConsumer(**_addrs(args)) as c:
        sets = sorted({q.broker_name for q in c.queues(args.topic)})
        if args.brokerName is None and len(sets) > 1:
            named = ", ".join(sets)
            raise BadRequestError(f"topic {args.topic!r} spans broker sets {named}: name one with -B",
                                  problem={"field": "brokerName"})
        if args.brokerName is not None and args.brokerName not in sets:
            raise TopicNotExistError(f"broker set {args.brokerName!r} does not hold topic {args.topic!r}")
        broker = args.brokerName or sets[0]
        res = c.pull(args.topic, args.queueId, max(args.offset, 0), 1, broker_name=broker)
    if args.offset < 0 or not res.messages or res.messages[0].queue_offset != args.offset:
        lo, hi = res.min_offset, res.max_offset
        holds = f"holds {lo}..{hi - 1}" if hi > lo else "is empty"
        raise MessageNotFoundError(
            f"no message at offset {args.offset} of {args.topic} queue {args.queueId} on {broker} "
            f"(the queue {holds})"
        )
    return {"brokerName": broker, **_message_row(res.messages[0])}, None


def cmd_update_topic(a: Admin, args: argparse.Namespace) -> Result:
    out = a.update_topic(
        args.topic,
        args.readQueueNums,
        args.writeQueueNums,
        args.perm,
        cluster=args.clusterName,
        broker_name=args.brokerName,
        attributes=args.attributes,
    )
    rows = []
    for b, d in out.items():
        row = {k: d[k] for k in ("topic", "readQueueNums", "writeQueueNums", "perm")}
        if d.get("attributes"):
            row["attributes"] = ",".join(f"{k}={v}" for k, v in sorted(d["attributes"].items()))
        rows.append({"brokerName": b, **row})
    return rows, None


def _sub_group_rows(groups: dict[str, Any], args: argparse.Namespace) -> Result:
    if args.json:
        return groups, None
    return [
        {
            "brokerName": b,
            "group": d["group"],
            "retryMaxTimes": d["retryMaxTimes"],
            "consumeMessageOrderly": d["consumeMessageOrderly"],
            "retryPolicy": json.dumps(d["retryPolicy"]) if d["retryPolicy"] else "none (at once)",
        }
        for b, d in groups.items()
    ], None


def cmd_get_sub_group(a: Admin, args: argparse.Namespace) -> Result:
    return _sub_group_rows(a.sub_group(args.groupName), args)


def cmd_update_sub_group(a: Admin, args: argparse.Namespace) -> Result:
    changes: dict[str, Any] = {}
    if args.retryMaxTimes is not None:
        changes["retryMaxTimes"] = args.retryMaxTimes
    if args.consumeMessageOrderly is not None:
        changes["consumeMessageOrderly"] = args.consumeMessageOrderly == "true"
    if args.groupRetryPolicy is not None:
        changes["retryPolicy"] = args.groupRetryPolicy
    groups = a.update_sub_group(args.groupName, changes, args.clusterName, args.brokerName)
    return _sub_group_rows(groups, args)


def cmd_delete_topic(a: Admin, args: argparse.Namespace) -> Result:
    return [
        {"brokerName": b, "deleted": args.topic} for b in a.delete_topic(args.topic, args.clusterName)
    ], None


def cmd_topic_list(a: Admin, args: argparse.Namespace) -> Result:
    return [{"topic": t} for t in a.topic_list()], None


def cmd_topic_route(a: Admin, args: argparse.Namespace) -> Result:
    doc = a.topic_route(args.topic)
    if args.json:
        return doc, None
    return [
        {
            "brokerName": b["brokerName"],
            "masterAddr": b.get("masterAddr"),
            "addrs": " ".join(f"{k}={v}" for k, v in sorted(b["addrs"].items())),
            "readQueueNums": b["readQueueNums"],
            "writeQueueNums": b["writeQueueNums"],
            "perm": b["perm"],
        }
        for b in doc["brokers"]
    ], None


def cmd_topic_status(a: Admin, args: argparse.Namespace) -> Result:
    rows = a.topic_status(args.topic)
    return rows, ["brokerName", "queueId", "minOffset", "maxOffset", *_error_column(rows)]


def cmd_cluster_list(a: Admin, args: argparse.Namespace) -> Result:
    columns = [
        "cluster",
        "brokerName",
        "brokerId",
        "addr",
        "role",
        "selfId",
        "term",
        "leaderId",
        "committedIndex",
    ]
    return a.cluster_list(), columns


BROKER_STATUS_COLUMNS = [
    "brokerName",
    "brokerId",
    "addr",
    "role",
    "selfId",
    "term",
    "ledgerEndIndex",
    "committedIndex",
    "followerLag",
    "uptimeS",
    "diskUsedRatio",
]


def _ratio(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def cmd_broker_status(a: Admin, args: argparse.Namespace) -> Result:
    """With -b: that member's `/status`, its DLedger part flattened (`dledger.term`, …), as
    RocketMQ's brokerStatus prints one broker's key/value pairs. Without: one row per member of
    every broker set, an unreachable one with its error."""
    if args.brokerAddr:
        st = a.member_status(args.brokerAddr, timeout_s=5.0)
        dl = st.pop("dledger", None) or {}
        return {**st, **{f"dledger.{k}": v for k, v in dl.items()}}, None
    rows = []
    for s, bid, addr, st in a.member_statuses():
        row: dict[str, Any] = {"brokerName": s.broker_name, "brokerId": bid, "addr": addr}
        if isinstance(st, LedgerMQError):
            rows.append({**row, "role": "UNREACHABLE", "error": st.code})
            continue
        dl = st.get("dledger") or {}
        lag = dl.get("followerLag") or {}
        row.update(
            role=st.get("role"),
            selfId=dl.get("selfId"),
            term=dl.get("term"),
            ledgerEndIndex=dl.get("ledgerEndIndex"),
            committedIndex=dl.get("committedIndex"),
            followerLag=lag if args.json else ",".join(f"{p}:{n}" for p, n in sorted(lag.items())),
            uptimeS=round((st.get("uptimeMs") or 0) / 1000),
            diskUsedRatio=_ratio(st.get("diskUsedRatio")),
        )
        rows.append(row)
    return rows, [*BROKER_STATUS_COLUMNS, *_error_column(rows)]


def cmd_get_broker_config(a: Admin, args: argparse.Namespace) -> Result:
    """RocketMQ's getBrokerConfig: key/value rows of one member (-b), or of every member of every
    set with its address; `-k` keeps the keys containing a text."""
    members = [args.brokerAddr] if args.brokerAddr else [addr for _, _, addr in a.members()]
    want = (args.key or "").lower()
    rows = []
    for addr in members:
        try:
            doc = a.member_config(addr)
        except LedgerMQError as exc:
            if args.brokerAddr:
                raise
            rows.append({"broker": addr, "key": "", "value": "", "error": exc.code})
            continue
        for key, value in doc["properties"].items():
            if want in key.lower():
                rows.append({"broker": addr, "key": key, "value": value})
    if args.brokerAddr:
        return [{k: r[k] for k in ("key", "value")} for r in rows], ["key", "value"]
    return rows, ["broker", "key", "value", *_error_column(rows)]


def cmd_update_broker_config(a: Admin, args: argparse.Namespace) -> Result:
    """RocketMQ's updateBrokerConfig: one member (-b), or every member of a set (-B) or of a
    cluster's sets (-c); a row per member, and any member not reached fails the command."""
    updates = {args.key: args.value}
    if args.brokerAddr:
        if args.brokerName or args.clusterName:
            raise BadRequestError("give one of -b (a member), -B (a set) or -c (a cluster)")
        rows = config_change_rows(a.update_member_config(args.brokerAddr, updates))
    elif args.brokerName or args.clusterName:
        rows = a.update_broker_config(updates, cluster=args.clusterName, broker_name=args.brokerName)
    else:
        raise BadRequestError("say which brokers to change: -b ADDR (one member), -B NAME (every member of "
                            "a set) or -c CLUSTER (every member of its sets)")
    return _all_updated(rows)


def cmd_wipe_write_perm(a: Admin, args: argparse.Namespace) -> Result:
    """RocketMQ's wipeWritePerm / addWritePerm, as the broker set's `brokerPermission` (kept by
    every member, so a restart or a failover does not give the writes back)."""
    if args.brokerAddr:
        raise BadRequestError(f"{args.command} names a broker set with -B, not a member with -b")
    perm = 4 if args.command == "wipeWritePerm" else 6
    return _all_updated(a.update_broker_config({"brokerPermission": perm}, broker_name=args.brokerName))


def _all_updated(rows: list[dict[str, Any]]) -> Result:
    """A config change's rows, or the error naming every member it did not reach."""
    failed = [r for r in rows if "error" in r]
    if failed:
        detail = "; ".join(f"{r['brokerName']} {r['addr']}: {r['detail']}" for r in failed)
        raise LedgerMQError(f"{len(failed)} member(s) not updated ({detail}); the others were: "
                            + ", ".join(r["addr"] for r in rows if "error" not in r))
    return rows, ["brokerName", "addr", "key", "old", "new"]


def cmd_consumer_progress(a: Admin, args: argparse.Namespace) -> Result:
    rows = a.consumer_progress(args.consumerGroup, args.topic)
    columns = ["brokerName", "topic", "queueId", "offset", "maxOffset", "lag"]
    if args.consumerGroup is None:
        columns.insert(0, "group")
    return rows, [*columns, *_error_column(rows)]


def cmd_query_msg_by_id(a: Admin, args: argparse.Namespace) -> Result:
    return a.query_msg_by_id(args.msgId), None


def cmd_query_msg_by_key(a: Admin, args: argparse.Namespace) -> Result:
    rows = a.query_msg_by_key(
        args.topic,
        args.msgKey,
        begin_ms=args.beginTimestamp,
        end_ms=args.endTimestamp,
        max_messages=args.maxNum,
    )
    columns = ["brokerName", "queueId", "queueOffset", "msgId", "tags", "keys", "storeTimestamp"]
    return rows, columns


def cmd_query_msg_by_unique_key(a: Admin, args: argparse.Namespace) -> Result:
    try:
        return a.query_msg_by_id(args.msgId), None
    except MessageNotFoundError:
        if args.topic is None:
            raise
    # Past the brokers' idempotency window the id is still the message's UNIQ_KEY, which a key
    # search of its topic finds (a bounded scan).
    found = a.query_msg_by_key(args.topic, args.msgId, max_messages=1)
    if not found:
        raise MessageNotFoundError(f"message {args.msgId} not found in topic {args.topic!r}")
    return found[0], None


def cmd_reset_offset_by_time(a: Admin, args: argparse.Namespace) -> Result:
    return a.reset_offset_by_time(args.group, args.topic, args.timestamp), None


CLIENT_LIST_COLUMNS = [
    "clientId",
    "clientType",
    "group",
    "topic",
    "protocol",
    "language",
    "version",
    "addr",
    "brokers",
]


def cmd_client_list(a: Admin, args: argparse.Namespace) -> Result:
    """One row per client, group and topic: a client is seen by every member it calls (a gRPC
    client heartbeats to every endpoint of its route), `brokers` names the sets that saw it and
    `lastSeen` is the latest."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in a.client_list(args.group):
        key = (r.get("clientId"), r.get("group"), r.get("topic"), r.get("protocol"))
        row = rows.get(key)
        if row is None:
            row = rows[key] = {c: r.get(c) for c in CLIENT_LIST_COLUMNS if c != "brokers"}
            row["lastSeen"], row["brokers"] = r.get("lastSeen"), []
        if r.get("brokerName") not in row["brokers"]:
            row["brokers"].append(r.get("brokerName"))
        row["lastSeen"] = max(row["lastSeen"] or 0, r.get("lastSeen") or 0)
    out = sorted(rows.values(), key=lambda r: (r["group"] or "", r["clientId"] or "", r["topic"] or ""))
    if not args.json:
        out = [{**r, "brokers": ",".join(r["brokers"])} for r in out]
    return out, CLIENT_LIST_COLUMNS


def cmd_leadership_transfer(a: Admin, args: argparse.Namespace) -> Result:
    return a.leadership_transfer(args.brokerName, args.transfereeId), None


# Commands that need a producer or a consumer, and those that run on an Admin.
CLIENT_COMMANDS = {
    "sendMessage": cmd_send_message,
    "consumeMessage": cmd_consume_message,
    "queryMsgByOffset": cmd_query_msg_by_offset,
}
ADMIN_COMMANDS = {
    "updateTopic": cmd_update_topic,
    "updateSubGroup": cmd_update_sub_group,
    "getSubGroup": cmd_get_sub_group,
    "deleteTopic": cmd_delete_topic,
    "topicList": cmd_topic_list,
    "topicRoute": cmd_topic_route,
    "topicStatus": cmd_topic_status,
    "clusterList": cmd_cluster_list,
    "brokerStatus": cmd_broker_status,
    "getBrokerConfig": cmd_get_broker_config,
    "updateBrokerConfig": cmd_update_broker_config,
    "wipeWritePerm": cmd_wipe_write_perm,
    "addWritePerm": cmd_wipe_write_perm,
    "consumerProgress": cmd_consumer_progress,
    "queryMsgById": cmd_query_msg_by_id,
    "queryMsgByKey": cmd_query_msg_by_key,
    "queryMsgByUniqueKey": cmd_query_msg_by_unique_key,
    "resetOffsetByTime": cmd_reset_offset_by_time,
    "leadershipTransfer": cmd_leadership_transfer,
    "clientList": cmd_client_list,
}


def run(args: argparse.Namespace) -> Result:
    """Execute one command; returns (data, table columns)."""
    if args.command in CLIENT_COMMANDS:
        return CLIENT_COMMANDS[args.command](args)
    with Admin(**_addrs(args)) as a:
        return ADMIN_COMMANDS[args.command](a, args)


def main(argv: list[str] | None = None, out=None) -> int:
    """Console entry point."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        data, columns = run(args)
    except LedgerMQError as exc:
        print(f"mqadmin {args.command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif isinstance(data, dict):
        print_table(
            [
                {"key": k, "value": v if not isinstance(v, dict | list) else orjson.dumps(v).decode()}
                for k, v in data.items()
            ],
            out=out,
        )
    else:
        print_table(data, columns, out=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
