"""Offline history checkers (pure Python; no I/O except reading a member's log files).

Event conventions (see `history.py`; the workload in `cluster.py` writes them):

- `send`: invoke value = the message body (a unique string); an `ok` carries
  `extra = {"queue": "<topic>/<queueId>", "offset": queueOffset}`.
- `poll` (during the run) and `final_read` (after the run): invoke value
  `{"queue", "offset"}`; `ok` value `{"queue", "from", "messages": [[queueOffset, body], ...]}`,
  `node` = the member that answered.
- `commit_offset`: invoke value `{"group", "queue", "offset"}`; `read_offset`: ok value the same
  shape with the committed offset the broker reported.
- `status`: ok value = one member's `/status` `dledger` metadata (`role`, `term`, `leaderId`,
  `selfId`, `committedIndex`, ...), `extra.incarnation` = which start of that member answered.
- nemesis events (process `"nemesis"`): `extra.leader_fault = True` and `extra.term` for faults of
  the leader, used by `new_master_times`.

Every checker returns a dict with `valid` (bool) plus counts and the offending items, so a
scenario can print it and assert on it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dledger.codes import DLedgerException
from dledger.entry import INDEX_UNIT_SIZE, decode, decode_index_record
from tests.fault.history import FAIL, INFO, INVOKE, OK, Event, pair_operations

MAX_ITEMS_REPORTED = 20  # keep reports short; counts stay exact


def _short(items: Iterable[Any]) -> list[Any]:
    return sorted(items, key=repr)[:MAX_ITEMS_REPORTED]


def _read_ops(events: Iterable[Event], fs: Sequence[str]) -> list[Event]:
    return [e for e in events if e.type == OK and e.f in fs and isinstance(e.value, dict)]


# -- total queue --------------------------------------------------------------------------------
def total_queue(events: Sequence[Event], final_fs: Sequence[str] = ("final_read",),
                any_read_fs: Sequence[str] = ("final_read", "poll")) -> dict[str, Any]:
    """Jepsen's total-queue: every acked send must be read back by the final reads.

    - lost: acked, never seen in a final read;
    - recovered: outcome unknown (info, or never completed), seen anyway (allowed);
    - failed_but_read: every attempt definitely failed, yet it was read (the broker lied);
    - unexpected: read but never sent;
    - duplicated: one value stored at two or more (queue, offset) positions although the client
      sent it once (a broker duplicate); retry_duplicated: the same, for values the client sent
      more than once (producer retries; reported apart, not a broker fault).
    """
    attempts: dict[Any, int] = defaultdict(int)
    outcomes: dict[Any, set[str]] = defaultdict(set)
    for inv, done in pair_operations(e for e in events if e.f == "send"):
        attempts[inv.value] += 1
        outcomes[inv.value].add(done.type if done is not None else INFO)

    final_seen: set[Any] = set()
    any_seen: set[Any] = set()
    positions: dict[Any, set[tuple[str, int]]] = defaultdict(set)
    for ev in _read_ops(events, any_read_fs):
        queue = ev.value["queue"]
        for offset, body in ev.value["messages"]:
            any_seen.add(body)
            positions[body].add((queue, offset))
            if ev.f in final_fs:
                final_seen.add(body)

    acked = {v for v, o in outcomes.items() if OK in o}
    indeterminate = {v for v, o in outcomes.items() if OK not in o and INFO in o}
    failed = {v for v, o in outcomes.items() if o == {FAIL}}
    lost = acked - final_seen
    recovered = indeterminate & final_seen
    failed_but_read = failed & any_seen
    unexpected = any_seen - set(attempts)
    multi = {v for v, p in positions.items() if len(p) > 1 and v in attempts}
    duplicated = {v for v in multi if attempts[v] == 1}
    retry_duplicated = multi - duplicated
    return {
        "valid": not (lost or failed_but_read or unexpected or duplicated),
        "attempted": len(attempts), "acked": len(acked), "failed": len(failed),
        "info": len(indeterminate), "read": len(final_seen),
        "lost_count": len(lost), "lost": _short(lost),
        "recovered_count": len(recovered),
        "failed_but_read_count": len(failed_but_read), "failed_but_read": _short(failed_but_read),
        "unexpected_count": len(unexpected), "unexpected": _short(unexpected),
        "duplicated_count": len(duplicated), "duplicated": _short(duplicated),
        "retry_duplicated_count": len(retry_duplicated),
    }


# -- per-queue log consistency --------------------------------------------------------------------
def log_consistency(events: Sequence[Event], read_fs: Sequence[str] = ("final_read", "poll"),
                    final_fs: Sequence[str] = ("final_read",)) -> dict[str, Any]:
    """One value per (queue, offset) across all reads from all members and all acks; no skipped
    offsets inside a read; every member's final read of a queue dense from its first offset;
    monotonic polls per (process, queue)."""
    seen: dict[tuple[str, int], dict[Any, list[str]]] = defaultdict(lambda: defaultdict(list))
    for inv, done in pair_operations(e for e in events if e.f == "send"):
        if done is not None and done.type == OK and "queue" in done.extra:
            seen[(done.extra["queue"], done.extra["offset"])][inv.value].append(f"ack:{inv.process}")

    skips: list[dict[str, Any]] = []
    nonmonotonic: list[dict[str, Any]] = []
    last_by_reader: dict[tuple[str, str], int] = {}
    final_offsets: dict[tuple[str, str], list[int]] = defaultdict(list)
    reads = _read_ops(events, read_fs)
    for ev in sorted(reads, key=lambda e: e.time_ns):
        queue, start, msgs = ev.value["queue"], ev.value["from"], ev.value["messages"]
        expect = start
        for offset, body in msgs:
            seen[(queue, offset)][body].append(f"{ev.f}:{ev.node}")
            # The first message may start later than asked only at the queue's min offset (retention).
            first_ok = expect == start and offset == ev.value.get("min_offset", start) and offset > start
            if offset != expect and not first_ok:
                skips.append({"node": ev.node, "queue": queue, "expected": expect, "got": offset})
            expect = offset + 1
        if ev.f in final_fs:
            final_offsets[(ev.node or "?", queue)].extend(o for o, _ in msgs)
        elif msgs:
            key = (ev.process, queue)
            first = msgs[0][0]
            if key in last_by_reader and first <= last_by_reader[key] and start > last_by_reader[key]:
                nonmonotonic.append({"process": ev.process, "queue": queue,
                                     "previous": last_by_reader[key], "got": first})
            last_by_reader[key] = max(last_by_reader.get(key, -1), msgs[-1][0])

    inconsistent = [{"queue": q, "offset": o, "values": {repr(v): s[:3] for v, s in vals.items()}}
                    for (q, o), vals in seen.items() if len(vals) > 1]
    holes: list[dict[str, Any]] = []
    for (node, queue), offsets in final_offsets.items():
        if not offsets:
            continue
        present = set(offsets)
        missing = [o for o in range(min(present), max(present) + 1) if o not in present]
        if missing:
            holes.append({"node": node, "queue": queue, "missing": missing[:MAX_ITEMS_REPORTED]})
    return {
        "valid": not (inconsistent or skips or holes or nonmonotonic),
        "positions": len(seen),
        "inconsistent_count": len(inconsistent), "inconsistent": inconsistent[:MAX_ITEMS_REPORTED],
        "skip_count": len(skips), "skips": skips[:MAX_ITEMS_REPORTED],
        "hole_count": len(holes), "holes": holes[:MAX_ITEMS_REPORTED],
        "nonmonotonic_count": len(nonmonotonic), "nonmonotonic": nonmonotonic[:MAX_ITEMS_REPORTED],
    }


# -- committed consumer offsets ---------------------------------------------------------------------
def consumer_offsets(events: Sequence[Event]) -> dict[str, Any]:
    """Committed consumer offsets never move backwards.

    (1) A read of a (group, queue) offset invoked after an earlier read completed returns at least
    that earlier value; (2) a read invoked after a commit of offset X completed returns >= X.
    The workload commits non-decreasing offsets per (group, queue); a commit below an earlier
    completed commit is itself reported (it would make the check meaningless).
    """
    # (kind, key, invoke time, completion time, offset) for ok commits and ok reads.
    obs: list[tuple[str, tuple[str, str], int, int, int]] = []
    for inv, done in pair_operations(e for e in events if e.f in ("commit_offset", "read_offset")):
        if done is None or done.type != OK:
            continue
        val = done.value if inv.f == "read_offset" else inv.value
        key = (val["group"], val["queue"])
        obs.append((inv.f, key, inv.time_ns, done.time_ns, int(val["offset"])))
    violations: list[dict[str, Any]] = []
    by_key: dict[tuple[str, str], list[tuple[str, tuple[str, str], int, int, int]]] = defaultdict(list)
    for o in obs:
        by_key[o[1]].append(o)
    reads = 0
    for key, items in by_key.items():
        done_sorted = sorted(items, key=lambda o: o[3])  # by completion time
        for kind, _, t_inv, _t_done, offset in items:
            if kind == "read_offset":
                reads += 1
            floor = max((o[4] for o in done_sorted if o[3] < t_inv), default=None)
            if floor is not None and offset < floor:
                violations.append({"group": key[0], "queue": key[1], "op": kind,
                                   "offset": offset, "earlier_completed": floor})
    return {"valid": not violations, "keys": len(by_key), "reads": reads,
            "backwards_count": len(violations), "backwards": violations[:MAX_ITEMS_REPORTED]}


# -- Raft invariants from /status samples --------------------------------------------------------------
def status_samples(events: Iterable[Event]) -> list[Event]:
    """The ok `status` events in time order."""
    return sorted((e for e in events if e.f == "status" and e.type == OK and isinstance(e.value, dict)),
                  key=lambda e: e.time_ns)


def raft_invariants(events: Sequence[Event]) -> dict[str, Any]:
    """Election safety (at most one leader per term, from self-reports and from the leaderId each
    member names for its term) and, per member incarnation, committedIndex never decreasing."""
    leaders: dict[int, set[str]] = defaultdict(set)
    regress: list[dict[str, Any]] = []
    last_commit: dict[tuple[str, Any], int] = {}
    samples = status_samples(events)
    for ev in samples:
        md = ev.value
        term = md.get("term")
        if term is None:
            continue
        if md.get("role") == "LEADER" and md.get("selfId"):
            leaders[int(term)].add(md["selfId"])
        if md.get("leaderId"):
            leaders[int(term)].add(md["leaderId"])
        key = (md.get("selfId") or ev.node or "?", ev.extra.get("incarnation"))
        ci = md.get("committedIndex")
        if ci is not None:
            if key in last_commit and ci < last_commit[key]:
                regress.append({"member": key[0], "incarnation": key[1], "from": last_commit[key], "to": ci})
            last_commit[key] = max(ci, last_commit.get(key, -1))
    two_leaders = {t: sorted(ids) for t, ids in leaders.items() if len(ids) > 1}
    return {"valid": not two_leaders and not regress, "samples": len(samples), "terms": len(leaders),
            "max_term": max(leaders, default=-1), "multiple_leaders": two_leaders,
            "commit_regressions": regress[:MAX_ITEMS_REPORTED]}


def new_master_times(events: Sequence[Event]) -> dict[str, Any]:
    """Seconds from each leader fault (nemesis event with extra.leader_fault) to the first status
    sample in which some member is LEADER of a higher term than the faulted leader's."""
    samples = status_samples(events)
    faults = [e for e in events if e.process == "nemesis" and e.type == OK and e.extra.get("leader_fault")]
    times: list[float | None] = []
    for fault in faults:
        old_term = int(fault.extra.get("term", -1))
        hit = next((s for s in samples if s.time_ns >= fault.time_ns and s.value.get("role") == "LEADER"
                    and int(s.value.get("term", -1)) > old_term), None)
        times.append(None if hit is None else (hit.time_ns - fault.time_ns) / 1e9)
    known = [t for t in times if t is not None]
    return {"faults": len(faults), "times_s": [None if t is None else round(t, 3) for t in times],
            "max_s": max(known, default=None), "missing": sum(t is None for t in times)}


