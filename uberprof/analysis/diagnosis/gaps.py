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

Tested before all of these: `warmup`, the host spent at least half the gap inside runtime
calls of `INIT_CALL_NS` (50 ms) or more that are not synchronisations: one-time
initialisation (CUDA context and streams, lazy kernel loading, memory pool growth, a first
convolution's cuDNN autotuning). Steady-state runtime calls take microseconds; on the public
traces such calls fill 96-100% of the warm-up gaps and appear in no steady-state trace. It is
named (`ms_by_cause.warmup`) and left out of the verdicts (findings/idle.py), also in traces
without step markers.

On CPU-only ranks (Gloo) the training threads' operators play the device: a gap is time with
neither an operator nor a Gloo collective running, so its cause is `data` or `host`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.causes import GAP_CAUSES, WARMUP
from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables import metrics as M
from uberprof.ingest import classify as K
from uberprof.units import ns_to_ms as _ms
from uberprof.units import shorten

__all__ = [
    "AROUND_SCHEMA",
    "CAUSES",
    "DEFAULT_THRESHOLD_NS",
    "GAP_SCHEMA",
    "INIT_CALL_NS",
    "RankGaps",
    "around_evidence",
    "exposed_around",
    "gap_context",
    "idle_gaps",
    "main_thread",
]

DEFAULT_THRESHOLD_NS = 50_000
INIT_CALL_NS = 50_000_000  # a runtime call this long is one-time initialisation (docstring)
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


# The exposed communication of one rank, per step, by the compute that ran right before it and
# right after it (`exposed_around`): what the exposed_comm finding names.
AROUND_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    ("step", pa.int64()),
    ("before", pa.string()),  # the compute that ended last before the exposed stretch
    ("after", pa.string()),  # the compute that started first after it
    ("dur_ns", pa.int64()),  # exposed time in such stretches of the step
    ("n", pa.int64()),  # stretches
])
AROUND_TOP = 3  # names kept on each side in a finding's evidence


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
    if mode != "cpu":
        m = M.kind_mask(events, (K.RUNTIME,)) & ((end - ts) >= INIT_CALL_NS)
        init = iv.covered_in(iv.union(ts[m], end[m]), g0, g1) >= 0.5 * gap
        cause[init] = WARMUP
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


def exposed_around(rank: int, events: pa.Table, steps: pa.Table, act: M.Activity) -> pa.Table:
    """Each stretch of exposed communication (communication under no compute, the breakdown's
    `exposed_comm`) in the device windows of `steps`, with the compute activity that ended last
    before it and the one that started first after it (operators on CPU ranks, kernels on
    accelerator ranks), summed per step and pair of names (AROUND_SCHEMA). From the event table
    the rank pass already holds: no second read of the trace."""
    exposed = iv.subtract(act.comm, act.compute)
    if not len(exposed) or not steps.num_rows:
        return AROUND_SCHEMA.empty_table()
    parts_s, parts_e, parts_step = [], [], []
    for s, lo, hi in zip(steps.column("step").to_pylist(),
                         steps.column("device_start_ns").to_pylist(),
                         steps.column("device_end_ns").to_pylist()):
        if lo is None or hi is None or hi <= lo:
            continue
        x = iv.clip(exposed, int(lo), int(hi))
        parts_s.append(x.starts)
        parts_e.append(x.ends)
        parts_step.append(np.full(len(x), s, dtype=np.int64))
    if not parts_s or not sum(p.size for p in parts_s):
        return AROUND_SCHEMA.empty_table()
    x0, x1 = np.concatenate(parts_s), np.concatenate(parts_e)
    before, after = _compute_around(events, act, x0, x1)
    t = pa.table({"step": np.concatenate(parts_step), "before": pa.array(before, pa.string()),
                  "after": pa.array(after, pa.string()), "dur_ns": x1 - x0})
    t = t.group_by(["step", "before", "after"], use_threads=False).aggregate(
        [("dur_ns", "sum"), ("dur_ns", "count")])
    return pa.table({
        "rank": pa.array(np.full(t.num_rows, rank), pa.int64()),
        "step": t.column("step"), "before": t.column("before"), "after": t.column("after"),
        "dur_ns": t.column("dur_ns_sum"), "n": t.column("dur_ns_count").cast(pa.int64()),
    }, schema=AROUND_SCHEMA)


