"""DLedgerCommitLog on a real 3-member group (three stores in one loop, real TCP between them):
the append hook stamps every message's physical offset, on every member, across data-file
roll-over; slaves' consume queues equal the master's once caught up."""

from __future__ import annotations

import asyncio
import io
import os
import struct

import pytest

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError
from broker.message import PHY_POS_POSITION, Message, decode_message
from broker.store.store_recovery import write_dispatch_checkpoint
from tests.integration.test_broker_store import free_port

pytest.importorskip("dledger.rpc.tcp")

ENTRY_HEADER = struct.Struct(">iiqqqiiii")
DATA_FILE_SIZE = 8 * 1024  # tiny DLedger data files: many roll-overs


def member_configs(root) -> list[BrokerConfig]:
    ports = [free_port() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
    return [BrokerConfig(store_path_root_dir=str(root / f"n{i}"), enable_dledger_commit_log=True,
                         dledger_group="broker-a", dledger_peers=peers, dledger_self_id=f"n{i}",
                         mapped_file_size_commit_log=DATA_FILE_SIZE, mapped_file_size_consume_queue=20 * 64,
                         listen_port=20000 + i, default_topic_queue_nums=2)
            for i in range(3)]


@pytest.fixture
async def group(tmp_path):
    from broker.controller import BrokerController

    ctls = [BrokerController(c) for c in member_configs(tmp_path)]
    await bounded("start", [c.start() for c in ctls])
    yield ctls
    await bounded("shutdown", [c.shutdown() for c in ctls])


async def bounded(what: str, aws, timeout_s: float = 60.0) -> None:
    """Await `aws` together; past `timeout_s` fail with every task's stack. One CI run hung here for
    300 s with the loop idle, and pytest-timeout showed only the main thread's `select`."""
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*aws, return_exceptions=what == "shutdown")
    except TimeoutError as exc:
        out = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(file=out)
        stacks = out.getvalue()
        raise AssertionError(f"{what} of the members took over {timeout_s} s; tasks:\n{stacks}") from exc


async def wait_for(pred, timeout_s=15.0, what="condition"):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def walk_data_files(data_dir: str) -> list[tuple[int, int, bytes]]:
    """(entry pos, magic, body) of every entry in the DLedger data files, read from disk."""
    out = []
    for name in sorted(os.listdir(data_dir)):
        start = int(name)
        raw = open(os.path.join(data_dir, name), "rb").read()
        off = 0
        while off + 8 <= len(raw):
            magic, size = struct.unpack_from(">ii", raw, off)
            if magic == -1:  # blank record: rest of the file
                break
            if magic == 0 and size == 0:
                break
            body_len = ENTRY_HEADER.unpack_from(raw, off)[8]
            assert ENTRY_HEADER.unpack_from(raw, off)[4] == start + off  # entry pos field
            out.append((start + off, magic, raw[off + 48:off + 48 + body_len]))
            off += size
    return out


