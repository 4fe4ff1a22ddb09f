"""`export_trace`: every rank's trace windows merged into one timeline on the aligned clock, with
uberprof's findings and the node counters beside them.

The diagnosis runs first (it reuses `uberprof analyze`'s tables): it gives the clock alignment,
each trace's rank, the steps' windows and the findings. Then each rank's files are read one at a
time, decided on (selection, size budget, flows, track lanes) and streamed to the writer, so
memory stays at one trace file, never the merged trace. When the budget might be exceeded, a
first pass over the files measures what each kind of event weighs; the budget then drops the
least useful events first (budget.py) and the summary says what went.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uberprof import __version__
from uberprof.analysis.diagnosis.advisor import Diagnosis
from uberprof.analysis.tables.context import RunContext, load_context
from uberprof.analysis.tables.derived import Analysis
from uberprof.analysis.diagnosis.gaps import DEFAULT_THRESHOLD_NS
from uberprof.analysis.diagnosis.saved import load_or_diagnose
from uberprof.ingest.trace import TraceError, json_size
from uberprof.present.export import counters as C
from uberprof.present.export.budget import Budget, Cut, describe_drops
from uberprof.present.export.findings import (
    FINDINGS_PROCESS,
    RANK_TRACKS,
    Mark,
    global_marks,
    rank_marks,
)
from uberprof.present.export.layout import (
    IdSpace,
    ProcessInfo,
    TrackInfo,
    nest_lanes,
    qualify,
    sort_processes,
)
from uberprof.present.export.source import (
    PH_FLOW,
    PH_INSTANT,
    PH_M,
    PH_X,
    TIER_PYTHON,
    FileScan,
    iter_events,
    scan_file,
)
from uberprof.present.export.writer import TraceWriter
from uberprof.rundir import parse_trace_file_name, ranks_by_id

__all__ = ["DEFAULT_MAX_MB", "ExportError", "ExportOptions", "ExportResult", "export_trace"]

DEFAULT_MAX_MB = 500  # uncompressed: what a viewer has to load
# Protobuf bytes per JSON byte of the same events (measured on CPU Kineto traces: 32.1 MB against
# 60.7 MB); the budget of a perfetto export is applied through it.
PERFETTO_PER_JSON_BYTE = 0.55
Progress = Callable[[int, int, str], None]


@dataclass
class ExportOptions:
    """What to export. `steps`: inclusive step range; `ranks`: None for all; `python`: keep
    Python function events (with_stack traces: large); `max_bytes`: budget on the uncompressed
    output (None: no limit); `fmt`: chrome or perfetto."""

    steps: tuple[int, int] | None = None
    ranks: set[int] | None = None
    counters: bool = True
    python: bool = False
    max_bytes: int | None = DEFAULT_MAX_MB * 1_000_000
    fmt: str = "chrome"
    gzip: bool = True
    gap_threshold_ns: int = DEFAULT_THRESHOLD_NS


@dataclass
class ExportResult:
    """What was written, and what was left out and why."""

    path: Path
    fmt: str
    ranks: list[int]
    events: int  # trace events written (metadata and counters included)
    bytes_uncompressed: int
    bytes_file: int
    seconds: float
    dropped: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class ExportError(Exception):
    """Nothing could be exported (no rank selected, no usable trace)."""


@dataclass
class _RankState:
    """One rank's process while it is written: its tracks so far."""

    rank: int
    pid: int
    name: str
    tids: dict[tuple[Any, ...], int] = field(default_factory=dict)
    main_tid: int | None = None
    x_events: int = 0


def export_trace(path: str | os.PathLike[str], out: str | os.PathLike[str],
                 options: ExportOptions | None = None, derived: str | os.PathLike[str] | None = None,
                 workers: int | None = None, progress: Progress | None = None) -> ExportResult:
    """Merge the traces under `path` (run directory, trace folder or file) into `out`."""
    was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived dicts and no cycles: spare the collector's scans
    try:
        return _export(path, out, options or ExportOptions(), derived, workers, progress)
    finally:
        if was_enabled:
            gc.enable()


