"""The broker store suite, run against both commit logs: the local `CommitLog` and a
(single-member) `DLedgerCommitLog` — the same tests, parametrised, not copied."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from broker.config import BrokerConfig
from broker.errors import BrokerCode, BrokerError
from broker.filter import TagFilter
from broker.message import KeyRun, Message, decode_message_id
from broker.store.message_store import DefaultMessageStore
from tests.ports import free_port

MODES = ["local", "dledger"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_config(mode: str, root: str, port: int | None = None) -> BrokerConfig:
    cfg = BrokerConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=64 * 1024,
                       mapped_file_size_consume_queue=20 * 50, default_topic_queue_nums=4,
                       max_message_size=16 * 1024, listen_port=18080)
    if mode == "dledger":
        pytest.importorskip("dledger.rpc.tcp")  # the DLedger TCP transport
        cfg.enable_dledger_commit_log = True
        cfg.dledger_group = "g"
        cfg.dledger_self_id = "n0"
        cfg.dledger_peers = f"n0-127.0.0.1:{port or free_port()}"
    return cfg


async def open_store(cfg: BrokerConfig) -> DefaultMessageStore:
    """A started store, through a BrokerController (which wires the DLedger role changes);
    close it with `close_store`."""
    from broker.controller import BrokerController
    from broker.role_change import wait_until_master

    ctl = BrokerController(cfg)
    await ctl.start()
    await wait_until_master(ctl.store, timeout_s=10)  # DLedger: the single member elects itself
    _controllers[id(ctl.store)] = ctl
    return ctl.store


async def close_store(store: DefaultMessageStore) -> None:
    await _controllers.pop(id(store)).shutdown()


_controllers: dict[int, object] = {}


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


@pytest.fixture
async def store(mode, tmp_path):
    s = await open_store(make_config(mode, tmp_path))
    yield s
    await close_store(s)


async def test_put_and_get_by_offset(store):
    res = await store.put_messages("T", [Message("T", f"m{i}".encode(), tags="a") for i in range(5)], 2)
    assert [r.queue_offset for r in res] == [0, 1, 2, 3, 4] and {r.queue_id for r in res} == {2}
    assert all(res[i].commit_log_offset < res[i + 1].commit_log_offset for i in range(4))
    got = store.get_messages("T", 2, 1, 3)
    assert [m.body for m in got.messages] == [b"m1", b"m2", b"m3"] and got.next_offset == 4
    assert (got.min_offset, got.max_offset) == (0, 5)
    for r in res:
        host, off = decode_message_id(r.msg_id)
        assert off == r.commit_log_offset and host == store.config.broker_addr
        m = store.look_message_by_offset(off)
        assert m.queue_offset == r.queue_offset and m.commit_log_offset == off and m.msg_id == r.msg_id
    assert store.get_messages("T", 2, 5, 3).messages == []
    assert store.max_offset("T", 0) == 0


async def test_consume_queue_tags_and_time(store):
    t0 = int(time.time() * 1000)
    for i in range(6):
        await store.put_messages("T", [Message("T", b"x%d" % i, tags="even" if i % 2 == 0 else "odd")], 0)
        await asyncio.sleep(0.01)
    got = store.get_messages("T", 0, 0, 10, message_filter=TagFilter("odd"))
    assert [m.body for m in got.messages] == [b"x1", b"x3", b"x5"] and got.next_offset == 6
    mid = store.look_message_by_offset(store.get_messages("T", 0, 3, 1).messages[0].commit_log_offset)
    assert store.offset_for_timestamp("T", 0, mid.store_timestamp) == 3
    assert store.offset_for_timestamp("T", 0, t0 - 1000) == 0
    assert store.offset_for_timestamp("T", 0, int(time.time() * 1000) + 10_000) == 6


async def test_wait_for_message_woken_by_dispatch(store):
    await store.put_messages("T", [Message("T", b"a")], 1)
    waiter = asyncio.create_task(store.wait_for_message("T", 1, 1, 5.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await store.put_messages("T", [Message("T", b"b")], 1)
    assert await asyncio.wait_for(waiter, 2.0) is True
    assert await store.wait_for_message("T", 1, 5, 0.05) is False


async def test_offsets_and_topics_survive_restart(mode, tmp_path):
    cfg = make_config(mode, tmp_path)
    s = await open_store(cfg)
    await s.topics.create_or_update("Orders", 3, 3)
    await s.put_messages("Orders", [Message("Orders", b"o%d" % i) for i in range(4)], 1)
    await s.offsets.commit("g1", "Orders", 1, 3)
    await s.offsets.commit_many("g2", "Orders", {0: 0, 1: 2})
    assert s.offsets.query("g1", "Orders", 1) == 3
    first = await s.put_messages("Orders", [Message("Orders", b"once", idempotency_key="k-1")], 2)
    await close_store(s)
    s = await open_store(cfg)
    try:
        assert s.topics.get("Orders").read_queue_nums == 3
        assert s.offsets.query("g1", "Orders", 1) == 3 and s.offsets.query("g2", "Orders", 1) == 2
        assert s.offsets.query("g1", "Orders", 0) == -1
        assert s.max_offset("Orders", 1) == 4
        again = await s.put_messages("Orders", [Message("Orders", b"twice", idempotency_key="k-1")], 2)
        assert again == first and s.max_offset("Orders", 2) == 1
        nxt = await s.put_messages("Orders", [Message("Orders", b"o4")], 1)
        assert nxt[0].queue_offset == 4
    finally:
        await close_store(s)


async def test_idempotency_key_in_batch_and_concurrent(store):
    a = store.put_messages("T", [Message("T", b"1", idempotency_key="dup")], 0)
    b = store.put_messages("T", [Message("T", b"2", idempotency_key="dup")], 0)
    ra, rb = await asyncio.gather(a, b)
    assert ra == rb and store.max_offset("T", 0) == 1
    batch = await store.put_messages("T", [Message("T", b"x", idempotency_key="n1"),
                                           Message("T", b"y", idempotency_key="n1")], 0)
    assert batch[0] == batch[1] and store.max_offset("T", 0) == 2


async def test_idempotency_keys_stored_in_flight_and_new_in_one_batch_keep_their_places(store):
    """SDK-shaped keys (32 hex digits) mixed with plain messages: a batch whose keys are partly
    stored already, partly being stored by a concurrent put, partly new gets each message's own
    result at its own place, and only the new ones are stored."""
    def key(n: int) -> str:
        return f"{n:032x}"

    def msg(body: str, n: int | None) -> Message:
        return Message("K", body.encode(), idempotency_key=None if n is None else key(n))

    first = await store.put_messages("K", [msg("a", 1), msg("b", 2)], 0)
    a = store.put_messages("K", [msg("c", 3), msg("plain", None), msg("d", 4)], 0)
    b = store.put_messages("K", [msg("d-again", 4), msg("a-again", 1), msg("e", 5), msg("plain2", None),
                                 msg("c-again", 3), msg("e-again", 5)], 0)
    ra, rb = await asyncio.gather(a, b)
    assert [r.queue_offset for r in first] == [0, 1] and len({r.queue_offset for r in ra}) == 3
    assert rb[0] == ra[2] and rb[1] == first[0] and rb[4] == ra[0] and rb[5] == rb[2]
    assert rb[3] not in ra and rb[2] not in ra
    assert store.max_offset("K", 0) == 7  # a, b, c, plain, d, e, plain2
    stored = {m.queue_offset: m.body for m in store.get_messages("K", 0, 0, 10).messages}
    assert [stored[r.queue_offset] for r in ra] == [b"c", b"plain", b"d"]
    assert [stored[r.queue_offset] for r in rb] == [b"d", b"a", b"e", b"plain2", b"c", b"e"]


async def test_a_key_run_is_stored_once_and_answered_by_key_also_after_restart(mode, tmp_path):
    """A put whose keys are a run (what the SDK sends: `firstIdempotencyKey`), put again whole,
    concurrently, overlapping, or key by key (a caller resending an outcome-unknown send's
    messages): each message is stored once and every key answered with its first result — also
    after a restart, when the table is rebuilt from the log, where only the run's first message
    carries a key."""
    cfg = make_config(mode, tmp_path)
    run = KeyRun("0123456789abcdef", 1000)

    def batch(tag: str, n: int = 6) -> list[Message]:
        return [Message("R", f"{tag}{i}".encode()) for i in range(n)]

    # 60 KB: several DLedger entries of 8 KB here, and a commit-log file's end in local mode.
    big_run = KeyRun("fedcba9876543210", 2**63)
    big = [Message("R", b"%04d" % i + b"x" * 1000) for i in range(60)]
    s = await open_store(cfg)
    try:
        first_big = await s.put_messages("R", big, 2, key_run=big_run)
        assert [r.queue_offset for r in first_big] == list(range(60))
        assert await s.put_messages("R", big, 2, key_run=big_run) == first_big
        by_key = [Message("R", b"e", idempotency_key=big_run.key(59))]
        assert await s.put_messages("R", by_key, 2) == first_big[59:]
        a, b = await asyncio.gather(s.put_messages("R", batch("a"), 1, key_run=run),
                                    s.put_messages("R", batch("b"), 1, key_run=run))
        assert a == b and [r.queue_offset for r in a] == list(range(6))
        assert await s.put_messages("R", batch("c"), 1, key_run=run) == a
        over = await s.put_messages("R", batch("d"), 1, key_run=KeyRun(run.prefix, 1004))
        assert over[:2] == a[4:] and [r.queue_offset for r in over[2:]] == [6, 7, 8, 9]
        assert await s.put_messages("R", [Message("R", b"e", idempotency_key=run.key(3))], 1) == [a[3]]
        assert s.max_offset("R", 1) == 10
        stored = [m.body for m in s.get_messages("R", 1, 0, 10).messages]
        assert stored == [b"a%d" % i for i in range(6)] + [b"d%d" % i for i in range(2, 6)]
    finally:
        await close_store(s)
    s = await open_store(cfg)
    try:
        assert await s.put_messages("R", batch("f", 10), 1, key_run=run) == a + over[2:]
        assert s.max_offset("R", 1) == 10
        over_big = await s.put_messages("R", big, 2, key_run=KeyRun(big_run.prefix, big_run.first + 30))
        assert over_big[:30] == first_big[30:]
        assert [r.queue_offset for r in over_big[30:]] == list(range(60, 90))
        assert s.max_offset("R", 2) == 90
    finally:
        await close_store(s)


async def test_bad_input_precise_errors_nothing_stored(store):
    ok = await store.put_messages("T", [Message("T", b"ok")], 0)
    before = store.commit_log.max_offset
    cases = [
        (lambda: store.put_messages("T", [Message("T", b"x" * (16 * 1024 + 1))], 0),
         BrokerCode.MESSAGE_TOO_LARGE),
        (lambda: store.put_messages("bad/topic", [Message("bad/topic", b"x")], 0), BrokerCode.INVALID_TOPIC),
        (lambda: store.put_messages("RMQ_SYS_CONSUMER_OFFSETS", [Message("RMQ_SYS_CONSUMER_OFFSETS", b"{}")]),
         BrokerCode.INVALID_TOPIC),
        (lambda: store.put_messages("T", [Message("T", b"x")], 99), BrokerCode.QUEUE_NOT_EXIST),
        (lambda: store.put_messages("T", [Message("T", b"ok"), Message("T", b"x" * 20000)], 0),
         BrokerCode.MESSAGE_TOO_LARGE),
        (lambda: store.put_messages("T", [], 0), BrokerCode.INVALID_REQUEST),
    ]
    for call, code in cases:
        with pytest.raises(BrokerError) as ei:
            await call()
        assert ei.value.code == code, ei.value
    assert store.commit_log.max_offset == before and store.max_offset("T", 0) == 1
    for call, code in [(lambda: store.get_messages("T", 0, 5, 1), BrokerCode.OFFSET_OUT_OF_RANGE),
                       (lambda: store.get_messages("T", 9, 0, 1), BrokerCode.QUEUE_NOT_EXIST),
                       (lambda: store.get_messages("Nope", 0, 0, 1), BrokerCode.TOPIC_NOT_EXIST),
                       (lambda: store.look_message_by_offset(10**12), BrokerCode.MESSAGE_NOT_FOUND),
                       (lambda: store.look_message_by_offset(ok[0].commit_log_offset + 7),
                        BrokerCode.MESSAGE_NOT_FOUND)]:
        with pytest.raises(BrokerError) as ei:
            call()
        assert ei.value.code == code
    with pytest.raises(BrokerError) as ei:
        store.get_messages("T", 0, 5, 1)
    assert ei.value.extra == {"minOffset": 0, "maxOffset": 1}


def _data_file_of(store: DefaultMessageStore, phys: int) -> tuple[str, int]:
    files = store.commit_log.files if not store.dledger else store.commit_log.dstore.data_file_list
    mf = files.find_file(phys)
    return mf.path, phys - mf.file_from_offset


def _flip_byte(path: str, at: int) -> None:
    """Flip one byte behind the store's back (the file and the store's mmap share the page cache)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


