"""Idle gaps: maximal device-idle intervals over a threshold, and why the device was idle.

Per docs/DESIGN.md the cause is the first that applies:

- `data`:   the host spent at least half the gap inside a data-loader fetch;
- `sync`:   the host was blocked in a synchronisation (cudaStreamSynchronize, ...) during it;
- `launch`: the work that ended the gap was launched only after the gap began, while the host
            was busy with other operators most of that time (launch-bound eager mode);
- `host`:   it was launched late while the host did something else (an optimizer step on the
            CPU, Python between operators, untraced work);
- `other`:  the work was already queued (a dependency on another stream or device), or the
            trace does not link launches.

On CPU-only ranks (Gloo) the training threads' operators play the device: a gap is time with
neither an operator nor a Gloo collective running, so its cause is `data` or `host`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.causes import GAP_CAUSES
from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables import metrics as M
from uberprof.ingest import classify as K

__all__ = [
    "CAUSES",
    "DEFAULT_THRESHOLD_NS",
    "GAP_SCHEMA",
    "RankGaps",
    "gap_context",
    "idle_gaps",
    "main_thread",
]

DEFAULT_THRESHOLD_NS = 50_000
CAUSES = tuple(GAP_CAUSES)  # the order causes are tested in (module docstring)

GAP_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("start_ns", pa.int64()),  # the rank's own clock
    ("end_ns", pa.int64()),
    ("dur_ns", pa.int64()),
    ("cause", pa.string()),
    ("next_launch_ns", pa.int64()),  # host time the work ending the gap was launched (-1: unknown)
    ("before", pa.string()),  # the activity that ended just before the gap
    ("after", pa.string()),  # the activity that ended the gap
])


@dataclass
class RankGaps:
    """A rank's gaps (GAP_SCHEMA) and, per traced step, the idle time below the threshold."""

    gaps: pa.Table
    small_idle_ns: dict[int, int]  # step -> idle time in gaps shorter than the threshold


def main_thread(events: pa.Table) -> int | None:
    """The training loop's thread: the one with the step annotations, else the most launches."""
    tid = events.column("tid").to_numpy()
    for kinds in ((K.STEP,), (K.RUNTIME,), (K.OPERATOR,)):
        m = M.kind_mask(events, kinds)
        if m.any():
            vals, counts = np.unique(tid[m], return_counts=True)
            return int(vals[np.argmax(counts)])
    return None


def idle_gaps(rank: int, events: pa.Table, steps: pa.Table,
              threshold_ns: int = DEFAULT_THRESHOLD_NS,
              act: M.Activity | None = None) -> RankGaps:
    """Every idle gap longer than `threshold_ns` inside the device windows of `steps` (this
    rank's traced steps, RUN_STEP_SCHEMA rows), with its cause."""
    act = act if act is not None else M.device_activity(events)
    step_no = steps.column("step").to_numpy()
    lo_w = steps.column("device_start_ns").to_numpy(zero_copy_only=False)
    hi_w = steps.column("device_end_ns").to_numpy(zero_copy_only=False)
    g_s, g_e, g_step = [], [], []
    small: dict[int, int] = {}
    for s, lo, hi in zip(step_no.tolist(), lo_w.tolist(), hi_w.tolist()):
        if lo is None or hi is None or hi <= lo:
            continue
        g = iv.complement_gaps(act.busy, int(lo), int(hi))
        d = g.ends - g.starts
        big = d > threshold_ns
        small[int(s)] = int(d[~big].sum())
        g_s.append(g.starts[big])
        g_e.append(g.ends[big])
        g_step.append(np.full(int(big.sum()), s, dtype=np.int64))
    if not g_s or not sum(x.size for x in g_s):
        return RankGaps(GAP_SCHEMA.empty_table(), small)
    g0 = np.concatenate(g_s)
    g1 = np.concatenate(g_e)
    step = np.concatenate(g_step)
    names = events.column("name").combine_chunks()
    name_of = np.asarray(names.dictionary.to_pylist() + [""], dtype=object)
    name_idx = names.indices.to_numpy(zero_copy_only=False)

    # the activity that ends the gap (starts at g1) and the one that ended before it
    order_s = np.argsort(act.starts, kind="stable")
    nxt = np.searchsorted(act.starts[order_s], g1, side="left")
    has_next = nxt < order_s.size
    nxt_row = order_s[np.minimum(nxt, order_s.size - 1)]
    has_next &= act.starts[nxt_row] == g1
    order_e = np.argsort(act.ends, kind="stable")
    prv = np.searchsorted(act.ends[order_e], g0, side="right") - 1
    prv_row = order_e[np.maximum(prv, 0)]
    has_prev = prv >= 0
    launch = np.where(has_next, act.launch[nxt_row], -1)
    linked = has_next & act.linked[nxt_row]

    cause = classify_gaps(events, act.mode, g0, g1, launch, linked)
    before = np.where(has_prev, name_of[name_idx[act.rows[prv_row]]], None)
    after = np.where(has_next, name_of[name_idx[act.rows[nxt_row]]], None)
    table = pa.table({
        "rank": pa.array(np.full(g0.size, rank), pa.int64()),
        "step": pa.array(step, pa.int64()),
        "start_ns": pa.array(g0, pa.int64()),
        "end_ns": pa.array(g1, pa.int64()),
        "dur_ns": pa.array(g1 - g0, pa.int64()),
        "cause": pa.array(cause, pa.string()),
        "next_launch_ns": pa.array(np.where(linked, launch, -1), pa.int64()),
        "before": pa.array(before.tolist(), pa.string()),
        "after": pa.array(after.tolist(), pa.string()),
    }, schema=GAP_SCHEMA)
    return RankGaps(table, small)


def classify_gaps(events: pa.Table, mode: str, g0: np.ndarray, g1: np.ndarray,
                  launch: np.ndarray, linked: np.ndarray) -> np.ndarray:
    """The cause of each gap `[g0, g1)` (see the module docstring), vectorised over gaps."""
    ts = events.column("ts").to_numpy()
    end = ts + events.column("dur").to_numpy()
    tid = events.column("tid").to_numpy()
    if mode == "cpu":
        host_threads = M.training_threads(events)
    else:
        mt = main_thread(events)
        host_threads = np.array([] if mt is None else [mt], dtype=np.int64)
    on_host = np.isin(tid, host_threads)

    def spans(kinds: tuple[str, ...], host_only: bool) -> iv.Intervals:
        m = M.kind_mask(events, kinds)
        if host_only:
            m &= on_host
        return iv.union(ts[m], end[m])

    gap = (g1 - g0).astype(np.float64)
    data = iv.covered_in(spans((K.DATALOADER,), False), g0, g1) >= 0.5 * gap
    sync = iv.covered_in(spans((K.SYNC,), False), g0, g1) > 0
    if mode == "cpu":
        late = np.ones(g0.size, dtype=bool)
        launch_bound = np.zeros(g0.size, dtype=bool)
    else:
        late = linked & (launch > g0)
        until = np.where(late, launch, g0)
        wait = np.maximum(until - g0, 1).astype(np.float64)
        ops = iv.covered_in(spans((K.OPERATOR, K.COMM_OP), True), g0, until) >= 0.5 * wait
        opt = iv.covered_in(M.optimizer_spans(events, host_threads), g0, until) >= \
            0.5 * wait
        launch_bound = late & ops & ~opt
    cause = np.full(g0.size, "other", dtype=object)
    cause[late] = "host"
    cause[launch_bound] = "launch"
    cause[sync & (mode != "cpu")] = "sync"
    cause[data] = "data"
    return cause


def gap_context(events: pa.Table, gaps: pa.Table, limit: int = 5) -> list[dict[str, object]]:
    """What the host was doing during the `limit` longest gaps of one rank: the host span
    (data-loader fetch, synchronisation, optimizer, operator) covering most of each gap."""
    if gaps.num_rows == 0:
        return []
    top = gaps.take(pc.sort_indices(gaps, [("dur_ns", "descending")])[:limit])
    ts = events.column("ts").to_numpy()
    end = ts + events.column("dur").to_numpy()
    mt = main_thread(events)
    tid = events.column("tid").to_numpy()
    kinds = (K.DATALOADER, K.SYNC, K.OPTIMIZER, K.OPERATOR, K.COMM_OP, K.ANNOTATION)
    cand = M.kind_mask(events, kinds) & ((tid == mt) | M.kind_mask(events, (K.DATALOADER,
                                                                             K.SYNC)))
    rows = np.flatnonzero(cand)
    names = events.column("name").take(pa.array(rows)).cast(pa.string()).to_pylist()
    kind_col = events.column("kind").take(pa.array(rows)).cast(pa.string()).to_pylist()
    cs, ce = ts[rows].copy(), end[rows]
    opt = np.asarray([k == K.OPTIMIZER for k in kind_col], dtype=bool)
    if opt.any():  # a closure's forward and backward inside Optimizer.step are not optimizer
        cs[opt] = M.optimizer_starts(events, rows[opt])
    out = []
    for g in top.to_pylist():
        ov = np.minimum(ce, g["end_ns"]) - np.maximum(cs, g["start_ns"])
        hit = np.flatnonzero(ov > 0)
        host = None
        if hit.size:
            # the outermost (longest-covering) span, ties to the earliest
            j = hit[np.argmax(ov[hit])]
            host = f"{kind_col[j]}: {names[j]}"
        out.append({**g, "host": host})
    return out