def _export(path: str | os.PathLike[str], out: str | os.PathLike[str], opts: ExportOptions,
            derived: str | os.PathLike[str] | None, workers: int | None,
            progress: Progress | None) -> ExportResult:
    t0 = time.monotonic()
    ctx = load_context(path, out=derived, workers=workers, progress=progress)
    d = load_or_diagnose(ctx, threshold_ns=opts.gap_threshold_ns)
    notes: list[str] = list(ctx.problems)  # what the analysis found wrong, as analyze says it
    offsets = d.alignment.offsets()

    ranks = [r for r in ctx.rank_ids if opts.ranks is None or r in opts.ranks]
    if opts.ranks is not None:
        missing = sorted(set(opts.ranks) - set(ctx.rank_ids))
        if missing:
            notes.append(f"rank(s) {_list(missing)} not in this run (it has {_list(ctx.rank_ids)})")
    # the analysis' own trace files, under the run as named now (never the manifest's cwd)
    files = {r: [str(p) for p in ctx.run.trace_files(r)
                 if not opts.steps or _file_overlaps(p.name, opts.steps)] for r in ranks}
    windows = _windows(ctx, d, ranks, opts.steps)  # own clock, per rank
    for r in ranks:
        if not files[r] or (opts.steps and r not in windows):
            notes.append(f"rank {r}: no traced step" +
                         (f" in {opts.steps[0]}-{opts.steps[1]}" if opts.steps else "") +
                         "; left out")
    ranks = [r for r in ranks if files[r] and (not opts.steps or r in windows)]
    if not ranks:
        raise ExportError("nothing to export: " + ("; ".join(notes) or "no trace window"))

    spans = _trace_spans(ctx.run, ranks)  # own clock: first to last event of each rank
    if not opts.steps:
        windows = {r: spans.get(r, windows.get(r)) for r in ranks
                   if spans.get(r, windows.get(r)) is not None}
    aligned = [(windows[r][0] + offsets.get(r, 0), windows[r][1] + offsets.get(r, 0))
               for r in ranks if r in windows]
    lo = min((a for a, _ in aligned), default=None)
    hi = max((b for _, b in aligned), default=None)
    # before every event, even those that start before the selected steps and reach into them
    first = min([spans[r][0] + offsets.get(r, 0) for r in ranks if r in spans]
                + ([lo] if lo is not None else []), default=None)
    base = _base(first)
    is_run = ctx.is_run_dir
    run_root = Path(ctx.root)

    # counters: which nodes, and which rank owns which GPU
    nodes: list[tuple[str, str | None]] = []
    gpu_of: dict[int, tuple[str, str]] = {}
    if opts.counters and is_run and lo is not None:
        for n in C.counter_nodes_of(run_root):
            try:
                from uberprof.rundir.counters import counter_meta

                h = counter_meta(run_root, n).get("host")
            except Exception:  # noqa: BLE001 - unreadable meta: the node keeps its name only
                h = None
            nodes.append((n, h if isinstance(h, str) else None))
        gpu_of = C.rank_gpu_labels(run_root)
    elif opts.counters and is_run:
        notes.append("counters left out: the traces give no time window")

    host_of = {r: ctx.host_of(r) for r in ranks}
    order = sort_processes(ranks, host_of, nodes)
    findings_pid = max(ranks) + 1
    node_pid = {n: findings_pid + 1 + i for i, (n, _) in enumerate(nodes)}
    ids = IdSpace(max_pid=findings_pid + len(nodes))

    marks = rank_marks(d, ranks, opts.steps)
    gmarks = global_marks(d, (lo, hi) if lo is not None else (0, 0), opts.steps, ranks) \
        if lo is not None else []

    # the size budget: measure only when the inputs could exceed it
    cut = Cut()
    if opts.max_bytes:
        bound = sum(json_size(p) for r in ranks for p in files[r])
        if bound > opts.max_bytes * 0.9:
            budget: Budget | None = None
            ratio = 1.0
            for r in ranks:
                for p in files[r]:
                    scan = _scan(p, notes)
                    if scan is None:
                        continue
                    keep, _ = _select(scan, windows.get(r) if opts.steps else None, opts.python)
                    if budget is None:  # sizes are the source's text: scale the limit to it
                        ratio = _output_ratio(scan, keep) * (
                            PERFETTO_PER_JSON_BYTE if opts.fmt == "perfetto" else 1.0)
                        budget = Budget(int(opts.max_bytes / ratio))
                    budget.add(scan, keep)
                    del scan
            if budget is not None:
                budget.add_fixed(sum(len(m) for m in marks.values()) * 300 + len(gmarks) * 2000)
                cut = budget.decide()
                cut.estimate_bytes = int(cut.estimate_bytes * ratio)
                cut.limit_bytes = opts.max_bytes

    cache: dict[str, C.NodeCounters] = {}

    def node_counters(n: str) -> C.NodeCounters:
        """A node's counters over the export's window, read once."""
        if n not in cache:
            assert lo is not None and hi is not None
            cache[n] = C.read_node_counters(run_root, n, _host_offset(d, dict(nodes).get(n)),
                                            _counter_window(lo, hi), base)
        return cache[n]

    writer = _writer(opts, Path(out), base)
    dropped_counts: dict[str, list[int]] = {}
    tier_counts: dict[int, list[int]] = {}
    per_rank: dict[int, int] = {}
    try:
        for i, r in enumerate(ranks):
            if progress:
                progress(i, len(ranks), f"rank {r}")
            st = None
            for p in files[r]:
                scan = _scan(p, notes)
                if scan is None:
                    continue
                if st is None:
                    st = _RankState(r, r, _rank_name(r, ctx, scan, gpu_of, run_root))
                    writer.process(ProcessInfo(st.pid, st.name, order[("rank", r)],
                                               f"rank {r}"))
                    _uberprof_tracks(writer, ids, st, marks.get(r, []))
                _write_file(writer, ids, st, scan, windows.get(r) if opts.steps else None,
                            opts.python, cut, offsets.get(r, 0) - base, dropped_counts,
                            tier_counts)
                writer.end_unit()  # a file at a time: what a writer may buffer
                del scan
            if st is None:
                continue
            _write_marks(writer, st, marks.get(r, []), base)
            if gpu_of.get(r) and gpu_of[r][0] in node_pid:
                node, gpu = gpu_of[r]
                _write_gpu_counters(writer, ids, st, node_counters(node), gpu, base)
            writer.end_unit()
            per_rank[r] = st.x_events
        if gmarks:
            writer.process(ProcessInfo(findings_pid, FINDINGS_PROCESS, order[("findings", None)],
                                       "uberprof"))
            fst = _RankState(-1, findings_pid, FINDINGS_PROCESS)
            _marks_tracks(writer, ids, fst, gmarks)
            _write_marks(writer, fst, gmarks, base)
            writer.end_unit()
        for n, h in nodes:
            taken = {g for r, (nd, g) in gpu_of.items() if nd == n and r in per_rank}
            series = [s for s in node_counters(n).series if s.gpu is None or s.gpu not in taken]
            if not series:
                continue
            pid = node_pid[n]
            writer.process(ProcessInfo(pid, qualify(f"node {n}", f"{h}, counters" if h and h != n
                                                   else "counters"),
                                       order[("node", n)], "counters"))
            tid = ids.new_tid(pid)
            writer.track(TrackInfo(pid, tid, "counters", 0))
            for s in series:
                writer.events(C.series_events(s, pid, tid, base))
            writer.end_unit()
        if not per_rank:  # a file of findings alone is no export: say why instead
            raise ExportError("nothing exported: no trace of any selected rank could be read: "
                              + "; ".join(notes))
        if getattr(writer, "unsupported", 0):
            notes.append(f"{writer.unsupported} events of kinds the perfetto format export does "
                         "not carry (B/E pairs, async events) left out; the JSON export keeps them")
        dropped = _drop_report(dropped_counts, tier_counts, cut)
        summary = _summary(d, ctx, opts, ranks, base, cut, dropped, notes, per_rank)
        summary["events_written"] = writer.events_written
        writer.finish(summary)
    except BaseException:
        writer.abort()
        raise
    final = writer.path
    return ExportResult(path=final, fmt=opts.fmt, ranks=ranks, events=writer.events_written,
                        bytes_uncompressed=writer.bytes_written,
                        bytes_file=final.stat().st_size, seconds=time.monotonic() - t0,
                        dropped=dropped, notes=notes, summary=summary)


