"""The offline checkers on hand-built histories: clean ones pass, and every anomaly the fault
suite exists to catch (loss, broker duplicate, inconsistent offset, gap, backwards offset, two
leaders in a term, diverging committed bytes) is flagged."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.entry import DLedgerEntry, encode, encode_index_record
from tests.fault.checkers import (
    MemberLog,
    committed_prefixes,
    consumer_offsets,
    log_consistency,
    new_master_times,
    raft_invariants,
    read_range,
    receipts,
    summarize,
    total_queue,
)
from tests.fault.history import FAIL, INFO, OK, Event, History, classify_http_outcome, load_history


def send(h: History, value: str, outcome: str, queue: str = "T/0", offset: int | None = None) -> None:
    inv = h.invoke("send", "p0", value)
    if outcome == OK:
        h.ok(inv, queue=queue, offset=offset)
    elif outcome == FAIL:
        h.fail(inv, "NOT_MASTER")
    elif outcome == INFO:
        h.info(inv, "timeout")


def read(h: History, node: str, queue: str, start: int, msgs: list[tuple[int, str]],
         f: str = "final_read", process: str = "reader") -> None:
    inv = h.invoke(f, process, {"queue": queue, "offset": start}, node=node)
    h.ok(inv, {"queue": queue, "from": start, "messages": [list(m) for m in msgs]})


def clean_history() -> History:
    h = History()
    send(h, "a", OK, offset=0)
    send(h, "b", OK, offset=1)
    send(h, "c", INFO)          # unknown outcome, was stored at 2 (recovered)
    send(h, "d", FAIL)          # definite failure, never stored
    send(h, "e", INFO)          # unknown outcome, never stored
    for node in ("n0", "n1", "n2"):
        read(h, node, "T/0", 0, [(0, "a"), (1, "b"), (2, "c")])
    return h


def test_clean_history_passes_every_checker() -> None:
    h = clean_history()
    tq = total_queue(h.events)
    assert tq["valid"], tq
    assert (tq["attempted"], tq["acked"], tq["failed"], tq["info"], tq["read"]) == (5, 2, 1, 2, 3)
    assert tq["recovered_count"] == 1 and tq["lost_count"] == 0
    lc = log_consistency(h.events)
    assert lc["valid"], lc
    assert summarize(h.events) == {"attempted": 5, "acked": 2, "failed": 1, "info": 2, "polls": 0}


def test_lost_acked_write_is_flagged() -> None:
    h = History()
    send(h, "a", OK, offset=0)
    send(h, "b", OK, offset=1)
    read(h, "n0", "T/0", 0, [(0, "a")])
    tq = total_queue(h.events)
    assert not tq["valid"]
    assert tq["lost"] == ["b"] and tq["lost_count"] == 1


def test_acked_write_seen_only_in_an_early_poll_is_still_lost() -> None:
    # Seen once during the run, gone from the final read: a truncated committed entry.
    h = History()
    send(h, "a", OK, offset=0)
    read(h, "n1", "T/0", 0, [(0, "a")], f="poll", process="c0")
    read(h, "n0", "T/0", 0, [])
    assert total_queue(h.events)["lost"] == ["a"]


def test_broker_duplicate_is_flagged_but_retry_duplicate_is_reported_apart() -> None:
    h = History()
    send(h, "a", OK, offset=0)
    send(h, "r", INFO)
    send(h, "r", OK, offset=2)  # producer retry of the same value
    read(h, "n0", "T/0", 0, [(0, "a"), (1, "r"), (2, "r"), (3, "a")])
    tq = total_queue(h.events)
    assert not tq["valid"]
    assert tq["duplicated"] == ["a"]
    assert tq["retry_duplicated_count"] == 1


def test_unexpected_and_failed_but_read_are_flagged() -> None:
    h = History()
    send(h, "d", FAIL)
    read(h, "n0", "T/0", 0, [(0, "d"), (1, "ghost")])
    tq = total_queue(h.events)
    assert not tq["valid"]
    assert tq["unexpected"] == ["ghost"] and tq["failed_but_read"] == ["d"]


def test_two_values_at_one_offset_across_members_is_inconsistent() -> None:
    h = History()
    send(h, "a", OK, offset=0)
    send(h, "b", OK, offset=1)
    read(h, "n0", "T/0", 0, [(0, "a"), (1, "b")])
    read(h, "n1", "T/0", 0, [(0, "a"), (1, "x")])
    lc = log_consistency(h.events)
    assert not lc["valid"]
    assert lc["inconsistent_count"] == 1 and lc["inconsistent"][0]["offset"] == 1


def test_ack_at_one_offset_and_read_at_another_is_inconsistent() -> None:
    h = History()
    send(h, "a", OK, offset=5)
    read(h, "n0", "T/0", 0, [(0, "a")])
    read(h, "n0", "T/0", 5, [(5, "z")])
    lc = log_consistency(h.events)
    assert not lc["valid"] and lc["inconsistent"][0]["offset"] == 5


def test_gap_inside_a_read_is_a_skip() -> None:
    h = History()
    read(h, "n0", "T/0", 0, [(0, "a"), (2, "c")], f="poll", process="c0")
    lc = log_consistency(h.events)
    assert not lc["valid"] and lc["skips"] == [{"node": "n0", "queue": "T/0", "expected": 1, "got": 2}]


def test_hole_across_a_members_final_reads_is_flagged() -> None:
    h = History()
    read(h, "n2", "T/0", 0, [(0, "a"), (1, "b")])
    read(h, "n2", "T/0", 3, [(3, "d")])
    lc = log_consistency(h.events)
    assert not lc["valid"] and lc["holes"] == [{"node": "n2", "queue": "T/0", "missing": [2]}]


def test_read_starting_at_min_offset_is_not_a_skip() -> None:
    h = History()
    inv = h.invoke("poll", "c0", {"queue": "T/0", "offset": 0}, node="n0")
    h.ok(inv, {"queue": "T/0", "from": 0, "min_offset": 3, "messages": [[3, "d"], [4, "e"]]})
    assert log_consistency(h.events)["valid"]


def offset_op(h: History, f: str, offset: int) -> None:
    val = {"group": "g", "queue": "T/0", "offset": offset}
    inv = h.invoke(f, "c0", val if f == "commit_offset" else {"group": "g", "queue": "T/0"})
    h.ok(inv, val)


def test_committed_offsets_moving_backwards_are_flagged() -> None:
    h = History()
    offset_op(h, "commit_offset", 5)
    offset_op(h, "read_offset", 5)
    offset_op(h, "commit_offset", 9)
    offset_op(h, "read_offset", 9)
    assert consumer_offsets(h.events)["valid"]
    offset_op(h, "read_offset", 7)  # e.g. a new master that lost the last commit
    res = consumer_offsets(h.events)
    assert not res["valid"]
    assert res["backwards"][0]["offset"] == 7 and res["backwards"][0]["earlier_completed"] == 9


def status(h: History, node: str, role: str, term: int, leader: str | None, committed: int,
           incarnation: int = 0) -> None:
    inv = h.invoke("status", "monitor", None, node=node)
    h.ok(inv, {"selfId": node, "role": role, "term": term, "leaderId": leader, "committedIndex": committed},
         incarnation=incarnation)


def test_one_leader_per_term_passes_and_two_leaders_in_a_term_are_flagged() -> None:
    h = History()
    status(h, "n0", "LEADER", 1, "n0", 10)
    status(h, "n1", "FOLLOWER", 1, "n0", 10)
    status(h, "n1", "LEADER", 2, "n1", 12)
    assert raft_invariants(h.events)["valid"]
    status(h, "n2", "LEADER", 2, "n2", 12)
    res = raft_invariants(h.events)
    assert not res["valid"] and res["multiple_leaders"] == {2: ["n1", "n2"]}


def test_follower_naming_another_leader_for_the_term_is_flagged() -> None:
    h = History()
    status(h, "n0", "LEADER", 3, "n0", 1)
    status(h, "n2", "FOLLOWER", 3, "n1", 1)
    assert raft_invariants(h.events)["multiple_leaders"] == {3: ["n0", "n1"]}


def test_commit_index_regression_within_one_incarnation_is_flagged() -> None:
    h = History()
    status(h, "n0", "LEADER", 1, "n0", 10)
    status(h, "n0", "LEADER", 1, "n0", 8)
    assert not raft_invariants(h.events)["valid"]
    h2 = History()
    status(h2, "n0", "LEADER", 1, "n0", 10, incarnation=0)
    status(h2, "n0", "FOLLOWER", 2, "n1", 8, incarnation=1)  # restarted: recovers lower, legal
    assert raft_invariants(h2.events)["valid"]


def test_new_master_time_is_measured_from_the_fault() -> None:
    h = History()
    status(h, "n0", "LEADER", 1, "n0", 1)
    h.nemesis("kill", "n0", leader_fault=True, term=1)
    status(h, "n1", "CANDIDATE", 2, None, 1)
    status(h, "n1", "LEADER", 2, "n1", 1)
    res = new_master_times(h.events)
    assert res["faults"] == 1 and res["missing"] == 0 and 0 <= res["max_s"] < 1
    h.nemesis("kill", "n1", leader_fault=True, term=2)
    assert new_master_times(h.events)["missing"] == 1


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    h = History(path)
    send(h, "a", OK, offset=0)
    inv = h.invoke("send", "p1", "b")
    h.close_open_as_info()
    h.close()
    loaded = load_history(path)
    assert [e.type for e in loaded] == ["invoke", "ok", "invoke", "info"]
    assert loaded[1].extra == {"queue": "T/0", "offset": 0} and loaded[3].op_id == inv.op_id
    (tmp_path / "bad.jsonl").write_text('{"type": "maybe"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_history(tmp_path / "bad.jsonl")


def test_completing_an_operation_twice_is_refused() -> None:
    h = History()
    inv = h.invoke("send", "p0", "a")
    h.ok(inv)
    with pytest.raises(ValueError, match="already completed"):
        h.info(inv, "late")


@pytest.mark.parametrize(("status", "problem", "sent", "expected"), [
    (200, None, True, OK),
    (None, None, True, INFO),        # timeout / reset after sending
    (None, None, False, FAIL),       # connection refused: nothing left the client
    (504, {"code": "TIMEOUT", "outcome": "unknown"}, True, INFO),
    (421, {"code": "NOT_MASTER"}, True, FAIL),
    (507, {"code": "DISK_FULL"}, True, FAIL),
    (500, {"code": "INTERNAL"}, True, INFO),
    (503, {"code": "SERVICE_UNAVAILABLE"}, True, INFO),
])
def test_http_outcome_classification(status: int | None, problem: dict | None, sent: bool,
                                     expected: str) -> None:
    assert classify_http_outcome(status, problem, sent) == expected


# -- committed prefixes on real DLedger-format files ---------------------------------------------------
def write_member(root: Path, name: str, bodies: list[bytes], term: int = 1,
                 file_size: int = 4096) -> MemberLog:
    """Lay out DLedger data/index files (named by 20-digit start offset) for the given entries;
    data spans several files when file_size is small."""
    data_dir, index_dir = root / name / "data", root / name / "index"
    data_dir.mkdir(parents=True)
    index_dir.mkdir(parents=True)
    data, index, pos = bytearray(), bytearray(), 0
    for i, body in enumerate(bodies):
        raw = encode(DLedgerEntry(body=body, index=i, term=term, pos=pos))
        data += raw
        index += encode_index_record(1, pos, len(raw), i, term)
        pos += len(raw)
    for base in range(0, max(len(data), 1), file_size):
        (data_dir / f"{base:020d}").write_bytes(bytes(data[base:base + file_size]))
    (index_dir / f"{0:020d}").write_bytes(bytes(index))
    return MemberLog(name, str(data_dir), str(index_dir), len(bodies) - 1)


def test_identical_committed_prefixes_pass_across_file_boundaries(tmp_path: Path) -> None:
    bodies = [f"message-{i}".encode() * 30 for i in range(40)]
    members = [write_member(tmp_path, n, bodies, file_size=1000) for n in ("n0", "n1", "n2")]
    # n2 lags (committed less) and holds an uncommitted suffix: compared only up to its commit.
    lagging = MemberLog("n2", members[2].data_dir, members[2].index_dir, 30)
    res = committed_prefixes([members[0], members[1], lagging])
    assert res["valid"], res
    assert {c["upto_index"] for c in res["compared"]} == {39, 30}
    assert read_range(members[0].data_dir, 990, 1010) == read_range(members[1].data_dir, 990, 1010)


def test_diverging_committed_bytes_are_flagged(tmp_path: Path) -> None:
    bodies = [f"m{i}".encode() * 10 for i in range(10)]
    a = write_member(tmp_path, "n0", bodies)
    b = write_member(tmp_path, "n1", [*bodies[:5], b"X" * len(bodies[5]), *bodies[6:]])
    res = committed_prefixes([a, b])
    assert not res["valid"] and any("differ" in e for e in res["errors"]), res


def test_bit_flip_in_a_committed_entry_is_flagged(tmp_path: Path) -> None:
    bodies = [f"m{i}".encode() * 10 for i in range(10)]
    a = write_member(tmp_path, "n0", bodies)
    path = Path(a.data_dir) / f"{0:020d}"
    raw = bytearray(path.read_bytes())
    raw[48 + 3] ^= 0x10  # inside the body of entry 0
    path.write_bytes(bytes(raw))
    res = committed_prefixes([a])
    assert not res["valid"] and "CRC" in res["errors"][0], res


def test_committed_index_beyond_the_files_is_flagged(tmp_path: Path) -> None:
    a = write_member(tmp_path, "n0", [b"x"] * 3)
    res = committed_prefixes([MemberLog("n0", a.data_dir, a.index_dir, 7)])
    assert not res["valid"] and "cannot read" in res["errors"][0]


def test_event_from_json_rejects_non_objects() -> None:
    with pytest.raises(ValueError):
        Event.from_json("[1, 2]")


# -- receipts (shared-queue group consumption) --------------------------------------------------------
class Receipts:
    """Hand-built receive/ack history with explicit times (ms)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.ids = 0

    def _op(self, f: str, t_inv: float, t_done: float, value: dict) -> None:
        self.ids += 1
        self.events.append(Event("invoke", f, "c", self.ids, int(t_inv * 1e6)))
        self.events.append(Event(OK, f, "c", self.ids, int(t_done * 1e6), value))

    def receive(self, t_inv: float, t_done: float, offset: int, handle: str, inv_ms: int = 1000) -> None:
        self._op("receive", t_inv, t_done, {"invisible_ms": inv_ms,
                                            "messages": [["T/0", offset, f"m{offset}", handle]]})

    def ack(self, t_inv: float, t_done: float, offset: int, handle: str, status: str = "OK") -> None:
        self._op("ack", t_inv, t_done, {"results": [["T/0", offset, handle, status]]})