async def test_hook_stamps_physical_offset_on_all_members_across_roll_over(group):
    await wait_for(lambda: any(c.is_master for c in group), what="a master")
    master = next(c for c in group if c.is_master)
    acked = []
    for i in range(60):  # ~300-900 byte messages over 8 KB files, single puts and batches
        n = 1 + i % 4
        msgs = [Message("Hook", (b"m%d-%d-" % (i, j)) * (20 + i % 30), tags="t") for j in range(n)]
        acked += await master.store.put_messages("Hook", msgs, i % 2)
    end = master.store.commit_log.max_offset
    for c in group:
        await wait_for(lambda c=c: c.store.reput_offset >= acked[-1].commit_log_offset, what="catch up")
    for c in group:
        data_dir = c.store.commit_log.dstore.config.data_store_path()
        files = os.listdir(data_dir)
        assert len(files) > 5, f"expected roll-over, got {len(files)} data files"
        stamped = {}
        packed = 0
        for pos, magic, body in walk_data_files(data_dir):
            if magic != 1 or pos + 48 + len(body) > end:
                continue
            off = 0  # a batch is packed into one entry: its messages lie back to back in the body
            while off < len(body):
                size = struct.unpack_from(">i", body, off)[0]
                phys = struct.unpack_from(">q", body, off + PHY_POS_POSITION)[0]
                assert phys == pos + 48 + off, \
                    f"{c.config.dledger_self_id}: stamped {phys}, bytes start at {pos + 48 + off}"
                stamped[phys] = decode_message(body[off:off + size], phys)
                off += size
            packed = max(packed, len([p for p in stamped if pos + 48 <= p < pos + 48 + len(body)]))
        assert packed >= 2, "a batch is packed into entries of up to an eighth of a data file"
        for r in acked:
            m = stamped[r.commit_log_offset]
            assert (m.queue_id, m.queue_offset) == (r.queue_id, r.queue_offset)
    # every member: consume queues hold the same units as the master's
    for q in (0, 1):
        units = master.store.consume_queues[("Hook", q)].get_units(0, 1000)
        assert [u[0] for u in units] == [r.commit_log_offset for r in acked if r.queue_id == q]
        for c in group:
            n = len(units)
            await wait_for(lambda c=c, q=q, n=n: c.store.max_offset("Hook", q) == n, what="slave cq")
            assert c.store.consume_queues[("Hook", q)].get_units(0, 1000) == units


async def test_slaves_refuse_writes_and_share_offsets(group):
    await wait_for(lambda: any(c.is_master for c in group), what="a master")
    master = next(c for c in group if c.is_master)
    slaves = [c for c in group if not c.is_master]
    await master.store.offsets.commit("g", "T", 0, 5)
    await master.store.put_messages("T", [Message("T", b"x")], 0)
    for s in slaves:
        await wait_for(lambda s=s: s.store.offsets.query("g", "T", 0) == 5, what="offset replicated")
        await wait_for(lambda s=s: s.master_addr == master.config.broker_addr, what="master addr known")
        assert s.broker_id == int(s.config.dledger_self_id[1:]) + 1
        with pytest.raises(BrokerError) as ei:
            await s.store.put_messages("T", [Message("T", b"y")], 0)
        assert ei.value.code == BrokerCode.NOT_MASTER
        assert ei.value.extra["masterAddr"] == master.config.broker_addr
        with pytest.raises(BrokerError) as ei:
            await s.store.offsets.commit("g", "T", 0, 6)
        assert ei.value.code == BrokerCode.NOT_MASTER
        await wait_for(lambda s=s: s.store.max_offset("T", 0) == 1, what="slave dispatch")
        assert s.store.get_messages("T", 0, 0, 10).messages[0].body == b"x"
    assert master.broker_id == 0 and master.status()["role"] == "MASTER"