# --- per file -----------------------------------------------------------------------------------

def _scan(path: str, notes: list[str]) -> FileScan | None:
    try:
        return scan_file(path)
    except TraceError as exc:
        notes.append(str(exc) + "; left out")
        return None
    except Exception as exc:  # noqa: BLE001 - one odd file never costs the other ranks
        notes.append(f"{path}: could not be read ({type(exc).__name__}: {exc}); left out "
                     "(please report this)")
        return None


def _select(scan: FileScan, window: tuple[int, int] | None,
            python: bool) -> tuple[np.ndarray, dict[str, int]]:
    """Events kept before the budget, and what was left out by rule (not by size)."""
    ph = scan.ph
    x = ph == PH_X
    valid = scan.ts_ok & (~x | (scan.dur_ns >= 0))
    keep = valid & (ph != PH_M)
    drops: dict[str, int] = {}
    bad = int((x & ~valid).sum())
    if bad:
        drops["invalid"] = bad
    if not python:
        py = keep & (scan.tier == TIER_PYTHON)
        if py.any():
            drops["python"] = int(py.sum())
            keep &= ~py
    if window is not None:
        lo, hi = window
        end = scan.ts_ns + np.where(x, np.maximum(scan.dur_ns, 0), 0)
        # overlapping the window (touching its edges is not), instants inside it
        inside = ((scan.ts_ns < hi) & (end > lo)) | ((end == scan.ts_ns) & (scan.ts_ns >= lo)
                                                     & (scan.ts_ns < hi))
        out = keep & ~inside
        if out.any():
            drops["steps"] = int((out & x).sum())
            keep &= inside
    return keep, drops


