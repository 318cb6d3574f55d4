"""The message-model checkers on hand-built histories: clean ones pass, and each violation the
fault scenarios exist to catch (a timer fired twice, early, lost or after its recall; a rolled-back
message visible; a FIFO group's next message before the previous ack) is flagged."""

from __future__ import annotations

from tests.fault.history import History
from tests.fault.msgmodel_checkers import fifo_order, timers, transactions


def delayed(h: History, body: str, due: int, ok: bool = True) -> None:
    inv = h.invoke("send_delayed", "p0", body)
    if ok:
        h.ok(inv, deliverAt=due)
    else:
        h.info(inv, "timeout")


def timer_read(h: History, node: str, rows: list[list]) -> None:
    inv = h.invoke("timer_read", "reader", node=node)
    h.ok(inv, {"queue": "T/0", "messages": rows})


def test_timers_clean_then_each_violation():
    h = History()
    delayed(h, "a", 1000)
    delayed(h, "b", 2000)
    delayed(h, "c", 3000, ok=False)  # unknown outcome, never stored: fine
    for node in ("n0", "n1"):
        timer_read(h, node, [[0, "a", 1010, 1000], [1, "b", 2003, 2000]])
    r = timers(h.events)
    assert r["valid"] and r["lateness_ms_max"] == 10, r

    twice = History()
    delayed(twice, "a", 1000)
    timer_read(twice, "n0", [[0, "a", 1010, 1000], [5, "a", 1500, 1000]])
    assert timers(twice.events)["fired_twice"] == ["a"]

    early = History()
    delayed(early, "a", 1000)
    timer_read(early, "n0", [[0, "a", 990, 1000]])
    assert timers(early.events)["early_count"] == 1

    lost = History()
    delayed(lost, "a", 1000)
    timer_read(lost, "n0", [])
    assert timers(lost.events)["lost"] == ["a"]

    recalled = History()
    delayed(recalled, "a", 1000)
    recalled.ok(recalled.invoke("recall", "p0", "a"))
    timer_read(recalled, "n0", [[0, "a", 1001, 1000]])
    r = timers(recalled.events)
    assert not r["valid"] and r["recalled_but_delivered"] == ["a"]


def tx(h: History, body: str, resolution: str | None, ok: bool = True) -> None:
    h.ok(h.invoke("tx_half", "p0", body), txid=f"id-{body}")
    if resolution:
        inv = h.invoke("tx_end", "p0", {"body": body, "resolution": resolution})
        h.ok(inv) if ok else h.info(inv, "timeout")


def tx_read(h: History, rows: list[list]) -> None:
    h.ok(h.invoke("tx_read", "reader", node="n0"), {"queue": "T/0", "messages": rows})


def test_transactions_clean_then_each_violation():
    h = History()
    tx(h, "c", "COMMIT")
    tx(h, "r", "ROLLBACK")
    tx(h, "u", "COMMIT", ok=False)  # unknown: may or may not be visible
    tx(h, "o", None)  # left open: discarded, never visible
    tx_read(h, [[0, "c"], [1, "u"]])
    assert transactions(h.events)["valid"]

    bad = History()
    tx(bad, "r", "ROLLBACK")
    tx(bad, "o", None)
    tx(bad, "c", "COMMIT")
    tx_read(bad, [[0, "r"], [1, "o"]])
    r = transactions(bad.events)
    assert r["rolled_back_visible"] == ["r"] and r["visible_without_commit"] == ["o", "r"]
    assert r["committed_lost"] == ["c"] and not r["valid"]


def test_fifo_order_clean_then_violation():
    h = History()
    for seq in range(3):
        h.ok(h.invoke("fifo_send", "p0", {"group": "g", "seq": seq, "body": f"g{seq}"}))
    h.ok(h.invoke("fifo_receive", "c0"), {"messages": [["g", 0]]})
    h.ok(h.invoke("fifo_receive", "c1"), {"messages": [["g", 0]]})  # redelivered: fine
    h.ok(h.invoke("fifo_ack", "c1", ["g", 0]))
    h.ok(h.invoke("fifo_receive", "c0"), {"messages": [["g", 1]]})
    h.ok(h.invoke("fifo_ack", "c0", ["g", 1]))
    h.ok(h.invoke("fifo_receive", "c0"), {"messages": [["g", 2]]})
    assert fifo_order(h.events)["valid"]

    bad = History()
    for seq in range(2):
        bad.ok(bad.invoke("fifo_send", "p0", {"group": "g", "seq": seq, "body": f"g{seq}"}))
    bad.ok(bad.invoke("fifo_receive", "c0"), {"messages": [["g", 0]]})
    bad.ok(bad.invoke("fifo_receive", "c1"), {"messages": [["g", 1]]})  # before 0 was acked
    bad.ok(bad.invoke("fifo_ack", "c0", ["g", 0]))
    r = fifo_order(bad.events)
    assert not r["valid"] and r["violations"] == [("g", 0, 1)]

    expired = History()  # an ack refused (EXPIRED) settles nothing: the next message came too early
    for seq in range(2):
        expired.ok(expired.invoke("fifo_send", "p0", {"group": "g", "seq": seq, "body": f"g{seq}"}))
    expired.ok(expired.invoke("fifo_receive", "c0"), {"messages": [["g", 0]]})
    expired.fail(expired.invoke("fifo_ack", "c0", ["g", 0]), "EXPIRED")
    expired.ok(expired.invoke("fifo_receive", "c1"), {"messages": [["g", 1]]})
    assert not fifo_order(expired.events)["valid"]
