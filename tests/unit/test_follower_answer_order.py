"""How a follower answers pushes: before it applies the commit a push carried, and — past Raft's
model — a leader lacking an entry it holds committed, refused with one line saying so.

The state machine's apply (on a broker: dispatching a whole batch of messages into its consume
queues) is the follower's own work; the leader waits for the answer to count its quorum. One real
`DLedgerServer` follower in this process (mmap store, loopback TCP); the leader is a blocking
socket in a thread, so it reads the answer while the follower's loop is still busy applying.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dledger.codes import DLedgerResponseCode
from dledger.config import DLedgerConfig
from dledger.entry import DLedgerEntry
from dledger.rpc.protocol import (
    FRAME_HEAD,
    KIND_REQUEST,
    PushEntryRequest,
    PushType,
    decode_frame_body,
    encode_frame,
)
from dledger.server import DLedgerServer
from dledger.statemachine import StateMachine
from dledger.store.mmap_store import DLedgerMmapFileStore
from tests.ports import free_ports

GROUP = "order"
APPLY_S = 0.6


def _member(base: Path, member: str = "n1", **settings: int) -> tuple[DLedgerConfig, list[int]]:
    """A member of a 3-member group on free loopback ports (its config, every member's port)."""
    ports = free_ports(3)
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
    return DLedgerConfig(group=GROUP, self_id=member, peers=peers, store_base_dir=str(base),
                         mapped_file_size_for_entry_data=1024 * 1024,
                         mapped_file_size_for_entry_index=64 * 1024, **settings), ports  # fmt: skip


class SlowMachine(StateMachine):
    """Holds the member's whole loop while it applies, as a long dispatch would."""

    def __init__(self) -> None:
        self.applied = -1
        self.done = asyncio.Event()

    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        time.sleep(APPLY_S)  # noqa: ASYNC251 - blocking the loop is the point
        self.applied = entries[-1].index
        self.done.set()

    def last_applied_index(self) -> int:
        return self.applied


def _push(sock: socket.socket, rid: int, req: PushEntryRequest) -> tuple[float, object]:
    """Send one push as the leader; (seconds until its answer was read, the answer)."""
    started = time.monotonic()
    sock.sendall(encode_frame(KIND_REQUEST, rid, req))
    head = _read(sock, 4)
    rest = _read(sock, int.from_bytes(head, "big"))
    _, kind, rtype, _ = FRAME_HEAD.unpack_from(head + rest)
    return time.monotonic() - started, decode_frame_body(kind, rtype, memoryview(rest)[FRAME_HEAD.size - 4 :])


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        assert got, "the follower closed the connection"
        out += got
    return out


def _lead(port: int) -> list[tuple[float, object]]:
    entries = [DLedgerEntry(body=b"first", index=0, term=1, pos=0)]
    entries[0].compute_size_in_bytes()
    second = DLedgerEntry(body=b"second", index=1, term=1, pos=entries[0].size)
    second.compute_size_in_bytes()

    def req(entry: DLedgerEntry, prev: int, commit: int) -> PushEntryRequest:
        return PushEntryRequest(group=GROUP, remote_id="n1", local_id="n0", leader_id="n0", term=1,
                                type=PushType.APPEND, commit_index=commit, prev_index=prev,
                                prev_term=1 if prev >= 0 else -1, entries=[entry])  # fmt: skip

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        return [
            _push(sock, 1, req(entries[0], -1, -1)),  # nothing committed yet
            _push(sock, 2, req(second, 0, 0)),
        ]  # commits entry 0: the follower will apply it


async def test_a_follower_answers_the_push_that_carries_a_commit_before_applying_it(tmp_path: Path) -> None:
    config, ports = _member(tmp_path)
    server = DLedgerServer(config)
    machine = SlowMachine()
    server.set_state_machine(machine)
    await server.start()
    try:
        (_, first), (waited_s, second) = await asyncio.to_thread(_lead, ports[1])
        assert first.code == second.code == DLedgerResponseCode.SUCCESS, (first, second)
        assert second.index == 1
        # The answer went out before the apply held the loop for APPLY_S.
        assert waited_s < APPLY_S / 2, waited_s
        await asyncio.wait_for(machine.done.wait(), 5)
        assert machine.applied == 0  # and the commit was applied all the same
    finally:
        await server.shutdown()


def _conflicting_leader(port: int, pushes: int) -> list[object]:
    """Leader n0 commits entries 0 and 1 in term 1; then, leading term 2 with a log whose entry 1
    differs, pushes it `pushes` times."""
    first = DLedgerEntry(body=b"first", index=0, term=1, pos=0)
    first.compute_size_in_bytes()
    second = DLedgerEntry(body=b"second", index=1, term=1, pos=first.size)
    other = DLedgerEntry(body=b"other", index=1, term=2, pos=first.size)

    def req(entry: DLedgerEntry, term: int, commit: int) -> PushEntryRequest:
        prev = entry.index - 1
        return PushEntryRequest(group=GROUP, remote_id="n1", local_id="n0", leader_id="n0", term=term,
                                type=PushType.APPEND, commit_index=commit, prev_index=prev,
                                prev_term=1 if prev >= 0 else -1, entries=[entry])  # fmt: skip

    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        answers.append(_push(sock, 1, req(first, 1, -1))[1])
        answers.append(_push(sock, 2, req(second, 1, 1))[1])  # entries 0 and 1 committed here
        for i in range(pushes):
            answers.append(_push(sock, 3 + i, req(other, 2, 1))[1])
    return answers


async def test_a_leader_without_an_entry_held_committed_is_refused_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past Raft's model (a majority lost acknowledged entries): the member refuses the leader's
    different entry every time, and says why — with what to do — once, not once a push."""
    config, ports = _member(tmp_path)
    server = DLedgerServer(config)
    await server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="dledger.entry_handler"):
            answers = await asyncio.to_thread(_conflicting_leader, ports[1], 30)
        assert [a.code for a in answers[:2]] == [DLedgerResponseCode.SUCCESS] * 2
        assert all(a.code == DLedgerResponseCode.INCONSISTENT_STATE for a in answers[2:])
        assert server.store.committed_index == 1 and server.store.get(1).body == b"second"
        lines = [r.getMessage() for r in caplog.records if "committed_entry_conflict" in r.getMessage()]
        assert len(lines) == 1, lines
        assert "index=1 committed=1" in lines[0] and "start it empty" in lines[0]
    finally:
        await server.shutdown()


def _prepared(config: DLedgerConfig, entries: list[tuple[bytes, int]], committed: int, term: int) -> None:
    """A member's files as a run left them: `entries` (body, term), `committed` checkpointed."""
    store = DLedgerMmapFileStore(config)
    store.recover()
    for body, entry_term in entries:
        store.append_as_leader(DLedgerEntry(body=body), entry_term)
    store.update_committed_index(entries[-1][1], committed)
    store.flush()
    store.write_checkpoint()
    store.close_without_flush()
    currterm = Path(config.store_base_dir, f"dledger-{config.self_id}", "currterm")
    currterm.write_text(f"currTerm={term}\nvoteLeader=\n")


@contextlib.asynccontextmanager
async def _diverged(tmp_path: Path, refusals: int) -> AsyncIterator[tuple[DLedgerServer, DLedgerServer, Any]]:
    """n1 holds entry 1 of term 1 committed; n0's log has another entry 1, of term 2 (what a
    majority that lost n1's went on to write). n0 leads (its log is the more up to date) and n1 can
    never follow. Yields (leader, follower, the leader's dispatcher to n1) once that dispatcher has
    been refused `refusals` times."""
    n0, _ = _member(tmp_path / "n0", "n0", heart_beat_time_interval_ms=100, min_vote_interval_ms=50,
                    max_vote_interval_ms=150)
    n1 = dataclasses.replace(n0, self_id="n1", store_base_dir=str(tmp_path / "n1"))
    _prepared(n1, [(b"first", 1), (b"second", 1)], committed=1, term=2)
    _prepared(n0, [(b"first", 1), (b"other", 2)], committed=0, term=2)
    leader, follower = DLedgerServer(n0), DLedgerServer(n1)
    await leader.start()
    await follower.start()
    try:
        async with asyncio.timeout(10):
            while not leader.member_state.is_leader():  # noqa: ASYNC110 - polling another member's state
                await asyncio.sleep(0.05)
            dispatcher = leader.pusher.dispatchers["n1"]
            while dispatcher.refusals < refusals:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        yield leader, follower, dispatcher
    finally:
        await follower.shutdown()
        await leader.shutdown()


async def test_a_leader_backs_off_from_a_follower_holding_a_different_committed_entry(tmp_path: Path) -> None:
    """n0 keeps trying n1 (see `_diverged`), but from the second refusal each retry waits twice as
    long — not thousands of COMPARE/TRUNCATE/APPEND rounds a second."""
    async with _diverged(tmp_path, 2) as (_, follower, dispatcher):
        await asyncio.sleep(2.5)
        # Waits of 0.1, 0.2, 0.4, 0.8 s after refusals 2..5: about 6 refusals in 2.5 s.
        assert 3 <= dispatcher.refusals <= 8, dispatcher.refusals
        assert dispatcher.refused_at == 1
        assert follower.store.committed_index == 1 and follower.store.get(1).body == b"second"


async def test_a_leader_that_stepped_down_during_a_refusal_backoff_sends_no_compare(tmp_path: Path) -> None:
    """The backoff before a COMPARE lasts up to seconds; a member that stopped leading meanwhile (or
    leads a newer term) must not send that COMPARE in the term it no longer leads."""
    async with _diverged(tmp_path, 3) as (leader, _, dispatcher):
        ms = leader.member_state
        compare = dispatcher._compare_and_truncate
        in_term: list[bool] = []

        async def recorded() -> None:
            in_term.append(ms.is_leader() and dispatcher.term == ms.curr_term)
            await compare()

        dispatcher._compare_and_truncate = recorded
        await asyncio.sleep(0.05)  # inside the 0.2 s wait after the third refusal
        ms.change_to_candidate(ms.curr_term + 1)
        await asyncio.sleep(1.5)
        assert in_term and all(in_term), in_term
