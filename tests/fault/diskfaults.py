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

from dledger.entry import BODY_OFFSET, INDEX_UNIT_SIZE, decode_index_record

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


def power_loss_cut(root: str | Path, record_path: str | Path,
                   start_extents: dict[str, int]) -> dict[str, int]:
    """Cut every log file under `root` back to its durable extent (see the module docstring).
    Returns counts: files cut and bytes zeroed."""
    try:
        flushed: dict[str, int] = json.loads(Path(record_path).read_text())
    except FileNotFoundError:
        flushed = {}
    files_cut = zeroed = 0
    for path in log_files(root):
        key = str(path)
        durable = max(start_extents.get(key, 0), flushed.get(key, 0))
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


def torn_tail(data_dir: str | Path, index_dir: str | Path) -> dict[str, int]:
    """Zero the second half of the last entry's bytes (a write torn by a crash). Returns which."""
    locs = entries(data_dir, index_dir)
    if not locs:
        raise ValueError(f"{index_dir}: no entries to tear")
    last = locs[-1]
    path, local = data_file_for(Path(data_dir), last.pos)
    keep = max(BODY_OFFSET // 2, last.size // 2)
    zero_from(path, local + keep, local + last.size)
    return {"index": last.index, "pos": last.pos, "size": last.size, "kept": keep}


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
