"""The metric definitions of docs/DESIGN.md, one function each. Every view imports these.

- `device_activity`: which events are the rank's compute, communication and memory activity
  (the accelerator's streams, or on CPU-only ranks the training threads and Gloo's threads).
- `step_device_windows`: the device window of each step (tiles the device timeline).
- `breakdown`: compute, comm, overlap, exposed comm, memory, idle of any set of windows.
- `trace_window`: the whole-trace window that Holistic Trace Analysis (HTA) uses.
- `percentages`: the summary percentages (HTA's temporal breakdown and comm/comp overlap).
- `window_shares`: the parts that tile a window, each as a share of it (for stacked bars).
- `analysed_ns`: a step's analysed time on a rank, the longer of its host and device windows.
- `host_time_in`: host-side time (data-loader wait, optimizer) inside host windows.
- `optimizer_spans`, `optimizer_time_in`: time in the optimizer proper. Lightning (and any
  `optimizer.step(closure)`) runs forward and backward inside `Optimizer.step#…`; that is not
  optimizer time. Each optimizer span counts from the end of the last backward or closure span
  nested in it (forward precedes backward in a closure, so it is left out too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables.intervals import Intervals
from uberprof.ingest import classify as K

__all__ = [
    "ANALYSED_PARTS",
    "WINDOW_PARTS",
    "Activity",
    "Breakdown",
    "analysed_ns",
    "analysed_parts",
    "breakdown",
    "device_activity",
    "host_time_in",
    "kind_mask",
    "launch_times",
    "name_mask",
    "optimizer_spans",
    "optimizer_starts",
    "optimizer_time_in",
    "percentages",
    "step_device_windows",
    "trace_activity",
    "trace_window",
    "training_threads",
    "window_shares",
]

# What counts as what on an accelerator. `device_other` (an unknown accelerator's activity) is
# counted as compute, with a warning from ingest. `device_sync` records are the host waiting,
# drawn on a stream: no work runs, so they are not activity (HTA 0.6 counts them as compute;
# the difference is below 0.01 points on the shared traces, see tests/unit/test_analysis_hta.py).
COMPUTE_KINDS = (K.KERNEL, K.DEVICE_OTHER)
COMM_KINDS = (K.COMM_KERNEL,)
MEMORY_KINDS = (K.MEMCPY, K.MEMSET)
# On CPU-only ranks.
CPU_COMPUTE_KINDS = (K.OPERATOR,)
CPU_COMM_KINDS = (K.HOST_COMM,)


def kind_mask(events: pa.Table, kinds: tuple[str, ...]) -> np.ndarray:
    """Boolean mask of the events whose `kind` is one of `kinds`."""
    col = events.column("kind").combine_chunks()
    dictionary = col.dictionary.to_pylist()
    wanted = np.array([d in kinds for d in dictionary] + [False], dtype=bool)
    idx = col.indices.to_numpy(zero_copy_only=False)
    idx = np.where(idx < 0, len(dictionary), idx) if idx.size else idx
    return wanted[idx.astype(np.int64)]


COMPUTE, COMM, MEMORY = 0, 1, 2  # roles of activity rows


@dataclass(frozen=True)
class Activity:
    """A rank's device activity: the events that make it up, and their interval sets."""

    mode: str  # "device" (an accelerator) or "cpu" (training threads play the device)
    rows: np.ndarray  # indices into the event table
    role: np.ndarray  # COMPUTE, COMM or MEMORY per row
    starts: np.ndarray
    ends: np.ndarray
    launch: np.ndarray  # when each was launched (host clock; its own start when not linked)
    linked: np.ndarray  # whether the launching host call was found
    not_compute: Intervals  # host time never counted as compute (CPU ranks: data-loader fetches
    #                         and the training threads' communication calls)
    compute: Intervals
    comm: Intervals
    memory: Intervals
    overlap: Intervals  # compute ∩ comm
    compute_or_comm: Intervals
    busy: Intervals  # compute ∪ comm ∪ memory

    @property
    def has_comm(self) -> bool:
        return len(self.comm) > 0

    def subset(self, keep: np.ndarray) -> Activity:
        """The same activity restricted to the rows where `keep` holds."""
        return _activity(self.mode, self.rows[keep], self.role[keep], self.starts[keep],
                         self.ends[keep], self.launch[keep], self.linked[keep], self.not_compute)


