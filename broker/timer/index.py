"""`TimerIndex`: the pending timers of one broker set, as every member derives them from the log.

A pending timer is a pair (due ms, its offset in the timer queue `rmq_sys_wheel_timer`/0), added
when the dispatcher applies the timer message and removed when it applies a *delete marker* for
that offset (written when the timer fires, in the same log entry as the delivered message, or when
it is recalled). The content is therefore the same on every member and exact after a failover;
only where an entry sits (near slot, far bucket, on disk) depends on the local clock.

Layout (two levels, the time-bucketed log of the design):

- **far buckets**: `bucket_ms` (60 s) wide, each an `array('q')` of interleaved (due, offset) —
  16 bytes a timer. Past `resident_limit` timers, the furthest buckets are spilled to one file
  each under `spill_dir` and read back when their time comes near, so memory stays bounded
  whatever the number of pending timers (the files are scratch: the index is rebuilt from the
  timer queue at start);
- **near slots**: within `near_ms` of now, buckets are split into `slot_ms` (100 ms) slots, so
  finding what is due reads one small array;
- **overdue**: entries of passed slots not fired yet (a follower, or a master past its batch
  limit); **in flight**: entries the master has taken to fire (or reserved to recall) and whose
  marker has not been applied yet.

Removal is lazy: a marker sets a bit in `removed` (a bitmap over timer-queue offsets from
`floor`), and an entry whose bit is set is dropped when its slot is next read. `floor` is the
low-water mark: every timer below it is fired or recalled, so markers for offsets below it are
ignored and the bitmap starts there.

Plain state, no I/O but the spill files, no clock: callers pass `now_ms`. Callers: the timer
service (dispatch hook → `add`/`remove`; the master's fire loop → `take_due`, `release_all`,
`next_due_ms`; every member → `compact`).
"""

from __future__ import annotations

import bisect
import logging
import os
from array import array

log = logging.getLogger(__name__)

_SPILL_BUFFER_ENTRIES = 32_768  # timers bound for spilled buckets held before a write (512 KB)


