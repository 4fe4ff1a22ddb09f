"""The report's operator and kernel views (the ones TensorBoard's profiler plugin had): host
operators by self and total time, device kernels by time with communication kernels apart,
summed over every rank's analysed steps, with each one's share and its spread across ranks.

Built once per diagnosis from the operator table `uberprof analyze` saved
(`derived/operators.parquet`, `tables/operators.py`) and the analysed steps, and saved in the
report document as `run.operators` (docs/json.md), so every view prints the same numbers and
none computes them. Shares: an operator's self (or total) time over the analysed steps' host
time of the ranks that have operators; a kernel's time over all device activity time (kernels,
communication kernels, copies and sets: "share of device time") and over the analysed steps'
time. The spread across ranks is per analysed step, so ranks traced over different numbers of
steps compare; a rank that never ran an operator counts as 0.

Host operators come twice: grouped by name (`operators`, key_averages()) and by name and input
shapes (`operators_by_shapes`, key_averages(group_by_input_shape=True)), from the one saved
table, whose rows keep the shapes where the trace recorded them (record_shapes); the views
offer both groupings and compute neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables.context import RunContext
from uberprof.ingest import classify as K
from uberprof.units import ns_to_ms as _ms

__all__ = ["TOP", "operators_doc", "run_operators"]

TOP = 30  # rows per list in the document; the full table is derived/operators.parquet
HOST_KINDS = (K.OPERATOR,)
KERNEL_KINDS = (K.KERNEL, K.MEMCPY, K.MEMSET)
COMM_KINDS = (K.COMM_KERNEL,)
DEVICE_KINDS = (*KERNEL_KINDS, *COMM_KINDS)
BASIS = ("sums over every rank's analysed steps (an operator in the step it starts in, device "
         "work in the step that launched it); operators grouped by name, and in "
         "operators_by_shapes by name and input shapes (where the trace recorded them); self "
         "time = total minus direct child operators on the same thread, as torch.profiler's "
         "key_averages(); spread: per rank, per analysed step")


def run_operators(ctx: RunContext, traced: pa.Table) -> dict[str, Any] | None:
    """`run.operators` of a diagnosed run; None when its operator table cannot be read (a
    derived folder written before uberprof saved one is analysed again, so this is damage)."""
    try:
        ops = ctx.operators()
    except (OSError, pa.ArrowException):
        return None
    return operators_doc(ops, traced)


def operators_doc(ops: pa.Table, traced: pa.Table, top: int = TOP) -> dict[str, Any]:
    """`run.operators` of the report document from the saved operator table (per rank, kind
    and name) and the analysed steps (RUN_STEP_SCHEMA): the top `top` host operators by self
    time, compute kernels (with copies and sets) and communication kernels by time."""
    steps = _rank_steps(traced)
    ops = ops.filter(pc.is_in(ops.column("rank"), value_set=pa.array(list(steps), pa.int64())))
    ranks = sorted(set(ops.column("rank").to_pylist()))
    step_ns = sum(steps[r][1] for r in ranks)
    device = ops.filter(pc.is_in(ops.column("kind"), value_set=pa.array(DEVICE_KINDS)))
    device_ns = int(pc.sum(device.column("incl_ns")).as_py() or 0)
    n_steps = np.array([max(steps[r][0], 1) for r in ranks], dtype=np.float64)
    ctx = _Ctx(ranks, n_steps, step_ns, device_ns)
    host, n_host = _rows(ops, HOST_KINDS, "self_ns", top, ctx)
    shaped, n_shaped = _rows(ops, HOST_KINDS, "self_ns", top, ctx, by_shapes=True)
    kernels, n_kernels = _rows(ops, KERNEL_KINDS, "incl_ns", top, ctx)
    comm, n_comm = _rows(ops, COMM_KINDS, "incl_ns", top, ctx)
    return {
        "basis": BASIS,
        "grouped_by": "name",
        "ranks": len(ranks),
        "rank_steps": int(sum(steps[r][0] for r in ranks)),
        "step_time_ms": _ms(step_ns),
        "device_time_ms": _ms(device_ns) if device.num_rows else None,
        "operators": [_host_entry(r, ctx) for r in host],
        "operators_total": n_host,
        "shapes_recorded": _shapes_recorded(ops),
        "operators_by_shapes": [{**_host_entry(r, ctx), "shapes": r["shapes"]} for r in shaped],
        "operators_by_shapes_total": n_shaped,
        "kernels": [_device_entry(r, ctx) for r in kernels],
        "kernels_total": n_kernels,
        "comm_kernels": [_device_entry(r, ctx) for r in comm],
        "comm_kernels_total": n_comm,
    }


@dataclass
class _Ctx:
    """What every row's shares and spread are relative to."""

    ranks: list[int]
    n_steps: np.ndarray  # analysed steps of each rank, in `ranks` order
    step_ns: int  # the analysed steps' host time, all ranks
    device_ns: int  # device activity time, all ranks

    @property
    def pos(self) -> dict[int, int]:
        return {r: i for i, r in enumerate(self.ranks)}


