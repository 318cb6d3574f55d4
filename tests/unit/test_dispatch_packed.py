"""`ReputMessageService.dispatch_packed` (one DLedger entry holding a batch) gives the same consume
queues, idempotency table and reput offset as dispatching each message alone — for plain runs,
tags, idempotency keys, queue and topic changes in the middle, and on replay."""

from __future__ import annotations

import random

import pytest

from broker.config import BrokerConfig
from broker.message import Message, encode_batch, encode_message, keyed_plain_key, keyed_tail
from broker.store.message_store import DefaultMessageStore

HOST = "127.0.0.1:10911"


def random_entry(rng: random.Random, base: int, next_qoff: dict) -> list[tuple[bytes, int]]:
    """Messages as the append hook leaves them: stamped queue offsets and physical offsets."""
    out = []
    phys = base
    topic, qid = "T1", 0
    for _ in range(rng.randrange(1, 40)):
        kind = rng.random()
        if kind < 0.1:
            topic = rng.choice(["T1", "T2"])
        elif kind < 0.2:
            qid = rng.randrange(3)
        key = (topic, qid)
        qoff = next_qoff.get(key, 0)
        shape = rng.random()
        if shape < 0.5:  # the bulk shape: only a UNIQ_KEY
            buf = encode_batch([Message(topic, rng.randbytes(rng.randrange(0, 300)))], queue_id=qid,
                               store_host=HOST)[0]
        elif shape < 0.75:  # the SDK's shape: UNIQ_KEY and an idempotency key
            idem = rng.choice([rng.randbytes(16).hex(), f"é/{rng.random()}", "k" * rng.randrange(1, 200)])
            msg = Message(topic, rng.randbytes(rng.randrange(0, 300)), idempotency_key=idem)
            buf = encode_batch([msg], queue_id=qid, store_host=rng.choice([HOST, "10.0.0.7:8080"]))[0]
        else:
            msg = Message(topic, b"special", tags=rng.choice([None, "TagA"]),
                          idempotency_key=rng.choice([None, f"idem-{rng.random()}"]),
                          properties=rng.choice([{}, {"k": "v"}]))
            buf = encode_message(msg, queue_id=qid, queue_offset=0, phys_offset=0, store_host=HOST)
        buf[20:28] = qoff.to_bytes(8, "big")
        buf[28:36] = phys.to_bytes(8, "big")
        next_qoff[key] = qoff + 1
        out.append((bytes(buf), phys))
        phys += len(buf)
    return out


async def open_store(path) -> DefaultMessageStore:
    store = DefaultMessageStore(BrokerConfig(store_path_root_dir=str(path)))
    await store.start()
    return store


def state(store: DefaultMessageStore) -> dict:
    return {
        "units": {k: cq.get_units(0, 10_000) for k, cq in sorted(store.consume_queues.items())
                  if not k[0].startswith("RMQ_SYS")},
        "reput": store.reput_offset,
        "idempotency": store.idempotency.entries(),
    }


@pytest.mark.parametrize("seed", range(8))
async def test_packed_equals_one_by_one(tmp_path, seed):
    rng = random.Random(seed)
    packed, single = await open_store(tmp_path / "packed"), await open_store(tmp_path / "single")
    try:
        assert packed.reput_offset == single.reput_offset
        base = packed.reput_offset
        next_qoff: dict = {}
        entries = []
        for _ in range(6):
            entry = random_entry(rng, base, next_qoff)
            entries.append(entry)
            base = entry[-1][1] + len(entry[-1][0])
        for entry in entries:
            packed.reput.dispatch_packed(b"".join(m for m, _ in entry), entry[0][1])
            for m, phys in entry:
                single.reput.dispatch(memoryview(m), phys)
        assert state(packed) == state(single)
        assert sum(len(u) for u in state(packed)["units"].values()) == sum(len(e) for e in entries)
        before = state(packed)
        for entry in entries:  # replay after a restart: nothing changes
            packed.reput.dispatch_packed(b"".join(m for m, _ in entry), entry[0][1])
        assert state(packed) == before
    finally:
        await packed.shutdown()
        await single.shutdown()


def test_keyed_plain_key_reads_only_the_sdk_shape():
    def stored(msg: Message) -> bytes:
        return bytes(encode_message(msg, queue_id=0, queue_offset=0, phys_offset=0, store_host=HOST))

    def key_of(buf: bytes, topic: str = "T1") -> bytes | None:
        topic_at = 84 + 4 + int.from_bytes(buf[84:88], "big")
        field = bytes([len(topic)]) + topic.encode()
        key = keyed_plain_key(buf, topic_at, len(buf), field)
        # The dispatcher's pattern for a run's key length reads exactly the same.
        for length in {1, 3, 8, len(key or b"")}:
            found = keyed_tail(field, length).fullmatch(memoryview(buf), topic_at, len(buf))
            assert (found[1] if found else None) == (key if key is not None and len(key) == length else None)
        return key

    assert key_of(stored(Message("T1", b"x", idempotency_key="k-1"))) == b"k-1"
    assert key_of(stored(Message("T1", b"x", idempotency_key="ключ"))) == "ключ".encode()
    assert key_of(stored(Message("T1", b"x", idempotency_key="k-1")), topic="T2") is None
    assert key_of(stored(Message("T1", b"x"))) is None  # plain: no key
    assert key_of(stored(Message("T1", b"x", tags="a", idempotency_key="k"))) is None
    assert key_of(stored(Message("T1", b"x", properties={"p": "v"}, idempotency_key="k"))) is None

