"""Step time with its basis stated, the profiler's inflation of traced steps, and uberprof's own
cost (the step right after each trace window: the profiler's teardown and trace write).

The step timeline (steps.jsonl) has every step of every rank; a step's wall time is its longest
rank's host window. Three groups of steps: *traced* (inside a trace window), *after a window*
(the step that follows one: uberprof's own cost) and *untraced* (the rest, less the first step,
which pays start-up: the baseline). Each group's median comes with a 95% distribution-free
interval (order statistics of the binomial). `profiler_inflation` is the traced median over the
untraced median: how much slower tracing made the analysed steps, which skews every share the
report computes from them. Its interval divides the intervals' ends.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["median_interval", "own_cost_steps", "step_time_doc", "step_walls"]

CONFIDENCE = 0.95


def median_interval(x: np.ndarray, confidence: float = CONFIDENCE
                    ) -> tuple[float, float] | None:
    """A distribution-free `confidence` interval of the median of `x` (order statistics j, k
    with Binomial(n, 1/2) mass between them >= confidence); None when `x` is too short."""
    xs = np.sort(np.asarray(x, dtype=np.float64))
    n = xs.size
    # (x_(j), x_(n-1-j)) covers the median with probability 1 - 2 P(B <= j): the largest j
    # that keeps it >= confidence. Exact integers: 2**n overflows a float from n = 1024, and
    # comb(n, i) one by one costs seconds at n = 10,000.
    limit = Fraction((1 - confidence) / 2) * (1 << n)  # P(B <= j) * 2**n may not exceed it
    j, total, c = -1, 0, 1  # c: comb(n, i)
    for i in range(n + 1):
        total += c
        if total > limit:
            break
        j = i
        c = c * (n - i) // (i + 1)
    if n == 0 or j < 0:
        return None
    return float(xs[j]), float(xs[n - 1 - j])


def step_walls(steps: pa.Table) -> dict[int, tuple[int, bool]]:
    """Per step: its wall time (the longest rank's host window, ns) and whether it was traced
    on any rank; in step order. Grouped in Arrow: 512 ranks x 10,000 steps are 5 M rows."""
    import pyarrow.compute as pc

    t = steps.select(["step", "step_time_ns", "traced"])
    t = t.filter(pc.and_(pc.greater_equal(t.column("step"), 0), t.column("step_time_ns")
                         .is_valid()))
    t = t.set_column(2, "traced", pc.fill_null(t.column("traced"), False))
    g = t.group_by("step").aggregate([("step_time_ns", "max"), ("traced", "any")]) \
        .sort_by("step")
    return {s: (max(w, 0), tr) for s, w, tr in zip(g.column("step").to_pylist(),
                                                 g.column("step_time_ns_max").to_pylist(),
                                                 g.column("traced_any").to_pylist(),
                                                 strict=True)}


def own_cost_steps(walls: dict[int, tuple[int, bool]]) -> tuple[int | None, list[int]]:
    """The first step (it pays start-up) and the steps right after each trace window
    (uberprof's own cost), of `step_walls`: left out of every baseline."""
    traced = {s for s, (_, t) in walls.items() if t}
    after = sorted(s for s in walls if s not in traced and (s - 1) in traced)
    return (min(walls) if walls else None), after


def _group(x: list[int]) -> dict[str, Any]:
    if not x:
        return {"steps": 0, "median_ms": None, "interval_ms": None}
    iv = median_interval(np.asarray(x))
    return {"steps": len(x), "median_ms": round(float(np.median(x)) / 1e6, 3),
            "interval_ms": [round(iv[0] / 1e6, 3), round(iv[1] / 1e6, 3)] if iv else None}


def step_time_doc(steps: pa.Table, median_step_ns: float | None) -> dict[str, Any]:
    """`run.step_time` of the report document (see the module docstring)."""
    walls = step_walls(steps)
    traced = {s for s, (_, t) in walls.items() if t}
    first, after = own_cost_steps(walls)
    untraced = [w for s, (w, t) in sorted(walls.items())
                if not t and s not in after and s != first]
    tr = _group([walls[s][0] for s in sorted(traced)])
    un = _group(untraced)
    af = _group([walls[s][0] for s in after])
    inflation = interval = None
    if tr["median_ms"] and un["median_ms"]:
        inflation = round(tr["median_ms"] / un["median_ms"], 2)
        if tr["interval_ms"] and un["interval_ms"] and un["interval_ms"][0] > 0:
            interval = [round(tr["interval_ms"][0] / un["interval_ms"][1], 2),
                        round(tr["interval_ms"][1] / un["interval_ms"][0], 2)]
    own = None
    if after and un["median_ms"] is not None:
        own = round(sum(max(walls[s][0] / 1e6 - un["median_ms"], 0.0) for s in after), 3)
    return {
        "median_ms": round(median_step_ns / 1e6, 3) if median_step_ns else None,
        "basis": "median host step window over every rank's analysed (traced) steps; "
                 "traced steps run under the profiler (see profiler_inflation)",
        "traced": tr, "untraced": un, "after_trace": {**af, "steps_list": after},
        "interval_basis": f"{100 * CONFIDENCE:.0f}% distribution-free interval of the median "
                          "of per-step wall times (longest rank)",
        "profiler_inflation": inflation, "profiler_inflation_interval": interval,
        "uberprof_cost_ms": own,
        "uberprof_cost_basis": "the steps right after each trace window (profiler teardown, "
                               "trace write), beyond the untraced median",
    }