def _output_ratio(scan: FileScan, keep: np.ndarray, sample: int = 2000) -> float:
    """Bytes the JSON export writes per byte of source text, from a sample of the file's kept
    events re-encoded compactly (Kineto indents and spaces its JSON; the export does not, and
    its timestamps are shorter)."""
    import msgspec
    import orjson

    idx = np.flatnonzero(keep & (scan.ph != PH_M))
    if idx.size == 0:
        return 1.0
    idx = idx[np.linspace(0, idx.size - 1, min(sample, idx.size)).astype(np.int64)]
    raws = [scan.raw.events[i] for i in idx.tolist()]
    evs = msgspec.json.decode(b"[" + b",".join(raws) + b"]")
    out = 0
    for e in evs:
        if isinstance(e, dict):
            e["ts"] = 1_234_567.89025  # a typical exported time: µs after the export's base
            out += len(orjson.dumps(e)) + 1
    src = sum(len(r) for r in raws) + len(raws)
    return min(max(out / src, 0.2), 1.5)


def _pair_flows(scan: FileScan, keep: np.ndarray) -> np.ndarray:
    """Flow arrows whose start or end (or the launch or kernel they bind to) is gone are
    dropped too: a viewer would draw them to nowhere, or to the wrong slice."""
    ph = scan.ph
    is_flow = ph == PH_FLOW
    if not is_flow.any():
        return keep
    gone_x = (ph == PH_X) & ~keep & (scan.correlation >= 0)
    if gone_x.any():
        orphan = is_flow & (scan.flow_int_id >= 0) & np.isin(scan.flow_int_id,
                                                             scan.correlation[gone_x])
        keep = keep & ~orphan
    live = keep & is_flow & (scan.flow >= 0)
    starts = np.unique(scan.flow[live & ~scan.flow_end])
    ends = np.unique(scan.flow[live & scan.flow_end])
    both = np.intersect1d(starts, ends, assume_unique=True)
    return keep & ~(is_flow & ~np.isin(scan.flow, both))