def test_receipts_clean_history_with_a_redelivery_after_the_invisible_time_passes() -> None:
    r = Receipts()
    r.receive(0, 5, 0, "e1.0.0.1")       # consumer killed before acking
    r.receive(1010, 1012, 0, "e1.0.0.2")  # visible again after 1000 ms: redelivered
    r.ack(1100, 1105, 0, "e1.0.0.1", "EXPIRED")  # the first handle is dead
    r.ack(1110, 1115, 0, "e1.0.0.2")
    r.receive(2000, 2003, 1, "e1.0.1.3")
    r.ack(2010, 2012, 1, "e1.0.1.3")
    res = receipts(r.events)
    assert res["valid"], res
    assert (res["messages"], res["deliveries"], res["redeliveries"], res["acked"], res["expired_acks"]) == (
        2, 3, 1, 2, 1)


def test_receipts_flag_a_message_handed_out_twice_while_invisible() -> None:
    r = Receipts()
    r.receive(0, 5, 0, "e1.0.0.1")
    r.receive(300, 302, 0, "e1.0.0.2")  # 300 ms later, still invisible to the group
    res = receipts(r.events)
    assert not res["valid"] and res["overlap_count"] == 1
    # A new master (another epoch) redelivers in-flight messages at once: not an overlap.
    r = Receipts()
    r.receive(0, 5, 0, "e1.0.0.1")
    r.receive(300, 302, 0, "e2.0.0.1")
    assert receipts(r.events)["valid"]


def test_receipts_flag_double_acks_stale_handles_and_redelivery_after_ack() -> None:
    r = Receipts()
    r.receive(0, 5, 0, "e1.0.0.1")
    r.receive(1010, 1012, 0, "e1.0.0.2")
    r.ack(1100, 1105, 0, "e1.0.0.1")  # the replaced handle accepted
    res = receipts(r.events)
    assert not res["valid"] and res["stale_ack_count"] == 1
    r.ack(1110, 1115, 0, "e1.0.0.2")
    res = receipts(r.events)
    assert res["double_ack_count"] == 1
    r.receive(3000, 3004, 0, "e1.0.0.3")  # delivered again after an OK ack completed
    assert receipts(r.events)["acked_redelivered_count"] == 2  # after both OK acks


def test_receipts_excuse_an_overlap_across_a_term_change() -> None:
    r = Receipts()
    r.receive(0, 5, 0, "e1.0.0.1")
    r.receive(300, 302, 0, "e1.0.0.2")
    assert receipts(r.events, term_changes_ns=[int(250e6)])["valid"]  # a new term in between
    assert not receipts(r.events, term_changes_ns=[int(5000e6)])["valid"]
