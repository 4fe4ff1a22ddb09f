"""`export_trace`: every rank's trace windows merged into one timeline on the aligned clock, with
uberprof's findings and the node counters beside them.

The export reads an opened run (`uberprof.analysis.read.open_run`): its tables give each
trace's rank, the steps' windows and the trace files; its diagnosis the clock alignment and the
findings. It computes none of them. The stages:

1. select (window.py): the ranks, their files and each rank's window, the time base;
2. plan (plan.py): counter sources, process order and ids, uberprof's marks, and the size
   budget's cut (a first pass measures what each kind of event weighs, when the inputs might
   exceed the budget; budget.py drops the least useful first); without `--steps`, when the
   events never dropped exceed the budget, the steps that fit (stepfit.py) are planned instead;
3. write: each rank's files read one at a time, their events decided on (events.py) and
   streamed to the writer on the rank's tracks (tracks.py), then its marks and GPU counters
   (overlay.py) and its GPU memory per step (memory.py); then the findings' process and the
   nodes' counters; last the summary.

Memory stays at one trace file, never the merged trace.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uberprof._version import __version__
from uberprof.analysis.diagnosis.model import WRITING_RANKS, Diagnosis, Progress
from uberprof.analysis.read import OpenedRun
from uberprof.present.export.autosteps import plan_window
from uberprof.present.export.budget import Cut
from uberprof.present.export.events import Drops, kept_events, read_scan
from uberprof.present.export.findings import RANK_TRACKS
from uberprof.present.export.layout import ProcessInfo
from uberprof.present.export.memory import MEMORY_COLUMNS
from uberprof.present.export.options import (
    DEFAULT_MAX_MB,
    ExportError,
    ExportOptions,
    ExportResult,
)
from uberprof.present.export.overlay import (
    NodeCounterReader,
    marks_tracks,
    write_findings_process,
    write_node_counters,
    write_rank_overlay,
)
from uberprof.present.export.plan import Plan, plan_cut, plan_layout
from uberprof.present.export.tracks import RankState, rank_name, write_file
from uberprof.present.export.window import Selection, select_window
from uberprof.present.export.writer import TraceWriter

if TYPE_CHECKING:
    from uberprof.analysis.read import RunContext  # OpenedRun.ctx

__all__ = ["DEFAULT_MAX_MB", "ExportError", "ExportOptions", "ExportResult", "export_trace"]


def export_trace(opened: OpenedRun, out: str | os.PathLike[str],
                 options: ExportOptions | None = None,
                 progress: Progress | None = None) -> ExportResult:
    """Merge the traces of `opened` (`open_run`'s run, with its diagnosis) into `out`.
    Raises `ExportError` when there is nothing to export (no traces, no rank left)."""
    was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived dicts and no cycles: spare the collector's scans
    try:
        return _export(opened, Path(out), options or ExportOptions(), progress)
    finally:
        if was_enabled:
            gc.enable()


def _export(opened: OpenedRun, out: Path, opts: ExportOptions,
            progress: Progress | None) -> ExportResult:
    """Select, plan, write (see the module doc); the writer's file is removed on any error."""
    t0 = time.monotonic()
    ctx, d = _tables_and_diagnosis(opened)
    notes: list[str] = list(ctx.problems)  # what the analysis found wrong, as analyze says it
    sel = select_window(ctx, d, opts, notes)
    plan = plan_layout(ctx, d, sel, opts, notes)
    sized = plan_cut(sel, opts, plan.fixed_bytes, notes,
                     ctx.steps() if not opts.steps else None)
    cut, chosen = sized.cut, None
    memory = opened.step_timelines(MEMORY_COLUMNS)
    if sized.tally is not None:  # what is never dropped exceeds the budget: fewer steps
        opts, sel, plan, cut = plan_window(ctx, d, opts, sel, plan, sized, memory, notes)
        chosen = {"steps": list(opts.steps or ()), "traced_steps": len(sized.tally.steps),
                  "around_step": sized.tally.steps[sized.tally.slowest],
                  "all_steps_mb": round(sized.kept_bytes / 1e6, 1)}
    writer = open_writer(opts.fmt, out, opts.gzip, sel.base)
    try:
        drops = Drops()
        per_rank = _write_all(writer, ctx, d, sel, plan, cut, opts, drops, notes, progress,
                              memory)
        if getattr(writer, "unsupported", 0):
            notes.append(f"{writer.unsupported} events of kinds the perfetto format export does "
                         "not carry (B/E pairs, async events) left out; the JSON export keeps them")
        dropped = drops.report(cut)
        summary = _summary(d, ctx, opts, sel, cut, dropped, notes, per_rank)
        if chosen:  # the steps the budget chose (the note says why)
            summary["budget"]["steps_chosen"] = chosen
        summary["events_written"] = writer.events_written
        writer.finish(summary)
    except BaseException:
        writer.abort()
        raise
    final = writer.path
    return ExportResult(path=final, fmt=opts.fmt, ranks=sel.ranks, events=writer.events_written,
                        bytes_uncompressed=writer.bytes_written,
                        bytes_file=final.stat().st_size, seconds=time.monotonic() - t0,
                        dropped=dropped, notes=notes, summary=summary)


def _tables_and_diagnosis(opened: OpenedRun) -> tuple[RunContext, Diagnosis]:
    """The run's tables and diagnosis; a path without traces has nothing to export."""
    if opened.ctx is None:
        raise ExportError(opened.no_traces or f"{opened.root}: no traces")
    if opened.diagnosis is None:
        raise ValueError("the export needs the run's diagnosis: open it with open_run")
    return opened.ctx, opened.diagnosis


def _write_all(writer: TraceWriter, ctx: RunContext, d: Diagnosis, sel: Selection, plan: Plan,
               cut: Cut, opts: ExportOptions, drops: Drops, notes: list[str],
               progress: Progress | None, memory: Any = None) -> dict[int, int]:
    """The write stage: the ranks in order, then the findings' process and the nodes'
    counters. Returns the complete events written per rank (a rank none of whose files could
    be read is left out); none at all is an `ExportError`."""
    counters = NodeCounterReader(Path(ctx.root), d, plan, sel.frame, sel.base)
    per_rank: dict[int, int] = {}
    for i, r in enumerate(sel.ranks):
        if progress:
            progress(i, len(sel.ranks), f"rank {r}", WRITING_RANKS)
        st = _write_rank(writer, ctx, sel, plan, cut, opts, r, drops, notes)
        if st is None:
            continue
        write_rank_overlay(writer, plan, sel, st, counters, memory)
        writer.end_unit()
        per_rank[r] = st.x_events
    write_findings_process(writer, plan, sel.base)
    write_node_counters(writer, plan, counters, per_rank, sel.base)
    if not per_rank:  # a file of findings alone is no export: say why instead
        raise ExportError("nothing exported: no trace of any selected rank could be read: "
                          + "; ".join(notes))
    return per_rank


def _write_rank(writer: TraceWriter, ctx: RunContext, sel: Selection, plan: Plan, cut: Cut,
                opts: ExportOptions, r: int, drops: Drops,
                notes: list[str]) -> RankState | None:
    """Rank `r`'s process and its trace files, one file in memory at a time; the process
    (named from the first readable file) and its uberprof tracks come first. None when no
    file could be read."""
    st = None
    for p in sel.files[r]:
        scan = read_scan(p, notes)
        if scan is None:
            continue
        if st is None:
            st = RankState(r, r, rank_name(r, ctx, scan, plan.gpu_of, Path(ctx.root)))
            writer.process(ProcessInfo(st.pid, st.name, plan.order[("rank", r)], f"rank {r}"))
            # the rank's uberprof tracks come first, so their tids (and places) precede the trace's
            marks_tracks(writer, plan.ids, st, plan.marks.get(r, []), RANK_TRACKS)
        keep = kept_events(scan, sel.event_window(r), opts.python, cut, drops)
        write_file(writer, plan.ids, st, scan, keep, sel.shift(r))
        writer.end_unit()  # a file at a time: what a writer may buffer
        del scan, keep
    return st


def _summary(d: Diagnosis, ctx: RunContext, opts: ExportOptions, sel: Selection, cut: Cut,
             dropped: list[dict[str, Any]], notes: list[str],
             per_rank: dict[int, int]) -> dict[str, Any]:
    """The export's own record, written into the file: what it holds, its clock, what the
    budget and the rules left out, the findings and the notes."""
    return {
        "uberprof_version": __version__,
        "source": str(ctx.root),
        "format": opts.fmt,
        "ranks": sel.ranks,
        "steps": list(opts.steps) if opts.steps else None,
        "time_base_ns": sel.base,
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


def open_writer(fmt: str, out: Path, gzipped: bool, base: int) -> TraceWriter:
    """The writer of format `fmt` (chrome or perfetto) for `out` (".gz" added when
    compressing), timestamps relative to `base` ns."""
    out = Path(out)
    if gzipped and not out.name.endswith(".gz"):
        out = out.with_name(out.name + ".gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "perfetto":
        from uberprof.present.export.perfetto import PerfettoWriter

        return PerfettoWriter(out, gzipped, base)
    if fmt != "chrome":
        raise ValueError(f"format must be chrome or perfetto, not {fmt!r}")
    from uberprof.present.export.chrome import ChromeWriter

    header = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
              "traceName": "uberprof export"}
    return ChromeWriter(out, gzipped, header)
