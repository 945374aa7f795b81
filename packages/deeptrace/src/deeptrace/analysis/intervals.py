"""Interval arithmetic over numpy arrays: the sweep-line primitives every time analysis is built from.

All functions take start/end arrays of integer nanoseconds. A *merged* set is sorted by start and has no two
intervals that overlap or touch; `merge` produces one. Lengths are nanoseconds (int).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


def merge(starts: I64, ends: I64) -> tuple[I64, I64]:
    """Union of the intervals as a merged set (HTA's `merge_kernel_intervals`: touching intervals join)."""
    if starts.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    reach = np.maximum.accumulate(e)
    begins_group = np.empty(s.size, dtype=bool)
    begins_group[0] = True
    begins_group[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(begins_group)
    return s[first], np.maximum.reduceat(e, first)


def total(merged: tuple[I64, I64]) -> int:
    """Length covered by a merged set."""
    return int((merged[1] - merged[0]).sum())


def _covered_before(t: I64, merged: tuple[I64, I64]) -> I64:
    """For each time in `t`: the length of the merged set that lies before it."""
    bs, be = merged
    if bs.size == 0:
        return np.zeros(t.shape, np.int64)
    lengths = be - bs
    before = np.concatenate(([0], np.cumsum(lengths)))
    k = np.searchsorted(bs, t, side="right")  # intervals that start at or before t
    last = np.maximum(k - 1, 0)
    partial = np.clip(t - bs[last], 0, lengths[last])
    return np.where(k > 0, before[last] + partial, 0)


def intersection(a: tuple[I64, I64], b: tuple[I64, I64]) -> int:
    """Length of time covered by both merged sets."""
    if a[0].size == 0 or b[0].size == 0:
        return 0
    return int((_covered_before(a[1], b) - _covered_before(a[0], b)).sum())


def union(*sets: tuple[I64, I64]) -> tuple[I64, I64]:
    """Union of several merged sets, merged."""
    return merge(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def difference(a: tuple[I64, I64], b: tuple[I64, I64]) -> tuple[I64, I64]:
    """The part of merged set `a` not covered by merged set `b`, merged."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    # Sweep: +1/-1 at a's bounds, +2/-2 at b's; the segments where the running sum is 1 are in a and not in b.
    times = np.concatenate((a[0], a[1], b[0], b[1]))
    deltas = np.concatenate((np.ones(a[0].size), -np.ones(a[1].size), np.full(b[0].size, 2), np.full(b[1].size, -2)))
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(deltas[order].astype(np.int64))
    keep = (level[:-1] == 1) & (times[1:] > times[:-1])
    return merge(times[:-1][keep], times[1:][keep])


def clip(merged: tuple[I64, I64], lo: int, hi: int) -> tuple[I64, I64]:
    """The part of a merged set inside [lo, hi]."""
    s = np.clip(merged[0], lo, hi)
    e = np.clip(merged[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def coarsen(merged: tuple[I64, I64], min_gap_ns: int) -> tuple[I64, I64]:
    """Join intervals separated by less than `min_gap_ns` (for drawing: one pixel cannot show the gap)."""
    s, e = merged
    if s.size == 0:
        return merged
    if min_gap_ns <= 0:
        return merged
    joined_s, joined_e = merge(s, e + min_gap_ns)
    return joined_s, joined_e - min_gap_ns
