"""The commit-log message codec (RocketMQ v1 layout) and offset message ids."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import BrokerCode, BrokerError
from broker.message import (
    BODY_LENGTH_POSITION,
    FIXED_OVERHEAD,
    MESSAGE_MAGIC_CODE,
    PHY_POS_POSITION,
    QUEUE_OFFSET_POSITION,
    Message,
    create_message_id,
    decode_dispatch_info,
    decode_message,
    decode_message_id,
    encode_batch,
    encode_message,
    pack_host,
    tags_hash_code,
)


def _enc(msg: Message, **kw) -> bytearray:
    args = dict(queue_id=3, queue_offset=41, phys_offset=9000, store_host="10.1.2.3:8081")
    args.update(kw)
    return encode_message(msg, **args)


def test_layout_fixed_fields_at_rocketmq_positions():
    buf = _enc(Message("T", b"abc", properties={}), props={})
    assert len(buf) == FIXED_OVERHEAD + 3 + 1  # fixed 91 + body + topic, empty properties
    total, magic = struct.unpack_from(">ii", buf, 0)
    assert total == len(buf) and magic == MESSAGE_MAGIC_CODE
    assert struct.unpack_from(">i", buf, 12)[0] == 3
    assert struct.unpack_from(">q", buf, QUEUE_OFFSET_POSITION)[0] == 41
    assert struct.unpack_from(">q", buf, PHY_POS_POSITION)[0] == 9000
    assert bytes(buf[84:88]) == struct.pack(">i", 3) and bytes(buf[88:91]) == b"abc"


def test_round_trip_with_tags_keys_properties():
    m = Message("OrderTopic", b"\x00\xffbody", tags="TagA", keys=["k1", "k2"], properties={"p": "v"},
                flag=5, idempotency_key="idem-1", born_host="192.168.0.9:5555", born_timestamp=123)
    ext = decode_message(_enc(m))
    assert (ext.topic, ext.body, ext.tags, ext.flag) == ("OrderTopic", m.body, "TagA", 5)
    assert ext.keys == ["k1", "k2"]
    assert ext.user_properties == {"p": "v"} and len(ext.uniq_key) == 32
    assert ext.properties["IDEMPOTENCY_KEY"] == "idem-1"
    assert (ext.queue_id, ext.queue_offset, ext.commit_log_offset) == (3, 41, 9000)
    assert ext.born_host == "192.168.0.9:5555" and ext.born_timestamp == 123
    assert ext.store_host == "10.1.2.3:8081"
    info = decode_dispatch_info(_enc(m))
    assert info.tags_code == tags_hash_code("TagA") and info.topic == "OrderTopic"


def test_msg_id_encodes_store_host_and_physical_offset():
    mid = create_message_id("127.0.0.1:10911", 123456789)
    assert len(mid) == 32 and mid == mid.upper()
    assert decode_message_id(mid) == ("127.0.0.1:10911", 123456789)
    with pytest.raises(BrokerError) as ei:
        decode_message_id("zz")
    assert ei.value.code == BrokerCode.INVALID_REQUEST


def test_tags_hash_is_java_string_hashcode():
    assert tags_hash_code("hello") == 99162322
    assert tags_hash_code("TagA") == 2598919
    assert tags_hash_code("a much longer tag value that overflows") < 2**31
    assert tags_hash_code(None) == 0


def test_body_crc_checked_on_decode():
    buf = _enc(Message("T", b"payload"))
    buf[90] ^= 0x01  # flip a bit in the body
    with pytest.raises(BrokerError) as ei:
        decode_message(buf, phys=9000)
    assert ei.value.code == BrokerCode.MESSAGE_CORRUPTED and "CRC" in ei.value.detail
    assert "9000" in ei.value.detail


@pytest.mark.parametrize("mutate", ["magic", "total", "bodylen", "truncate"])
def test_corrupt_layout_is_a_precise_error(mutate):
    buf = _enc(Message("T", b"payload"))
    if mutate == "magic":
        buf[4] = 0
    elif mutate == "total":
        struct.pack_into(">i", buf, 0, 10)
    elif mutate == "bodylen":
        struct.pack_into(">i", buf, 84, 10_000)
    else:
        buf = buf[:50]
    with pytest.raises(BrokerError) as ei:
        decode_message(buf)
    assert ei.value.code == BrokerCode.MESSAGE_CORRUPTED


def test_oversize_and_bad_properties_refused():
    with pytest.raises(BrokerError) as ei:
        _enc(Message("T", b"x" * 101), max_message_size=100)
    assert ei.value.code == BrokerCode.MESSAGE_TOO_LARGE and ei.value.status == 413
    with pytest.raises(BrokerError) as ei:
        _enc(Message("T", b"x", properties={"a\x01": "b"}))
    assert ei.value.code == BrokerCode.MESSAGE_ILLEGAL


@given(body=st.binary(max_size=300), topic=st.from_regex(r"[a-zA-Z0-9_%|-]{1,127}", fullmatch=True),
       tags=st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_characters="\x01\x02"),
                                        min_size=1, max_size=20)),
       qoff=st.integers(0, 2**62), phys=st.integers(0, 2**62))
def test_round_trip_property(body, topic, tags, qoff, phys):
    m = Message(topic, body, tags=tags)
    if tags is not None and any("\ud800" <= c <= "\udfff" for c in tags):
        with pytest.raises(BrokerError) as ei:  # a lone surrogate has no UTF-8: refused, precisely
            encode_message(m, queue_id=1, queue_offset=qoff, phys_offset=phys, store_host="127.0.0.1:1")
        assert ei.value.code == BrokerCode.MESSAGE_ILLEGAL
        return
    ext = decode_message(encode_message(m, queue_id=1, queue_offset=qoff, phys_offset=phys,
                                        store_host="127.0.0.1:1"))
    assert (ext.topic, ext.body, ext.tags) == (topic, body, tags)
    assert (ext.queue_offset, ext.commit_log_offset) == (qoff, phys)


def test_problem_body():
    err = BrokerError(BrokerCode.NOT_MASTER, "I am a slave", masterAddr="127.0.0.1:1")
    p = err.problem()
    assert p["status"] == 421 and p["code"] == "NOT_MASTER" and p["masterAddr"] == "127.0.0.1:1"
    assert p["type"].endswith("NOT_MASTER")


def test_encode_batch_writes_what_encode_message_writes():
    """The bulk loops of encode_batch (with an idempotency key or not) and encode_message give the
    same message, field by field and byte for byte after the head, across topics, born hosts,
    keys and messages with properties in between."""
    msgs = [Message("A", b"one", born_timestamp=5, born_host="10.0.0.1:7"),
            Message("A", b"", born_host="10.0.0.2:8"),
            Message("A", b"tagged", tags="t", keys=["k"], properties={"p": "v"}),
            Message("B\u00e9", b"x" * 3000, flag=3),
            Message("A", b"last", idempotency_key="idem"),
            Message("B\u00e9", b"sdk", idempotency_key="0123456789abcdef0123456789abcdef"),
            Message("A", b"", idempotency_key="k%s%d"),
            Message("A", b"long", idempotency_key="k" * 2000),
            Message("A", b"utf8", idempotency_key="cl\u00e9"),
            Message("A", b"keyed+tag", tags="t", idempotency_key="idem"),
            Message("pct-%s%d-%%", b"percent topic", idempotency_key="k%d")]
    batch = encode_batch(msgs, queue_id=2, store_host="127.0.0.1:10911")
    uniq = set()
    for msg, buf in zip(msgs, batch, strict=True):
        one = encode_message(msg, queue_id=2, queue_offset=0, phys_offset=0, store_host="127.0.0.1:10911")
        a, b = decode_message(buf), decode_message(one)
        assert len(buf) == len(one) == a.store_size
        u = a.properties.pop("UNIQ_KEY")
        uniq.add(u)
        assert bytes(buf[BODY_LENGTH_POSITION:]).replace(u.encode(), b"U" * 32) == \
               bytes(one[BODY_LENGTH_POSITION:]).replace(b.properties.pop("UNIQ_KEY").encode(), b"U" * 32)
        assert (a.topic, a.body, a.queue_id, a.born_host, a.store_host, a.flag, a.properties) == \
               (b.topic, b.body, b.queue_id, b.born_host, b.store_host, b.flag, b.properties)
        assert a.born_timestamp == (msg.born_timestamp or a.store_timestamp)
    assert len(uniq) == len(msgs) and all(len(u) == 32 for u in uniq)


def test_store_host_names_resolve_into_message_ids():
    # docker-compose sets brokerIP1 to a service name; its msgIds must carry the resolved address.
    assert pack_host("localhost:10911") == (bytes([127, 0, 0, 1]), 10911)
    host, offset = decode_message_id(create_message_id("localhost:10911", 4242))
    assert (host, offset) == ("127.0.0.1:10911", 4242)
    assert pack_host("no-such-host.invalid:1") == (b"\0\0\0\0", 1)