def _activity(mode: str, rows: np.ndarray, role: np.ndarray, starts: np.ndarray,
              ends: np.ndarray, launch: np.ndarray, linked: np.ndarray,
              not_compute: Intervals) -> Activity:
    def sets(r: int) -> Intervals:
        m = role == r
        return iv.union(starts[m], ends[m])

    compute = iv.subtract(sets(COMPUTE), not_compute)
    comm = sets(COMM)
    memory = sets(MEMORY)
    compute_or_comm = iv.merge(compute, comm)
    return Activity(mode=mode, rows=rows, role=role, starts=starts, ends=ends, launch=launch,
                    linked=linked, not_compute=not_compute, compute=compute, comm=comm,
                    memory=memory, overlap=iv.intersect(compute, comm),
                    compute_or_comm=compute_or_comm, busy=iv.merge(compute_or_comm, memory))


def training_threads(events: pa.Table) -> np.ndarray:
    """Threads that run the model: threads with operators, less those that carry Gloo's work
    (its collective threads also run a few operators), but always the threads that carry the
    profiler's steps: a pipeline stage runs Gloo's send/recv on its training thread."""
    tid = events.column("tid").to_numpy()
    ops = np.unique(tid[kind_mask(events, CPU_COMPUTE_KINDS)])
    comm = np.unique(tid[kind_mask(events, CPU_COMM_KINDS)])
    steps = np.unique(tid[kind_mask(events, (K.STEP,))])
    return np.union1d(np.setdiff1d(ops, comm), np.intersect1d(ops, steps))


def device_activity(events: pa.Table) -> Activity:
    """Compute, communication and memory activity of one rank, per docs/DESIGN.md.

    On a rank with accelerator activity these are kernels, NCCL-family kernels and
    memcpy/memset over all its streams, and `gloo:*` spans: Gloo runs a collective of device
    tensors on its host threads (staging them through pinned memory), so while one is in
    flight the rank's communication is under way though no comm kernel runs. On a CPU-only rank
    (Gloo) the training threads' operators are the compute, less their time inside data-loader
    fetches; `gloo:*` spans (on Gloo's own threads) are the communication.
    """
    ts = events.column("ts").to_numpy()
    end = ts + events.column("dur").to_numpy()
    compute_m = kind_mask(events, COMPUTE_KINDS)
    comm_m = kind_mask(events, COMM_KINDS)
    memory_m = kind_mask(events, MEMORY_KINDS)
    not_compute = iv.empty()
    if compute_m.any() or comm_m.any() or memory_m.any():
        mode = "device"
        host_comm_m = kind_mask(events, CPU_COMM_KINDS)
        comm_m = comm_m | host_comm_m
        rows = np.flatnonzero(compute_m | comm_m | memory_m)
        launch, linked = launch_times(events, rows)
        linked |= host_comm_m[rows]  # a host span is its own launch
    else:
        mode = "cpu"
        train = np.isin(events.column("tid").to_numpy(), training_threads(events))
        compute_m = kind_mask(events, CPU_COMPUTE_KINDS) & train
        comm_m = kind_mask(events, CPU_COMM_KINDS)
        memory_m = np.zeros_like(comm_m)
        # Time in a data-loader fetch is data loading, and time in a communication call
        # (`_c10d_functional::wait_tensor` inside an autograd function, a blocking send/recv)
        # is communication: neither is the model's compute, whatever operator encloses it.
        away_m = kind_mask(events, (K.DATALOADER, K.COMM_OP)) & train
        away_m |= _blocking(kind_mask(events, (K.HOST_COMM,)) & train, ts, end, compute_m)
        not_compute = iv.union(ts[away_m], end[away_m])
        compute_m &= ~_starts_inside(ts, not_compute)
        rows = np.flatnonzero(compute_m | comm_m)
        launch, linked = ts[rows], np.ones(rows.size, dtype=bool)
    role = np.where(comm_m[rows], COMM, np.where(memory_m[rows], MEMORY, COMPUTE)).astype(np.int8)
    return _activity(mode, rows, role, ts[rows], end[rows], launch, linked, not_compute)


def _blocking(calls: np.ndarray, ts: np.ndarray, end: np.ndarray,
              ops: np.ndarray) -> np.ndarray:
    """Which of the training threads' Gloo calls (`calls`, a mask) held the thread: those in
    which its operators (`ops`) ran for at most half the call. A send or recv issued
    asynchronously (`isend`, a pipeline schedule's sends of gradients) is recorded from its
    issue to its wait, while the thread runs the model (a stage's backward ran inside its own
    sends: counted as communication, its compute read as half of what it was)."""
    rows = np.flatnonzero(calls)
    out = np.zeros_like(calls)
    if rows.size:
        busy = iv.covered_in(iv.union(ts[ops], end[ops]), ts[rows], end[rows])
        out[rows[2 * busy <= end[rows] - ts[rows]]] = True
    return out