async def test_corrupted_stored_bytes_detected_others_intact(store):
    res = await store.put_messages("T", [Message("T", b"body-%d" % i) for i in range(3)], 0)
    _flip_byte(*_data_file_of(store, res[1].commit_log_offset + 88 + 2))
    got = store.get_messages("T", 0, 0, 3)
    assert [m.body for m in got.messages] == [b"body-0"] and got.next_offset == 1
    with pytest.raises(BrokerError) as ei:
        store.get_messages("T", 0, 1, 3)
    assert ei.value.code == BrokerCode.MESSAGE_CORRUPTED and str(res[1].commit_log_offset) in ei.value.detail
    assert store.get_messages("T", 0, 2, 3).messages[0].body == b"body-2"
    with pytest.raises(BrokerError):
        store.look_message_by_offset(res[1].commit_log_offset)
    assert (await store.put_messages("T", [Message("T", b"after")], 0))[0].queue_offset == 3


async def test_roll_over_files(store):
    big = b"z" * 5000
    res = []
    for i in range(30):  # 30 x ~5 KB over 64 KB files: several roll-overs
        res += await store.put_messages("T", [Message("T", big + b"%d" % i)], 3)
    assert [r.queue_offset for r in res] == list(range(30))
    got = store.get_messages("T", 3, 0, 30, max_bytes=10**9)
    assert [m.body[-2:].lstrip(b"z") for m in got.messages] == [b"%d" % i for i in range(30)]
    assert [m.commit_log_offset for m in got.messages] == [r.commit_log_offset for r in res]


CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from tests.integration.test_broker_store import make_config, open_store
    from broker.message import Message

    async def main():
        store = await open_store(make_config({mode!r}, {root_dir!r}, {port!r}))
        await store.offsets.commit("g", "K", 0, 7)
        print("ready", flush=True)
        i = 0
        while True:
            r = await store.put_messages("K", [Message("K", b"k%d" % i)], i % 2)
            print("acked", i, r[0].queue_id, r[0].queue_offset, flush=True)
            i += 1

    asyncio.run(main())
""")


def _produce_in_child_then_sigkill(code: str, count: int) -> list[tuple[int, int, int]]:
    """Run a producing store in a child process, SIGKILL it after `count` acks; the acks."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    acked: list[tuple[int, int, int]] = []
    try:
        deadline = time.time() + 30
        while time.time() < deadline and len(acked) < count:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("acked"):
                _, i, q, o = line.split()
                acked.append((int(i), int(q), int(o)))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert len(acked) >= count, "child did not produce"
    return acked


async def test_recovery_after_sigkill(mode, tmp_path):
    port = free_port()
    cfg = make_config(mode, tmp_path, port)
    acked = _produce_in_child_then_sigkill(CHILD.format(root=ROOT, mode=mode, root_dir=str(tmp_path),
                                                         port=port), 150)
    s = await open_store(cfg)
    try:
        for q in (0, 1):
            mine = [(i, o) for i, qq, o in acked if qq == q]
            got = s.get_messages("K", q, 0, 1024, max_bytes=10**9)
            bodies = [m.body for m in got.messages]
            assert [m.queue_offset for m in got.messages] == list(range(len(bodies)))
            assert bodies[:len(mine)] == [b"k%d" % i for i, _ in mine]  # every acked message, in order
        assert s.offsets.query("g", "K", 0) == 7
        r = await s.put_messages("K", [Message("K", b"after")], 0)
        assert r[0].queue_offset == s.max_offset("K", 0) - 1
    finally:
        await close_store(s)


