"""Consumer offset records and the idempotency table (plain objects, no I/O)."""

import pytest

from broker.errors import BrokerCode, BrokerError
from broker.store.offsets import ConsumerOffsetManager, IdempotencyTable, PutResult


def _res(n: int) -> PutResult:
    return PutResult(f"ID{n}", 0, n, n * 100, 100)


def test_idempotency_window():
    t = IdempotencyTable(window_ms=1000)
    t.remember("T", "k", _res(1), store_ts_ms=10_000)
    t.remember("T", "k", _res(2), store_ts_ms=10_001)  # a later duplicate never replaces the first
    assert t.get("T", "k", now_ms=10_500) == _res(1)
    assert t.get("U", "k", now_ms=10_500) is None
    assert t.get("T", "k", now_ms=11_001) is None
    t.remember("T", "k2", _res(3), store_ts_ms=20_000)  # expires older keys
    assert len(t) == 1


async def test_offset_records_applied_in_order():
    m = ConsumerOffsetManager()
    written = []

    async def writer(topic, record):
        written.append((topic, record))
        m.apply_record(record)

    m.set_writer(writer)
    await m.commit("g", "T", 1, 5)
    await m.commit_many("g", "T", {0: 2, 1: 6})
    assert m.query("g", "T", 1) == 6 and m.query("g", "T", 0) == 2 and m.query("g", "T", 3) == -1
    assert m.offsets_of("g") == {"T": {0: 2, 1: 6}} and m.groups() == ["g"]
    assert written[0] == ("RMQ_SYS_CONSUMER_OFFSETS", {"group": "g", "topic": "T", "offsets": {"1": 5}})
    m.apply_record({"bad": 1})  # a malformed record is logged, not fatal
    with pytest.raises(BrokerError) as ei:
        await m.commit("g", "T", 0, -1)
    assert ei.value.code == BrokerCode.INVALID_REQUEST
