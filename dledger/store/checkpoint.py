"""The `checkpoint` file beside the data and index dirs: DLedger's `endIndex` / `committedIndex`.

Properties format, one `key=value` per line (what RocketMQ's DLedger 0.3.x writes). Written to a
temporary file, fsynced and renamed, so a crash leaves either the old or the new checkpoint.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from dledger.codes import DLedgerException, DLedgerResponseCode

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the last checkpoint said; -1 means nothing recorded."""

    end_index: int = -1
    committed_index: int = -1


def read_checkpoint(path: str) -> Checkpoint:
    """Read a checkpoint file; a missing file is an empty checkpoint. A malformed one raises
    DISK_ERROR naming the file and line (we must not guess the committed index)."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except FileNotFoundError:
        return Checkpoint()
    values: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        try:
            if not sep:
                raise ValueError("missing '='")
            values[key.strip()] = int(value.strip())
        except ValueError as e:
            raise DLedgerException(DLedgerResponseCode.DISK_ERROR,
                                   f"{path}:{lineno}: bad checkpoint line {raw!r}: {e}") from None
    return Checkpoint(values.get("endIndex", -1), values.get("committedIndex", -1))


def write_checkpoint(path: str, checkpoint: Checkpoint) -> None:
    """Atomically replace the checkpoint file (blocking: run it in a worker thread on the loop)."""
    data = f"endIndex={checkpoint.end_index}\ncommittedIndex={checkpoint.committed_index}\n".encode()
    _write_atomically(path, data)


# ---- catch-up watermark ------------------------------------------------------------------------
# A member whose recovery had to cut entries at or below its checkpointed committed index keeps,
# until it has re-fetched past it, the index it must reach before it may vote or campaign again
# (see `mmap_recovery`). It lives in its own small file so the DLedger checkpoint format stays
# RocketMQ's; written atomically like the checkpoint, so a crash during catch-up keeps it.

CATCHUP_FILE = "catchup"


def read_catchup_watermark(path: str) -> int:
    """The persisted catch-up watermark, -1 when there is none. A malformed file raises
    DISK_ERROR (guessing could let a member that lost committed entries vote)."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except FileNotFoundError:
        return -1
    for lineno, raw in enumerate(text.splitlines(), 1):
        key, sep, value = raw.strip().partition("=")
        if sep and key.strip() == "catchUpIndex":
            try:
                return int(value.strip())
            except ValueError:
                raise DLedgerException(DLedgerResponseCode.DISK_ERROR,
                                       f"{path}:{lineno}: bad catch-up line {raw!r}") from None
    raise DLedgerException(DLedgerResponseCode.DISK_ERROR, f"{path}: no catchUpIndex line in {text!r}")


def write_catchup_watermark(path: str, index: int) -> None:
    """Persist the catch-up watermark atomically, or remove the file when `index` < 0 (blocking;
    once per recovery and once on catching up, so the loop may call it)."""
    if index >= 0:
        _write_atomically(path, f"catchUpIndex={index}\n".encode())
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    _fsync_dir(path)


def _write_atomically(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename / unlink itself durable
    finally:
        os.close(dir_fd)
