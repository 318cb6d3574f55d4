"""Disk faults done to a stopped member's files: power loss (cut back to the fsync watermark),
torn tail, bit flips. All work on real DLedger files (20-digit names = start offsets).

Power-loss model: a member's files survive a plain SIGKILL whole (the page cache is the kernel's,
not the process's). When the harness simulates power loss after a SIGKILL, each file keeps
max(what it held when this incarnation started, what this incarnation fsynced) and everything
after that is zeroed; files never fsynced by this incarnation and empty at its start are zeroed
whole. The fsynced positions come from the `--fsync-record` side file written by
`tests/fault/launch.py`. Rewrites inside the durable region (a follower's truncate-and-rewrite)
are kept as written: the model cannot bring old bytes back. The `currterm`/`checkpoint` files are
left alone.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from dledger.entry import (
    BODY_OFFSET,
    INDEX_UNIT_SIZE,
    MAGIC_NORMAL,
    DLedgerEntry,
    decode_index_record,
    encode,
    encode_index_record,
)

_SEEK_DATA = getattr(os, "SEEK_DATA", 3)
_SEEK_HOLE = getattr(os, "SEEK_HOLE", 4)


def log_files(root: str | Path) -> list[Path]:
    """Every file under `root` named like a file-list file (20 digits)."""
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and p.name.isdigit() and len(p.name) == 20)


def nonzero_extent(path: str | Path) -> int:
    """1 + position of the last non-zero byte (0 for an all-zero file). Uses SEEK_DATA/SEEK_HOLE
    so a sparse, pre-sized file costs only its written pages."""
    with open(path, "rb") as fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        segments: list[tuple[int, int]] = []
        pos = 0
        try:
            while pos < size:
                start = os.lseek(fd, pos, _SEEK_DATA)
                end = os.lseek(fd, start, _SEEK_HOLE)
                segments.append((start, end))
                pos = end
        except OSError:  # ENXIO: no data after pos
            pass
        for start, end in reversed(segments):
            chunk_end = end
            while chunk_end > start:
                chunk_start = max(start, chunk_end - (1 << 20))
                fh.seek(chunk_start)
                data = fh.read(chunk_end - chunk_start).rstrip(b"\x00")
                if data:
                    return chunk_start + len(data)
                chunk_end = chunk_start
    return 0


def snapshot_extents(root: str | Path) -> dict[str, int]:
    """{path: non-zero extent} of every log file under `root` (taken before a member starts)."""
    return {str(p): nonzero_extent(p) for p in log_files(root)}


def zero_from(path: str | Path, start: int, end: int | None = None) -> int:
    """Zero bytes [start, end or file size) of `path`; returns how many bytes were zeroed."""
    size = os.path.getsize(path)
    end = size if end is None else min(end, size)
    if start >= end:
        return 0
    with open(path, "r+b") as fh:
        pos = start
        while pos < end:
            n = min(1 << 20, end - pos)
            fh.seek(pos)
            fh.write(bytes(n))
            pos += n
        fh.flush()
        os.fsync(fh.fileno())
    return end - start


def durable_extents(record_path: str | Path, start_extents: dict[str, int]) -> dict[str, int]:
    """{path: durable extent} of a stopped member's log files: max(what the file held when this
    incarnation started, what this incarnation fsynced); a file in neither has nothing durable."""
    try:
        flushed: dict[str, int] = json.loads(Path(record_path).read_text())
    except FileNotFoundError:
        flushed = {}
    keys = start_extents.keys() | flushed.keys()
    return {key: max(start_extents.get(key, 0), flushed.get(key, 0)) for key in keys}


def power_loss_cut(root: str | Path, record_path: str | Path,
                   start_extents: dict[str, int]) -> dict[str, int]:
    """Cut every log file under `root` back to its durable extent (see the module docstring).
    Returns counts: files cut and bytes zeroed."""
    durable_of = durable_extents(record_path, start_extents)
    files_cut = zeroed = 0
    for path in log_files(root):
        durable = durable_of.get(str(path), 0)
        extent = nonzero_extent(path)
        if extent > durable:
            zeroed += zero_from(path, durable, extent)
            files_cut += 1
    return {"files_cut": files_cut, "bytes_zeroed": zeroed}


@dataclass(frozen=True)
class EntryLocation:
    """Where entry `index` of a member's log is: data position and size, from the index file."""

    index: int
    pos: int
    size: int
    term: int


def _read_global(directory: Path, pos: int, size: int) -> bytes:
    files = sorted((int(p.name), p) for p in directory.iterdir() if p.name.isdigit())
    for i, (base, path) in enumerate(files):
        nxt = files[i + 1][0] if i + 1 < len(files) else base + path.stat().st_size
        if base <= pos < nxt:
            with open(path, "rb") as fh:
                fh.seek(pos - base)
                return fh.read(size)
    return b""


def entries(data_dir: str | Path, index_dir: str | Path) -> list[EntryLocation]:
    """Every entry the index files describe (stops at the first all-zero/invalid record)."""
    out: list[EntryLocation] = []
    index_dir = Path(index_dir)
    files = sorted((int(p.name), p) for p in index_dir.iterdir() if p.name.isdigit())
    for base, path in files:
        raw = path.read_bytes()
        for off in range(0, len(raw) - INDEX_UNIT_SIZE + 1, INDEX_UNIT_SIZE):
            magic, pos, size, index, term = decode_index_record(raw[off:off + INDEX_UNIT_SIZE])
            if magic <= 0 or size <= 0 or index != (base + off) // INDEX_UNIT_SIZE:
                return out
            out.append(EntryLocation(index, pos, size, term))
    return out


