"""Self-tests of the fault harness's own machinery on real processes and real store files: the
link proxy really drops and heals, the power-loss shim really cuts back to the fsync watermark,
torn tails and bit flips really land in the bytes a store reads."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dledger.codes import DLedgerException
from dledger.config import DLedgerConfig
from dledger.entry import DLedgerEntry
from dledger.store.mmap_store import DLedgerMmapFileStore
from tests.fault import diskfaults
from tests.fault.cluster import REPO, free_ports

pytestmark = pytest.mark.timeout(60)


def store_config(root: Path) -> DLedgerConfig:
    return DLedgerConfig(self_id="n0", peers="n0-127.0.0.1:1", store_base_dir=str(root),
                         mapped_file_size_for_entry_data=64 * 1024,
                         mapped_file_size_for_entry_index=32 * 1024)


def recovered_end(root: Path) -> int:
    store = DLedgerMmapFileStore(store_config(root))
    store.recover()
    try:
        return store.ledger_end_index
    finally:
        store.close_without_flush()


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)


def test_power_loss_cut_keeps_exactly_what_was_fsynced(tmp_path: Path, procs: list) -> None:
    root, record = tmp_path / "store", tmp_path / "fsync.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fault.launch", f"--fsync-record={record}", "--",
         "tests.fault.store_writer", "--dir", str(root), "--flushed", "60", "--unflushed", "25"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    line = proc.stdout.readline()
    assert line.startswith("READY"), proc.stderr.read() if proc.poll() is not None else line
    assert int(line.split()[1]) == 84
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)
    recorded = json.loads(record.read_text())
    assert any("/data/" in p for p in recorded) and any("/index/" in p for p in recorded)

    # A plain SIGKILL loses nothing: the page cache is the kernel's.
    crash_only = tmp_path / "crash-only"
    shutil.copytree(root, crash_only)
    assert recovered_end(crash_only) == 84

    cut = diskfaults.power_loss_cut(root, record, start_extents={})
    assert cut["files_cut"] >= 2 and cut["bytes_zeroed"] > 0
    assert recovered_end(root) == 59  # exactly the fsynced prefix survives the power loss


def test_power_loss_keeps_files_that_predate_the_incarnation(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = DLedgerMmapFileStore(store_config(root))
    store.recover()
    for i in range(10):
        store.append_as_leader(DLedgerEntry(body=b"old-%d" % i), term=1)
    store.flush()
    store.close_without_flush()
    extents = diskfaults.snapshot_extents(root)
    assert extents and all(v > 0 for v in extents.values())
    # This incarnation never fsynced anything (no record file): the old content must survive.
    diskfaults.power_loss_cut(root, tmp_path / "missing.json", extents)
    assert recovered_end(root) == 9


def make_store(root: Path, n: int) -> None:
    store = DLedgerMmapFileStore(store_config(root))
    store.recover()
    for i in range(n):
        store.append_as_leader(DLedgerEntry(body=(b"entry-%d-" % i) * 10), term=1)
    store.flush()
    store.close_without_flush()


def test_torn_tail_is_seen_by_recovery(tmp_path: Path) -> None:
    make_store(tmp_path, 20)
    dl = tmp_path / "dledger-n0"
    res = diskfaults.torn_tail(dl / "data", dl / "index")
    assert res["index"] == 19
    assert recovered_end(tmp_path) == 18


def test_a_torn_tail_tears_only_what_was_not_durable(tmp_path: Path) -> None:
    """A crash cannot tear fsynced bytes: a last entry not durable whole loses its second half past
    the durable extent; one fsynced whole stays, and the write torn is the next entry's."""
    make_store(tmp_path, 20)
    dl = tmp_path / "dledger-n0"
    last = diskfaults.entries(dl / "data", dl / "index")[-1]
    path, local = diskfaults.data_file_for(dl / "data", last.pos)
    before = path.read_bytes()
    durable = local + last.size - 10  # all but the entry's last 10 bytes were fsynced
    res = diskfaults.torn_tail(dl / "data", dl / "index", {str(path): durable})
    assert (res["index"], res["torn"], res["appended"]) == (19, 10, 0)
    assert path.read_bytes()[:durable] == before[:durable]
    assert recovered_end(tmp_path) == 18