class TimerIndex:
    """Pending timers: (due ms, timer-queue offset). See the module docstring for the layout."""

    def __init__(self, *, slot_ms: int = 100, bucket_ms: int = 60_000, near_ms: int = 120_000,
                 resident_limit: int | None = None, spill_dir: str | None = None, floor: int = 0) -> None:
        if bucket_ms % slot_ms:
            raise ValueError("bucket_ms must be a multiple of slot_ms")
        self.slot_ms = slot_ms
        self.bucket_ms = bucket_ms
        self.near_ms = near_ms
        self.resident_limit = resident_limit if spill_dir else None
        self.spill_dir = spill_dir
        self.floor = floor  # every timer below this offset is settled
        self._removed = bytearray()  # bit i: the timer at floor + i was fired or recalled
        self._pending = 0
        self._horizon = -(1 << 62)  # buckets below this id are split into slots
        self._buckets: dict[int, array] = {}  # far, resident
        self._bucket_ids: list[int] = []  # sorted ids of far buckets, resident or spilled
        self._resident = 0  # entries in resident far buckets
        self._spilled: dict[int, int] = {}  # bucket id -> entries on disk (plus _spill_buf)
        self._spill_buf: dict[int, array] = {}
        self._buffered = 0  # entries in _spill_buf
        self._spilled_min: dict[int, int] = {}  # bucket id -> lowest offset spilled
        self._slots: dict[int, array] = {}  # near
        self._slot_ids: list[int] = []
        self._overdue = array("q")
        self.inflight: dict[int, int] = {}  # offset -> due
        if spill_dir:
            os.makedirs(spill_dir, exist_ok=True)
            for name in os.listdir(spill_dir):  # leftovers of an earlier run: the index is rebuilt
                if name.endswith(".tmr"):
                    os.unlink(os.path.join(spill_dir, name))

    # ---- the log (every member, log order) ---------------------------------------------------

    def add(self, due_ms: int, offset: int) -> None:
        """A timer message was applied."""
        if offset < self.floor:
            return
        self._pending += 1
        bucket = due_ms // self.bucket_ms
        if bucket < self._horizon:
            self._add_to_slot(due_ms, offset)
        else:
            self._add_to_bucket(bucket, due_ms, offset)

    def remove(self, offset: int) -> None:
        """A delete marker for `offset` was applied (fired or recalled)."""
        i = offset - self.floor
        if i < 0:
            return
        byte = i >> 3
        if byte >= len(self._removed):
            self._removed.extend(bytes(byte + 1 - len(self._removed) + 4096))
        bit = 1 << (i & 7)
        if self._removed[byte] & bit:
            return  # a second marker for the same timer: nothing more to remove
        self._removed[byte] |= bit
        self._pending -= 1
        self.inflight.pop(offset, None)

    def is_removed(self, offset: int) -> bool:
        """True once a marker for `offset` was applied (or the offset is below the floor)."""
        i = offset - self.floor
        if i < 0:
            return True
        byte = i >> 3
        return byte < len(self._removed) and bool(self._removed[byte] & (1 << (i & 7)))

    def __len__(self) -> int:
        """Pending timers: added and not yet removed (in flight included)."""
        return self._pending

    # ---- the master --------------------------------------------------------------------------

    def take_due(self, now_ms: int, limit: int) -> list[tuple[int, int]]:
        """Up to `limit` pending timers due at or before `now_ms`, earliest slots first, moved to
        `inflight` (they stay pending until their marker is applied)."""
        self.advance(now_ms)
        out: list[tuple[int, int]] = []
        if self._overdue:
            self._overdue = self._take_from(self._overdue, now_ms, limit, out)
        while self._slot_ids and len(out) < limit:
            sid = self._slot_ids[0]
            if sid * self.slot_ms > now_ms:
                break
            rest = self._take_from(self._slots[sid], now_ms, limit, out)
            if rest:
                self._slots[sid] = rest
                break
            del self._slots[sid]
            self._slot_ids.pop(0)
        return out

    def _take_from(self, arr: array, now_ms: int, limit: int, out: list[tuple[int, int]]) -> array:
        keep = array("q")
        inflight = self.inflight
        for i in range(0, len(arr), 2):
            due, off = arr[i], arr[i + 1]
            if off in inflight or self.is_removed(off):
                continue
            if due <= now_ms and len(out) < limit:
                out.append((due, off))
                inflight[off] = due
            else:
                keep.append(due)
                keep.append(off)
        return keep

    def reserve(self, offset: int, due_ms: int) -> bool:
        """Hold a pending timer out of `take_due` (a recall is being written); False if it is
        already removed or in flight."""
        if offset in self.inflight or self.is_removed(offset):
            return False
        self.inflight[offset] = due_ms
        return True

    def release(self, offset: int) -> None:
        """An in-flight timer goes back to pending (its fire or recall was not written)."""
        due = self.inflight.pop(offset, None)
        if due is not None and not self.is_removed(offset):
            self._overdue.append(due)
            self._overdue.append(offset)

    def release_all(self) -> None:
        """Mastership lost or a new term: whatever was in flight is pending again (its marker,
        if the entry committed, still removes it)."""
        for off in list(self.inflight):
            self.release(off)

    def next_due_ms(self, now_ms: int) -> int | None:
        """When the next pending timer is due (None: none pending); `now_ms` if one is overdue."""
        self.advance(now_ms)
        if self._overdue:
            return now_ms
        for sid in self._slot_ids:
            arr = self._slots[sid]
            dues = [arr[i] for i in range(0, len(arr), 2)
                    if arr[i + 1] not in self.inflight and not self.is_removed(arr[i + 1])]
            if dues:
                return min(dues)
        if self._bucket_ids:
            return self._bucket_ids[0] * self.bucket_ms
        return None

    # ---- every member ------------------------------------------------------------------------

    def advance(self, now_ms: int) -> None:
        """Split the far buckets that came within `near_ms` into slots (reading spilled ones)."""
        target = (now_ms + self.near_ms) // self.bucket_ms + 1
        if target <= self._horizon:
            return
        while self._bucket_ids and self._bucket_ids[0] < target:
            bid = self._bucket_ids.pop(0)
            arr = self._load_bucket(bid)
            for i in range(0, len(arr), 2):
                if not self.is_removed(arr[i + 1]):
                    self._add_to_slot(arr[i], arr[i + 1])
        self._horizon = target

    def compact(self, now_ms: int, grace_ms: int) -> None:
        """Drop removed entries of slots that ended `grace_ms` ago (a follower sees the master's
        markers about then); the rest of those slots become overdue."""
        self.advance(now_ms)
        limit = (now_ms - grace_ms) // self.slot_ms
        keep = array("q")
        for arr in [self._overdue, *(self._slots.pop(s) for s in self._slot_ids if s < limit)]:
            for i in range(0, len(arr), 2):
                if not self.is_removed(arr[i + 1]):
                    keep.append(arr[i])
                    keep.append(arr[i + 1])
        self._slot_ids = [s for s in self._slot_ids if s >= limit]
        self._overdue = keep

    def low_water_mark(self, next_offset: int) -> int:
        """The lowest pending offset (`next_offset`, the queue's end, if none is pending)."""
        # Removed entries still in the arrays only lower the mark: safe, and one C-level min each.
        lows = [next_offset]
        for arr in (self._overdue, *self._slots.values(), *self._buckets.values(), *self._spill_buf.values()):
            if arr:
                lows.append(min(arr[1::2]))
        lows.extend(self._spilled_min.values())
        lows.extend(self.inflight)
        return min(lows)

    def raise_floor(self, offset: int) -> None:
        """Forget markers below `offset` (a low-water mark): the bitmap is cut to start there."""
        if offset <= self.floor:
            return
        shift = offset - self.floor
        byte, bits = shift >> 3, shift & 7
        removed = self._removed[byte:]
        if bits and removed:  # re-align the bitmap on the new floor
            n = int.from_bytes(removed, "little") >> bits
            removed = bytearray(n.to_bytes(len(removed), "little"))
        self._removed = removed
        self.floor = offset

    def stats(self) -> dict[str, int]:
        """Sizes for metrics and the benchmark."""
        near = sum(len(a) for a in self._slots.values()) // 2 + len(self._overdue) // 2
        return {"pending": self._pending, "resident_far": self._resident, "near": near,
                "spilled": sum(self._spilled.values()), "inflight": len(self.inflight),
                "buckets": len(self._bucket_ids), "slots": len(self._slot_ids),
                "removed_bitmap_bytes": len(self._removed)}

    # ---- layout ------------------------------------------------------------------------------

    def _add_to_slot(self, due_ms: int, offset: int) -> None:
        sid = due_ms // self.slot_ms
        arr = self._slots.get(sid)
        if arr is None:
            arr = self._slots[sid] = array("q")
            bisect.insort(self._slot_ids, sid)
        arr.append(due_ms)
        arr.append(offset)

    def _add_to_bucket(self, bid: int, due_ms: int, offset: int) -> None:
        if bid in self._spilled:
            buf = self._spill_buf.setdefault(bid, array("q"))
            buf.append(due_ms)
            buf.append(offset)
            self._spilled[bid] += 1
            self._spilled_min[bid] = min(self._spilled_min[bid], offset)
            self._buffered += 1
            if self._buffered >= _SPILL_BUFFER_ENTRIES:  # one bounded buffer for all spilled buckets
                for b, pending in self._spill_buf.items():
                    self._write_spill(b, pending)
                self._spill_buf.clear()
                self._buffered = 0
            return
        arr = self._buckets.get(bid)
        if arr is None:
            arr = self._buckets[bid] = array("q")
            bisect.insort(self._bucket_ids, bid)
        arr.append(due_ms)
        arr.append(offset)
        self._resident += 1
        if self.resident_limit is not None and self._resident > self.resident_limit:
            self._spill_furthest()

    def _spill_furthest(self) -> None:
        """Write the furthest resident buckets to disk until 3/4 of the limit is resident."""
        assert self.resident_limit is not None
        target = self.resident_limit * 3 // 4
        for bid in reversed(self._bucket_ids):
            if self._resident <= target:
                break
            arr = self._buckets.pop(bid, None)
            if arr is None:
                continue
            self._write_spill(bid, arr)
            n = len(arr) // 2
            self._spilled[bid] = n
            self._spilled_min[bid] = min(arr[1::2])
            self._resident -= n
        log.info("event=timer_buckets_spilled resident=%d spilled=%d", self._resident,
                 sum(self._spilled.values()))

    def _spill_path(self, bid: int) -> str:
        assert self.spill_dir is not None
        return os.path.join(self.spill_dir, f"{bid:012d}.tmr")

    def _write_spill(self, bid: int, arr: array) -> None:
        with open(self._spill_path(bid), "ab") as f:
            f.write(arr.tobytes())

    def _load_bucket(self, bid: int) -> array:
        arr = self._buckets.pop(bid, None)
        if arr is not None:
            self._resident -= len(arr) // 2
            return arr
        arr = array("q")
        if self._spilled.pop(bid, None) is not None:
            path = self._spill_path(bid)
            with open(path, "rb") as f:
                arr.frombytes(f.read())
            os.unlink(path)
            buffered = self._spill_buf.pop(bid, None)
            if buffered is not None:
                arr.extend(buffered)
                self._buffered -= len(buffered) // 2
            self._spilled_min.pop(bid, None)
        return arr
