"""Child process for test_store_crash: open the store, then append and commit in a loop until
SIGKILLed. Prints `ready <endIndex>` once recovered. Bodies are derived from their index (see
`expected_body`) and stamped by an append hook, so the parent can check every recovered entry.

Usage: python store_crash_child.py <store_base_dir> <seed>
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import sys

import uvloop

from dledger.config import DLedgerConfig
from dledger.entry import BODY_OFFSET, DLedgerEntry
from dledger.store.mmap_store import DLedgerMmapFileStore

STAMP_AT = 28  # like the broker's PHY_POS_POSITION


def crash_config(base: str) -> DLedgerConfig:
    """Small files so runs roll over often; flush and checkpoint often."""
    return DLedgerConfig(store_base_dir=base, mapped_file_size_for_entry_data=64 * 1024,
                         mapped_file_size_for_entry_index=32 * 1024, flush_file_interval_ms=5,
                         check_point_interval_ms=10)


def expected_body(index: int, length: int) -> bytes:
    """The body written for `index` (before the stamp)."""
    return (f"{index}:".encode() * (length // 2 + 1))[:length]


def stamp(entry: DLedgerEntry, view: memoryview, body_offset: int) -> None:
    if len(view) >= body_offset + STAMP_AT + 8:
        struct.pack_into(">q", view, body_offset + STAMP_AT, entry.pos + BODY_OFFSET)


async def main(base: str, seed: int) -> None:
    store = DLedgerMmapFileStore(crash_config(base))
    store.add_append_hook(stamp)
    await store.start()
    term = max(store.ledger_end_term, 0) + 1
    sys.stdout.write(f"ready {store.ledger_end_index}\n")
    sys.stdout.flush()
    rng = random.Random(seed)
    while True:
        first = store.ledger_end_index + 1
        # Mostly small bodies, sometimes large ones so that kills also land mid-copy.
        entries = [DLedgerEntry(body=expected_body(i, rng.randint(0, 700) if rng.random() < 0.9
                                                   else rng.randint(8000, 30000)))
                   for i in range(first, first + 8)]
        if rng.random() < 0.5:
            store.batch_append_as_leader(entries, term)
        else:
            for e in entries:
                store.append_as_leader(e, term)
        store.update_committed_index(term, max(store.committed_index,
                                               store.ledger_end_index - rng.randint(0, 20)))
        await asyncio.sleep(0 if rng.random() < 0.6 else 0.002)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    uvloop.run(main(sys.argv[1], int(sys.argv[2])))