def _write_file(writer: TraceWriter, ids: IdSpace, st: _RankState, scan: FileScan,
                window: tuple[int, int] | None, python: bool, cut: Cut, shift: int,
                dropped: dict[str, list[int]], tier_counts: dict[int, list[int]]) -> None:
    keep, rule_drops = _select(scan, window, python)
    for k, v in rule_drops.items():
        dropped.setdefault(k, [0, 0])[0] += v
    by_budget = cut.drop_mask(scan, keep)
    if by_budget.any():
        for t in np.unique(scan.tier[by_budget]).tolist():
            m = by_budget & (scan.tier == t)
            c = tier_counts.setdefault(int(t), [0, 0])
            c[0] += int(m.sum())
            c[1] += int(scan.size[m].sum())
        keep = keep & ~by_budget
    keep = _pair_flows(scan, keep)

    # tracks: lanes where a source track's complete events do not nest
    x = keep & (scan.ph == PH_X)
    lane = np.zeros(scan.n, dtype=np.int32)
    xi = np.flatnonzero(x)
    if xi.size:
        tr = scan.track[xi]
        order = np.argsort(tr, kind="stable")
        xs, trs = xi[order], tr[order]
        cuts = np.flatnonzero(np.diff(trs)) + 1
        for seg in np.split(xs, cuts):
            s = scan.ts_ns[seg]
            lane[seg] = nest_lanes(s, s + scan.dur_ns[seg])
    on_track = keep & ~((scan.ph == PH_INSTANT) & (scan.scope > 0))  # those go to the process
    used = sorted({(int(t), int(l)) for t, l in zip(scan.track[on_track].tolist(),
                                                   lane[on_track].tolist())},
                  key=lambda k: _track_order(scan, k))
    main = scan.main_track()
    local: dict[tuple[int, int], int] = {}
    devices = {scan.tracks[t][0] for t in scan.device_tracks}
    for t, ln in used:
        src = scan.tracks[t]
        key = (src[0], src[1], ln)
        tid = st.tids.get(key)
        if tid is None:
            tid = st.tids[key] = ids.new_tid(st.pid)
            writer.track(TrackInfo(st.pid, tid, _track_name(scan, t, ln, devices),
                                   len(st.tids)))
        local[(t, ln)] = tid
        if st.main_tid is None and t == main and ln == 0:
            st.main_tid = tid
    if st.main_tid is None and local:
        st.main_tid = next(iter(local.values()))
    tid_of = np.zeros(scan.n, dtype=np.int64)
    for (t, ln), tid in local.items():
        tid_of[(scan.track == t) & (lane == ln) & keep] = tid
    flow_ids = {int(f): ids.new_flow_id() for f in np.unique(scan.flow[keep & (scan.flow >= 0)])}
    process_tid = st.main_tid if st.main_tid is not None else 0
    st.x_events += int(x.sum())
    for batch in iter_events(scan, keep, tid_of, st.pid, shift, flow_ids, process_tid):
        writer.events(batch)


def _track_order(scan: FileScan, key: tuple[int, int]) -> tuple[Any, ...]:
    """Main thread first, then other host threads, then device streams, then the rest."""
    t, lane = key
    pid, tid = scan.tracks[t]
    if t == scan.main_track():
        group = 0
    elif t in scan.device_tracks:
        group = 2
    elif isinstance(pid, int) and isinstance(tid, int):
        group = 1
    else:
        group = 3
    num = tid if isinstance(tid, int) else 0
    return (group, str(type(pid)), pid if isinstance(pid, int) else 0, num, str(tid), lane)


def _track_name(scan: FileScan, t: int, lane: int, device_pids: set[Any]) -> str:
    pid, tid = scan.tracks[t]
    name = scan.thread_names.get((pid, tid))
    if t in scan.device_tracks:
        base = name or f"stream {tid}"
        if len(device_pids) > 1:
            label = scan.process_labels.get(pid) or f"device {pid}"
            base = qualify(base, label)
    elif name:
        base = name
    elif isinstance(tid, str):
        base = tid
    else:
        base = f"thread {tid}"
    if t == scan.main_track() and "main" not in base:
        base = qualify(base, "training loop")
    return base if lane == 0 else qualify(base, f"overlapping {lane}")


