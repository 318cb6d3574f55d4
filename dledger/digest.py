"""`DigestStateMachine`: the state machine of a bare member (`python -m dledger --state-machine
digest`): it folds every committed normal entry's body into a running SHA-256 and counts them, so
two members that applied the same log hold the same (count, digest) whatever they received it as
— entries, or a snapshot and entries (InstallSnapshot). Its state is in memory: at start the log
(or the newest snapshot, then the log) rebuilds it. The member's metadata shows it
(`"stateMachine"`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.entry import MAGIC_NORMAL, DLedgerEntry
from dledger.snapshot import SnapshotReader, SnapshotWriter
from dledger.statemachine import StateMachine

_SNAPSHOT_FILE = "digest.json"


class DigestStateMachine(StateMachine):
    """(count, SHA-256 chain) of the applied normal entries' bodies."""

    def __init__(self) -> None:
        self.applied = -1
        self.count = 0
        self.digest = bytes(32)

    async def on_apply(self, entries: list[DLedgerEntry]) -> None:
        digest, count = self.digest, self.count
        for e in entries:
            if e.magic == MAGIC_NORMAL:
                digest = hashlib.sha256(digest + e.body).digest()
                count += 1
        self.digest, self.count, self.applied = digest, count, entries[-1].index

    def last_applied_index(self) -> int:
        return self.applied

    async def on_snapshot_save(self, writer: SnapshotWriter) -> None:
        state = {"count": self.count, "digest": self.digest.hex()}
        writer.write_file(_SNAPSHOT_FILE, json.dumps(state).encode())

    async def on_snapshot_load(self, reader: SnapshotReader) -> None:
        try:
            doc = json.loads(reader.read_file(_SNAPSHOT_FILE))
            digest, count = bytes.fromhex(doc["digest"]), int(doc["count"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DLedgerException(DLedgerResponseCode.LOAD_SNAPSHOT_ERROR,
                                   f"{reader.where}/{_SNAPSHOT_FILE}: {exc}") from None
        self.digest, self.count, self.applied = digest, count, reader.index

    def status(self) -> dict[str, Any]:
        return {"kind": "digest", "appliedIndex": self.applied, "count": self.count,
                "digest": self.digest.hex()}
