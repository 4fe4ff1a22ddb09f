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


def memory_timeline_doc(mem: pa.Table, traced: pa.Table) -> dict[str, Any] | None:
    """One entry per rank and device (accelerators first), from RUN_MEMORY_TIMELINE_SCHEMA
    rows and the analysed steps (RUN_STEP_SCHEMA)."""
    rank = mem.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    step = mem.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    t_rank = traced.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    t_step = traced.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
    big = np.int64(1 << 32)
    keep = np.isin(rank * big + step, t_rank * big + t_step)
    if not keep.any():  # traces without steps: the whole window
        keep = np.ones(mem.num_rows, dtype=bool)
    mem = mem.select(_COLS).filter(pa.array(keep))
    starts = {(r, s): h for r, s, h in zip(t_rank.tolist(), t_step.tolist(),
                                           traced.column("host_start_ns").to_pylist())}
    cols = {c: mem.column(c).to_pylist() for c in ("device", "operator", "trace")}
    rank = mem.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    ts = mem.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    total = mem.column("total_allocated").to_numpy(zero_copy_only=False).astype(np.int64)
    reserved = mem.column("total_reserved").to_numpy(zero_copy_only=False).astype(np.int64)
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
        p = int(idx[int(np.argmax(total[idx]))])
        first, last = int(idx[0]), int(idx[-1])
        start = starts.get((r, int(step[p])))
        first_start = starts.get((r, int(step[idx].min())))
        entries.append({
            "rank": r, "device": d, "trace": cols["trace"][p], "events": int(idx.size),
            "steps": [int(step[idx].min()), int(step[idx].max())],
            "peak_allocated_bytes": int(total[p]),
            "peak_step": int(step[p]) if step[p] >= 0 else None,
            "peak_in_step_ms": _ms(int(ts[p]) - int(start)) if start is not None else None,
            "peak_operator": cols["operator"][p],
            # the rank's own clock (ns), for views that draw the window's timeline
            "peak_ns": int(ts[p]),
            "start_ns": int(first_start) if first_start is not None else int(ts[first]),
            "first_allocated_bytes": int(total[first] - delta[first]),
            "last_allocated_bytes": int(total[last]),
            "max_reserved_bytes": int(reserved[idx].max()) if d != "cpu" else None,
            "categories": None,
        })
    return {"basis": BASIS, "categories": None, "categories_note": NO_CATEGORIES,
            "ranks": entries} if entries else None