# -- identical committed prefixes (bytes of every member's DLedger files) ------------------------------
@dataclass(frozen=True)
class MemberLog:
    """Where one member's DLedger files are and how far its log is committed."""

    name: str
    data_dir: str
    index_dir: str
    committed_index: int


def _files(directory: str) -> list[tuple[int, str]]:
    """(start offset, path) of the files in a DLedger data/index dir, by offset (names are offsets)."""
    out = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if name.isdigit():
            out.append((int(name), os.path.join(directory, name)))
    return sorted(out)


def read_range(directory: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of the global address space stored in the files of `directory`.
    Raises ValueError if any part of the range is not in a file (a hole or a short file)."""
    out = bytearray()
    pos = start
    files = _files(directory)
    for i, (base, path) in enumerate(files):
        if pos >= end:
            break
        size = os.path.getsize(path)
        limit = files[i + 1][0] if i + 1 < len(files) else base + size
        limit = min(limit, base + size)
        if pos < base or pos >= limit:
            continue
        take = min(end, limit) - pos
        with open(path, "rb") as fh:
            fh.seek(pos - base)
            chunk = fh.read(take)
        out += chunk
        pos += len(chunk)
    if pos < end:
        raise ValueError(f"{directory}: bytes [{pos}, {end}) are not in any file")
    return bytes(out)


def _prefix(member: MemberLog, upto_index: int) -> tuple[bytes, bytes, list[str]]:
    """(index bytes, data bytes, entry errors) of entries [first, upto_index] of a member."""
    files = _files(member.index_dir)
    first_index = files[0][0] // INDEX_UNIT_SIZE if files else 0
    idx = read_range(member.index_dir, first_index * INDEX_UNIT_SIZE, (upto_index + 1) * INDEX_UNIT_SIZE)
    _, first_pos, _, _, _ = decode_index_record(idx[:INDEX_UNIT_SIZE])
    _, last_pos, last_size, _, _ = decode_index_record(idx[-INDEX_UNIT_SIZE:])
    data = read_range(member.data_dir, first_pos, last_pos + last_size)
    errors = []
    for i in range(0, len(idx), INDEX_UNIT_SIZE):
        magic, pos, size, index, term = decode_index_record(idx[i:i + INDEX_UNIT_SIZE])
        if index != first_index + i // INDEX_UNIT_SIZE:
            want = first_index + i // INDEX_UNIT_SIZE
            errors.append(f"{member.name}: index record {want} says index {index}")
            continue
        try:
            entry = decode(data[pos - first_pos: pos - first_pos + size])
        except DLedgerException as exc:
            errors.append(f"{member.name}: committed entry {index}: {exc}")
            continue
        if (entry.index, entry.term, entry.pos, entry.magic) != (index, term, pos, magic):
            errors.append(f"{member.name}: entry {index} header {entry.index}/{entry.term}/{entry.pos} "
                          f"!= index record {index}/{term}/{pos}")
    return idx, data, errors


def committed_prefixes(members: Sequence[MemberLog]) -> dict[str, Any]:
    """For every pair of members, the bytes of their index and data files up to the smaller of the
    two committed indexes must be identical, and every committed entry must decode with a good CRC.
    A member with committed_index < 0 has nothing to compare."""
    errors: list[str] = []
    compared: list[dict[str, Any]] = []
    prefixes: dict[str, tuple[bytes, bytes]] = {}
    top = max((m.committed_index for m in members), default=-1)
    for m in members:
        if m.committed_index < 0:
            continue
        try:
            idx, data, errs = _prefix(m, m.committed_index)
        except (ValueError, OSError, DLedgerException) as exc:
            errors.append(f"{m.name}: cannot read committed prefix up to {m.committed_index}: {exc}")
            continue
        errors.extend(errs)
        prefixes[m.name] = (idx, data)
    live = [m for m in members if m.name in prefixes]
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            upto = min(a.committed_index, b.committed_index)
            n_idx = (upto + 1) * INDEX_UNIT_SIZE
            ia, da = prefixes[a.name]
            ib, db = prefixes[b.name]
            # Both prefixes start at index 0 in our runs (no log cleaning); compare the tails evenly.
            ia, ib = ia[:n_idx], ib[:n_idx]
            if ia != ib:
                first = next(k for k in range(min(len(ia), len(ib))) if ia[k] != ib[k]) \
                    if len(ia) == len(ib) else min(len(ia), len(ib))
                errors.append(f"index files of {a.name} and {b.name} differ at entry "
                              f"{first // INDEX_UNIT_SIZE}")
                continue
            _, pos, size, _, _ = decode_index_record(ia[-INDEX_UNIT_SIZE:])
            end = pos + size - decode_index_record(ia[:INDEX_UNIT_SIZE])[1]
            if da[:end] != db[:end]:
                first = next((k for k in range(end) if da[k] != db[k]), end)
                errors.append(f"data files of {a.name} and {b.name} differ at byte {first} "
                              f"(committed up to index {upto})")
            compared.append({"a": a.name, "b": b.name, "upto_index": upto, "bytes": end})
    return {"valid": not errors and bool(compared or len(live) <= 1), "max_committed_index": top,
            "compared": compared, "errors": errors[:MAX_ITEMS_REPORTED]}


def summarize(events: Sequence[Event]) -> dict[str, int]:
    """Op counts for a scenario report: sends attempted / acked / failed / info, reads."""
    counts = {"attempted": 0, "acked": 0, "failed": 0, "info": 0}
    for _inv, done in pair_operations(e for e in events if e.f == "send"):
        counts["attempted"] += 1
        kind = done.type if done is not None else INFO
        counts[{OK: "acked", FAIL: "failed", INFO: "info"}[kind]] += 1
    counts["polls"] = sum(1 for e in events if e.f == "poll" and e.type == INVOKE)
    return counts


# -- group consumption with receipts (simple consumer) ------------------------------------------------
# `receive`: ok value {"invisible_ms": N, "messages": [[queueKey, queueOffset, body, receiptHandle]]}
# (queueKey = "<topic>/<queueId>"); `ack`: ok value {"results": [[queueKey, queueOffset, handle,
# status]]} with status "OK" or "EXPIRED". A handle starts with the master's epoch ("<epoch>.").
RECEIPT_SLACK_NS = 5_000_000  # the broker's invisibility clock is whole milliseconds


def term_change_times(events: Iterable[Event]) -> list[int]:
    """Monitor times at which some member first reported a term above every earlier one."""
    out, high = [], None
    for e in status_samples(events):
        term = int(e.value.get("term", -1) or -1)
        if high is not None and term > high:
            out.append(e.time_ns)
        high = term if high is None else max(high, term)
    return out


_TERM_SAMPLE_LAG_NS = 500_000_000  # the monitor samples /status every 100 ms, slower under load


def receipts(events: Sequence[Event], term_changes_ns: Sequence[int] = ()) -> dict[str, Any]:
    """What a shared-queue consumer group guarantees per message (there is no queue ownership:
    every consumer of a group receives from every queue):

    1. `overlaps`: within one master epoch, a message is never handed out again while an earlier
       delivery of it is still invisible. Flagged when the second delivery *completed* before the
       first was even invoked + invisibleMs (the broker's deadline lies after the first invoke).
    2. `double_acks`: a message is acknowledged OK at most once, group-wide.
    3. `stale_acks`: an OK ack uses the message's latest handle: no later delivery of it (invoked
       after the acked one completed) completed before the ack was invoked — a redelivery
       invalidates the earlier handle.
    4. `acked_redelivered`: a message is not delivered again once an OK ack of it completed.
    A new master term redelivers in-flight messages at once: an overlap with a term change
    (`term_changes_ns`, see `term_change_times`) between the two deliveries is not flagged.
    """
    deliveries: dict[tuple[str, int], list[tuple[int, int, int, str]]] = defaultdict(list)
    acks: dict[tuple[str, int], list[tuple[int, int, str]]] = defaultdict(list)
    expired = 0
    for inv, done in pair_operations(e for e in events if e.f in ("receive", "ack")):
        if done is None or done.type != OK:
            continue
        if inv.f == "receive":
            inv_ns = int(done.value["invisible_ms"]) * 1_000_000
            for queue, offset, _body, handle in done.value["messages"]:
                deliveries[(queue, int(offset))].append((inv.time_ns, done.time_ns, inv_ns, handle))
        else:
            for queue, offset, handle, status in done.value["results"]:
                if status == "OK":
                    acks[(queue, int(offset))].append((inv.time_ns, done.time_ns, handle))
                else:
                    expired += 1
    overlaps, double_acks, stale_acks, redelivered = [], [], [], []
    for key, ds in deliveries.items():
        ds.sort(key=lambda d: d[1])
        for i, (t_inv, _t_done, inv_ns, handle) in enumerate(ds):
            epoch = handle.split(".", 1)[0]
            for _t2_inv, t2_done, _, h2 in ds[i + 1:]:
                if h2.split(".", 1)[0] == epoch and t2_done + RECEIPT_SLACK_NS < t_inv + inv_ns and not any(
                        t_inv <= t <= t2_done + _TERM_SAMPLE_LAG_NS for t in term_changes_ns):
                    overlaps.append({"message": list(key), "first": handle, "second": h2,
                                     "second_done_ms_after_first_invoke": (t2_done - t_inv) / 1e6})
        for a_inv, a_done, a_handle in acks.get(key, []):
            mine = next((d for d in ds if d[3] == a_handle), None)
            if mine is None or any(t_inv > mine[1] and t_done < a_inv for t_inv, t_done, _, _ in ds):
                # acked with a handle never handed out, or one a later delivery had replaced
                stale_acks.append({"message": list(key), "handle": a_handle})
            if any(t_inv > a_done for t_inv, _, _, _ in ds):
                redelivered.append({"message": list(key), "acked_handle": a_handle})
    for key, a in acks.items():
        if len(a) > 1:
            double_acks.append({"message": list(key), "handles": [x[2] for x in a]})
    n_deliveries = sum(len(d) for d in deliveries.values())
    return {"valid": not (overlaps or double_acks or stale_acks or redelivered),
            "messages": len(deliveries), "deliveries": n_deliveries,
            "redeliveries": n_deliveries - len(deliveries), "acked": sum(len(a) for a in acks.values()),
            "expired_acks": expired,
            "overlap_count": len(overlaps), "overlaps": overlaps[:MAX_ITEMS_REPORTED],
            "double_ack_count": len(double_acks), "double_acks": double_acks[:MAX_ITEMS_REPORTED],
            "stale_ack_count": len(stale_acks), "stale_acks": stale_acks[:MAX_ITEMS_REPORTED],
            "acked_redelivered_count": len(redelivered),
            "acked_redelivered": redelivered[:MAX_ITEMS_REPORTED]}
