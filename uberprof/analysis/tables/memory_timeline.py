"""A trace's memory timeline: its `[memory]` events (`uberprof run --profile-memory`, ingest's
`IngestedTrace.memory`) with the step each falls in and the operator running then, what
`uberprof analyze` saves as `memory.parquet` (per input, then per rank in
`derived/memory.parquet`) and the report's `run.memory_timeline` reads
(`diagnosis/memory_timeline.py`).

The operator of an event is the innermost host operator open on the allocating thread at its
time (the one that allocated or freed). The events carry no category (parameters, gradients,
optimizer state, activations): see ingest/memory.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from uberprof.analysis.tables.metrics import kind_mask
from uberprof.analysis.tables.schemas import MEMORY_TIMELINE_SCHEMA
from uberprof.ingest import classify as K

__all__ = ["memory_timeline", "open_operator"]


def memory_timeline(memory: pa.Table | None, events: pa.Table, step: np.ndarray) -> pa.Table:
    """MEMORY_TIMELINE_SCHEMA rows: the trace's memory events (MEMORY_SCHEMA) with `step`
    (each event's step, -1 outside every step) and `operator`."""
    if memory is None or not memory.num_rows:
        return MEMORY_TIMELINE_SCHEMA.empty_table()
    ts = memory.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    tid = memory.column("tid").to_numpy(zero_copy_only=False).astype(np.int64)
    op = open_operator(events, ts, tid)
    return pa.table({
        "ts": memory.column("ts"),
        "device": memory.column("device").cast(pa.string()),
        "bytes": memory.column("bytes"),
        "total_allocated": memory.column("total_allocated"),
        "total_reserved": memory.column("total_reserved"),
        "step": pa.array(step, pa.int64()),
        "operator": op,
    }, schema=MEMORY_TIMELINE_SCHEMA)


def open_operator(events: pa.Table, ts: np.ndarray, tid: np.ndarray) -> pa.Array:
    """For each time `ts` on thread `tid`, the name of the innermost operator open there
    (null where none is)."""
    out: list[str | None] = [None] * ts.size
    m = kind_mask(events, (K.OPERATOR, K.COMM_OP, K.OPTIMIZER)) if events.num_rows else None
    if m is None or not m.any() or not ts.size:
        return pa.array(out, pa.string())
    ops = events.filter(pa.array(m))
    o_ts = ops.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    o_end = o_ts + ops.column("dur").to_numpy(zero_copy_only=False).astype(np.int64)
    o_tid = ops.column("tid").to_numpy(zero_copy_only=False).astype(np.int64)
    names = ops.column("name").cast(pa.string()).to_pylist()
    for t in np.unique(tid).tolist():
        rows = np.flatnonzero(o_tid == t)
        if not rows.size:
            continue
        rows = rows[np.lexsort((-(o_end[rows] - o_ts[rows]), o_ts[rows]))]
        starts, ends = o_ts[rows], o_end[rows]
        parent = _parents(starts, ends)
        for i in np.flatnonzero(tid == t).tolist():
            j = int(np.searchsorted(starts, ts[i], side="right")) - 1
            while j >= 0 and ends[j] < ts[i]:
                j = parent[j]
            if j >= 0:
                out[i] = names[rows[j]]
    return pa.array(out, pa.string())


def _parents(starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Each interval's innermost enclosing one (-1: none), intervals sorted by start, longer
    first on ties."""
    parent = [-1] * starts.size
    stack: list[int] = []
    for i in range(starts.size):
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return parent
