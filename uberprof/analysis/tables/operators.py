"""Operators and kernels of one rank: calls, self time and inclusive time; what `diff` compares
between runs and the straggler finding between ranks (`diagnosis/op_excess.py`).

Host operators nest (aten::linear calls aten::addmm ...), so their inclusive times double count
across levels. Comparisons rank them by **self time** (inclusive minus the direct children
on the same thread): self times of a thread add up to at most its busy time, so their deltas
can be set against the change in step time. Device activity (kernels, copies, sets) does not
nest: its time is its duration. Operators are matched between runs by kind and name (`rank_ops`:
what `diff` and the straggler finding compare), whatever their input shapes.

`operator_table` is what `uberprof analyze` saves of one trace (derived `operators.parquet`, per
input, then per rank): every operator's and kernel's calls, self and inclusive time over the
trace's steps, so that the report, `diff` and the straggler finding read one small table instead
of each rank's events. Self times are worked out over the whole trace before the steps are
selected, so an operator's self time never depends on whether its parent started in the window.
These are the numbers of torch.profiler's `key_averages()` (self and total CPU time, count) for
host operators (tests/unit/test_operator_table.py checks them on a real job). The saved table
keeps host operators apart by input shapes where the trace recorded them (`shapes`, the
`Input Dims` the ingest keeps when the job profiled with record_shapes, which `uberprof run`
does on CPU ranks): its rows are key_averages(group_by_input_shape=True)'s, and summing them over
`shapes` gives key_averages()'s by name (`by_name`). Keeping the finer grouping costs a few rows
per operator, and no view needs a second pass over the events to offer both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables.metrics import kind_mask
from uberprof.analysis.tables.schemas import OPERATOR_SCHEMA
from uberprof.ingest import classify as K

__all__ = ["DEVICE_OP_KINDS", "OP_KINDS", "OpStat", "by_name", "operator_table", "rank_ops",
           "self_times", "text_codes"]

DEVICE_OP_KINDS = (K.KERNEL, K.COMM_KERNEL, K.MEMCPY, K.MEMSET)
# CUDA runtime calls (cudaLaunchKernel, cudaMemcpyAsync, synchronisations) inside an operator
# are its children: key_averages() leaves their time out of the operator's self CPU time (on an
# H100 trace, aten::mm's self time is 72% of its total: the rest is launching its kernels).
_RUNTIME_KINDS = (K.RUNTIME, K.SYNC)
OP_KINDS = (K.OPERATOR, *DEVICE_OP_KINDS)


@dataclass
class OpStat:
    """One operator or kernel: totals of one rank, or per-step averages over compared ranks."""

    kind: str
    name: str
    calls: float = 0.0  # per step
    self_ns: float = 0.0  # per step
    incl_ns: float = 0.0  # per step


def self_times(tid: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Each event's duration minus its direct children's on the same thread (events nest).

    Columnar, per thread: with events in start order (the longer first on a tie), an event's
    depth is how many earlier ones are still open at its start, and its parent the latest
    earlier event one level up. Zero-length events give and take nothing. A thread whose events
    do not nest (a child ending after its parent: clock rounding) takes the ordered walk
    (`_walk`), the same rule one event at a time. 4-5x faster than the walk alone on the shared
    GPU traces (25.6 -> 5.7 ms on 23,038 host events), with identical results on all of them."""
    out = dur.astype(np.int64).copy()
    if ts.size == 0:
        return out
    order = np.lexsort((-dur, ts, tid))
    cuts = np.flatnonzero(np.diff(tid[order])) + 1
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, ts.size].tolist()):
        idx = order[lo:hi]
        idx = idx[dur[idx] > 0]
        if idx.size >= 2:
            out[idx] = _thread_self_times(ts[idx].astype(np.int64), dur[idx].astype(np.int64))
    return np.maximum(out, 0)