def test_a_durable_last_entry_is_kept_and_the_next_write_is_torn(tmp_path: Path) -> None:
    make_store(tmp_path, 20)
    dl = tmp_path / "dledger-n0"
    last = diskfaults.entries(dl / "data", dl / "index")[-1]
    path, local = diskfaults.data_file_for(dl / "data", last.pos)
    before = path.read_bytes()
    res = diskfaults.torn_tail(dl / "data", dl / "index", {str(path): local + last.size})
    assert (res["index"], res["appended"]) == (20, 1) and res["torn"] > 0
    assert path.read_bytes()[: local + last.size] == before[: local + last.size]
    assert [e.index for e in diskfaults.entries(dl / "data", dl / "index")][-2:] == [19, 20]
    assert recovered_end(tmp_path) == 19  # the torn write is cut, everything durable stays


def test_bit_flip_is_caught_by_the_body_crc(tmp_path: Path) -> None:
    make_store(tmp_path, 20)
    dl = tmp_path / "dledger-n0"
    res = diskfaults.bit_flip(dl / "data", dl / "index", random.Random(7), index=5)
    assert res["index"] == 5
    store = DLedgerMmapFileStore(store_config(tmp_path))
    store.recover()
    try:
        assert store.get(4).body == b"entry-4-" * 10
        # Recovery may cut the log at the corrupt entry or keep it and refuse to read it; either
        # way the flipped bytes are never served.
        with pytest.raises(DLedgerException, match=r"CRC|INDEX_OUT_OF_RANGE"):
            store.get(5)
    finally:
        store.close_without_flush()


def test_nonzero_extent_of_sparse_file(tmp_path: Path) -> None:
    p = tmp_path / f"{0:020d}"
    with open(p, "wb") as fh:
        fh.truncate(8 * 1024 * 1024)
        fh.seek(3 * 1024 * 1024 + 5)
        fh.write(b"xy")
    assert diskfaults.nonzero_extent(p) == 3 * 1024 * 1024 + 7
    assert diskfaults.zero_from(p, 3 * 1024 * 1024 + 6) == 8 * 1024 * 1024 - (3 * 1024 * 1024 + 6)
    assert diskfaults.nonzero_extent(p) == 3 * 1024 * 1024 + 6


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _control(port: int, msg: dict) -> dict:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(json.dumps(msg).encode() + b"\n")
    reply = json.loads(await r.readline())
    w.close()
    return reply


async def test_netproxy_passes_blocks_and_heals(procs: list) -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    echo_port = server.sockets[0].getsockname()[1]
    link_port, control = free_ports(2)
    proc = subprocess.Popen(  # noqa: ASYNC220 - a quick spawn; the proxy runs on its own
        [sys.executable, "-m", "tests.fault.netproxy", f"--control-port={control}",
         f"--link=a->b={link_port}:{echo_port}"], cwd=REPO, stdout=subprocess.PIPE)
    procs.append(proc)
    assert (await asyncio.to_thread(proc.stdout.readline)).strip() == b"READY"
    async with server:
        r, w = await asyncio.open_connection("127.0.0.1", link_port)
        w.write(b"hello")
        assert await asyncio.wait_for(r.readexactly(5), 2) == b"hello"

        assert (await _control(control, {"cmd": "set", "link": "a->b", "forward": "block"}))["ok"]
        w.write(b"lost")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.readexactly(4), 0.3)
        stats = (await _control(control, {"cmd": "stats"}))["links"]["a->b"]
        assert stats["dropped"] == 4 and stats["forward"] == "block"

        assert (await _control(control, {"cmd": "heal"}))["ok"]
        # The connection that lost bytes is closed so both ends resync; a new one passes.
        assert await asyncio.wait_for(r.read(10), 2) == b""
        r2, w2 = await asyncio.open_connection("127.0.0.1", link_port)
        w2.write(b"again")
        assert await asyncio.wait_for(r2.readexactly(5), 2) == b"again"
        w2.close()
        bad = await _control(control, {"cmd": "set", "link": "x->y", "forward": "block"})
        assert not bad["ok"] and "unknown link" in bad["error"]