async def test_restart_redispatches_an_entry_its_queue_held_only_in_part(tmp_path):
    """A batch is one DLedger entry; if a stop left only part of its units in the consume queue,
    the restarted member applies that entry again and the queue is whole."""
    from broker.controller import BrokerController

    confs = member_configs(tmp_path)
    ctls = [BrokerController(c) for c in confs]
    await bounded("start", [c.start() for c in ctls])
    try:
        await wait_for(lambda: any(c.is_master for c in ctls), what="a master")
        master = next(c for c in ctls if c.is_master)
        acked = []
        for i in range(6):
            msgs = [Message("Part", b"p%d-%d" % (i, j) * 10) for j in range(5)]
            acked += await master.store.put_messages("Part", msgs, 0)
        for c in ctls:
            await wait_for(lambda c=c: c.store.max_offset("Part", 0) == 30, what="every member dispatched")
        expected = master.store.consume_queues[("Part", 0)].get_units(0, 100)
        assert [u[0] for u in expected] == [r.commit_log_offset for r in acked]
        # Each batch of 5 is one entry: every message maps to its batch's entry, found by search.
        cl = master.store.commit_log
        index_of = [cl.entry_index_at(r.commit_log_offset) for r in acked]
        assert all(index_of[i] == index_of[i - i % 5] for i in range(30))
        assert len(set(index_of)) == 6 and index_of == sorted(index_of)
        for i in index_of:
            pos, size = cl.dstore.get_entry_pos_and_size(i)
            assert pos + 48 <= acked[index_of.index(i)].commit_log_offset < pos + size
    finally:
        await bounded("shutdown", [c.shutdown() for c in ctls])
    for c in confs:  # lose the last 3 units of the last batch (of 5) in every member's queue
        qdir = tmp_path / c.dledger_self_id / "consumequeue" / "Part" / "0"
        cq_file = sorted(qdir.iterdir())[0]
        raw = bytearray(cq_file.read_bytes())
        raw[27 * 20:30 * 20] = bytes(3 * 20)
        cq_file.write_bytes(raw)
        # As after a power loss: the dispatch checkpoint (written only after the queues' fsync)
        # cannot cover units the queue lost; it was taken before the last batch.
        write_dispatch_checkpoint(str(tmp_path / c.dledger_self_id / "dispatchcheckpoint"),
                                  acked[25].commit_log_offset)
    ctls = [BrokerController(c) for c in confs]
    await bounded("start", [c.start() for c in ctls])
    try:
        for c in ctls:
            await wait_for(lambda c=c: c.store.max_offset("Part", 0) == 30, what="entry applied again")
            assert c.store.consume_queues[("Part", 0)].get_units(0, 100) == expected
    finally:
        await bounded("shutdown", [c.shutdown() for c in ctls])


async def test_a_stuck_dispatcher_bounds_the_claimed_keys_and_loses_no_deduplication(group, monkeypatch):
    """The master answers keyed puts before its own dispatch and keeps their keys claimed until the
    dispatcher passes them. With the dispatcher failing (every apply raises), the claims of at most
    `_MAX_PUTS_AWAITING_DISPATCH` puts wait; later puts hand their keys to the table at once. A
    retry of any of them, claimed or tabled, gets the first results and stores nothing; once the
    dispatcher recovers every message is in the consume queue once and no claim is left."""
    from broker.store import put_service

    monkeypatch.setattr(put_service, "_MAX_PUTS_AWAITING_DISPATCH", 3)
    await wait_for(lambda: any(c.is_master for c in group), what="a master")
    master = next(c for c in group if c.is_master)
    store = master.store
    await store.put_messages("Stuck", [Message("Stuck", b"warm")], 0)
    reput = store.reput
    real = reput.dispatch_packed

    def failing(data, base):  # the dispatch of every entry fails, as a broken apply would
        raise RuntimeError("dispatch broken for the test")

    monkeypatch.setattr(reput, "dispatch_packed", failing)

    def batch(i: int) -> list[Message]:
        return [Message("Stuck", f"s{i}-{j}".encode(), idempotency_key=f"stuck-{i}-{j}") for j in range(4)]

    first = [await store.put_messages("Stuck", batch(i), 0, await_dispatch=False) for i in range(6)]
    assert reput.callbacks_waiting == 3
    pending = store.puts._pending.get("Stuck", {})
    assert len(pending) == 3 * 4  # the first three puts' keys: claimed; the other three: in the table
    for i in range(6):
        assert await store.put_messages("Stuck", batch(i), 0, await_dispatch=False) == first[i]

    monkeypatch.setattr(reput, "dispatch_packed", real)
    await wait_for(lambda: store.max_offset("Stuck", 0) == 1 + 6 * 4, what="the dispatcher recovered")
    assert reput.callbacks_waiting == 0 and not store.puts._pending.get("Stuck")
    for i in range(6):  # and the table answers for every key now
        assert await store.put_messages("Stuck", batch(i), 0, await_dispatch=False) == first[i]
    assert store.max_offset("Stuck", 0) == 1 + 6 * 4