def _rank_steps(traced: pa.Table) -> dict[int, tuple[int, int]]:
    """rank -> (analysed steps, their host time in ns)."""
    out: dict[int, tuple[int, int]] = {}
    for r, t in zip(traced.column("rank").to_pylist(),
                    traced.column("step_time_ns").to_pylist()):
        n, ns = out.get(r, (0, 0))
        out[r] = (n + 1, ns + int(t or 0))
    return out


def _shapes_recorded(ops: pa.Table) -> bool:
    """Whether any host operator of the table has its input shapes (record_shapes)."""
    if "shapes" not in ops.column_names:
        return False
    host = ops.filter(pc.is_in(ops.column("kind"), value_set=pa.array(HOST_KINDS)))
    return host.column("shapes").null_count < host.num_rows


def _rows(ops: pa.Table, kinds: tuple[str, ...], by: str, top: int, ctx: _Ctx,
          by_shapes: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The `top` (kind, name) groups (`by_shapes`: (kind, name, shapes)) of `kinds` by `by`
    summed over ranks, each with its per-rank totals; and how many groups there are in all."""
    sub = ops.filter(pc.is_in(ops.column("kind"), value_set=pa.array(kinds)))
    if sub.num_rows == 0:
        return [], 0
    group = ["kind", "name"]
    if by_shapes:
        if "shapes" not in sub.column_names:
            sub = sub.append_column("shapes", pa.nulls(sub.num_rows, pa.string()))
        group.append("shapes")
    sums = sub.group_by(group).aggregate(
        [("calls", "sum"), ("self_ns", "sum"), ("incl_ns", "sum"), ("rank", "count_distinct")])
    sums = sums.sort_by([(f"{by}_sum", "descending"), ("name", "ascending")])
    chosen = sums.slice(0, top).to_pylist()
    keys = {tuple(r[g] for g in group): i for i, r in enumerate(chosen)}
    per_rank = np.zeros((len(chosen), len(ctx.ranks)), dtype=np.float64)
    pos = ctx.pos
    for *key, rank, v in zip(*(sub.column(c).to_pylist() for c in (*group, "rank", by))):
        i = keys.get(tuple(key))
        if i is not None:
            per_rank[i, pos[rank]] += v or 0
    for row, values in zip(chosen, per_rank):
        row["per_step"] = values / ctx.n_steps
    return chosen, sums.num_rows


def _spread(per_step: np.ndarray, ranks: list[int]) -> dict[str, Any]:
    """Min, median and max over ranks of a per-step time (ns), with the ranks of the extremes."""
    lo, hi = int(np.argmin(per_step)), int(np.argmax(per_step))
    return {"min": _ms(per_step[lo]), "median": _ms(float(np.median(per_step))),
            "max": _ms(per_step[hi]), "min_rank": ranks[lo], "max_rank": ranks[hi]}


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None


def _host_entry(r: dict[str, Any], ctx: _Ctx) -> dict[str, Any]:
    calls, self_ns, incl_ns = r["calls_sum"], r["self_ns_sum"], r["incl_ns_sum"]
    return {"name": r["name"], "calls": calls, "self_ms": _ms(self_ns), "total_ms": _ms(incl_ns),
            "self_mean_us": round(self_ns / calls / 1e3, 3) if calls else None,
            "mean_us": round(incl_ns / calls / 1e3, 3) if calls else None,
            "self_pct": _pct(self_ns, ctx.step_ns), "total_pct": _pct(incl_ns, ctx.step_ns),
            "ranks": r["rank_count_distinct"],
            "self_ms_per_step": _spread(r["per_step"], ctx.ranks)}


def _device_entry(r: dict[str, Any], ctx: _Ctx) -> dict[str, Any]:
    calls, ns = r["calls_sum"], r["incl_ns_sum"]
    return {"kind": r["kind"], "name": r["name"], "calls": calls, "time_ms": _ms(ns),
            "mean_us": round(ns / calls / 1e3, 3) if calls else None,
            "device_pct": _pct(ns, ctx.device_ns), "step_pct": _pct(ns, ctx.step_ns),
            "ranks": r["rank_count_distinct"],
            "ms_per_step": _spread(r["per_step"], ctx.ranks)}
