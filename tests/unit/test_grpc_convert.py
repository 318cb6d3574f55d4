"""Protobuf ⇄ broker messages and routes of the gRPC endpoint (no server needed)."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from broker.errors import BrokerCode, BrokerError
from broker.grpc.convert import from_message, timestamp, to_message
from broker.grpc.protocol import pb
from broker.grpc.route import (
    ACCESS_ENTRIES_PER_MASTER_ENTRY,
    MAX_ACCESS_ENTRIES,
    BrokerRoute,
    assignments,
    endpoints,
    message_queues,
    spread,
)
from broker.grpc.settings import PRODUCER_MAX_ATTEMPTS
from broker.message import PROPERTY_UNIQ_KEY, MessageExt

MID = "0102FC000000016BC50B17DF6100000004"


def sent(body: bytes = b"hi", **sp) -> pb.Message:
    props = {"message_id": MID, "born_host": "10.1.2.3", "born_timestamp": timestamp(1_700_000_000_123)}
    props.update(sp)
    return pb.Message(
        topic=pb.Resource(name="t"),
        user_properties={"a": "1"},
        system_properties=pb.SystemProperties(**props),
        body=body,
    )


def test_sent_message_keeps_id_tags_keys_properties_born() -> None:
    m = to_message(sent(tag="TagA", keys=["k1", "k2"]), "messages[0]", 1024, "ipv4:127.0.0.1:5555")
    assert (m.topic, m.body, m.tags, m.keys) == ("t", b"hi", "TagA", ["k1", "k2"])
    assert m.properties == {"a": "1", PROPERTY_UNIQ_KEY: MID}
    assert m.idempotency_key == MID  # a retried send is answered with the first result
    assert (m.born_timestamp, m.born_host) == (1_700_000_000_123, "10.1.2.3:0")


def test_born_host_that_is_no_ipv4_literal_is_the_connections() -> None:
    m = to_message(sent(born_host="my-laptop"), "messages[0]", 1024, "ipv4:192.168.7.9:40000")
    assert m.born_host == "192.168.7.9:0"


def test_gzip_body_is_inflated_within_the_limit() -> None:
    m = to_message(sent(gzip.compress(b"x" * 1000), body_encoding=pb.GZIP), "messages[0]", 1000, "")
    assert m.body == b"x" * 1000
    with pytest.raises(BrokerError) as err:
        to_message(sent(gzip.compress(b"x" * 1001), body_encoding=pb.GZIP), "messages[0]", 1000, "")
    assert err.value.code == BrokerCode.MESSAGE_TOO_LARGE
    with pytest.raises(BrokerError) as err:
        to_message(sent(b"not gzip", body_encoding=pb.GZIP), "messages[0]", 1000, "")
    assert err.value.code == BrokerCode.INVALID_REQUEST


@pytest.mark.parametrize(
    ("msg", "code"),
    [
        (sent(b"x" * 1025), BrokerCode.MESSAGE_TOO_LARGE),
        (sent(message_id=""), BrokerCode.INVALID_REQUEST),
        (sent(message_id="a\nb"), BrokerCode.INVALID_REQUEST),
        (sent(message_id="x" * 129), BrokerCode.INVALID_REQUEST),
        (sent(body_encoding=7), BrokerCode.INVALID_REQUEST),
    ],
)
def test_bad_sent_messages(msg: pb.Message, code: BrokerCode) -> None:
    with pytest.raises(BrokerError) as err:
        to_message(msg, "messages[0]", 1024, "")
    assert err.value.code == code


def test_uniq_key_in_user_properties_is_refused() -> None:
    msg = sent()
    msg.user_properties[PROPERTY_UNIQ_KEY] = "other"
    with pytest.raises(BrokerError):
        to_message(msg, "messages[0]", 1024, "")


def test_delivered_message_has_md5_digest_attempt_and_handle() -> None:
    ext = MessageExt(
        topic="t",
        body=b"payload",
        queue_id=2,
        queue_offset=7,
        commit_log_offset=99,
        store_size=0,
        born_timestamp=1_700_000_000_000,
        born_host="10.1.2.3:0",
        store_timestamp=1_700_000_000_500,
        store_host="127.0.0.1:10911",
        properties={"TAGS": "TagA", "KEYS": "k1 k2", PROPERTY_UNIQ_KEY: MID, "a": "1"},
    )
    m = from_message(ext, namespace="", receipt_handle="h1", delivery_attempt=2, invisible_ms=30_000)
    sp = m.system_properties
    assert (m.body, sp.message_id, sp.tag, list(sp.keys), dict(m.user_properties)) == (
        b"payload",
        MID,
        "TagA",
        ["k1", "k2"],
        {"a": "1"},
    )
    assert sp.body_digest.type == pb.MD5
    assert sp.body_digest.checksum == hashlib.md5(b"payload").hexdigest().upper()
    assert (sp.receipt_handle, sp.delivery_attempt, sp.queue_id, sp.queue_offset) == ("h1", 2, 2, 7)
    assert sp.born_host == "10.1.2.3" and sp.invisible_duration.seconds == 30
    assert not sp.HasField("delivery_timestamp")  # set only for delay messages


def test_route_one_address_per_broker_and_split_permissions() -> None:
    routes = [
        BrokerRoute("broker-a", "127.0.0.1:8081", 2, 3, 6),
        BrokerRoute("broker-b", "mq-b:8081", 1, 1, 4),
    ]
    queues = message_queues(pb.Resource(name="t"), routes)
    got = [(q.broker.name, q.id, pb.Permission.Name(q.permission)) for q in queues]
    assert got == [
        ("broker-a", 0, "READ_WRITE"),
        ("broker-a", 1, "READ_WRITE"),
        ("broker-a", 2, "WRITE"),
        ("broker-b", 0, "READ"),
    ]
    assert all(len(q.broker.endpoints.addresses) == 1 and q.broker.id == 0 for q in queues)
    assert list(queues[0].accept_message_types) == [pb.NORMAL]
    assert endpoints("mq-b:8081").scheme == pb.DOMAIN_NAME and endpoints("127.0.0.1:1").scheme == pb.IPv4
    assert [a.message_queue.broker.name for a in assignments(pb.Resource(name="t"), routes)] == [
        "broker-a",
        "broker-b",
    ]


def _longest_cyclic_run(entries: list[str], value: str) -> int:
    """The longest run of `value` going round `entries` (as a client's round robin does)."""
    if all(e == value for e in entries):
        return len(entries)
    doubled = entries + entries
    best = run = 0
    for e in doubled:
        run = run + 1 if e == value else 0
        best = max(best, run)
    return best


@pytest.mark.parametrize("others", [("s1",), ("s1", "s2")])
@pytest.mark.parametrize("n", range(1, 33))
def test_spread_puts_another_member_within_every_run_of_send_attempts(
    n: int, others: tuple[str, ...]
) -> None:
    """A send that fails at the master is retried on the next entries: among any
    PRODUCER_MAX_ATTEMPTS consecutive entries (cyclically) one names another member — and no more
    entries than that do, so most calls go straight to the master."""
    entries = spread(n, "m", others)
    assert len(entries) == n
    if n == 1:
        assert entries == ["m"]  # one queue: nothing to spread over
        return
    assert _longest_cyclic_run(entries, "m") <= PRODUCER_MAX_ATTEMPTS - 1
    assert sum(e != "m" for e in entries) == -(-n // PRODUCER_MAX_ATTEMPTS)
    assert {e for e in entries if e != "m"} <= set(others)
    if n >= 2 * PRODUCER_MAX_ATTEMPTS:
        assert {e for e in entries if e != "m"} == set(others)  # the slaves share the load


def test_spread_without_other_members_names_the_master_only() -> None:
    assert spread(8, "m", ()) == ["m"] * 8


def test_route_spreads_each_sets_queues_over_its_members() -> None:
    routes = [
        BrokerRoute("broker-a", "10.0.0.1:8081", 4, 4, 6, ("10.0.0.2:8081", "10.0.0.3:8081")),
        BrokerRoute("broker-b", "10.0.1.1:8081", 2, 2, 6),
    ]
    queues = message_queues(pb.Resource(name="t"), routes)
    got = [(q.broker.name, q.id, q.broker.endpoints.addresses[0].host, q.permission) for q in queues]
    # Before broker-a's entry at a slave: its NONE entries (push consumers' QueryAssignment
    # picks), 4 per entry at its master, at both slaves; none for broker-b, which has no other members.
    access = [("broker-a", 4 + k, f"10.0.0.{2 + k % 2}", pb.NONE) for k in range(12)]
    assert got[3:15] == access
    del got[3:15]
    # A queue named at a slave is written and read there: sends, receives and acks each get a
    # way around a dead master (the slave forwards them to the new one).
    assert got == [
        ("broker-a", 0, "10.0.0.1", pb.READ_WRITE),
        ("broker-a", 1, "10.0.0.1", pb.READ_WRITE),
        ("broker-a", 2, "10.0.0.1", pb.READ_WRITE),
        ("broker-a", 3, "10.0.0.2", pb.READ_WRITE),
        ("broker-b", 0, "10.0.1.1", pb.READ_WRITE),
        ("broker-b", 1, "10.0.1.1", pb.READ_WRITE),
    ]
    # Every entry stays a master queue of its set (broker id 0, one address): the clients send to it.
    assert all(q.broker.id == 0 and len(q.broker.endpoints.addresses) == 1 for q in queues)
    # Push consumers are assigned each set at its master.
    assert [
        a.message_queue.broker.endpoints.addresses[0].host for a in assignments(pb.Resource(name="t"), routes)
    ] == [
        "10.0.0.1",
        "10.0.1.1",
    ]


@pytest.mark.parametrize("reads,writes", [(8, 8), (8, 4), (4, 8), (1, 1), (16, 16)])
def test_every_queue_is_read_and_written_where_spread_says(reads: int, writes: int) -> None:
    others = ("10.0.0.2:8081", "10.0.0.3:8081")
    route = BrokerRoute("broker-a", "10.0.0.1:8081", reads, writes, 6, others)
    queues = message_queues(pb.Resource(name="t"), [route])

    def where(q: pb.MessageQueue) -> str:
        a = q.broker.endpoints.addresses[0]
        return f"{a.host}:{a.port}"

    readable = [(q.id, where(q)) for q in queues if q.permission in (pb.READ, pb.READ_WRITE)]
    writable = [(q.id, where(q)) for q in queues if q.permission in (pb.WRITE, pb.READ_WRITE)]
    layout = spread(max(reads, writes), "10.0.0.1:8081", others)
    assert readable == [(i, layout[i]) for i in range(reads)]
    assert writable == [(i, layout[i]) for i in range(writes)]
    # One entry per queue id, besides the NONE ones.
    assert len([q for q in queues if q.permission != pb.NONE]) == max(reads, writes)


@pytest.mark.parametrize("others", [(), ("127.0.0.1:2",), ("127.0.0.1:2", "127.0.0.1:3")])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 9, 16, 17, 32, 64])
def test_route_carries_none_entries_at_the_other_members(n: int, others: tuple[str, ...]) -> None:
    """Entries with permission NONE, at the set's other members, for the push consumers' random
    (Python) or stepping (Java, skipping NONE) QueryAssignment pick: ACCESS_ENTRIES_PER_MASTER_ENTRY
    per entry at the master (at most MAX_ACCESS_ENTRIES), each run just before an entry at
    another member; the entries clients
    send and receive on are the same as without them, the first still at the master (the Node.js
    client asks its first endpoint)."""
    master = "127.0.0.1:1"
    routes = [BrokerRoute("broker-a", master, n, n, 6, others)]
    queues = message_queues(pb.Resource(name="t"), routes)
    at = [f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}" for q in queues]
    none = [i for i, q in enumerate(queues) if q.permission == pb.NONE]
    usable = [(q.id, q.permission, a) for q, a in zip(queues, at, strict=True) if q.permission != pb.NONE]
    assert at[0] == master and queues[0].permission != pb.NONE
    assert len({u[0] for u in usable}) == n and all(u[0] < n for u in usable)
    masters = sum(a == master for _, _, a in usable)
    if not others:
        assert not none
        return
    assert len(none) == min(ACCESS_ENTRIES_PER_MASTER_ENTRY * masters, MAX_ACCESS_ENTRIES)
    assert {at[i] for i in none} == set(others)  # every other member, none at the master
    assert sorted(queues[i].id for i in none) == list(range(n, n + len(none)))  # after the set's own
    assert all(queues[i].broker.name == "broker-a" and queues[i].broker.id == 0 for i in none)
    # Stepping on from a NONE entry, past the others, reaches an entry at another member (the
    # Java client's pick) whenever one names another member.
    if any(a != master for _, _, a in usable):
        for i in none:
            j = i
            while queues[j % len(queues)].permission == pb.NONE:
                j += 1
            assert at[j % len(queues)] != master, (i, j)
    # After the master dies, most entries of a route cached before lead to a live member.
    assert sum(a != master for a in at) / len(at) >= 2 / 3
