"""Operators and kernels of one rank: calls, self time and inclusive time; what `diff` compares
between runs and the straggler finding between ranks (`diagnosis/op_excess.py`).

Host operators nest (aten::linear calls aten::addmm ...), so their inclusive times double count
across levels. Comparisons rank them by **self time** (inclusive minus the direct children
on the same thread): self times of a thread add up to at most its busy time, so their deltas
can be set against the change in step time. Device activity (kernels, copies, sets) does not
nest: its time is its duration. Operators are matched between runs by kind and name (the event
table does not keep input shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables.metrics import kind_mask
from uberprof.ingest import classify as K

__all__ = ["OP_KINDS", "OpStat", "rank_ops", "self_times"]

DEVICE_OP_KINDS = (K.KERNEL, K.COMM_KERNEL, K.MEMCPY, K.MEMSET)
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
    """Each event's duration minus its direct children's on the same thread (events nest)."""
    n = ts.size
    out = dur.astype(np.int64).copy()
    order = np.lexsort((-dur, ts, tid))
    stack: list[int] = []  # indices of the open ancestors
    ends = ts + dur
    last_tid = None
    for i in order.tolist():
        if tid[i] != last_tid:
            stack.clear()
            last_tid = tid[i]
        while stack and ends[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            out[stack[-1]] -= min(dur[i], ends[stack[-1]] - ts[i])
        stack.append(i)
    return np.maximum(out, 0) if n else out


def rank_ops(events: pa.Table, steps: set[int] | None) -> dict[tuple[str, str], OpStat]:
    """Totals (not yet per step) of one rank's operators and kernels in `steps` (None: all)."""
    keep = kind_mask(events, OP_KINDS)
    if steps is not None and "step" in events.column_names:
        step = events.column("step").to_numpy(zero_copy_only=False)
        keep &= np.isin(step, np.fromiter(steps, dtype=np.int64))
    ev = events.filter(pa.array(keep)).select(["kind", "name", "ts", "dur", "tid"])
    if ev.num_rows == 0:
        return {}
    ts = ev.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
    dur = np.nan_to_num(ev.column("dur").to_numpy(zero_copy_only=False).astype(np.float64)
                        ).astype(np.int64)
    tid = ev.column("tid").to_numpy(zero_copy_only=False).astype(np.int64)
    self_ns = dur.copy()
    host = kind_mask(ev, (K.OPERATOR,))
    if host.any():
        self_ns[host] = self_times(tid[host], ts[host], dur[host])
    sums = pa.table({"kind": pc.cast(ev.column("kind"), pa.string()),
                     "name": pc.cast(ev.column("name"), pa.string()),
                     "self": self_ns, "dur": dur}).group_by(["kind", "name"]).aggregate(
        [("dur", "count"), ("self", "sum"), ("dur", "sum")])
    return {(k, nm): OpStat(k, nm, float(c), float(s), float(d)) for k, nm, c, s, d in zip(
        *(sums.column(c).to_pylist() for c in ("kind", "name", "dur_count", "self_sum",
                                               "dur_sum")))}