def _thread_self_times(s: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Self times of one thread's events, given in start order (longer first on a tie)."""
    e = s + d
    n = s.size
    pos = np.arange(n, dtype=np.int64)
    depth = pos - np.searchsorted(np.sort(e), s, side="right")  # earlier events still open
    keys = np.sort(depth * n + pos)
    at = np.searchsorted(keys, (depth - 1) * n + pos, side="left") - 1  # latest one level up
    parent = keys[np.clip(at, 0, None)] % n
    ok = (depth > 0) & (at >= 0) & (keys[np.clip(at, 0, None)] // n == depth - 1)
    ok &= e[np.where(ok, parent, 0)] > s
    child, parent = pos[ok], parent[ok]
    if (e[child] > e[parent]).any():
        return _walk(s, d)
    give = np.minimum(d[child], e[parent] - s[child])
    return d - np.bincount(parent, weights=give, minlength=n).astype(np.int64)


def _walk(s: np.ndarray, d: np.ndarray) -> np.ndarray:
    """`_thread_self_times` one event at a time: a stack of the open ancestors; each event
    takes its time (up to its parent's end) from the innermost one still open at its start."""
    out = d.copy()
    e = s + d
    stack: list[int] = []
    for i in range(s.size):
        while stack and e[stack[-1]] <= s[i]:
            stack.pop()
        if stack:
            out[stack[-1]] -= min(d[i], e[stack[-1]] - s[i])
        stack.append(i)
    return out


def rank_ops(events: pa.Table, steps: set[int] | None) -> dict[tuple[str, str], OpStat]:
    """Totals (not yet per step) of one rank's operators and kernels in `steps` (None: all)."""
    sums = _sums(events, steps)
    return {(k, nm): OpStat(k, nm, float(c), float(s), float(d)) for k, nm, c, s, d in zip(
        *(sums.column(c).to_pylist() for c in ("kind", "name", "calls", "self_ns", "incl_ns")))}


def operator_table(events: pa.Table) -> pa.Table:
    """OPERATOR_SCHEMA rows of one trace's events (with their `step`): per kind, name and input
    shapes (operators that recorded them; null otherwise), the calls, self and inclusive time
    of its steps' events (an event belongs to the step it starts in, device work to the step
    that launched it); of the whole trace when it has no step annotation (the diagnosis then
    analyses it as one pseudo-step). Largest self time first, ties by name, kind and shapes
    (so the order never depends on how the rows were grouped)."""
    steps: set[int] | None = None
    if "step" in events.column_names:
        step = events.column("step").to_numpy(zero_copy_only=False)
        if (step >= 0).any():
            steps = {int(s) for s in np.unique(step[step >= 0])}
    return _sums(events, steps, by_shapes=True).sort_by(
        [("self_ns", "descending"), ("name", "ascending"), ("kind", "ascending"),
         ("shapes", "ascending")])


def by_name(ops: pa.Table, keys: tuple[str, ...] = ("kind", "name")) -> pa.Table:
    """An operator table (OPERATOR_SCHEMA, or the run's with `rank` among `keys`) summed over
    input shapes: `keys` and calls, self_ns and incl_ns, as key_averages() groups by name."""
    sums = ops.group_by(list(keys)).aggregate(
        [("calls", "sum"), ("self_ns", "sum"), ("incl_ns", "sum")])
    return pa.table({**{k: sums.column(k) for k in keys},
                     **{c: sums.column(f"{c}_sum") for c in ("calls", "self_ns", "incl_ns")}})


def _sums(events: pa.Table, steps: set[int] | None, by_shapes: bool = False) -> pa.Table:
    """OPERATOR_SCHEMA: calls, self and inclusive ns by kind and name (and, `by_shapes`, input
    shapes; else `shapes` is null) of the events in `steps` (None: all). Self times are
    computed over every operator of the trace first (see the module docstring), then the
    steps are selected.

    Grouped on the columns' dictionary codes, the strings looked up once per group: filtering
    the table and casting its name and shapes columns to text copied the events' columns, the
    memory peak of a gigabyte trace's analysis (2.1x its JSON; benchmarks/README.md)."""
    rows = np.flatnonzero(kind_mask(events, OP_KINDS + _RUNTIME_KINDS))
    if rows.size == 0:
        return OPERATOR_SCHEMA.empty_table()
    ts = _ints(events.column("ts"), rows)
    dur = _ints(events.column("dur"), rows)
    tid = _ints(events.column("tid"), rows)
    kind, kinds = text_codes(events.column("kind"))
    kind = kind[rows]
    runtime = np.isin(kind, [i for i, k in enumerate(kinds) if k in _RUNTIME_KINDS])
    self_ns = dur.copy()
    host = runtime | np.isin(kind, [i for i, k in enumerate(kinds) if k == K.OPERATOR])
    if host.any():
        self_ns[host] = self_times(tid[host], ts[host], dur[host])
    del ts, tid, host
    keep = ~runtime  # children only: they are no rows of the table
    if steps is not None and "step" in events.column_names:
        keep &= np.isin(_ints(events.column("step"), rows),
                        np.fromiter(steps, dtype=np.int64))
    rows = rows[keep]
    name, names = text_codes(events.column("name"))
    parts = [(kind[keep], kinds), (name[rows], names)]
    del name
    if by_shapes and "shapes" in events.column_names:
        shape, shapes = text_codes(events.column("shapes"))
        parts.append((shape[rows], shapes))
        del shape
    return _grouped(parts, self_ns[keep], dur[keep])


def _ints(column: pa.ChunkedArray, rows: np.ndarray) -> np.ndarray:
    """`column[rows]` as int64 (nulls as 0)."""
    if column.null_count:
        column = pc.fill_null(column, 0)
    return column.to_numpy().astype(np.int64, copy=False)[rows]


def text_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A text column as int64 codes into its distinct values (-1: null), and those values:
    each event's position in the dictionary, no string per event."""
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    distinct: dict[str, int] = {}
    remap = np.array([-1 if v is None else distinct.setdefault(v, len(distinct))
                      for v in arr.dictionary.to_pylist()] + [-1], dtype=np.int64)
    idx = pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return remap[idx], list(distinct)


def _grouped(parts: list[tuple[np.ndarray, list[str]]], self_ns: np.ndarray,
             dur: np.ndarray) -> pa.Table:
    """OPERATOR_SCHEMA rows: one per distinct (kind, name[, shapes]) of `parts` (codes and
    their values), groups in order of first appearance, then largest self time first."""
    key = np.zeros(self_ns.size, dtype=np.int64)
    for codes, values in parts:  # one int64 per group while the product fits; else pairs
        if (len(values) + 1) * (int(key.max(initial=0)) + 1) >= 2**62:
            _, key = np.unique(key, return_inverse=True)
        key = key * (len(values) + 1) + (codes + 1)
    _, first, group = np.unique(key, return_index=True, return_inverse=True)
    group = np.argsort(np.argsort(first, kind="stable"), kind="stable")[group.reshape(-1)]
    n = first.size
    at = np.sort(first)  # each group's first row, in group order
    calls = np.bincount(group, minlength=n).astype(np.int64)
    order = np.argsort(group, kind="stable")
    bounds = np.r_[0, np.cumsum(calls)[:-1]]
    self_sum = np.add.reduceat(self_ns[order], bounds) if n else calls
    incl_sum = np.add.reduceat(dur[order], bounds) if n else calls

    def text(i: int) -> pa.Array:
        if i >= len(parts):
            return pa.nulls(n, pa.string())
        codes, values = parts[i]
        return pa.array([values[c] if c >= 0 else None for c in codes[at].tolist()],
                        pa.string())

    return pa.table({"kind": text(0), "name": text(1), "shapes": text(2), "calls": calls,
                     "self_ns": self_sum.astype(np.int64), "incl_ns": incl_sum.astype(np.int64)},
                    schema=OPERATOR_SCHEMA)
