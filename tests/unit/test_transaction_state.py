"""TransactionTable: the replicated transaction state (half messages + op records), no I/O."""

from broker.transaction.state import HalfMessage, TransactionState, TransactionTable


def half(txid: str, offset: int, store_ms: int = 0, **kw) -> HalfMessage:
    return HalfMessage(txid, offset, phys=1000 + offset, size=100, producer_group="pg", topic="T",
                       store_ms=store_ms, **kw)


def end(txid: str, outcome: str, at: int = 1) -> dict:
    return {"op": "end", "txid": txid, "outcome": outcome, "fromCheck": False, "atMs": at}


def test_first_end_wins_and_later_ends_change_nothing():
    t = TransactionTable()
    t.add_half(half("a", 0))
    t.apply_record(end("a", "ROLLBACK"))
    t.apply_record(end("a", "COMMIT"))  # e.g. a commit raced a rollback across a failover
    assert t.get("a").state is TransactionState.ROLLED_BACK


def test_check_schedule_timeout_interval_and_max():
    t = TransactionTable()
    t.add_half(half("a", 0, store_ms=0))
    t.add_half(half("b", 1, store_ms=0, immunity_ms=60_000))
    assert t.due_checks(5_000, 6_000, 30_000, 3).check == []  # younger than transactionTimeOut
    plan = t.due_checks(6_000, 6_000, 30_000, 3)
    assert [h.txid for h in plan.check] == ["a"] and plan.discard == []
    t.apply_record({"op": "check", "txid": "a", "times": 1, "atMs": 6_000})
    assert t.due_checks(20_000, 6_000, 30_000, 3).check == []  # asked within the interval
    for n, at in ((2, 36_000), (3, 66_000)):
        t.apply_record({"op": "check", "txid": "a", "times": n, "atMs": at})
    plan = t.due_checks(96_000, 6_000, 30_000, 3)
    assert [h.txid for h in plan.discard] == ["a"] and [h.txid for h in plan.check] == ["b"]
    t.apply_record(end("a", "DISCARD"))
    assert t.get("a").state is TransactionState.DISCARDED and t.open_count() == 1


def test_replay_order_op_records_before_the_half_scan():
    t = TransactionTable()
    t.apply_record({"op": "check", "txid": "a", "times": 1, "atMs": 5})
    t.apply_record({"op": "check", "txid": "a", "times": 2, "atMs": 9})
    t.apply_record(end("b", "COMMIT"))
    t.apply_record(end("old", "COMMIT"))  # its half lies below where the scan starts
    t.add_half(half("a", 3))
    t.add_half(half("b", 4))
    assert t.get("a").check_times == 2 and t.get("a").last_check_ms == 9
    assert t.get("b").state is TransactionState.COMMITTED
    assert t.drop_unmatched() == 1 and t.get("old") is None


def test_low_water_mark_prune_and_snapshot():
    t = TransactionTable()
    for i, txid in enumerate("abc"):
        t.add_half(half(txid, i))
    t.apply_record(end("a", "COMMIT", at=10))
    t.apply_record({"op": "check", "txid": "b", "times": 2, "atMs": 7})
    assert t.low_water_mark(3) == 1
    snap = t.snapshot()
    copy = TransactionTable()
    for i, txid in enumerate("abc"):
        copy.add_half(half(txid, i))
    copy.restore(snap)
    assert copy.get("a").state is TransactionState.COMMITTED and copy.get("b").check_times == 2
    assert copy.get("c").state is TransactionState.OPEN
    assert t.prune(before_offset=1, resolved_before_ms=11) == 1 and t.get("a") is None
    assert t.prune(before_offset=3, resolved_before_ms=11) == 0  # b and c are open
