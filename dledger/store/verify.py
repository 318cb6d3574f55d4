"""Background verification of the data files recovery did not scan, and the cut of a corrupt log
while the member runs.

Recovery (`mmap_recovery`) scans only the last three data files (or from the checkpointed
committed entry's file), so a flipped bit in an older file is not seen on start: reads would
catch it by CRC (never served), but the member could still win an election holding it, and as
leader it could then not replicate it. So after `start()` the store checks every older record
with the recovery scan's own checks (`scan_entries`: header sanity, the pos it sits at, index
continuity, terms not going backwards, body CRC, index record agreement) from the first entry up
to where recovery's scan began, and finally that the two regions join (index and term).

Until that is done `store.verifying` is True and the member neither campaigns nor accepts a
leadership transfer (`MemberState.check_verifying`; it may still vote, see `elector`).

It runs on the event loop in slices of `_SLICE_ENTRIES` records (a few milliseconds) with an
`await asyncio.sleep(0)` between them, not in a worker thread: every mutation of the file lists
(appends at the tail, truncates, expired-file deletion, a rebuild) also runs on the loop, so each
slice sees a consistent list and cannot read a file that another task unmaps mid-read; between
slices it re-reads the list (files deleted as expired are skipped, a rebuilt list ends the work).

A bad record cuts the log right before it exactly like recovery cuts a committed entry (the
store's `cut_corrupt_log`): the catch-up watermark (the log end before the cut, or the committed index
or a persisted watermark if higher) is persisted first, `corrupt_cut_listeners` run (the elector
steps down if this member leads; the entry handler answers parked pushes so the leader goes back
to COMPARE at once), then data and index are cut and the ledger state moved back. The member is
then *recovering* (`MemberState.check_recovering`): no votes, no campaign, re-fetching from the
leader through the ordinary COMPARE/TRUNCATE/APPEND path until it is past the watermark.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from dledger.store.file_list import MmapFileList
from dledger.store.mmap_recovery import ScanState, scan_entries

log = logging.getLogger(__name__)

# Records per slice: ~1000 small entries take ~2-4 ms of CRC and unpacking; a slice of large
# entries is bounded by the data file size the records sit in (CRC runs at ~1 GB/s).
_SLICE_ENTRIES = 1000


class VerifiedStore(Protocol):
    """What the verification reads and calls (the mmap store)."""

    data_file_list: MmapFileList
    index_file_list: MmapFileList
    unverified_region: int | None
    verifying: bool
    ledger_begin_index: int
    ledger_end_index: int
    committed_index: int
    log_ctx: str

    @property
    def data_begin_pos(self) -> int: ...
    def get_entry_pos_and_size(self, index: int) -> tuple[int, int]: ...
    def term_of(self, index: int) -> int: ...
    def cut_corrupt_log(self, pos: int, last_index: int, reason: str) -> None: ...


async def verify_old_files(store: VerifiedStore, stop_pos: int | None = None) -> bool:
    """Verify `store`'s unscanned region (set by recovery) — or, given `stop_pos`, a running
    store's data from its first entry up to that data position (a check after a suspected disk
    fault) — and cut the log at the first bad record. Returns True when the region checked out
    (or vanished: expired or rebuilt), False when it cut or failed. `store.verifying` is True
    meanwhile and cleared at the end, except after an unexpected error: then the member keeps
    holding its campaign (it cannot vouch for those files) and the error is logged."""
    if stop_pos is not None:
        store.unverified_region = stop_pos
        store.verifying = True
    region = store.unverified_region
    if region is None:
        store.verifying = False
        return True
    stop_pos = region
    dl = store.data_file_list
    ctx = store.log_ctx
    begin_pos = store.data_begin_pos
    files = sum(1 for mf in dl.files if mf.file_from_offset < stop_pos)
    total = stop_pos - max(begin_pos, 0)
    t0 = time.monotonic()
    log.info("event=old_files_verify_start %s files=%d bytes=%d fromPos=%d toPos=%d", ctx, files, total,
             begin_pos, stop_pos)
    st = ScanState(begin_pos)
    result = "ok"
    hold = False
    try:
        while True:
            if not dl.files or dl.files[0].file_from_offset >= stop_pos or store.data_begin_pos < 0:
                result = "gone"  # every old file expired, or the list was rebuilt for the leader
                break
            if st.pos < store.data_begin_pos:
                # Old files were deleted as expired while we yielded: go on from the new first entry.
                st = ScanState(store.data_begin_pos, scanned_bytes=st.scanned_bytes)
            scan_entries(dl, store.index_file_list, st, store.committed_index, stop_pos=stop_pos,
                         max_entries=_SLICE_ENTRIES)
            if st.done:
                break
            await asyncio.sleep(0)
        joins = store.ledger_begin_index <= st.last_index < store.ledger_end_index
        if result == "ok" and not st.reason and joins:
            # Both regions check out on their own; they must also join: the next entry (checked by
            # recovery's scan, or appended since) sits right at the stop and does not go back in term.
            nxt = st.last_index + 1
            npos = store.get_entry_pos_and_size(nxt)[0]
            nterm = store.term_of(nxt)
            if npos != st.pos or nterm < st.last_term:
                st.reason = (f"entry {st.last_index} (term {st.last_term}) ends at pos {st.pos}, but entry "
                             f"{nxt} sits at pos {npos} (term {nterm})")
        if st.reason:
            result = "corrupt"
            store.cut_corrupt_log(st.pos, st.last_index, f"verification of the older data files: {st.reason}")
    except asyncio.CancelledError:
        result = "cancelled"  # the store is shutting down
        raise
    except Exception:
        # Unexpected (a bug, an unreadable file): stay `verifying`, i.e. never lead with files we
        # could not check; the member still follows and votes. Logged loudly for the operator.
        result, hold = "error", True
        log.exception("event=old_files_verify_failed %s pos=%d: not campaigning until restarted", ctx, st.pos)
    finally:
        store.verifying = hold
        store.unverified_region = None
        log.info("event=old_files_verify_end %s files=%d bytes=%d verifiedBytes=%d seconds=%.3f result=%s",
                 ctx, files, total, st.scanned_bytes, time.monotonic() - t0, result)
    return result in ("ok", "gone")
