"""Where a series of step times changes level: offline change-points over a whole timeline.

The collector's slowdown trigger (collect/slowdown.py) watches the last steps as they come; the
report sees the whole timeline at once, so it can place each change where the data split best
and judge it with every step on either side. The procedure, chosen for what step timelines
hold (noise of ±10% between neighbouring steps, single long steps, evaluation or checkpoint
steps every N, a slow drift on a shared machine):

- **Locate** with Pettitt's test: the ranks of the values (not the values: one 10x step moves
  a rank by one), and the split `k` that maximises |U_k|, U_k = 2·(sum of the first k ranks) −
  k·(n+1), the Mann-Whitney statistic of "before k" against "from k on". Its approximate
  p-value, 2·exp(−6·U²/(n³+n²)), is the chance of so uneven a split in a series without one.
- **Binary segmentation**: a split found, each side is searched again, up to `MAX_CHANGES`,
  never closer than `MIN_SEGMENT` steps to another split (a trace window of 10 steps, or a few
  slow steps at start-up, is no level).
- **Keep** a split when its p-value is at most `MAX_P` and its levels, the medians of the
  segments on either side, differ by at least `MIN_CHANGE` (20%, the collector's trigger's own
  rise; steps on these machines drift ±10% between runs) and by more than `NOISE_K` robust
  standard deviations (scaled MAD) of the steps within them. Medians, not means: periodic long
  steps (an evaluation every 50) do not move them.

Levels are re-read once every split is placed, from the final segments, so a change's
"before" runs from the previous change (or the first step) and its "after" to the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_CHANGES", "MIN_CHANGE", "MIN_SEGMENT", "LevelChange", "level_changes",
           "pettitt"]

MIN_SEGMENT = 12  # steps on either side of a split, and between two splits
MAX_CHANGES = 6  # splits per series
MAX_P = 1e-3  # Pettitt's approximate p-value (strict: the segmentation tests several times)
MIN_CHANGE = 0.2  # |after / before - 1|
NOISE_K = 1.0  # the change against the robust spread of the steps within the segments
MAD_SCALE = 1.4826  # MAD to standard deviation under normal noise


@dataclass(frozen=True)
class LevelChange:
    """A change of level at index `at` (the first value of the new level) of the series, with
    the segment on either side: values [lo, at) before, [at, hi) after."""

    at: int
    lo: int
    hi: int
    before: float  # the medians of the two segments
    after: float
    p_value: float  # Pettitt's, where the split was found

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before > 0 else math.inf


def pettitt(values: np.ndarray, min_segment: int = MIN_SEGMENT) -> tuple[int, float] | None:
    """The best split of `values` by Pettitt's test, as (index of the first value after it,
    approximate p-value), or None when the series is too short for two segments."""
    n = int(values.size)
    if n < 2 * min_segment:
        return None
    ranks = _ranks(values)
    u = 2.0 * np.cumsum(ranks)[:-1] - np.arange(1, n) * (n + 1.0)  # split after value k
    k = np.arange(1, n)
    allowed = (k >= min_segment) & (n - k >= min_segment)
    stat = np.where(allowed, np.abs(u), -1.0)
    best = int(np.argmax(stat))
    big_u = float(stat[best])
    p = min(1.0, 2.0 * math.exp(-6.0 * big_u * big_u / (float(n) ** 3 + float(n) ** 2)))
    return best + 1, p


def level_changes(values: np.ndarray, min_segment: int = MIN_SEGMENT,
                  max_changes: int = MAX_CHANGES, min_change: float = MIN_CHANGE
                  ) -> list[LevelChange]:
    """The lasting changes of level in `values` (a step time per step, in step order), in
    order (module docstring: how they are found and kept)."""
    v = np.asarray(values, dtype=np.float64)
    splits: list[tuple[int, float]] = []
    todo = [(0, int(v.size))]
    while todo and len(splits) < max_changes:
        lo, hi = todo.pop()
        found = pettitt(v[lo:hi], min_segment)
        if found is None:
            continue
        at, p = lo + found[0], found[1]
        if p > MAX_P or not _material(v[lo:at], v[at:hi], min_change):
            continue
        splits.append((at, p))
        todo += [(lo, at), (at, hi)]
    return _read_levels(v, sorted(splits), min_change)


def _read_levels(v: np.ndarray, splits: list[tuple[int, float]], min_change: float
                 ) -> list[LevelChange]:
    """Each split's levels from the final segments; a split whose final segments no longer
    differ materially (a neighbour took part of its rise) is dropped, and its segments
    merged."""
    while True:
        bounds = [0, *(at for at, _ in splits), int(v.size)]
        out = [LevelChange(at=at, lo=bounds[i], hi=bounds[i + 2],
                           before=float(np.median(v[bounds[i]:at])),
                           after=float(np.median(v[at:bounds[i + 2]])), p_value=p)
               for i, (at, p) in enumerate(splits)]
        weak = [i for i, c in enumerate(out)
                if not _material(v[c.lo:c.at], v[c.at:c.hi], min_change)]
        if not weak:
            return out
        del splits[weak[0]]


def _material(before: np.ndarray, after: np.ndarray, min_change: float) -> bool:
    """Whether two segments' medians differ by `min_change` of the first and by `NOISE_K`
    robust standard deviations of the steps around their own medians."""
    if before.size == 0 or after.size == 0:
        return False
    a, b = float(np.median(before)), float(np.median(after))
    if a <= 0:
        return b > 0
    resid = np.concatenate([before - a, after - b])
    spread = MAD_SCALE * float(np.median(np.abs(resid)))
    return abs(b / a - 1.0) >= min_change and abs(b - a) > NOISE_K * spread


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank."""
    order = np.argsort(values, kind="mergesort")
    sorted_v = values[order]
    ranks = np.empty(values.size, np.float64)
    ranks[order] = np.arange(1, values.size + 1, dtype=np.float64)
    # ties: the mean rank of their run
    edges = np.flatnonzero(np.diff(sorted_v) != 0) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [values.size]])
    if starts.size != values.size:
        mean_rank = (starts + ends + 1) / 2.0
        ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks
