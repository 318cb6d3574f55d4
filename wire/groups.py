"""Which queue a FIFO message group lands in: `consistentHash(group.hashCode(), writeQueueNums)`
— Guava's jump consistent hash over Java's `String.hashCode()`, as RocketMQ's proxy chooses
(`SendMessageActivity`). The broker stores a grouped message there whatever queue the request
names; the SDK computes the same queue, so it batches a group's messages into that one queue and
their order survives its pipelining."""

from __future__ import annotations

import struct

_MASK64 = (1 << 64) - 1
_LCG_MULTIPLIER = 2862933555777941757


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()` (over UTF-16 code units, a signed 32-bit int)."""
    h = 0
    for (unit,) in struct.iter_unpack(">H", text.encode("utf-16-be", "surrogatepass")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def consistent_hash(value: int, buckets: int) -> int:
    """Guava's `Hashing.consistentHash(long, int)` (jump consistent hash, Lamping & Veach): the
    bucket in [0, buckets) of `value` (a Java long, two's complement)."""
    if buckets <= 0:
        raise ValueError(f"buckets must be positive: {buckets}")
    state = value & _MASK64
    candidate = 0
    while True:
        state = (_LCG_MULTIPLIER * state + 1) & _MASK64
        next_double = ((state >> 33) + 1) / 2.0**31
        nxt = int((candidate + 1) / next_double)
        if 0 <= nxt < buckets:
            candidate = nxt
        else:
            return candidate


def queue_of_group(message_group: str, write_queue_nums: int) -> int:
    """The queue a message group's messages land in (RocketMQ's proxy formula)."""
    return consistent_hash(java_string_hash(message_group), write_queue_nums)
