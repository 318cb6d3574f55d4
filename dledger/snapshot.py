"""State-machine snapshots (DLedger 0.3's `snapshot` package): what a state machine writes at an
applied index, kept on disk beside the log, and sent whole to a member that needs entries the
leader's log no longer has (InstallSnapshot, see `dispatcher` and `entry_handler`).

Layout, DLedger's: `{storeBaseDir}/dledger-{selfId}/snapshot/snapshot_{index}/` holding the
machine's files and `snapshot_meta` (JSON: `lastIncludedIndex`, `lastIncludedTerm`, ours
`lastIncludedEndPos` — the data position right after that entry, where the next one starts on
every member — and each file's size and CRC-32, checked when it is read back). A snapshot is
written into `snapshot/tmp`, fsynced, then renamed into place, so a crash leaves either the whole
snapshot or none; the newest `max_snapshot_reserved_num` are kept. `MemorySnapshotStore` keeps them
in a dict for the simulator (which hands the same object to a member's next incarnation, like its
log store).

Who calls what: `StateMachineCaller` saves one every `snapshot_threshold` applied entries and
loads the newest at start when it is ahead of the machine; the leader's dispatcher reads the newest
to send it; the follower's entry handler receives it chunk by chunk into a `SnapshotWriter`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from zlib_ng.zlib_ng import crc32

from dledger.codes import DLedgerException, DLedgerResponseCode

log = logging.getLogger("dledger.snapshot")

SNAPSHOT_DIR = "snapshot"
SNAPSHOT_DIR_PREFIX = "snapshot_"
SNAPSHOT_META_FILE = "snapshot_meta"
_TMP_DIR = "tmp"


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Which applied entry a snapshot stands for (index, term, the data position right after it)
    and its files (name -> (size, CRC-32))."""

    index: int
    term: int
    end_pos: int
    files: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({"lastIncludedIndex": self.index, "lastIncludedTerm": self.term,
                           "lastIncludedEndPos": self.end_pos,
                           "files": {n: {"size": s, "crc32": c} for n, (s, c) in self.files.items()}},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SnapshotMeta:
        try:
            doc = json.loads(data)
            files = {str(n): (int(f["size"]), int(f["crc32"])) for n, f in doc["files"].items()}
            return cls(int(doc["lastIncludedIndex"]), int(doc["lastIncludedTerm"]),
                       int(doc["lastIncludedEndPos"]), files)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DLedgerException(DLedgerResponseCode.LOAD_SNAPSHOT_ERROR,
                                   f"bad snapshot meta: {exc}") from None


def _check_name(name: str) -> None:
    if not name or name == SNAPSHOT_META_FILE or "/" in name or "\\" in name or name in (".", ".."):
        raise DLedgerException(DLedgerResponseCode.UNEXPECTED_ARGUMENT, f"bad snapshot file name {name!r}")


class SnapshotWriter:
    """Where a state machine writes one snapshot (`StateMachine.on_snapshot_save`): the state as of
    `index` / `term`, as one or more named files."""

    def __init__(self, index: int, term: int, end_pos: int) -> None:
        self.index = index
        self.term = term
        self.end_pos = end_pos  # where the entry after `index` starts in the data files
        self._files: dict[str, bytearray] = {}

    def write_file(self, name: str, data: bytes) -> None:
        """Add (or replace) one file of the snapshot."""
        _check_name(name)
        self._files[name] = bytearray(data)

    def append(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """Add `data` at `offset` of `name` (an install receiving the leader's chunks in order)."""
        _check_name(name)
        buf = self._files.setdefault(name, bytearray())
        if offset != len(buf):
            raise DLedgerException(DLedgerResponseCode.INSTALL_SNAPSHOT_ERROR,
                                   f"snapshot chunk of {name!r} at {offset}, expected {len(buf)}")
        buf += data

    def meta(self) -> SnapshotMeta:
        files = {n: (len(b), crc32(b)) for n, b in sorted(self._files.items())}
        return SnapshotMeta(self.index, self.term, self.end_pos, files)

    def contents(self) -> dict[str, bytes]:
        return {n: bytes(b) for n, b in self._files.items()}


class SnapshotReader:
    """One stored snapshot (`StateMachine.on_snapshot_load`, and what a leader sends)."""

    def __init__(self, meta: SnapshotMeta, contents: dict[str, bytes], where: str) -> None:
        self.meta = meta
        self.index = meta.index
        self.term = meta.term
        self.end_pos = meta.end_pos
        self.where = where
        self._contents = contents

    def files(self) -> list[str]:
        return sorted(self.meta.files)

    def read_file(self, name: str) -> bytes:
        """The file's bytes, checked against the size and CRC the snapshot recorded."""
        if name not in self.meta.files:
            raise DLedgerException(DLedgerResponseCode.LOAD_SNAPSHOT_ERROR,
                                   f"{self.where} has no file {name!r}")
        data = self._contents[name]
        size, crc = self.meta.files[name]
        if len(data) != size or crc32(data) != crc:
            raise DLedgerException(DLedgerResponseCode.LOAD_SNAPSHOT_ERROR,
                                   f"{self.where}/{name}: {len(data)} bytes, CRC {crc32(data)}; "
                                   f"the snapshot recorded {size} bytes, CRC {crc}")
        return data


class SnapshotStore(ABC):
    """Where a member keeps its snapshots."""

    def __init__(self, reserved: int) -> None:
        self.reserved = max(1, reserved)

    @abstractmethod
    def save(self, writer: SnapshotWriter, meta: SnapshotMeta | None = None) -> SnapshotReader:
        """Store the writer's files durably as the snapshot of `writer.index` (checked against `meta`
        when the files came from elsewhere); drop the oldest beyond the reserved count."""

    @abstractmethod
    def latest(self) -> SnapshotReader | None:
        """The newest stored snapshot that reads back whole (None: none)."""

    def latest_index(self) -> int:
        """Index of the newest stored snapshot (-1: none)."""
        latest = self.latest()
        return latest.index if latest is not None else -1

    async def save_async(self, writer: SnapshotWriter, meta: SnapshotMeta | None = None) -> SnapshotReader:
        """`save` from the event loop (the file store runs it in a worker thread)."""
        return self.save(writer, meta)

    async def latest_async(self) -> SnapshotReader | None:
        """`latest` from the event loop (the file store reads in a worker thread)."""
        return self.latest()


def _verified(writer: SnapshotWriter, meta: SnapshotMeta | None) -> SnapshotMeta:
    got = writer.meta()
    if meta is not None and meta != got:
        raise DLedgerException(DLedgerResponseCode.INSTALL_SNAPSHOT_ERROR,
                               f"received snapshot {got.index} does not match its meta: {got.files} != "
                               f"{meta.files}")
    return got


class MemorySnapshotStore(SnapshotStore):
    """Snapshots in a dict (the simulator: the object plays the disk across a member's crash)."""

    def __init__(self, reserved: int = 3) -> None:
        super().__init__(reserved)
        self.snapshots: dict[int, tuple[SnapshotMeta, dict[str, bytes]]] = {}

    def save(self, writer: SnapshotWriter, meta: SnapshotMeta | None = None) -> SnapshotReader:
        got = _verified(writer, meta)
        self.snapshots[got.index] = (got, writer.contents())
        for old in sorted(self.snapshots)[:-self.reserved]:
            del self.snapshots[old]
        return self._reader(got.index)

    def latest(self) -> SnapshotReader | None:
        return self._reader(max(self.snapshots)) if self.snapshots else None

    def _reader(self, index: int) -> SnapshotReader:
        meta, contents = self.snapshots[index]
        return SnapshotReader(meta, contents, f"memory snapshot {index}")


class FileSnapshotStore(SnapshotStore):
    """DLedger's `FileSnapshotStore`: `snapshot_{index}` directories under `base_dir`."""

    def __init__(self, base_dir: str, reserved: int = 3) -> None:
        super().__init__(reserved)
        self.base_dir = base_dir

    async def save_async(self, writer: SnapshotWriter, meta: SnapshotMeta | None = None) -> SnapshotReader:
        return await asyncio.to_thread(self.save, writer, meta)

    async def latest_async(self) -> SnapshotReader | None:
        return await asyncio.to_thread(self.latest)

    def _indexes(self) -> list[int]:
        try:
            names = os.listdir(self.base_dir)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            if n.startswith(SNAPSHOT_DIR_PREFIX) and n[len(SNAPSHOT_DIR_PREFIX):].isdigit():
                out.append(int(n[len(SNAPSHOT_DIR_PREFIX):]))
        return sorted(out)

    def _path(self, index: int) -> str:
        return os.path.join(self.base_dir, f"{SNAPSHOT_DIR_PREFIX}{index}")

    def save(self, writer: SnapshotWriter, meta: SnapshotMeta | None = None) -> SnapshotReader:
        """Blocking (fsyncs): callers on the loop run it in a worker thread."""
        got = _verified(writer, meta)
        tmp = os.path.join(self.base_dir, _TMP_DIR)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        contents = writer.contents()
        for name, data in [*contents.items(), (SNAPSHOT_META_FILE, got.to_json())]:
            _write_synced(os.path.join(tmp, name), data)
        _fsync_dir(tmp)
        final = self._path(got.index)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(self.base_dir)
        for old in self._indexes()[:-self.reserved]:
            shutil.rmtree(self._path(old), ignore_errors=True)
        log.info("event=snapshot_saved dir=%s index=%d term=%d files=%d bytes=%d", final, got.index, got.term,
                 len(contents), sum(len(d) for d in contents.values()))
        return SnapshotReader(got, contents, final)

    def latest(self) -> SnapshotReader | None:
        for index in reversed(self._indexes()):
            path = self._path(index)
            try:
                with open(os.path.join(path, SNAPSHOT_META_FILE), "rb") as f:
                    meta = SnapshotMeta.from_json(f.read())
                contents = {}
                for name in meta.files:
                    _check_name(name)
                    with open(os.path.join(path, name), "rb") as f:
                        contents[name] = f.read()
                reader = SnapshotReader(meta, contents, path)
                for name in meta.files:
                    reader.read_file(name)  # size and CRC
                return reader
            except (OSError, DLedgerException) as exc:
                log.error("event=snapshot_unreadable dir=%s error=%s: trying an older one", path, exc)
        return None


def _write_synced(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
