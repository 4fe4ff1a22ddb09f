"""Interval arithmetic on sorted int64 numpy arrays: the one place every metric's set math lives.

An interval set is a pair `(starts, ends)` of int64 arrays, sorted, disjoint and non-touching
(half-open `[start, end)`), as `union` returns it. Every breakdown (per step, per trace, per
rank) is built from these helpers, so a metric cannot drift between views.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "Intervals",
    "clip",
    "complement_gaps",
    "covered_before",
    "covered_in",
    "empty",
    "intersect",
    "merge",
    "subtract",
    "total",
    "union",
]


class Intervals(NamedTuple):
    """A normalised interval set: sorted, disjoint, non-empty half-open intervals (ns)."""

    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:  # number of intervals
        return int(self.starts.shape[0])


_EMPTY = np.zeros(0, dtype=np.int64)


def empty() -> Intervals:
    return Intervals(_EMPTY, _EMPTY)


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge possibly overlapping intervals into a normalised set (touching ones merge too)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    if s.size == 0:
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # a new group starts where the interval begins after everything before it has ended
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], run_end[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return Intervals(s[first], run_end[last])


def merge(*sets: Intervals) -> Intervals:
    """Union of several normalised sets."""
    sets = tuple(x for x in sets if len(x))
    if not sets:
        return empty()
    if len(sets) == 1:
        return sets[0]
    return union(np.concatenate([x.starts for x in sets]), np.concatenate([x.ends for x in sets]))


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """`a ∩ b` for two normalised sets, by a sweep over both boundaries (linear after a sort)."""
    if not len(a) or not len(b):
        return empty()
    return _sweep(a, b, both=True)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """`a − b` for two normalised sets."""
    if not len(a) or not len(b):
        return a
    return _sweep(a, b, both=False)


def _sweep(a: Intervals, b: Intervals, both: bool) -> Intervals:
    # Boundaries with +1/-1 per set; coverage of a and b after each boundary tells membership.
    t = np.concatenate([a.starts, a.ends, b.starts, b.ends])
    da = np.concatenate([np.ones(len(a), np.int8), -np.ones(len(a), np.int8),
                         np.zeros(2 * len(b), np.int8)])
    db = np.concatenate([np.zeros(2 * len(a), np.int8), np.ones(len(b), np.int8),
                         -np.ones(len(b), np.int8)])
    order = np.argsort(t, kind="stable")
    t, da, db = t[order], da[order], db[order]
    ca = np.cumsum(da)
    cb = np.cumsum(db)
    inside = (ca > 0) & (cb > 0) if both else (ca > 0) & (cb == 0)
    # segment i spans [t[i], t[i+1]) with the coverage after boundary i
    seg_s, seg_e, seg_in = t[:-1], t[1:], inside[:-1]
    sel = seg_in & (seg_e > seg_s)
    if not sel.any():
        return empty()
    return union(seg_s[sel], seg_e[sel])


def clip(a: Intervals, lo: int, hi: int) -> Intervals:
    """The part of `a` inside `[lo, hi)`."""
    if not len(a) or hi <= lo:
        return empty()
    s = np.maximum(a.starts, lo)
    e = np.minimum(a.ends, hi)
    keep = e > s
    return Intervals(s[keep], e[keep])


def total(a: Intervals) -> int:
    """Covered length of a normalised set (ns)."""
    return int((a.ends - a.starts).sum()) if len(a) else 0


def covered_before(a: Intervals, t: np.ndarray) -> np.ndarray:
    """Length of `a` inside `(-inf, t)` for every t: a cumulative coverage function."""
    t = np.asarray(t, dtype=np.int64)
    if not len(a):
        return np.zeros(t.shape, dtype=np.int64)
    lengths = a.ends - a.starts
    prefix = np.concatenate([[0], np.cumsum(lengths)])
    # i = number of intervals starting at or before t
    i = np.searchsorted(a.starts, t, side="right")
    full = prefix[np.maximum(i - 1, 0)]
    last_start = a.starts[np.maximum(i - 1, 0)]
    last_end = a.ends[np.maximum(i - 1, 0)]
    partial = np.clip(np.minimum(t, last_end) - last_start, 0, None)
    return np.where(i > 0, full + partial, 0)


def covered_in(a: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of `a` inside each window `[lo[k], hi[k])`, vectorised over windows."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    return np.maximum(covered_before(a, hi) - covered_before(a, lo), 0)


def complement_gaps(a: Intervals, lo: int, hi: int) -> Intervals:
    """The gaps of `a` inside `[lo, hi)`: where nothing in the set is active."""
    if hi <= lo:
        return empty()
    c = clip(a, lo, hi)
    if not len(c):
        return Intervals(np.array([lo], np.int64), np.array([hi], np.int64))
    s = np.concatenate([[lo], c.ends])
    e = np.concatenate([c.starts, [hi]])
    keep = e > s
    return Intervals(s[keep], e[keep])
