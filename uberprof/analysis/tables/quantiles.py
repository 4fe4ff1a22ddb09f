"""Continuous quantiles (median, p90) on numpy, overall and per group.

The reduce saves two summaries built on medians: the overview's step time (`overview.py`) and
the collective kinds (`shares.py`). Both were DuckDB queries, and they were DuckDB's only use in
`uberprof analyze`: importing it and opening a connection cost every analysis 0.08-0.12 s of CPU
and 50 MB of memory (issue 51), more than the two queries themselves on any run. Here the same
definition in numpy: the value at rank (n - 1) * q of the sorted values, interpolated linearly
between its two neighbours as `lo + (hi - lo) * fraction` (DuckDB's `quantile_cont` and
`median`; numpy's own `quantile` interpolates from the upper neighbour above a fraction of one
half). The median agrees with DuckDB's to the bit; other quantiles to the last bit or so.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["group_quantiles", "quantile_cont"]


def _interpolate(ordered: np.ndarray, start: np.ndarray, count: np.ndarray,
                 q: float) -> np.ndarray:
    """The q-quantile of each run `ordered[start:start + count]` (each sorted, count >= 1)."""
    rn = (count - 1).astype(np.float64) * q
    low = np.floor(rn)
    frac = rn - low
    lo = ordered[start + low.astype(np.int64)].astype(np.float64)
    hi = ordered[start + np.ceil(rn).astype(np.int64)].astype(np.float64)
    return lo + (hi - lo) * frac


def quantile_cont(values: np.ndarray, q: float) -> float | None:
    """The q-quantile (0 <= q <= 1) of `values`, interpolated between the two nearest ranks;
    None when there are none. A partition around those two ranks, not a sort: linear in the
    values (5 M steps of a 512-rank x 10,000-step run)."""
    v = np.asarray(values)
    if v.size == 0:
        return None
    rn = (v.size - 1) * q
    at = sorted({math.floor(rn), math.ceil(rn)})
    part = np.partition(v, at)
    lo, hi = float(part[at[0]]), float(part[at[-1]])
    return lo + (hi - lo) * (rn - math.floor(rn))


def group_quantiles(group: np.ndarray, values: np.ndarray, n_groups: int,
                    q: float) -> np.ndarray:
    """The q-quantile of `values` in each group 0..n_groups-1 (`group` is each value's group),
    NaN for a group without a value: one sort for all groups, not one per group."""
    group = np.asarray(group, dtype=np.int64)
    order = np.lexsort((values, group))
    ordered = np.asarray(values)[order]
    count = np.bincount(group, minlength=n_groups)
    start = np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64)
    out = np.full(n_groups, np.nan)
    some = count > 0
    if some.any():
        out[some] = _interpolate(ordered, start[some], count[some], q)
    return out
