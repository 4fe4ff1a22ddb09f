"""The report's memory timeline per rank (`run.memory_timeline`, docs/json.md): from the
allocations and frees torch.profiler recorded in the trace windows (`uberprof run
--profile-memory`), each rank's peak allocated bytes per device in its analysed steps, the
moment of the peak (its step, the time into that step, the operator running then), and what
was allocated when the window's first event and last event came.

Built once per diagnosis from `derived/memory.parquet` (`tables/memory_timeline.py`). The
trace's [memory] events carry no category, so no split into parameters, gradients, optimizer
state and activations is given (`categories` is null; docs/json.md says why). None without
memory events.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.tables.context import RunContext, rows_or_none
from uberprof.units import ns_to_ms as _ms

__all__ = ["memory_timeline_doc", "run_memory_timeline"]

BASIS = ("torch.profiler's [memory] events (profile_memory) in the analysed steps: the "
         "allocator's total allocated bytes on the device after each allocation or free; the "
         "peak is the largest, at its first occurrence; operator: the innermost operator open "
         "on the allocating thread")
NO_CATEGORIES = ("the trace's [memory] events carry no category (parameters, gradients, "
                 "optimizer state, activations): totals only")
_COLS = ["rank", "ts", "device", "bytes", "total_allocated", "total_reserved", "step",
         "operator", "trace"]


def run_memory_timeline(ctx: RunContext, traced: pa.Table) -> dict[str, Any] | None:
    """`run.memory_timeline` of a diagnosed run; None without memory events."""
    mem = rows_or_none(ctx.memory_timeline)
    return memory_timeline_doc(mem, traced) if mem is not None else None


def _in_analysed_steps(mem: pa.Table, traced: pa.Table
                       ) -> tuple[pa.Table, dict[tuple[int, int], int]]:
    """The memory rows of the analysed steps (all of them for traces without steps), and each
    analysed (rank, step)'s host start."""
    rank = mem.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    step = mem.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    t_rank = traced.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    t_step = traced.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    big = np.int64(1 << 32)
    keep = np.isin(rank * big + step, t_rank * big + t_step)
    if not keep.any():  # traces without steps: the whole window
        keep = np.ones(mem.num_rows, dtype=bool)
    starts = {(r, s): h for r, s, h in zip(t_rank.tolist(), t_step.tolist(),
                                           traced.column("host_start_ns").to_pylist())}
    return mem.select(_COLS).filter(pa.array(keep)), starts


def memory_timeline_doc(mem: pa.Table, traced: pa.Table) -> dict[str, Any] | None:
    """One entry per rank and device (accelerators first), from RUN_MEMORY_TIMELINE_SCHEMA
    rows and the analysed steps (RUN_STEP_SCHEMA)."""
    mem, starts = _in_analysed_steps(mem, traced)
    cols = {c: mem.column(c).to_pylist() for c in ("device", "operator", "trace")}
    rank = mem.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    ts = mem.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    # totals are null where the trace does not give them (old traces: only each change's
    # bytes): then the peak, the first and last totals and the reserved bytes are unknown
    known = mem.column("total_allocated").is_valid().to_numpy(zero_copy_only=False)
    total = mem.column("total_allocated").fill_null(0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    res_col = mem.column("total_reserved")
    res_known = res_col.is_valid().to_numpy(zero_copy_only=False)
    reserved = res_col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    delta = mem.column("bytes").to_numpy(zero_copy_only=False).astype(np.int64)
    step = mem.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    groups: dict[tuple[int, str], list[int]] = {}
    for i, (r, d) in enumerate(zip(rank.tolist(), cols["device"])):
        groups.setdefault((r, d), []).append(i)
    entries = []
    for (r, d), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == "cpu",
                                                               kv[0][1])):
        idx = np.asarray(rows)
        idx = idx[np.argsort(ts[idx], kind="stable")]
        all_idx = idx
        if known[idx].any():
            idx = idx[known[idx]]
        p = int(idx[int(np.argmax(total[idx]))])
        has = bool(known[p])
        first, last = int(idx[0]), int(idx[-1])
        start = starts.get((r, int(step[p])))
        first_start = starts.get((r, int(step[all_idx].min())))
        res = all_idx[res_known[all_idx]]
        entries.append({
            "rank": r, "device": d, "trace": cols["trace"][p], "events": int(all_idx.size),
            "steps": [int(step[all_idx].min()), int(step[all_idx].max())],
            "peak_allocated_bytes": int(total[p]) if has else None,
            "peak_step": int(step[p]) if has and step[p] >= 0 else None,
            "peak_in_step_ms": _ms(int(ts[p]) - int(start))
            if has and start is not None else None,
            "peak_operator": cols["operator"][p] if has else None,
            # the rank's own clock (ns), for views that draw the window's timeline
            "peak_ns": int(ts[p]) if has else None,
            "start_ns": int(first_start) if first_start is not None else int(ts[all_idx[0]]),
            "first_allocated_bytes": int(total[first] - delta[first]) if has else None,
            "last_allocated_bytes": int(total[last]) if has else None,
            "max_reserved_bytes": int(reserved[res].max())
            if d != "cpu" and res.size else None,
            "categories": None,
        })
    return {"basis": BASIS, "categories": None, "categories_note": NO_CATEGORIES,
            "ranks": entries} if entries else None