def _rank_name(r: int, ctx: RunContext, scan: FileScan, gpu_of: dict[int, tuple[str, str]],
               run_root: Path) -> str:
    host = ctx.host_of(r) or scan.raw.host or "unknown host"
    dev = "CPU"
    if r in gpu_of:
        g = gpu_of[r][1]
        dev = "GPU " + g[3:] if g.startswith("gpu") else g
    else:
        meta = _rank_meta(run_root, r) if ctx.is_run_dir else {}
        device = meta.get("device") if isinstance(meta.get("device"), dict) else {}
        if isinstance(device.get("index"), int):
            dev = f"GPU {device['index']}"
        else:
            gpus = sorted({scan.process_labels.get(scan.tracks[t][0], "")
                           for t in scan.device_tracks} - {""})
            if gpus:
                dev = ", ".join(gpus)
            elif scan.device_tracks:
                dev = "GPU"
    return qualify(f"rank {r}", f"{host}, {dev}")


def _rank_meta(root: Path, rank: int) -> dict[str, Any]:
    m = ranks_by_id(root).get(rank)
    return m.raw if m is not None else {}


# --- uberprof's own tracks ----------------------------------------------------------------------

def _uberprof_tracks(writer: TraceWriter, ids: IdSpace, st: _RankState, marks: list[Mark]) -> None:
    """The rank's uberprof tracks come first, so their tids (and places) precede the trace's."""
    _marks_tracks(writer, ids, st, marks, RANK_TRACKS)


def _marks_tracks(writer: TraceWriter, ids: IdSpace, st: _RankState, marks: list[Mark],
                  order: tuple[str, ...] = ()) -> None:
    names: list[str] = [t for t in order if any(m.track == t for m in marks)]
    names += [m.track for m in marks if m.track not in names]
    names = list(dict.fromkeys(names))
    for name in names:
        mine = [m for m in marks if m.track == name]
        ranged = [m for m in mine if m.dur is not None]
        lanes = nest_lanes(np.array([m.ts for m in ranged], dtype=np.int64),
                           np.array([m.ts + (m.dur or 0) for m in ranged], dtype=np.int64))
        for m, ln in zip(ranged, lanes.tolist()):
            m.args.setdefault("_lane", ln)
        for m in mine:
            if m.dur is None:
                m.args.setdefault("_lane", 0)
        for ln in sorted({int(m.args["_lane"]) for m in mine}):
            tid = ids.new_tid(st.pid)
            st.tids[("uberprof", name, ln)] = tid
            writer.track(TrackInfo(st.pid, tid, name if ln == 0 else qualify(name, f"lane {ln + 1}"),
                                   len(st.tids)))


def _write_marks(writer: TraceWriter, st: _RankState, marks: list[Mark], base: int) -> None:
    batch = []
    for m in marks:
        lane = int(m.args.pop("_lane", 0))
        tid = st.tids.get(("uberprof", m.track, lane))
        if tid is None:
            continue
        ts = max(m.ts, base)  # nothing before the time base (viewers drop negative times)
        e: dict[str, Any] = {"name": m.name, "cat": "uberprof", "pid": st.pid, "tid": tid,
                             "ts": ts - base, "args": m.args}
        if m.dur is None:
            e["ph"], e["s"] = "i", "t"
        else:
            e["ph"], e["dur"] = "X", max(m.ts + m.dur - ts, 0)
        batch.append(e)
    if batch:
        writer.events(batch)


def _write_gpu_counters(writer: TraceWriter, ids: IdSpace, st: _RankState,
                        nc: C.NodeCounters, gpu: str, base: int) -> None:
    series = [s for s in nc.series if s.gpu == gpu]
    if not series:
        return
    tid = ids.new_tid(st.pid)
    st.tids[("uberprof", "counters", 0)] = tid
    writer.track(TrackInfo(st.pid, tid, "GPU counters", len(st.tids)))
    for s in series:
        writer.events(C.series_events(s, st.pid, tid, base))


# --- helpers ------------------------------------------------------------------------------------

def _writer(opts: ExportOptions, out: Path, base: int) -> TraceWriter:
    out = Path(out)
    if opts.gzip and not out.name.endswith(".gz"):
        out = out.with_name(out.name + ".gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    if opts.fmt == "perfetto":
        from uberprof.present.export.perfetto import PerfettoWriter

        return PerfettoWriter(out, opts.gzip, base)
    if opts.fmt != "chrome":
        raise ValueError(f"format must be chrome or perfetto, not {opts.fmt!r}")
    from uberprof.present.export.chrome import ChromeWriter

    header = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
              "traceName": "uberprof export"}
    return ChromeWriter(out, opts.gzip, header)


