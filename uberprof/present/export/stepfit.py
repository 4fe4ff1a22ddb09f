"""A step window that fits the size budget, for an export given no `--steps` whose events that
are never dropped (steps, collectives, synchronisations, marks) alone exceed the budget.

Dropping host operators and kernels cannot help then; fewer steps can. The budget's measuring
pass (plan.py) tallies, besides each tier's weight, what a window of steps would keep, so no
second pass over the traces is needed: for each rank and each candidate step j, the bytes of
events that start before the window's end if the window ended with step j (`before_end`) and
of those that end by its start if it started with step j (`ended_by`). An export of steps a-b
keeps a rank's events that overlap [start of a, end of b], so its weight is
`before_end[b] - ended_by[a]`, summed over ranks: exact for complete events, one cumulative
sum per category (the budget's tiers and duration buckets, and the events never dropped),
so the window's cut is decided as the whole run's is.

The candidate steps are the steps traced on every selected rank (so every rank has a step at
each end of every window). The window is grown from the anchor step (the slowest traced step:
the longest step time on any rank), one step at a time on the side with fewer steps so far,
while the events never dropped and uberprof's marks of the window fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.present.export.budget import N_CATEGORIES, NEVER_DROPPED, categories

__all__ = ["StepWeights", "StepWindow", "grow_window", "step_weights"]

Span = tuple[int, int]


@dataclass
class StepWindow:
    """The steps chosen: indices `i`..`j` into the candidate steps, around `anchor`."""

    i: int
    j: int
    anchor: int


@dataclass
class StepWeights:
    """Per candidate step, the cumulative tallies described in the module doc, summed over
    ranks; `starts`/`ends` are each rank's window edges per candidate step (own clock): the
    earliest start of its traced steps from that step on, the latest end up to it, so a
    window's edges are the ones `--steps` would select (wider when steps overlap)."""

    steps: list[int]
    slowest: int  # index into `steps`
    starts: dict[int, np.ndarray]
    ends: dict[int, np.ndarray]
    before_end: np.ndarray = field(init=False)  # (steps, N_CATEGORIES) bytes
    ended_by: np.ndarray = field(init=False)
    meta_bytes: int = 0  # the names of the traces' tracks (about 200 bytes a track and file)

    def __post_init__(self) -> None:
        m = len(self.steps)
        self.before_end = np.zeros((m, N_CATEGORIES), dtype=np.int64)
        self.ended_by = np.zeros((m, N_CATEGORIES), dtype=np.int64)

    def add(self, rank: int, ts: np.ndarray, end: np.ndarray, tier: np.ndarray,
            size: np.ndarray, bucket: np.ndarray) -> None:
        """Tally one file's kept events of `rank` (its own clock), weighed as the budget
        weighs them (`Budget.weigh`)."""
        if rank not in self.ends or not len(ts):
            return
        m = len(self.steps)
        cat = categories(tier, bucket)
        # first candidate whose window end is after the event's start: counted from there on
        first = np.searchsorted(self.ends[rank], ts, side="right")
        self.before_end += _cumulative(first, cat, size, m)
        # first candidate whose window start is at or after the event's end
        first = np.searchsorted(self.starts[rank], end, side="left")
        self.ended_by += _cumulative(first, cat, size, m)

    def weights(self, i: int, j: int) -> np.ndarray:
        """What the events of candidate steps i..j weigh, by category."""
        return np.maximum(self.before_end[j] - self.ended_by[i], 0)

    def never_dropped(self, i: int, j: int) -> int:
        """What the events of candidate steps i..j that are never dropped weigh."""
        return int(self.before_end[j, NEVER_DROPPED] - self.ended_by[i, NEVER_DROPPED])


def _cumulative(first: np.ndarray, cat: np.ndarray, size: np.ndarray, m: int) -> np.ndarray:
    """(m, N_CATEGORIES): row k holds the bytes of events with `first` <= k."""
    ok = first < m
    flat = np.bincount(first[ok] * N_CATEGORIES + cat[ok], weights=size[ok],
                       minlength=m * N_CATEGORIES)
    return np.cumsum(np.rint(flat).astype(np.int64).reshape(m, N_CATEGORIES), axis=0)


def step_weights(steps: pa.Table, ranks: list[int]) -> StepWeights | None:
    """An empty tally over the steps traced on every rank of `ranks` (the run's step table:
    `rank`, `step`, `traced`, host and device windows, `step_time_ns`); None when no step is
    traced on all of them."""
    t = steps.filter(pc.and_(pc.fill_null(steps["traced"], False),
                             pc.is_in(steps["rank"], pa.array(ranks, pa.int64()))))
    if t.num_rows == 0:
        return None
    spans: dict[int, dict[int, Span]] = {}
    time_of: dict[int, int] = {}
    for row in t.select(["rank", "step", "host_start_ns", "host_end_ns", "device_start_ns",
                         "device_end_ns", "step_time_ns"]).to_pylist():
        lo = _edge(min, row["host_start_ns"], row["device_start_ns"])
        hi = _edge(max, row["host_end_ns"], row["device_end_ns"])
        if lo is None or hi is None:
            continue
        r, s = row["rank"], row["step"]
        a, b = spans.setdefault(r, {}).get(s, (lo, hi))
        spans[r][s] = (min(a, lo), max(b, hi))
        time_of[s] = max(time_of.get(s, 0), row["step_time_ns"] or 0)
    if set(spans) != set(ranks):
        return None
    common = sorted(set.intersection(*(set(v) for v in spans.values())))
    if not common:
        return None
    starts, ends = {}, {}
    for r, by_step in spans.items():
        own = sorted(by_step)
        s_arr = np.array([by_step[s][0] for s in own], dtype=np.int64)
        e_arr = np.array([by_step[s][1] for s in own], dtype=np.int64)
        suffix_min = np.minimum.accumulate(s_arr[::-1])[::-1]
        prefix_max = np.maximum.accumulate(e_arr)
        # own steps >= / <= each candidate (every candidate is one of them)
        pos = np.searchsorted(own, common)
        starts[r], ends[r] = suffix_min[pos], prefix_max[pos]
    slowest = max(range(len(common)), key=lambda k: (time_of.get(common[k], 0), -k))
    return StepWeights(common, slowest, starts, ends)


def _edge(pick: Callable[[list[int]], int], *vals: int | None) -> int | None:
    have = [v for v in vals if v is not None]
    return pick(have) if have else None


def grow_window(w: StepWeights, marks: np.ndarray, fixed: int, limit: int) -> StepWindow:
    """The window around the slowest step that fits `limit` bytes with its events never
    dropped, `marks` (uberprof's marks per candidate step) and `fixed` (marks of no step),
    grown on the side with fewer steps so far; the slowest step alone when nothing more fits
    (or even it does not)."""
    a = i = j = w.slowest
    m = len(w.steps)

    def fits(lo: int, hi: int) -> bool:
        return 0 <= lo and hi < m and \
            w.never_dropped(lo, hi) + int(marks[lo:hi + 1].sum()) + fixed <= limit

    while True:
        sides = [(i, j + 1), (i - 1, j)] if j - a <= a - i else [(i - 1, j), (i, j + 1)]
        nxt = next((s for s in sides if fits(*s)), None)
        if nxt is None:
            return StepWindow(i, j, a)
        i, j = nxt