def _compute_around(events: pa.Table, act: M.Activity, lo: np.ndarray, hi: np.ndarray
                    ) -> tuple[list[str | None], list[str | None]]:
    """For each stretch `[lo, hi)`, the name of the compute activity ending last at or before
    `lo` and of the one starting first at or after `hi` (None: there is none)."""
    keep = act.role == M.COMPUTE
    rows, starts, ends = act.rows[keep], act.starts[keep], act.ends[keep]
    if not rows.size:
        return [None] * lo.size, [None] * lo.size
    names = events.column("name").combine_chunks()
    if isinstance(names, pa.DictionaryArray):
        name_of = np.asarray(names.dictionary.to_pylist() + [None], dtype=object)
        idx = names.indices.to_numpy(zero_copy_only=False)[rows]
    else:
        name_of = np.asarray(names.to_pylist(), dtype=object)
        idx = rows
    by_end = np.argsort(ends, kind="stable")
    k = np.searchsorted(ends[by_end], lo, side="right") - 1
    before = np.where(k >= 0, name_of[idx[by_end[np.maximum(k, 0)]]], None)
    by_start = np.argsort(starts, kind="stable")
    j = np.searchsorted(starts[by_start], hi, side="left")
    after = np.where(j < rows.size, name_of[idx[by_start[np.minimum(j, rows.size - 1)]]], None)
    return before.tolist(), after.tolist()


def around_words(evidence: dict[str, Any]) -> str:
    """"; around it: after ..., before ..." from a finding's `around` evidence, or "" (the
    evidence sentence of the idle and exposed-communication findings)."""
    sentence = (evidence.get("around") or {}).get("sentence")
    return f"; around it: {sentence}" if sentence else ""


def around_evidence(before: list[str | None], after: list[str | None], dur_ns: list[int],
                    count: list[int], top: int = AROUND_TOP) -> dict[str, Any] | None:
    """What a finding says of the activity around the time it counts: on each side the `top`
    names by time, each with how many stretches it bordered, its time and share of the counted
    time, and one sentence ("after aten::item 12x (80%), before aten::mm 12x (80%)"). None when
    nothing was counted."""
    total = sum(dur_ns)
    if not total:
        return None

    def side(names: list[str | None]) -> list[dict[str, Any]]:
        acc: dict[str, list[int]] = {}
        for name, d, n in zip(names, dur_ns, count):
            if name is not None:
                a = acc.setdefault(name, [0, 0])
                a[0] += d
                a[1] += n
        order = sorted(acc.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:top]
        return [{"name": k, "count": n, "ms": _ms(d), "pct": round(100 * d / total, 1)}
                for k, (d, n) in order]

    b, a = side(before), side(after)

    def words(rows: list[dict[str, Any]]) -> str:
        return ", ".join(f"{_label(r['name'])} {r['count']}x ({r['pct']:g}%)" for r in rows)

    parts = ([f"after {words(b)}"] if b else []) + ([f"before {words(a)}"] if a else [])
    return {"before": b, "after": a, "ms": _ms(total), "stretches": int(sum(count)),
            "sentence": "; ".join(parts)}


def _label(name: str, n: int = 60) -> str:
    """A kernel's name as a sentence can hold it: no `void`, template arguments or parameter
    list (`void at::native::elementwise_kernel<128, 2, ...>(...)` -> `at::native::
    elementwise_kernel`); operator names stay as they are. The evidence keeps the full name."""
    short = name.removeprefix("void ")
    cut = min((i for i in (short.find("<"), short.find("(")) if i > 0), default=len(short))
    return shorten(short[:cut].strip() or name, n)