def _windows(ctx: RunContext, d: Diagnosis, ranks: list[int],
             steps: tuple[int, int] | None) -> dict[int, tuple[int, int]]:
    """Per rank, the time span (own clock) to export: the whole trace, or the selected steps'
    host and device windows."""
    out: dict[int, tuple[int, int]] = {}
    if steps is None:
        for r in ranks:
            w = ctx.ranks[r].window
            if w is not None:
                out[r] = w
        return out
    t = ctx.steps()
    for row in t.to_pylist():
        r, s = row["rank"], row["step"]
        if r not in ranks or not row.get("traced") or not (steps[0] <= s <= steps[1]):
            continue
        vals = [v for v in (row.get("host_start_ns"), row.get("device_start_ns")) if v is not None]
        ends = [v for v in (row.get("host_end_ns"), row.get("device_end_ns")) if v is not None]
        if not vals or not ends:
            continue
        a, b = min(vals), max(ends)
        if r in out:
            a, b = min(a, out[r][0]), max(b, out[r][1])
        out[r] = (a, b)
    return out


def _base(first: int | None) -> int:
    """The output's time base: a whole millisecond at least one before anything in it, so
    every timestamp is small, positive and exact in a double (and viewers open on the data)."""
    if first is None:
        return 0
    return (first // 1_000_000 - 1) * 1_000_000


def _trace_spans(analysis: Analysis, ranks: list[int]) -> dict[int, tuple[int, int]]:
    """Per rank, its traces' first event start and last event end (own clock), from the
    analysis' per-input summaries."""
    out: dict[int, tuple[int, int]] = {}
    for r, s in analysis.input_summaries():
        a, b = s.get("first_ns"), s.get("last_ns")
        if r in ranks and isinstance(a, int) and isinstance(b, int):
            out[r] = (min(a, out[r][0]), max(b, out[r][1])) if r in out else (a, b)
    return out


def _counter_window(lo: int, hi: int) -> tuple[int, int]:
    """Counters over the traces, and from a while before them (the value they start with)."""
    return lo - 10_000_000_000, hi


def _host_offset(d: Diagnosis, host: str | None) -> int:
    for h in d.alignment.hosts:
        if h.host == host:
            return h.offset_ns
    return 0


def _file_overlaps(name: str, steps: tuple[int, int]) -> bool:
    span = parse_trace_file_name(name)
    return span is None or (span[0] <= steps[1] and steps[0] <= span[1])


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:12])) + (f" (+{len(xs) - 12})" if len(xs) > 12 else "")


_RULE_DROPS = {
    "python": "Python function events (off by default: --with-python keeps them)",
    "steps": "complete events outside the selected steps",
    "invalid": "complete events without a usable time or with a negative duration "
               "(uberprof analyze leaves them out too)",
}


def _drop_report(counts: dict[str, list[int]], tiers: dict[int, list[int]],
                 cut: Cut) -> list[dict[str, Any]]:
    out = [{"what": _RULE_DROPS[k], "reason": k, "events": v[0]}
           for k, v in counts.items() if v[0]]
    return out + describe_drops(tiers, cut)


def _summary(d: Diagnosis, ctx: RunContext, opts: ExportOptions, ranks: list[int], base: int,
             cut: Cut, dropped: list[dict[str, Any]], notes: list[str],
             per_rank: dict[int, int]) -> dict[str, Any]:
    return {
        "uberprof_version": __version__,
        "source": str(ctx.root),
        "format": opts.fmt,
        "ranks": ranks,
        "steps": list(opts.steps) if opts.steps else None,
        "time_base_ns": base,
        "clock": "aligned: each host's offset (clock_alignment) added to its ranks' timestamps",
        "clock_alignment": d.alignment.as_dict(),
        "complete_events_per_rank": {str(r): n for r, n in per_rank.items()},
        "budget": {"limit_mb": round(opts.max_bytes / 1e6, 1) if opts.max_bytes else None,
                   "estimate_mb": round(cut.estimate_bytes / 1e6, 1) if cut.estimate_bytes
                   else None},
        "dropped": dropped,
        "findings": [f.title for f in d.findings],
        "notes": notes,
    }

