"""Test-only launcher: run a LedgerMQ entry point (`broker`, `namesrv`, `dledger`) with fault-suite
instrumentation switched on, without any test code in the production modules.

    python -m tests.fault.launch [--fsync-record FILE] [--unsafe-ack] -- broker -c broker.conf

--fsync-record FILE
    The power-loss shim. After every successful fsync of an `MmapFileList` (the DLedger data and
    index files, and any broker file list built on it), `MmapFileList.mark_flushed` runs; we wrap
    it to record `{file path: flushed position}` in FILE (written atomically with os.replace,
    before `mark_flushed` returns, so before any SYNC_FLUSH ack that depends on that fsync). The
    harness reads FILE after SIGKILL and zeroes each file beyond what was fsynced: a power loss.
--unsafe-ack
    Sets `DLedgerConfig.unsafe_ack_before_quorum = True` on every config the process builds: the
    debug switch that acks before quorum/fsync, used by the self-test that proves the checkers
    can fail.
--dledger FIELD=VALUE
    Any other DLedgerConfig field the broker config does not expose (flush_file_interval_ms...).
--clock-offset-ms N / --clock-strobe-ms N
    A skewed wall clock: `time.time`/`time.time_ns` return real time + N ms, or (strobe) flip
    between +N and -N ms every 500 ms of monotonic time. Election timing uses the monotonic clock
    and is unaffected, so only message timestamps may change (matrix row 11).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import threading
from typing import Any


def install_fsync_recorder(record_path: str) -> None:
    """Wrap `MmapFileList.mark_flushed` to persist per-file flushed positions in `record_path`."""
    from dledger.store import file_list

    original = file_list.MmapFileList.mark_flushed
    flushed: dict[str, int] = {}
    tmp = record_path + ".tmp"
    # Consume-queue flushes run in a worker thread while the DLedger store's run on the loop.
    lock = threading.Lock()

    def mark_flushed(targets: list[tuple[Any, int]]) -> None:
        original(targets)
        with lock:
            changed = False
            for mf, _ in targets:
                if flushed.get(mf.path, -1) < mf.flushed_pos:
                    flushed[mf.path] = mf.flushed_pos
                    changed = True
            if changed:
                # Page cache survives SIGKILL, so no fsync of the record itself is needed.
                with open(tmp, "w", encoding="utf-8") as fh:
                    json.dump(flushed, fh)
                os.replace(tmp, record_path)

    file_list.MmapFileList.mark_flushed = staticmethod(mark_flushed)  # type: ignore[method-assign]


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`field=value` strings → typed values, by the type of the DLedgerConfig field's default.
    Raises ValueError naming an unknown field or a bad value."""
    from dledger.config import DLedgerConfig

    defaults = DLedgerConfig()
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not hasattr(defaults, name):
            raise ValueError(f"--dledger {item!r}: expected FIELD=VALUE with a DLedgerConfig field")
        kind = type(getattr(defaults, name))
        out[name] = raw.lower() in ("1", "true", "yes") if kind is bool else kind(raw)
    return out


def install_dledger_overrides(overrides: dict[str, Any]) -> None:
    """Force the given fields on every DLedgerConfig built in this process (after the broker's
    own mapping), e.g. unsafe_ack_before_quorum=True or flush_file_interval_ms=1000."""
    from dledger import config as dconfig

    original_init = dconfig.DLedgerConfig.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        for name, value in overrides.items():
            setattr(self, name, value)

    dconfig.DLedgerConfig.__init__ = __init__  # type: ignore[method-assign]


def install_clock_skew(offset_ms: int, strobe_ms: int) -> None:
    """Offset (or strobe) the process's wall clock; the monotonic clock stays true."""
    import time

    real_time, real_time_ns, mono = time.time, time.time_ns, time.monotonic

    def skew_ns() -> int:
        if strobe_ms:
            return (strobe_ms if int(mono() * 2) % 2 else -strobe_ms) * 1_000_000
        return offset_ms * 1_000_000

    time.time = lambda: real_time() + skew_ns() / 1e9  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + skew_ns()  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    """Apply the requested instrumentation, then run `module` as `__main__` with the rest of argv."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m tests.fault.launch [options] -- MODULE [ARGS...]", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="tests.fault.launch")
    p.add_argument("--fsync-record")
    p.add_argument("--unsafe-ack", action="store_true")
    p.add_argument("--dledger", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--clock-offset-ms", type=int, default=0)
    p.add_argument("--clock-strobe-ms", type=int, default=0)
    opts = p.parse_args(argv[:split])
    if opts.clock_offset_ms or opts.clock_strobe_ms:
        install_clock_skew(opts.clock_offset_ms, opts.clock_strobe_ms)
    module, *rest = argv[split + 1:]
    if opts.fsync_record:
        install_fsync_recorder(opts.fsync_record)
    overrides = parse_overrides(opts.dledger)
    if opts.unsafe_ack:
        overrides["unsafe_ack_before_quorum"] = True
    if overrides:
        install_dledger_overrides(overrides)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
