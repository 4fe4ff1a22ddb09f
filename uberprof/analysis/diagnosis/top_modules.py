"""The report's time per nn.Module (`run.modules`, docs/json.md, docs/modules.md): the model's
modules by total time over every rank's analysed steps, with self time (less child modules),
shares of the analysed steps' time and the spread across ranks per step.

Built once per diagnosis from the module table `uberprof analyze` saved
(`derived/modules.parquet`, `tables/modules.py`), so every view prints the same numbers. None
when the traces have no module spans (`uberprof run --modules`, or torch.profiler's own with
stacks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables.context import RunContext, rows_or_none
from uberprof.units import ns_to_ms as _ms

__all__ = ["TOP", "modules_doc", "run_modules"]

TOP = 30  # modules in the document; the full table is derived/modules.parquet
BASIS = ("sums over every rank's analysed steps (a module call in the step it starts in); "
         "forward calls only; total = the calls' durations; self = total minus direct child "
         "modules on the same thread; spread: per rank, per analysed step")


def run_modules(ctx: RunContext, traced: pa.Table) -> dict[str, Any] | None:
    """`run.modules` of a diagnosed run; None without module spans or a readable table."""
    mods = rows_or_none(ctx.modules)
    return modules_doc(mods, traced) if mods is not None else None


def modules_doc(mods: pa.Table, traced: pa.Table, top: int = TOP) -> dict[str, Any] | None:
    """`run.modules` from the saved module table (RUN_MODULE_SCHEMA) and the analysed steps
    (RUN_STEP_SCHEMA): the top `top` module paths by total time summed over ranks."""
    steps: dict[int, tuple[int, int]] = {}
    for r, t in zip(traced.column("rank").to_pylist(), traced.column("step_time_ns").to_pylist()):
        n, ns = steps.get(r, (0, 0))
        steps[r] = (n + 1, ns + int(t or 0))
    mods = mods.filter(pc.is_in(mods.column("rank"), value_set=pa.array(list(steps), pa.int64())))
    if not mods.num_rows:
        return None
    ranks = sorted(set(mods.column("rank").to_pylist()))
    pos = {r: i for i, r in enumerate(ranks)}
    n_steps = np.array([max(steps[r][0], 1) for r in ranks], dtype=np.float64)
    step_ns = sum(steps[r][1] for r in ranks)
    sums = mods.group_by(["module"]).aggregate(
        [("calls", "sum"), ("total_ns", "sum"), ("self_ns", "sum"), ("rank", "count_distinct")]
    ).sort_by([("total_ns_sum", "descending"), ("module", "ascending")])
    chosen = sums.slice(0, top).to_pylist()
    index = {r["module"]: i for i, r in enumerate(chosen)}
    per_rank = np.zeros((len(chosen), len(ranks)), dtype=np.float64)
    for m, rank, v in zip(*(mods.column(c).to_pylist() for c in ("module", "rank", "total_ns"))):
        i = index.get(m)
        if i is not None:
            per_rank[i, pos[rank]] += v or 0
    rows = []
    for r, values in zip(chosen, per_rank):
        calls, total, own = r["calls_sum"], r["total_ns_sum"], r["self_ns_sum"]
        per_step = values / n_steps
        lo, hi = int(np.argmin(per_step)), int(np.argmax(per_step))
        rows.append({
            "module": r["module"], "calls": calls, "total_ms": _ms(total), "self_ms": _ms(own),
            "mean_us": round(total / calls / 1e3, 3) if calls else None,
            "total_pct": _pct(total, step_ns), "self_pct": _pct(own, step_ns),
            "ranks": r["rank_count_distinct"],
            "total_ms_per_step": {"min": _ms(per_step[lo]),
                                  "median": _ms(float(np.median(per_step))),
                                  "max": _ms(per_step[hi]), "min_rank": ranks[lo],
                                  "max_rank": ranks[hi]},
        })
    return {
        "basis": BASIS,
        "sources": sorted(set(mods.column("source").to_pylist())),
        "ranks": len(ranks),
        "rank_steps": int(sum(steps[r][0] for r in ranks)),
        "step_time_ms": _ms(step_ns),
        "modules": rows,
        "modules_total": sums.num_rows,
    }


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None
