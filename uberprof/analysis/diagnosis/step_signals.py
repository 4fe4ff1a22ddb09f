"""Straggler and data-stall indications from the step timelines alone, while the job runs.

Before a trace window is analysed, the only evidence is each rank's host step time and data
wait per step (`steps.jsonl`). The indications are held to the diagnosis's own rules, not to
thresholds of their own:

- **Straggler**: each of the last `WINDOW` steps that every rank finished is one instance, and
  a rank's lateness in it is its step time (then, separately, its data wait) beyond the fastest
  rank's. `stragglers.straggler_test` decides, with its sole-last frequency
  test (Poisson-binomial, Bonferroni over ranks) and its materiality rules: confirmed,
  suspected, or nothing. In a synchronous job (DDP) ranks wait for each other, so step times
  are alike and only a data-loader straggler shows in them; where the run has busy time
  (`busy.py`: the training thread's CPU time, CPU runs), the same test on it shows a
  rank that computes more. The trace window tells the rest.
- **Data stall**: a rank whose data wait is at least the diagnosis's `MIN_SHARE` of its step
  time over the window; its confidence is `evidence.count_test`'s (too few
  steps: suspected).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from uberprof.analysis.diagnosis.busy import followed_busy
from uberprof.analysis.diagnosis.evidence import count_test
from uberprof.analysis.diagnosis.lateness import Series, matrix_lateness
from uberprof.analysis.diagnosis.model import MIN_SHARE
from uberprof.analysis.diagnosis.stragglers import BASIS_STEP_TIMELINE, straggler_test

if TYPE_CHECKING:
    from uberprof.rundir.follow import RunFollower

__all__ = ["WINDOW", "Signal", "followed_signals", "step_signals"]

WINDOW = 100  # the latest steps every rank finished: what "now" means for an indication


@dataclass(frozen=True)
class Signal:
    """One indication: what, on which rank, how sure, and the test behind it in words."""

    kind: str  # "straggler" | "data_stall" (the finding kinds of the diagnosis)
    rank: int
    confidence: str  # "confirmed" | "suspected"
    title: str
    test: dict[str, Any]  # evidence.Test.as_dict()


def _matrix(series: Sequence[Series], window: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(ranks, steps, values[rank, step]) over the latest `window` steps that every rank has."""
    last = min(int(s[-1]) for _, s, _ in series)
    lo = last - window + 1
    m = np.full((len(series), window), np.nan)
    for i, (_, s, v) in enumerate(series):
        a, b = np.searchsorted(s, lo), np.searchsorted(s, last, side="right")  # s is in order
        m[i, s[a:b] - lo] = v[a:b]
    done = ~np.isnan(m).any(axis=0)
    return [r for r, _, _ in series], np.arange(lo, last + 1)[done], m[:, done]


def _straggler(ranks: list[int], steps: np.ndarray, times: np.ndarray, waits: np.ndarray,
               busy: tuple[np.ndarray, np.ndarray] | None) -> Signal | None:

    median_step = float(np.median(times))
    wall = float(times.max(axis=0).sum())  # the ranks run in parallel
    bases = [("step time", steps, times), ("data wait", steps, waits)]
    if busy is not None:
        bases.append(("CPU time", *busy))
    for what, s, m in bases:
        t = straggler_test(matrix_lateness(ranks, s, m, what), median_step, wall,
                           basis=BASIS_STEP_TIMELINE)
        if t is None or t.decision == "none":
            continue
        verb = "is a straggler" if t.decision == "confirmed" else \
            "may be a straggler (suspected)"
        title = (f"rank {t.rank} {verb}: the longest {what} in {t.last} of the last "
                 f"{t.instances} steps, {t.median_lead_ns / 1e6:,.1f} ms over the others' "
                 "median")
        return Signal("straggler", t.rank, t.decision, title, t.as_test().as_dict())
    return None


def _data_stall(ranks: list[int], times: np.ndarray, waits: np.ndarray) -> Signal | None:

    share = waits.sum(axis=1) / np.maximum(times.sum(axis=1), 1)
    hit = np.flatnonzero(share >= MIN_SHARE)
    if not hit.size:
        return None
    i = int(hit[np.argmax(share[hit])])
    rank, steps = ranks[i], int(times.shape[1])
    pct = 100 * float(share[i])
    confidence, test = count_test(
        f"data wait on rank {rank}, {pct:.0f}% of its step time over the last {steps} step(s) "
        f"(threshold {100 * MIN_SHARE:.0f}%)", int((waits[i] > 0).sum()), steps)
    title = (f"rank {rank} waits for data {pct:.0f}% of its step time"
             + (f" ({hit.size} ranks over {100 * MIN_SHARE:.0f}%)" if hit.size > 1 else "")
             + ("" if confidence == "confirmed" else " (suspected)"))
    return Signal("data_stall", rank, confidence, title, test.as_dict())


def step_signals(times: Sequence[Series], waits: Sequence[Series], window: int = WINDOW,
                 busy: Sequence[Series] | None = None) -> list[Signal]:
    """The indications of the latest `window` steps every rank finished: `times` and `waits`
    are per rank (rank, steps, step time ns) and (rank, steps, data wait ns), in step order
    (`RunFollower.series`); `busy`, where the run has busy time, likewise
    (`analysis.busy.followed_busy`). None before any step."""
    times = [x for x in times if x[1].size]
    if not times:
        return []
    ranks, steps, t = _matrix(times, window)
    by_rank = {r: (s, v) for r, s, v in waits}
    _, _, w = _matrix([(r, *by_rank.get(r, (s, np.zeros_like(v)))) for r, s, v in times], window)
    if not steps.size or w.shape != t.shape:
        return []
    w = np.nan_to_num(w)
    b = None
    busy_of = {r: (s, v) for r, s, v in busy or () if s.size}
    if busy_of.keys() == set(ranks):  # every rank, or no busy basis at all
        _, b_steps, b_m = _matrix([(r, *busy_of[r]) for r in ranks], window)
        b = (b_steps, b_m) if b_steps.size else None
    out = [_straggler(ranks, steps, t, w, b) if len(ranks) > 1 else None,
           _data_stall(ranks, t, w)]
    return [s for s in out if s is not None]


def followed_signals(follower: RunFollower, window: int = WINDOW) -> list[Signal]:
    """The indications of a run followed while its job runs (`uberprof watch`, the live
    dashboard): step time, data wait and, where the run has it, busy time per rank."""
    return step_signals(follower.series("duration_ns"), follower.series("data_wait_ns"), window,
                        busy=followed_busy(follower, window))
