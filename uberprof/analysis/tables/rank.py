"""The per-rank map: one trace file -> its tables, one rank's step timeline -> its table. Plain
top-level functions of picklable arguments, so a process pool (default) or a Dask cluster can
run them unchanged.

- `analyze_trace(path)` returns the tables in memory (`TraceTables`).
- `analyze_input(path, out_dir)` writes them as Parquet/JSON under `out_dir` and returns a small
  status dict, so that no event table ever travels back to the coordinating process.
- `timeline_table(rank_dir, out_file)` does the same for a rank folder's steps.jsonl.

Tables and file names are `uberprof.analysis.tables.derived`'s; every file is written atomically.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.derived import (
    ACTIVITY_FILE,
    EVENTS_FILE,
    INPUT_COLLECTIVES_FILE,
    INPUT_OPERATORS_FILE,
    INPUT_STEPS_FILE,
    MEMORY_FILE,
    MODULES_FILE,
    OLD_INPUT_FILES,
    SUMMARY_FILE,
    old_timeline_file,
    replacing,
    write_events,
    write_parquet,
    write_small,
)
from uberprof.analysis.tables.enclosing import EnclosingSpans
from uberprof.analysis.tables.launches import link_launches
from uberprof.analysis.tables.memory_timeline import memory_timeline
from uberprof.analysis.tables.modules import module_table
from uberprof.analysis.tables.operators import operator_table
from uberprof.analysis.tables.schemas import (
    ACTIVITY_SCHEMA,
    BREAKDOWN_FIELDS,
    COLLECTIVE_SCHEMA,
    STEP_SCHEMA,
    TIMELINE_SCHEMA,
)
from uberprof.ingest import classify as K
from uberprof.ingest.trace import TraceError, ingest_trace
from uberprof.rundir import STEPS_FILE as STEPS_JSONL
from uberprof.rundir.step_table import read_step_table

__all__ = [  # the table names (derived.py's) and schemas (schemas.py's), importable here
    "BREAKDOWN_FIELDS",
    "COLLECTIVE_SCHEMA",
    "EVENTS_FILE",
    "INPUT_COLLECTIVES_FILE",
    "INPUT_STEPS_FILE",
    "STEP_SCHEMA",
    "SUMMARY_FILE",
    "TraceTables",
    "analyze_input",
    "analyze_trace",
    "timeline_table",
]


@dataclass
class TraceTables:
    """Everything derived from one trace file."""

    path: str
    events: pa.Table  # the ingest table plus `step`
    steps: pa.Table  # STEP_SCHEMA
    collectives: pa.Table  # COLLECTIVE_SCHEMA
    summary: dict[str, Any]  # whole-trace breakdown (HTA-compatible) and trace metadata
    activity: pa.Table  # ACTIVITY_SCHEMA: what the breakdown counted, for the views to draw
    operators: pa.Table  # OPERATOR_SCHEMA: operators and kernels over the trace's steps
    modules: pa.Table  # MODULE_SCHEMA: nn.Modules over the trace's steps (tables/modules.py)
    memory: pa.Table  # MEMORY_TIMELINE_SCHEMA: [memory] events (tables/memory_timeline.py)
    problems: list[str] = field(default_factory=list)


def analyze_trace(path: str | os.PathLike[str]) -> TraceTables:
    """Ingest one trace and compute its per-step and whole-trace breakdowns."""
    t = ingest_trace(path)
    ev = t.events
    ts = ev.column("ts").to_numpy()
    act = M.device_activity(ev)

    step_no, host_lo, host_hi = _profiler_steps(ev)
    dev_lo, dev_hi = M.step_device_windows(host_lo, host_hi, act)
    b = M.breakdown(act, dev_lo, dev_hi)
    threads = M.training_threads(ev) if act.mode == "cpu" else None
    data_wait = M.host_time_in(ev, (K.DATALOADER,), host_lo, host_hi, threads)
    optimizer = M.optimizer_time_in(ev, host_lo, host_hi, threads)

    # Every event's step: host events by where they start, device events by their launch.
    event_step = _step_of(ts, host_lo, host_hi, step_no)
    if act.rows.size:
        event_step[act.rows] = _step_of(act.launch, host_lo, host_hi, step_no)
    events = ev.append_column("step", pa.array(event_step, pa.int64()))

    colls = _collectives(ev, act, host_lo, host_hi, step_no)
    comm_bytes, n_coll = _per_step_collectives(colls, step_no)
    steps = pa.table({
        "step": pa.array(step_no, pa.int64()),
        "host_start_ns": pa.array(host_lo, pa.int64()),
        "host_end_ns": pa.array(host_hi, pa.int64()),
        "device_start_ns": pa.array(dev_lo, pa.int64()),
        "device_end_ns": pa.array(dev_hi, pa.int64()),
        **{k: pa.array(v, pa.int64()) for k, v in b.as_dict().items()},
        "data_wait_ns": pa.array(data_wait, pa.int64()),
        "optimizer_ns": pa.array(optimizer, pa.int64()),
        "comm_bytes": pa.array(comm_bytes, pa.int64()),
        "collectives": pa.array(n_coll, pa.int64()),
        "device_incomplete": pa.array(_incomplete(ev, act, host_lo, host_hi), pa.bool_()),
    }, schema=STEP_SCHEMA)

    summary = _trace_summary(t, ev, act, host_lo, step_no)
    problems = list(t.problems)
    if not act.rows.size:
        problems.append(f"{t.path}: no device activity and no operators on a training thread: "
                        "nothing to break down")
    return TraceTables(path=t.path, events=events, steps=steps, collectives=colls,
                       summary=summary, activity=activity_table(act),
                       operators=operator_table(events), modules=module_table(events),
                       memory=_memory(t.memory, ev, host_lo, host_hi, step_no),
                       problems=problems)


def _trace_summary(t: Any, ev: pa.Table, act: Any, host_lo: np.ndarray, step_no: np.ndarray
                   ) -> dict[str, Any]:
    """The trace's summary: what it says of itself (rank, host, groups, clock), its extent, its
    steps and its whole-trace breakdown (the trace window's totals)."""
    ts = ev.column("ts").to_numpy()
    dur = ev.column("dur").to_numpy()
    whole = M.trace_activity(act, host_lo, t.sub_us)
    lo, hi = M.trace_window(whole)
    wb = M.breakdown(whole, np.array([lo]), np.array([hi]))
    totals = {k: int(v[0]) for k, v in wb.as_dict().items()}
    return {
        "path": t.path,
        "trace_rank": t.rank,
        "world_size": t.world_size,
        "backend": t.backend,
        "process_groups": t.process_groups,
        "host": t.host,
        "device_type": t.device_type,
        "mode": act.mode,
        "clock": t.clock,
        "uberprof_window": t.uberprof_window,
        "events": ev.num_rows,
        "first_ns": int(ts.min()),
        "last_ns": int((ts + dur).max()),
        "window_start_ns": lo,
        "window_end_ns": hi,
        "steps": [int(s) for s in step_no],
        **totals,
        "has_comm": whole.has_comm,
    }


def _memory(memory: pa.Table | None, ev: pa.Table, host_lo: np.ndarray, host_hi: np.ndarray,
            step_no: np.ndarray) -> pa.Table:
    """The trace's memory timeline, each event in the step it falls in."""
    ts = memory.column("ts").to_numpy() if memory is not None else np.zeros(0, np.int64)
    return memory_timeline(memory, ev, _step_of(ts, host_lo, host_hi, step_no))


def activity_table(act: M.Activity) -> pa.Table:
    """The interval sets of a trace's activity as rows (ACTIVITY_SCHEMA): what the breakdown
    counted as compute, communication and memory, saved so a view draws it without
    recomputing it from the events."""
    parts = [(name, s) for name, s in (("compute", act.compute), ("comm", act.comm),
                                       ("memory", act.memory))]
    roles = np.concatenate([np.full(len(s), i, np.int8) for i, (_, s) in enumerate(parts)])
    return pa.table({
        "role": pa.DictionaryArray.from_arrays(pa.array(roles, pa.int8()),
                                               pa.array([n for n, _ in parts])),
        "start_ns": pa.array(np.concatenate([s.starts for _, s in parts]), pa.int64()),
        "end_ns": pa.array(np.concatenate([s.ends for _, s in parts]), pa.int64()),
    }, schema=ACTIVITY_SCHEMA)


def analyze_input(path: str, out_dir: str) -> dict[str, Any]:
    """Analyse one trace file and write its tables under `out_dir`; never raises.

    Returns {"status": "ok"|"error", "message": ..., "summary": ...}. Errors name the file.
    """
    out = Path(out_dir)
    try:
        tables = analyze_trace(path)
        out.mkdir(parents=True, exist_ok=True)
        before = set(os.listdir(out))  # one listing, not an unlink tried per old name
        write_events(tables.events, out / EVENTS_FILE)
        write_small(tables.steps, out / INPUT_STEPS_FILE)
        write_small(tables.collectives, out / INPUT_COLLECTIVES_FILE)
        write_small(tables.activity, out / ACTIVITY_FILE)
        write_small(tables.operators, out / INPUT_OPERATORS_FILE)
        # Optional tables (the reduce reads a missing one as no rows): most traces have no
        # module spans or memory events, and two files fewer per trace are thousands of
        # writes and reads fewer on a large run.
        for table, name, codec in ((tables.modules, MODULES_FILE, "snappy"),
                                   (tables.memory, MEMORY_FILE, "zstd")):
            if table.num_rows:
                write_parquet(table, out / name, compression=codec)
            elif name in before:  # not one an earlier analysis of this input left
                (out / name).unlink(missing_ok=True)
        for name in OLD_INPUT_FILES & before:
            (out / name).unlink(missing_ok=True)
        doc = {"summary": tables.summary, "problems": tables.problems}
        with replacing(out / SUMMARY_FILE) as tmp:  # last: its presence marks a finished input
            tmp.write_bytes(orjson.dumps(doc))
        return {"status": "ok", "message": None, **doc}
    except TraceError as exc:
        return {"status": "error", "message": str(exc), "summary": None, "problems": []}
    except MemoryError:
        return {"status": "error", "message": f"{path}: out of memory while analysing it",
                "summary": None, "problems": []}
    except Exception as exc:  # noqa: BLE001 - one bad file must not stop the other ranks
        tb = traceback.format_exc(limit=4)
        return {"status": "error", "summary": None, "problems": [],
                "message": f"{path}: could not be analysed ({type(exc).__name__}: {exc}); "
                           f"please report this with the trace. {tb.strip().splitlines()[-1]}"}


def timeline_table(rank_dir: str, out_file: str) -> dict[str, Any]:
    """A rank's step timeline (`ranks/<r>/steps.jsonl`) as a Parquet table of TIMELINE_SCHEMA,
    one row per step: parsed here, in the map, so that the cross-rank step and the diagnosis
    read a small columnar table per rank rather than every JSON line of every rank. Never
    raises.

    Returns {"status", "message", "rows": steps read, "truncated": cut-off last line,
    "skipped": the line naming rows left out, or None, "last_step", "last_end_ns": the last
    step and its end (None without), which the crash evidence needs}.
    """
    try:
        timeline = read_step_table(Path(rank_dir), TIMELINE_SCHEMA.names)
        write_small(timeline.table.cast(TIMELINE_SCHEMA), Path(out_file))
        old_timeline_file(Path(out_file)).unlink(missing_ok=True)
        rows, last_step, last_end_ns = timeline.tail()
        return {"status": "ok", "message": None, "rows": rows, "truncated": timeline.truncated,
                "skipped": timeline.problem(Path(rank_dir) / STEPS_JSONL),
                "last_step": last_step, "last_end_ns": last_end_ns}
    except Exception as exc:  # noqa: BLE001 - one bad file must not stop the other ranks
        return {"status": "error", "rows": 0, "truncated": False,
                "message": f"{Path(rank_dir) / STEPS_JSONL}: could not be read "
                           f"({type(exc).__name__}: {exc}); step times of this rank left out"}


# --- helpers ------------------------------------------------------------------------------------

def _profiler_steps(ev: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step numbers and host windows from `ProfilerStep#N` spans (first span per number)."""
    m = M.kind_mask(ev, (K.STEP,))
    if not m.any():
        return (np.zeros(0, np.int64),) * 3  # type: ignore[return-value]
    names = ev.column("name").filter(pa.array(m)).to_pylist()
    ts = ev.column("ts").to_numpy()[m]
    end = ts + ev.column("dur").to_numpy()[m]
    tid = ev.column("tid").to_numpy()[m]
    # Steps live on one thread (the training loop's); annotations elsewhere are strays.
    vals, counts = np.unique(tid, return_counts=True)
    main = vals[np.argmax(counts)]
    seen: dict[int, tuple[int, int]] = {}
    for name, s, e, t in zip(names, ts.tolist(), end.tolist(), tid.tolist()):
        n = K.step_number(name)
        if n is None or t != main or n in seen:
            continue
        seen[n] = (s, e)
    order = sorted(seen.items(), key=lambda kv: kv[1][0])
    step = np.array([k for k, _ in order], dtype=np.int64)
    lo = np.array([v[0] for _, v in order], dtype=np.int64)
    hi = np.array([v[1] for _, v in order], dtype=np.int64)
    # Clip overlaps (a step's span may run into the next one's on some profilers).
    if lo.size > 1:
        hi[:-1] = np.minimum(hi[:-1], lo[1:])
    return step, lo, hi


def _step_of(t: np.ndarray, lo: np.ndarray, hi: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Step number of each time t (-1 outside every host window)."""
    out = np.full(t.shape, -1, dtype=np.int64)
    if lo.size == 0 or t.size == 0:
        return out
    k = np.searchsorted(lo, t, side="right") - 1
    ok = (k >= 0) & (t < hi[np.clip(k, 0, lo.size - 1)])
    out[ok] = step[k[ok]]
    return out


def _collectives(ev: pa.Table, act: M.Activity, host_lo: np.ndarray, host_hi: np.ndarray,
                 step_no: np.ndarray) -> pa.Table:
    """One row per collective instance: Gloo spans on CPU ranks, comm kernels (and the Gloo
    spans of collectives on device tensors) on accelerators. A Gloo span is named by the launch
    behind it, with the peer of a send/recv (launches.py).

    Kernels without NCCL metadata (older PyTorch) take it from the host span that launched
    them (`nccl:*` annotation or `record_param_comms`), found by time on the launching thread.
    """
    if act.mode == "cpu":
        m = M.kind_mask(ev, (K.HOST_COMM,))
        rows = np.flatnonzero(m)
        launch = ev.column("ts").to_numpy()[rows]
    else:
        keep = act.role == M.COMM
        rows = act.rows[keep]
        launch = act.launch[keep]
    if rows.size == 0:
        return COLLECTIVE_SCHEMA.empty_table()
    sub = ev.take(pa.array(rows))
    ts = sub.column("ts").to_numpy()
    cols: dict[str, Any] = {
        "name": sub.column("coll_name").cast(pa.string()).to_pylist(),
        "event": sub.column("name").cast(pa.string()).to_pylist(),
        "start_ns": ts,
        "end_ns": ts + sub.column("dur").to_numpy(),
        "launch_ns": launch,
        "step": _step_of(launch, host_lo, host_hi, step_no),
        "in_bytes": sub.column("in_bytes").to_pylist(),
        "out_bytes": sub.column("out_bytes").to_pylist(),
        "dtype": sub.column("dtype").cast(pa.string()).to_pylist(),
        "group_size": sub.column("group_size").to_pylist(),
        "pg_name": sub.column("pg_name").cast(pa.string()).to_pylist(),
        "pg_ranks": sub.column("pg_ranks").cast(pa.string()).to_pylist(),
        "seq": sub.column("seq").to_pylist(),
        "stream": sub.column("stream").to_numpy(),
        "tid": sub.column("tid").to_numpy(),
        "peer": [None] * rows.size,
    }
    if act.mode == "device":
        _fill_from_launching_span(ev, act, keep, cols)
    cols["name"] = [K.canonical_collective(n) if n else None for n in cols["name"]]
    spans = np.flatnonzero(M.kind_mask(sub, (K.HOST_COMM,)))
    for i, link in zip(spans.tolist(), link_launches(ev, rows[spans],
                                                     [cols["name"][i] for i in spans])):
        if link is not None:
            cols["name"][i], cols["peer"][i], posted = link
            if act.mode == "cpu" and cols["name"][i] in ("send", "recv"):
                # a Gloo send/recv was issued when its c10d call started (launches.py); the
                # collectives keep their span's start (groups.py finds the Flight Recorder's
                # arrival at or before it)
                cols["launch_ns"][i] = min(posted, int(cols["launch_ns"][i]))
    return pa.table(cols, schema=COLLECTIVE_SCHEMA)


def _fill_from_launching_span(ev: pa.Table, act: M.Activity, keep: np.ndarray,
                              cols: dict[str, Any]) -> None:
    """Metadata for comm kernels that lack it, from the host span that launched them: the
    innermost `nccl:*` / `record_param_comms` span around the launching runtime call (same
    thread), else the span with the kernel's external id (2021 traces have no runtime link).
    A send/recv kernel also takes its peer from the `c10d::send` / `c10d::recv_` around it."""
    def wants(i: int) -> bool:
        name = cols["name"][i]
        return name is None or cols["in_bytes"][i] is None or (
            cols["peer"][i] is None and K.canonical_collective(name) in ("send", "recv"))

    missing = [i for i in range(len(cols["name"])) if wants(i)]
    span_m = M.kind_mask(ev, (K.COMM_OP,))
    if not missing or not span_m.any():
        return
    rows = act.rows[keep]
    corr = ev.column("correlation").to_numpy()
    ext = ev.column("external_id").to_numpy()
    tid_all = ev.column("tid").to_numpy()
    ts_all = ev.column("ts").to_numpy()
    rt_idx = np.flatnonzero(M.kind_mask(ev, (K.RUNTIME, K.SYNC)) & (corr >= 0))
    order = np.argsort(corr[rt_idx], kind="stable")
    rt_corr, rt_rows = corr[rt_idx][order], rt_idx[order]
    spans = np.flatnonzero(span_m)
    enclosing = EnclosingSpans(tid_all[spans], ts_all[spans],
                               ts_all[spans] + ev.column("dur").to_numpy()[spans])
    by_ext: dict[int, list[int]] = {}
    for s, x in zip(spans.tolist(), ext[spans].tolist()):
        by_ext.setdefault(x, []).append(s)
    names = ev.column("coll_name").cast(pa.string()).to_pylist()
    in_b = ev.column("in_bytes").to_pylist()
    dtypes = ev.column("dtype").cast(pa.string()).to_pylist()
    peers = ev.column("peer").to_pylist()
    for i in missing:
        r = rows[i]
        candidates: list[int] = []
        p = np.searchsorted(rt_corr, corr[r]) if rt_corr.size and corr[r] >= 0 else -1
        if 0 <= p < rt_corr.size and rt_corr[p] == corr[r]:
            launch = rt_rows[p]
            candidates = spans[enclosing.around(tid_all[launch], ts_all[launch])].tolist()
        if not candidates and ext[r] >= 0:
            candidates = by_ext.get(int(ext[r]), [])
        for s in candidates:  # innermost first, until one gives the size (`c10d::` ones do not)
            if names[s] is not None:
                cols["name"][i] = cols["name"][i] or names[s]
                if cols["in_bytes"][i] is None:
                    cols["in_bytes"][i] = in_b[s]
                cols["dtype"][i] = cols["dtype"][i] or dtypes[s]
            if cols["peer"][i] is None and peers[s] is not None:
                cols["peer"][i] = peers[s]
            if not wants(i):
                break


def _per_step_collectives(colls: pa.Table, step_no: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    nbytes = np.zeros(step_no.size, dtype=np.int64)
    count = np.zeros(step_no.size, dtype=np.int64)
    if colls.num_rows == 0 or step_no.size == 0:
        return nbytes, count
    st = colls.column("step").to_numpy()
    b = np.array([x or 0 for x in colls.column("in_bytes").to_pylist()], dtype=np.int64)
    pos = {int(s): i for i, s in enumerate(step_no)}
    for s, x in zip(st.tolist(), b.tolist()):
        i = pos.get(s)
        if i is not None:
            nbytes[i] += x
            count[i] += 1
    return nbytes, count


def _incomplete(ev: pa.Table, act: M.Activity, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Steps with kernel launches whose kernels are missing from the trace (cut off when the
    profiler stopped, or dropped by CUPTI's buffers)."""
    out = np.zeros(lo.size, dtype=bool)
    if act.mode != "device" or lo.size == 0:
        return out
    names = ev.column("name").combine_chunks()
    dictionary = names.dictionary.to_pylist()
    is_launch = np.array([("LaunchKernel" in n or "ModuleLaunch" in n) for n in dictionary]
                         + [False], dtype=bool)
    idx = names.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    launch = is_launch[idx] & M.kind_mask(ev, (K.RUNTIME,))
    corr = ev.column("correlation").to_numpy()
    launch &= corr >= 0
    if not launch.any():
        return out
    device_corr = np.unique(corr[M.kind_mask(ev, tuple(K.DEVICE_KINDS))])
    lost = launch & ~np.isin(corr, device_corr)
    if not lost.any():
        return out
    t = ev.column("ts").to_numpy()[lost]
    k = np.searchsorted(lo, t, side="right") - 1
    ok = (k >= 0) & (t < hi[np.clip(k, 0, lo.size - 1)])
    out[np.unique(k[ok])] = True
    return out