def _starts_inside(t: np.ndarray, spans: Intervals) -> np.ndarray:
    """Whether each time lies inside one of the (normalised) spans."""
    if not len(spans):
        return np.zeros(t.shape, dtype=bool)
    k = np.searchsorted(spans.starts, t, side="right") - 1
    return (k >= 0) & (t < spans.ends[np.clip(k, 0, len(spans) - 1)])


def launch_times(events: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host time at which each device event in `rows` was launched (its runtime call's start),
    and whether that call was found (linked by correlation id; else the event's own start)."""
    ts = events.column("ts").to_numpy()
    corr = events.column("correlation").to_numpy()
    out = ts[rows].copy()
    found = np.zeros(rows.size, dtype=bool)
    host = kind_mask(events, (K.RUNTIME, K.SYNC)) & (corr >= 0)
    if not host.any() or rows.size == 0:
        return out, found
    hc, hts = corr[host], ts[host]
    order = np.argsort(hc, kind="stable")
    hc, hts = hc[order], hts[order]
    want = corr[rows]
    pos = np.clip(np.searchsorted(hc, want), 0, hc.size - 1)
    found = (hc[pos] == want) & (want >= 0)
    out[found] = hts[pos[found]]
    return out, found


def step_device_windows(step_start: np.ndarray, step_end: np.ndarray,
                        act: Activity) -> tuple[np.ndarray, np.ndarray]:
    """Device window `[lo, hi)` of each step (host windows given), per docs/DESIGN.md.

    lo = start of the first activity launched during the step; hi = lo of the next step that
    launched anything, or for the last such step the end of its last activity. Steps that
    launched nothing get an empty window (lo = hi). Windows tile the device timeline.
    """
    n = step_start.size
    lo = np.full(n, -1, dtype=np.int64)
    last_end = np.full(n, -1, dtype=np.int64)
    if n == 0 or act.rows.size == 0:
        return lo, lo.copy()
    k = np.searchsorted(step_start, act.launch, side="right") - 1
    inside = (k >= 0) & (act.launch < step_end[np.clip(k, 0, n - 1)])
    k, s, e = k[inside], act.starts[inside], act.ends[inside]
    has = np.zeros(n, dtype=bool)
    if k.size:
        has[np.unique(k)] = True
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, k, s)
        np.maximum.at(last_end, k, e)
        lo = np.where(has, first, -1)
    hi = np.full(n, -1, dtype=np.int64)
    steps_with = np.flatnonzero(has)
    if steps_with.size:
        # keep the starts monotonic so that the windows never overlap
        lo[steps_with] = np.maximum.accumulate(lo[steps_with])
        hi[steps_with[:-1]] = lo[steps_with[1:]]
        last = steps_with[-1]
        hi[last] = max(last_end[last], lo[last])
        # steps without activity: an empty window where the next one starts
        nxt = np.searchsorted(steps_with, np.arange(n), side="left")
        for i in np.flatnonzero(~has):
            j = nxt[i]
            at = lo[steps_with[j]] if j < steps_with.size else hi[last]
            lo[i] = hi[i] = at
    return lo, hi


@dataclass(frozen=True)
class Breakdown:
    """Nanoseconds per window; compute + exposed_comm + memory + idle == window, always."""

    window: np.ndarray
    compute: np.ndarray
    comm: np.ndarray
    overlap: np.ndarray  # compute ∩ comm
    exposed_comm: np.ndarray  # comm − compute
    memory: np.ndarray  # memcpy/memset not under compute or comm
    idle: np.ndarray  # window − everything

    def as_dict(self) -> dict[str, np.ndarray]:
        return {f"{k}_ns": getattr(self, k) for k in
                ("window", "compute", "comm", "overlap", "exposed_comm", "memory", "idle")}


def breakdown(act: Activity, lo: np.ndarray, hi: np.ndarray) -> Breakdown:
    """The breakdown of each window `[lo[k], hi[k])` (union of intervals over all streams)."""
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.maximum(np.asarray(hi, dtype=np.int64), lo)
    compute = iv.covered_in(act.compute, lo, hi)
    comm = iv.covered_in(act.comm, lo, hi)
    overlap = iv.covered_in(act.overlap, lo, hi)
    compute_or_comm = iv.covered_in(act.compute_or_comm, lo, hi)
    busy = iv.covered_in(act.busy, lo, hi)
    window = hi - lo
    return Breakdown(
        window=window,
        compute=compute,
        comm=comm,
        overlap=overlap,
        exposed_comm=comm - overlap,
        memory=busy - compute_or_comm,
        idle=window - busy,
    )


def trace_activity(act: Activity, step_starts: np.ndarray, snap_us: bool = False) -> Activity:
    """The activity a whole-trace summary covers, selected the way HTA selects it.

    - With two or more profiler steps the last step is left out: only device work launched
      before it began counts (the profiler stops at the host boundary while the last step's
      kernels may still run, so they are often cut off), and only work whose launch is known
      (when the trace links any launches at all).
    - `snap_us`: for traces with sub-microsecond timestamps, HTA rounds each event's start up
      and its end down to whole microseconds; the summary does the same on accelerator ranks
      so that its percentages agree with HTA's (per-step breakdowns keep nanoseconds).
    """
    out = act
    if np.unique(step_starts).size >= 2 and act.rows.size:
        # A trace with no launch links at all (old or unknown runtimes) keeps its own starts.
        linked = act.linked if act.linked.any() else np.ones_like(act.linked)
        out = act.subset(linked & (act.launch < np.max(step_starts)))
    if snap_us and act.mode == "device" and out.rows.size:
        starts = -((-out.starts) // 1000) * 1000
        ends = np.maximum((out.ends // 1000) * 1000, starts)
        out = _activity(out.mode, out.rows, out.role, starts, ends, out.launch, out.linked,
                        out.not_compute)
    return out


def trace_window(act: Activity) -> tuple[int, int]:
    """The whole-trace window: first activity start to last activity end (HTA's kernel time)."""
    if not len(act.busy):
        return 0, 0
    return int(act.busy.starts[0]), int(act.busy.ends[-1])


def percentages(window: int, compute: int, comm: int, overlap: int, exposed_comm: int,
                memory: int, idle: int) -> dict[str, Any]:
    """Summary percentages of a breakdown's totals (HTA temporal breakdown + overlap ratio).

    `non_compute` = exposed comm + memory, HTA's "non-compute"; `overlap_pct` is
    |compute ∩ comm| / |comm| (HTA's comm/comp overlap), None without communication.
    """
    def pct(x: int) -> float | None:
        return round(100.0 * x / window, 2) if window > 0 else None

    return {
        "idle_pct": pct(idle),
        "compute_pct": pct(compute),
        "non_compute_pct": pct(exposed_comm + memory),
        "overlap_pct": round(100.0 * overlap / comm, 2) if comm > 0 else None,
        "exposed_comm_pct": pct(exposed_comm),
        "memory_pct": pct(memory),
    }


WINDOW_PARTS = ("compute_only", "comm_under_compute", "exposed_comm", "memory", "idle")


def window_shares(window: int, compute: int, overlap: int, exposed_comm: int, memory: int,
                  idle: int) -> dict[str, float | None]:
    """`WINDOW_PARTS` as % of the window: they tile it (compute splits into the part with
    communication under it and the part without), so they add up to 100. Not the overlap
    ratio: `comm_under_compute_pct` is |compute ∩ comm| / window, `overlap_pct` (in
    `percentages`) is |compute ∩ comm| / |comm|."""
    parts = (compute - overlap, overlap, exposed_comm, memory, idle)
    return {f"{k}_pct": (100.0 * v / window if window > 0 else None)
            for k, v in zip(WINDOW_PARTS, parts)}


def analysed_ns(steps: pa.Table) -> np.ndarray:
    """Per row of `steps` (RUN_STEP_SCHEMA), the step's analysed time on that rank: the longer
    of its host window (`step_time_ns`) and its device window (`device_end_ns` -
    `device_start_ns`). Host windows tile the host's timeline and device windows the device's,
    so summed over steps neither is counted twice; where the GPU runs behind its host, the
    device's steps are longer than the CPU's and what is measured on them (idle gaps, exposed
    communication) is a share of them, never more than 100% (docs/DESIGN.md §4)."""
    host = steps.column("step_time_ns").to_numpy(zero_copy_only=False)
    host = np.nan_to_num(host.astype(np.float64), nan=0.0)
    lo = steps.column("device_start_ns").to_numpy(zero_copy_only=False).astype(np.float64)
    hi = steps.column("device_end_ns").to_numpy(zero_copy_only=False).astype(np.float64)
    dev = np.nan_to_num(np.clip(hi - lo, 0, None), nan=0.0)
    return np.maximum(host, dev).astype(np.int64)


ANALYSED_PARTS = ("window", "compute", "comm", "overlap", "exposed_comm", "memory", "idle")


def analysed_parts(steps: pa.Table) -> dict[str, np.ndarray]:
    """Per row of `steps` (RUN_STEP_SCHEMA), the breakdown of the step's analysed time
    (`analysed_ns`, as `window`): compute, communication, overlap, exposed communication and
    memory as the device window measured them, and idle the rest of the analysed time, so the
    parts tile it. The report's rank table takes its shares from these and the idle findings
    their shares from the same time: a device running behind its host (its steps longer than
    the host's) made the whole-trace window and the findings' disagree (a rank at "100%
    compute" beside 272 ms of idle gaps, docs/DESIGN.md §4)."""
    def col(name: str) -> np.ndarray:
        v = steps.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        return np.nan_to_num(v, nan=0.0).astype(np.int64)

    window = analysed_ns(steps)
    out = {k: col(f"{k}_ns") for k in ("compute", "comm", "overlap", "exposed_comm", "memory")}
    busy = out["compute"] + out["exposed_comm"] + out["memory"]
    return {"window": window, **out, "idle": np.maximum(window - busy, 0)}


def host_time_in(events: pa.Table, kinds: tuple[str, ...], lo: np.ndarray, hi: np.ndarray,
                 threads: np.ndarray | None = None) -> np.ndarray:
    """Time the host spent in spans of `kinds` inside each host window (nested spans once)."""
    m = kind_mask(events, kinds)
    if threads is not None:
        m &= np.isin(events.column("tid").to_numpy(), threads)
    ts = events.column("ts").to_numpy()
    spans = iv.union(ts[m], ts[m] + events.column("dur").to_numpy()[m])
    return iv.covered_in(spans, lo, hi)


# Spans that mean a training closure runs inside Optimizer.step (Lightning, LBFGS-style closures).
_NESTED_STEP = re.compile(r"backward|training_step|closure", re.IGNORECASE)


def name_mask(events: pa.Table, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of the events whose name matches `pattern` (searched)."""
    col = events.column("name").combine_chunks()
    if not isinstance(col.type, pa.DictionaryType):
        col = col.dictionary_encode()
    dictionary = col.dictionary.to_pylist()
    wanted = np.array([bool(d and pattern.search(d)) for d in dictionary] + [False], dtype=bool)
    idx = col.indices.to_numpy(zero_copy_only=False)
    idx = np.where(idx < 0, len(dictionary), idx) if idx.size else idx
    return wanted[idx.astype(np.int64)]


def optimizer_starts(events: pa.Table, rows: np.ndarray) -> np.ndarray:
    """Where the optimizer proper starts in each `Optimizer.step` event of `rows`: after the
    last backward or closure span nested in it on its thread (module docstring)."""
    tid = events.column("tid").to_numpy()
    ts = events.column("ts").to_numpy()
    end = ts + events.column("dur").to_numpy()
    starts = ts[rows].copy()
    nested = kind_mask(events, (K.OPERATOR, K.ANNOTATION, K.PYTHON)) & \
        name_mask(events, _NESTED_STEP)
    if nested.any() and rows.size:
        n_ts, n_end, n_tid = ts[nested], end[nested], tid[nested]
        for i, r in enumerate(rows.tolist()):
            inside = (n_tid == tid[r]) & (n_ts >= ts[r]) & (n_end <= end[r])
            if inside.any():
                starts[i] = min(max(ts[r], int(n_end[inside].max())), end[r])
    return starts


def optimizer_spans(events: pa.Table, threads: np.ndarray | None = None) -> Intervals:
    """The optimizer proper: `Optimizer.step` spans (on `threads`, when given), each from
    `optimizer_starts` to its end."""
    m = kind_mask(events, (K.OPTIMIZER,))
    if threads is not None:
        m &= np.isin(events.column("tid").to_numpy(), threads)
    rows = np.flatnonzero(m)
    ends = events.column("ts").to_numpy()[rows] + events.column("dur").to_numpy()[rows]
    return iv.union(optimizer_starts(events, rows), ends)


def optimizer_time_in(events: pa.Table, lo: np.ndarray, hi: np.ndarray,
                      threads: np.ndarray | None = None) -> np.ndarray:
    """Time in the optimizer proper (`optimizer_spans`) inside each host window."""
    return iv.covered_in(optimizer_spans(events, threads), lo, hi)
