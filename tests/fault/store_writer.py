"""Helper process for the power-loss shim's self-test: writes entries into a real
`DLedgerMmapFileStore`, fsyncs the first `--flushed` of them, writes `--unflushed` more without an
fsync, prints `READY <end index>` and sleeps until killed. Run through `tests.fault.launch
--fsync-record` so the recorder sees exactly the fsyncs this process did.
"""

from __future__ import annotations

import argparse
import sys
import time

from dledger.config import DLedgerConfig
from dledger.entry import DLedgerEntry
from dledger.store.mmap_store import DLedgerMmapFileStore


def main(argv: list[str] | None = None) -> int:
    """Write, flush some, print READY, wait to be killed."""
    p = argparse.ArgumentParser(prog="store_writer")
    p.add_argument("--dir", required=True)
    p.add_argument("--flushed", type=int, required=True)
    p.add_argument("--unflushed", type=int, required=True)
    p.add_argument("--file-size", type=int, default=64 * 1024)
    args = p.parse_args(argv)
    cfg = DLedgerConfig(self_id="n0", peers="n0-127.0.0.1:1", store_base_dir=args.dir,
                        mapped_file_size_for_entry_data=args.file_size,
                        mapped_file_size_for_entry_index=32 * 1024)
    store = DLedgerMmapFileStore(cfg)
    store.recover()  # no background flush service: fsyncs happen only where we call flush()
    start = store.ledger_end_index + 1
    for i in range(args.flushed):
        store.append_as_leader(DLedgerEntry(body=f"durable-{start + i}".encode() * 20), term=1)
    store.flush()
    for i in range(args.unflushed):
        store.append_as_leader(DLedgerEntry(body=f"volatile-{i}".encode() * 20), term=1)
    sys.stdout.write(f"READY {store.ledger_end_index}\n")
    sys.stdout.flush()
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
