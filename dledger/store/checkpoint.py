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
    tmp = path + ".tmp"
    data = f"endIndex={checkpoint.end_index}\ncommittedIndex={checkpoint.committed_index}\n".encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