def data_file_for(data_dir: str | Path, pos: int) -> tuple[Path, int]:
    """(data file, local offset) of global position `pos`."""
    data_dir = Path(data_dir)
    files = sorted((int(p.name), p) for p in data_dir.iterdir() if p.name.isdigit())
    for base, path in reversed(files):
        if base <= pos:
            return path, pos - base
    raise ValueError(f"{data_dir}: no data file holds position {pos}")


def torn_tail(data_dir: str | Path, index_dir: str | Path,
              durable: dict[str, int] | None = None) -> dict[str, int]:
    """A write torn by a crash: the second half of the entry being written never reached the disk.

    A crash tears only what was not on disk yet. Without `durable` the last entry is taken to be
    that write and its second half is zeroed. With `durable` ({file path: durable extent},
    `durable_extents`) no byte below a file's durable extent is touched: a last entry that was not
    fsynced whole loses its second half past the extent; one that was fsynced whole (the member
    may have acknowledged it) stays, and the write in flight at the crash is the next entry
    instead, whose header, first half and index record landed (`appended`: 1). Tearing fsynced
    bytes would be corrupting data the member may have acknowledged — the bit-flip nemesis's
    fault, with its own rules. Returns which entry, its size and what was kept and zeroed."""
    data_dir, index_dir = Path(data_dir), Path(index_dir)
    locs = entries(data_dir, index_dir)
    if not locs:
        raise ValueError(f"{index_dir}: no entries to tear")
    last = locs[-1]
    path, local = data_file_for(data_dir, last.pos)
    start = local + max(BODY_OFFSET // 2, last.size // 2)
    if durable is None or durable.get(str(path), 0) < local + last.size:
        if durable is not None:
            start = max(start, durable.get(str(path), 0))
        torn = zero_from(path, start, local + last.size)
        return {"index": last.index, "pos": last.pos, "size": last.size, "kept": start - local,
                "torn": torn, "appended": 0}
    return _torn_next_entry(data_dir, index_dir, last)


def _torn_next_entry(data_dir: Path, index_dir: Path, last: EntryLocation) -> dict[str, int]:
    """Write the first half of an entry after `last` (a copy of its body) and its index record."""
    body = _read_global(data_dir, last.pos + BODY_OFFSET, last.size - BODY_OFFSET)
    entry = DLedgerEntry(body=body, magic=MAGIC_NORMAL, index=last.index + 1, term=last.term,
                         pos=last.pos + last.size)
    raw = encode(entry)
    path, local = data_file_for(data_dir, entry.pos)
    index_path, index_local = data_file_for(index_dir, entry.index * INDEX_UNIT_SIZE)
    if local + len(raw) > path.stat().st_size or index_local + INDEX_UNIT_SIZE > index_path.stat().st_size:
        # The next entry would start a new file: tear nothing rather than invent the roll.
        return {"index": entry.index, "pos": entry.pos, "size": len(raw), "kept": 0, "torn": 0, "appended": 0}
    keep = max(BODY_OFFSET, len(raw) // 2)
    record = encode_index_record(MAGIC_NORMAL, entry.pos, len(raw), entry.index, entry.term)
    for target, off, data in ((path, local, bytes(raw[:keep])), (index_path, index_local, record)):
        with open(target, "r+b") as fh:
            fh.seek(off)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return {"index": entry.index, "pos": entry.pos, "size": len(raw), "kept": keep, "torn": len(raw) - keep,
            "appended": 1}


def bit_flip(data_dir: str | Path, index_dir: str | Path, rng: random.Random,
             index: int | None = None, in_body: bool = True) -> dict[str, int]:
    """Flip one bit of one entry (a random one unless `index` is given): inside the body by default
    (caught by the body CRC), or in the header (caught by magic/size/index checks)."""
    locs = [e for e in entries(data_dir, index_dir) if e.size > BODY_OFFSET]
    if not locs:
        raise ValueError(f"{index_dir}: no entry with a body to corrupt")
    loc = next(e for e in locs if e.index == index) if index is not None else rng.choice(locs)
    offset = rng.randrange(BODY_OFFSET, loc.size) if in_body else rng.randrange(0, BODY_OFFSET)
    bit = rng.randrange(8)
    path, local = data_file_for(Path(data_dir), loc.pos)
    with open(path, "r+b") as fh:
        fh.seek(local + offset)
        byte = fh.read(1)[0]
        fh.seek(local + offset)
        fh.write(bytes([byte ^ (1 << bit)]))
        fh.flush()
        os.fsync(fh.fileno())
    return {"index": loc.index, "pos": loc.pos, "byte": offset, "bit": bit}


def entry_bytes(data_dir: str | Path, loc: EntryLocation) -> bytes:
    """The raw bytes of one entry (for before/after comparisons in tests)."""
    return _read_global(Path(data_dir), loc.pos, loc.size)