async def test_local_retention_deletes_expired_files_and_moves_min_offset(tmp_path):
    cfg = make_config("local", tmp_path)
    cfg.file_reserved_time = 0  # every full file is expired at once
    cfg.delete_when = str(time.localtime().tm_hour)
    s = await open_store(cfg)
    try:
        for i in range(40):
            await s.put_messages("T", [Message("T", b"r" * 4000 + b"%d" % i)], 0)
        await s.clean_expired()
        assert s.commit_log.min_offset > 0
        lo = s.min_offset("T", 0)
        assert 0 < lo < 40 and s.max_offset("T", 0) == 40
        got = s.get_messages("T", 0, lo, 1)
        assert got.messages[0].body.endswith(b"%d" % lo)
        with pytest.raises(BrokerError) as ei:
            s.get_messages("T", 0, 0, 1)
        assert ei.value.code == BrokerCode.OFFSET_OUT_OF_RANGE and ei.value.extra["minOffset"] == lo
    finally:
        await close_store(s)


def _zero_from(path: str, at: int) -> None:
    """Lose every byte of a file from `at` (a crash that never wrote the tail)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes(size - at))


async def test_local_lost_tail_cuts_consume_queues_on_recovery(tmp_path):
    cfg = make_config("local", tmp_path)
    s = await open_store(cfg)
    res = await s.put_messages("T", [Message("T", b"t%d" % i) for i in range(10)], 0)
    await close_store(s)
    _zero_from(*_data_file_of_local(tmp_path, res[8].commit_log_offset))
    s = await open_store(cfg)
    try:
        assert s.commit_log.max_offset == res[8].commit_log_offset
        assert s.max_offset("T", 0) == 8  # units of the lost messages are gone
        assert [m.body for m in s.get_messages("T", 0, 0, 20).messages] == [b"t%d" % i for i in range(8)]
        again = await s.put_messages("T", [Message("T", b"new")], 0)
        assert again[0].queue_offset == 8 and again[0].commit_log_offset == res[8].commit_log_offset
    finally:
        await close_store(s)


def _data_file_of_local(root, phys: int) -> tuple[str, int]:
    size = 64 * 1024
    return os.path.join(str(root), "commitlog", f"{phys - phys % size:020d}"), phys % size


async def test_a_deleted_topics_offsets_stay_deleted_after_restart(mode, tmp_path):
    # Offsets and topic configs live in two system topics; replay must apply them in log order.
    cfg = make_config(mode, tmp_path)
    s = await open_store(cfg)
    await s.topics.create_or_update("Re", 2, 2)
    await s.put_messages("Re", [Message("Re", b"old%d" % i) for i in range(8)], 0)
    await s.offsets.commit_many("old", "Re", {0: 8})
    await s.offsets.commit_many("both", "Re", {0: 6})
    await s.topics.delete("Re")
    assert s.offsets.query("old", "Re", 0) == -1
    await s.topics.create_or_update("Re", 2, 2)
    await s.put_messages("Re", [Message("Re", b"new%d" % i) for i in range(3)], 0)
    await s.offsets.commit_many("both", "Re", {0: 1})
    await close_store(s)
    s = await open_store(cfg)
    try:
        # The first topic's commits are gone, the re-created topic's are kept.
        assert s.offsets.query("old", "Re", 0) == -1
        assert s.offsets.query("both", "Re", 0) == 1
        # The restart re-dispatches from the queue furthest behind, which is before the delete:
        # the first incarnation's messages must not come back into the new queues.
        assert s.max_offset("Re", 0) == 3
        got = s.get_messages("Re", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"new0", b"new1", b"new2"]
        await s.topics.delete("Re")
        await s.topics.create_or_update("Re", 2, 2)  # re-created, nothing stored yet
    finally:
        await close_store(s)
    s = await open_store(cfg)
    try:
        assert (s.max_offset("Re", 0), s.max_offset("Re", 1)) == (0, 0)
    finally:
        await close_store(s)


async def test_restart_resumes_dispatch_at_the_checkpoint_not_at_an_idle_queue(mode, tmp_path, caplog):
    cfg = make_config(mode, tmp_path)
    s = await open_store(cfg)
    await s.put_messages("Idle", [Message("Idle", b"once")], 0)  # this queue's end stays here
    for _ in range(20):
        await s.put_messages("Busy", [Message("Busy", b"x" * 500) for _ in range(50)], 0)
    await close_store(s)
    end = s.reput_offset  # at the stop (a state snapshot may have been written after the puts)
    with caplog.at_level("INFO", logger="broker.store.message_store"):
        s = await open_store(cfg)
    try:
        resume = next(r.getMessage() for r in caplog.records if "event=dispatch_resume" in r.getMessage())
        # A clean shutdown checkpoints the end: nothing is dispatched twice (it used to restart at
        # the idle queue's end and re-read every message after it).
        assert f"from={end} " in resume and f"checkpoint={end} " in resume
        assert s.max_offset("Busy", 0) == 1000 and s.max_offset("Idle", 0) == 1
    finally:
        await close_store(s)


def test_dispatch_checkpoint_torn_or_corrupt_is_ignored(tmp_path):
    from broker.store.store_recovery import read_dispatch_checkpoint, write_dispatch_checkpoint

    path = str(tmp_path / "dispatchcheckpoint")
    assert read_dispatch_checkpoint(path) is None
    write_dispatch_checkpoint(path, 123_456)
    assert read_dispatch_checkpoint(path) == 123_456
    raw = bytearray(open(path, "rb").read())
    open(path, "wb").write(raw[:5])  # torn
    assert read_dispatch_checkpoint(path) is None
    raw[3] ^= 0x10  # a flipped bit: the checksum no longer matches
    open(path, "wb").write(raw)
    assert read_dispatch_checkpoint(path) is None


async def test_offset_replay_starts_at_last_snapshot(mode, tmp_path, caplog):
    cfg = make_config(mode, tmp_path)
    s = await open_store(cfg)
    s.offsets.snapshot_every_records = 10
    for i in range(25):
        await s.offsets.commit("g", "T", i % 3, i)
    await close_store(s)
    with caplog.at_level("INFO", logger="broker.store.message_store"):
        s = await open_store(cfg)
    try:
        assert [s.offsets.query("g", "T", q) for q in range(3)] == [24, 22, 23]
        replayed = [r.getMessage() for r in caplog.records if "RMQ_SYS_CONSUMER_OFFSETS" in r.getMessage()
                    and "system_records_replayed" in r.getMessage()]
        assert replayed and int(replayed[0].rsplit("=", 1)[1]) < 10
    finally:
        await close_store(s)


async def test_concurrent_first_puts_create_topic_once(store):
    res = await asyncio.gather(*(store.put_messages("NewTopic", [Message("NewTopic", b"%d" % i)], 0)
                                 for i in range(10)))
    assert sorted(r[0].queue_offset for r in res) == list(range(10))
    assert store.max_offset("RMQ_SYS_TOPIC_CONFIG", 0) == 1


async def test_state_snapshot_is_where_replay_starts_and_a_torn_one_is_skipped(mode, tmp_path, caplog):
    from broker.topics import SYS_STATE_SNAPSHOT

    cfg = make_config(mode, tmp_path)
    s = await open_store(cfg)
    await s.topics.create_or_update("Snap", 3, 2, 4)
    await s.offsets.commit("g", "Snap", 0, 3)
    await s.snapshots.write()
    first = s.system.snapshot_first
    assert first >= 0 and s.keep_from() == first
    await s.offsets.commit("g", "Snap", 1, 4)
    # A master that died mid-snapshot leaves its first parts: a later start must not use them.
    torn = s.system.snapshot_messages(b'{"version": 1, "states": {}}', "torn", part_bytes=10)
    assert len(torn) == 3
    await s.put_messages(SYS_STATE_SNAPSHOT, torn[:2], 0, _system=True)
    await close_store(s)
    with caplog.at_level("INFO", logger="broker.store.message_store"):
        s = await open_store(cfg)
    try:
        applied = [r.getMessage() for r in caplog.records if "event=state_snapshot_applied" in r.getMessage()]
        assert len(applied) == 1 and f"first={first} " in applied[0]
        replayed = [r.getMessage() for r in caplog.records if "system_records_replayed" in r.getMessage()
                    and "RMQ_SYS_CONSUMER_OFFSETS" in r.getMessage()]
        assert replayed == ["event=system_records_replayed topic=RMQ_SYS_CONSUMER_OFFSETS records=1"]
        cfg_snap = s.topics.get("Snap")
        assert (cfg_snap.read_queue_nums, cfg_snap.write_queue_nums, cfg_snap.perm) == (3, 2, 4)
        assert [s.offsets.query("g", "Snap", q) for q in range(3)] == [3, 4, -1]
    finally:
        await close_store(s)
