"""The cross-rank reduce of `uberprof analyze`: reads only the small per-input tables (steps,
summaries, collectives, operators) and the rank folders' step timelines, decides which rank each
trace belongs to, and writes the run-level tables (steps, ranks, collectives, operators) and
summary.json, one rank at a time so that memory holds one rank's tables however many ranks
there are. When nothing it reads has changed since it last ran (`reduce.json` holds a key of its
inputs), it reads back what it wrote instead: a second `report` or `dashboard` of a big run
starts at once.

In a run directory, one folder per rank is read (`uberprof.rundir.ranks_by_id`, the rule every
reader follows): a second folder of a rank (a restart, or two jobs under one run id) and a
folder whose rank cannot be read are left out, never mixed in, and the problems `info` names
about the folders are the analysis' problems too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from uberprof._version import __version__
from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.derived import (
    COLLECTIVES_FILE,
    FORMAT_VERSION,
    MEMORY_FILE,
    MODULES_FILE,
    OPERATORS_FILE,
    OVERVIEW_FILE,
    RANKS_FILE,
    REDUCE_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    Analysis,
    ParquetOut,
    read_input_summary,
    read_input_table,
    read_timeline,
    read_whole,
)
from uberprof.analysis.tables.overview import write_overview
from uberprof.analysis.tables.schemas import (
    BREAKDOWN_FIELDS,
    RANK_SCHEMA,
    RUN_COLLECTIVE_SCHEMA,
    RUN_MEMORY_TIMELINE_SCHEMA,
    RUN_MODULE_SCHEMA,
    RUN_OPERATOR_SCHEMA,
    RUN_STEP_SCHEMA,
)
from uberprof.ingest.discover import Source, TraceInput
from uberprof.rundir import (
    RANK_FILE,
    RankMeta,
    RunDir,
    folder_problems,
    is_utf8,
    list_nodes,
    list_ranks,
    ranks_by_id,
    shown,
    write_json_atomic,
)
from uberprof.rundir import STEPS_FILE as STEPS_JSONL
from uberprof.rundir.damage import damage_problems

__all__ = ["reduce_run"]

_WRITES = (STEPS_FILE, COLLECTIVES_FILE, OPERATORS_FILE, MODULES_FILE, MEMORY_FILE, RANKS_FILE,
           SUMMARY_FILE, OVERVIEW_FILE)


def reduce_run(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
               timelines: dict[str, dict[str, Any]], reuse: bool = True) -> Analysis:
    """Decide each trace's rank, then write the run-level tables and summary.json from the
    inputs' and timelines' tables (`entries`, `timelines`: the manifest's sections); or, with
    `reuse`, read them back when none of that changed since the last time."""
    key = _reduce_key(source, entries, timelines)
    done = _reduced_before(source, derived, entries, key) if reuse else None
    if done is not None:
        done.timelines = timelines
        return done
    result = _reduce(source, derived, entries, timelines, key)
    result.timelines = timelines
    rank_of = {rel: e.get("rank") for rel, e in result.inputs.items()}
    try:
        write_json_atomic(derived / REDUCE_FILE, {"key": key, "rank_of": rank_of})
    except OSError:
        pass  # only the next start's shortcut is lost
    return result


def _reduce_key(source: Source, entries: dict[str, dict[str, Any]],
                timelines: dict[str, dict[str, Any]]) -> str:
    """Everything the reduce reads, as a hash: the inputs' and timelines' manifest entries
    (each names the size and mtime of its file), and each rank folder's rank.json (its
    identity and state, which the reduce's problems quote)."""
    folders = []
    for rank, rd in source.rank_dirs:
        try:
            st = (rd / RANK_FILE).stat()
            folders.append([rank, rd.name, st.st_size, st.st_mtime_ns])
        except OSError:
            folders.append([rank, rd.name, None, None])
    doc = {"format": FORMAT_VERSION, "version": __version__, "kind": source.kind,
           "root": str(source.root),
           "inputs": [[i.rel, i.rank_hint, i.hint_source, entries.get(i.rel)]
                      for i in source.inputs],
           "timelines": timelines, "folders": folders}
    # the standard encoder: file names that are not UTF-8 (lone surrogates) are escaped, not
    # refused as orjson does
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _reduced_before(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
                    key: str) -> Analysis | None:
    """The Analysis the last reduce wrote, when it read exactly what this one would."""
    try:
        mark = orjson.loads((derived / REDUCE_FILE).read_bytes())
        if not isinstance(mark, dict) or mark.get("key") != key or \
                not all(os.path.isfile(derived / f) for f in _WRITES):
            return None
        summary = orjson.loads((derived / SUMMARY_FILE).read_bytes())
        rank_rows = read_whole(derived / RANKS_FILE).to_pylist()
    except (OSError, ValueError, pa.ArrowException):
        return None
    rank_of = mark.get("rank_of") or {}
    inputs = {i.rel: {**entries[i.rel], "rank": rank_of.get(i.rel)}
              for i in source.inputs if i.rel in entries}
    return Analysis(source=source.root, derived=derived, summary=summary, ranks=rank_rows,
                    inputs=inputs)


Item = tuple[TraceInput, dict[str, Any], dict[str, Any]]  # input, manifest entry, summary
Ranked = tuple[int, TraceInput, dict[str, Any], dict[str, Any]]  # rank, then as Item


def _reduce(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
            timelines: dict[str, dict[str, Any]], key: str = "") -> Analysis:
    """The reduce, in stages: choose the rank folders to read (one per rank), read the inputs'
    summaries, decide each trace's rank and drop duplicates, write the per-rank steps and
    collectives, then the rank table and the summary document. Every stage adds its problems
    to one list, in this order: the order the summary gives them in."""
    problems: list[str] = []
    metas = list_ranks(source.root) if source.kind == "run" else []
    if source.kind == "run":  # run.json, node.json, flight logs, counters: named, not fatal
        problems.extend(damage_problems(source.root))
    problems.extend(folder_problems(metas))
    read = {m.folder for m in ranks_by_id(metas).values()}
    left_out = {rd for _, rd in source.rank_dirs if rd not in read}
    loaded = _read_summaries(source, derived, entries, left_out, problems)
    kept = _drop_duplicates(_assign_ranks(source, loaded, problems), problems)
    rank_rows = _write_rank_steps(source, derived, timelines, kept, left_out, metas, problems)
    write_overview(derived, key)  # what the dashboard's overview draws, from these steps
    if not rank_rows and not problems:
        problems.append(f"{source.root}: nothing to analyse: no trace and no step timeline")
    _write_ranks(derived, rank_rows)
    summary = _write_summary(derived, rank_rows, problems)
    rank_of = {inp.rel: rank for rank, inp, _, _ in kept}
    inputs = {}
    for inp in source.inputs:
        if inp.rel in entries:
            inputs[inp.rel] = {**entries[inp.rel], "rank": rank_of.get(inp.rel)}
    return Analysis(source=source.root, derived=derived, summary=summary, ranks=rank_rows,
                    inputs=inputs)


def _read_summaries(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
                    left_out: set[Path], problems: list[str]) -> list[Item]:
    """Stage 1: the summary of each input the reduce can use, with its manifest entry. An
    input of a rank folder left out, with a file name that is not UTF-8, that failed or whose
    tables cannot be read is left out (the last three named in `problems`); the problems the
    map found in an input are the analysis' too."""
    loaded: list[Item] = []
    for inp in source.inputs:
        if left_out and inp.path.parents[1] in left_out:  # ranks/<r>/traces/<file>
            continue
        if not is_utf8(inp.rel):
            problems.append(f"{shown(inp.path)}: the file name is not valid UTF-8; left out "
                            "(rename it to analyse it)")
            continue
        e = entries.get(inp.rel)
        if e is None:
            continue
        if e.get("status") != "ok":
            problems.append(e.get("message") or f"{inp.path}: could not be analysed")
            continue
        try:
            doc = read_input_summary(derived, e["key"])
        except (OSError, ValueError) as exc:
            problems.append(f"{inp.path}: its derived tables are unreadable ({exc}); "
                            "run uberprof analyze --force")
            continue
        problems.extend(doc.get("problems") or [])
        summary = doc["summary"]
        # Only what the reduce uses: a summary's process groups list every rank of each group,
        # and keeping them for every input would grow with ranks squared.
        loaded.append((inp, e, {k: summary.get(k) for k in _REDUCE_KEYS}))
    return loaded


def _assign_ranks(source: Source, loaded: list[Item], problems: list[str]) -> list[Ranked]:
    """Stage 2: which rank each trace belongs to: the trace itself, then the run directory,
    then its name. Where the trace and its folder disagree, the trace's rank wins (said in
    `problems`); a lone trace with none is rank 0; other traces without one are left out."""
    assigned: list[Ranked] = []
    unranked = []
    for inp, e, s in loaded:
        rank = s.get("trace_rank")
        if rank is not None:
            if inp.rank_hint is not None and inp.hint_source == "run directory" \
                    and inp.rank_hint != rank:
                problems.append(f"{inp.path}: the trace says rank {rank} but it sits in the "
                                f"folder of rank {inp.rank_hint}; using rank {rank}")
        elif inp.rank_hint is not None:
            rank = inp.rank_hint
        if rank is None:
            unranked.append((inp, e, s))
        else:
            assigned.append((rank, inp, e, s))
    if unranked and len(source.inputs) == 1:
        inp, e, s = unranked[0]
        problems.append(f"{inp.path}: no rank in the trace (distributedInfo), its folder or its "
                        "name; analysed as rank 0, the only trace here")
        assigned.append((0, inp, e, s))
    else:
        for inp, _, _ in unranked:
            problems.append(f"{inp.path}: cannot tell which rank wrote it: no distributedInfo.rank "
                            "in the trace, not under ranks/<rank>/ of a run directory, and no "
                            "rank in its name (such as rank-3.json or worker3.pt.trace.json); "
                            "left out")
    return assigned


def _write_rank_steps(source: Source, derived: Path, timelines: dict[str, dict[str, Any]],
                      kept: list[Ranked], left_out: set[Path], metas: list[RankMeta],
                      problems: list[str]) -> list[dict[str, Any]]:
    """Stage 3: the run's steps, collectives and operators tables (through ParquetOut), one
    rank at a time: its step rows, collectives and operators are written out before the next
    rank's are read, so memory holds one rank's tables (plus one small row per rank), however
    many. A rank counts with a trace or a step timeline. Returns the ranks' rows (RANK_SCHEMA);
    cut-off timelines and ranks without a trace go to `problems`."""
    ranks_info: dict[int, list[Item]] = {}
    for rank, inp, e, s in kept:
        ranks_info.setdefault(rank, []).append((inp, e, s))
    dirs: dict[int, list[Path]] = {}
    for rank, rd in source.rank_dirs:
        if rank is not None and rd not in left_out:
            dirs.setdefault(rank, []).append(rd)
    cut: dict[Path, str] = {}  # step timelines cut off or unreadable
    rank_rows: list[dict[str, Any]] = []
    untraced: list[int] = []
    last_step: int | None = None  # the last step any rank finished or traced
    with ParquetOut(derived / STEPS_FILE, RUN_STEP_SCHEMA) as steps_out, \
            ParquetOut(derived / COLLECTIVES_FILE, RUN_COLLECTIVE_SCHEMA) as coll_out, \
            ParquetOut(derived / OPERATORS_FILE, RUN_OPERATOR_SCHEMA) as ops_out, \
            ParquetOut(derived / MODULES_FILE, RUN_MODULE_SCHEMA) as mod_out, \
            ParquetOut(derived / MEMORY_FILE, RUN_MEMORY_TIMELINE_SCHEMA) as mem_out:
        for rank in sorted(set(ranks_info) | set(dirs)):
            items = ranks_info.get(rank, [])
            timeline = _timeline(source.root, derived, timelines, dirs.get(rank, []), cut)
            if not items and timeline is None:
                continue
            rows = _steps(derived, rank, items, timeline)
            steps_out.write(rows)
            if rows.num_rows:
                top = pc.max(rows.column("step")).as_py()
                last_step = top if last_step is None else max(last_step, top)
            for part in _per_trace(derived, rank, items, COLLECTIVES_FILE,
                                   RUN_COLLECTIVE_SCHEMA):
                coll_out.write(part)
            for part in _per_trace(derived, rank, items, OPERATORS_FILE, RUN_OPERATOR_SCHEMA):
                ops_out.write(part)
            for part in _per_trace(derived, rank, items, MODULES_FILE, RUN_MODULE_SCHEMA,
                                   optional=True):
                mod_out.write(part)
            for part in _per_trace(derived, rank, items, MEMORY_FILE,
                                   RUN_MEMORY_TIMELINE_SCHEMA, optional=True):
                mem_out.write(part)
            rank_rows.append(_rank_row(rank, items, rows))
            if not items:
                untraced.append(rank)
    problems.extend(cut[rd] for _, rd in source.rank_dirs if rd in cut)
    if untraced and not source.inputs:
        why = _why_untraced(metas, rank_rows, _still_running(source.root), last_step)
        problems.append(f"{source.root}: no trace window in this run: {why}; "
                        "step times only, no breakdown")
    elif untraced:
        problems.append(f"rank(s) {', '.join(map(str, untraced))}: no usable trace window, "
                        "step times only")
    return rank_rows


def _write_ranks(derived: Path, rank_rows: list[dict[str, Any]]) -> None:
    """Stage 4: the rank table (RANK_SCHEMA), one row per rank, HTA's whole-trace breakdown."""
    with ParquetOut(derived / RANKS_FILE, RANK_SCHEMA) as out:
        out.write(pa.Table.from_pylist(rank_rows, schema=RANK_SCHEMA))


def _write_summary(derived: Path, rank_rows: list[dict[str, Any]],
                   problems: list[str]) -> dict[str, Any]:
    """Stage 5: summary.json, the `uberprof analyze --json` document: per rank its steps,
    breakdown shares and step times, then every problem the stages found; returned too."""
    summary = {
        "ranks": [
            {
                "rank": r["rank"],
                "steps": r["steps"],
                "idle_pct": r["idle_pct"],
                "compute_pct": r["compute_pct"],
                "non_compute_pct": r["non_compute_pct"],
                "overlap_pct": r["overlap_pct"],
                "exposed_comm_pct": r["exposed_comm_pct"],
                "step_time_ms": {"median": r["step_time_median_ms"],
                                 "p90": r["step_time_p90_ms"]},
            }
            for r in rank_rows
        ],
        "problems": problems,
    }
    write_json_atomic(derived / SUMMARY_FILE, summary)
    return summary


def _still_running(root: Path) -> bool:
    """Whether a node of the run has not written its end: the job runs (or its launcher was
    killed), so a rank without an end has not necessarily crashed (the dashboard's rule)."""
    return any(n.end_ns is None for n in list_nodes(RunDir(root)) if n.readable)


def _why_untraced(metas: list[RankMeta], rank_rows: list[dict[str, Any]],
                  running: bool = False, last_step: int | None = None) -> str:
    """Why a run has no trace at all, from what its ranks wrote: tracing off, tracing switched
    off, a job still running before its trace window, one that ended before it, or one that
    stopped inside it (it died in a step of the window, `last_step` + 1, before the window's
    trace was written: "before its trace window" would send the user to the wrong steps)."""
    trace = next((m.trace for m in metas if m.trace), {})
    schedule = trace.get("schedule")
    reason = next((m.trace.get("disabled_reason") for m in metas
                   if isinstance(m.trace.get("disabled_reason"), str)), None)
    if schedule == "off":
        return "tracing was off (--no-trace)"
    if reason:
        return f"tracing was switched off ({reason})"
    steps = max((r["steps"] for r in rank_rows), default=0)
    crashed = any(m.readable and (not m.finished or m.raw.get("exit") == "exception")
                  for m in metas)
    ended = ("the job is still running (or its launcher was killed)" if running
             else "the job stopped abruptly (crashed or killed)" if crashed else "the job ended")
    ended += f" after {steps} step(s)" if steps else " before finishing a step"
    if not isinstance(schedule, str):
        return f"{ended} without writing a trace (tracing off with --no-trace, or never started)"
    hint = (f", e.g. --trace-steps {max(0, steps - 3)}-{steps - 1}" if steps else "")
    died_in = (last_step + 1 if last_step is not None else 0) if crashed and not running \
        else None
    if died_in is not None and any(a <= died_in <= b for a, b in schedule_windows(schedule)):
        return (f"{ended}, inside its trace window ({schedule}): it stopped in step {died_in}, "
                "before the window's trace was written; to get a trace, choose steps it "
                f"finishes with --trace-steps{hint}")
    return (f"{ended}, before its trace window ({schedule}); to get a trace, choose steps "
            f"it reaches with --trace-steps{hint}")


def schedule_windows(schedule: str) -> list[tuple[int, int]]:
    """The windows of a trace schedule as rank.json describes it (`steps 3-6, steps 10-12`);
    none for a periodic one (`3 steps every 100`) or anything else."""
    return [(int(a), int(b)) for a, b in re.findall(r"steps (\d+)-(\d+)", schedule)]


_REDUCE_KEYS = ("trace_rank", "first_ns", "last_ns", "mode", "device_type", "host",
                *BREAKDOWN_FIELDS)


def _drop_duplicates(assigned: list[Ranked], problems: list[str]) -> list[Ranked]:
    """Several traces of one rank are fine when they cover different times (several windows);
    traces of one rank over the same time come from two jobs or copies: keep the first."""
    kept: list[Ranked] = []
    of_rank: dict[int, list[Ranked]] = {}
    for rank, inp, e, s in sorted(assigned, key=lambda x: (x[0], x[1].rel)):
        clash = next((k for k in of_rank.get(rank, [])  # per rank: linear in ranks
                      if s["first_ns"] < k[3]["last_ns"] and k[3]["first_ns"] < s["last_ns"]),
                     None)
        if clash is not None:
            problems.append(f"{inp.path}: duplicate rank {rank}: {clash[1].path} already covers "
                            "the same time for that rank (two jobs in one folder, or a copied "
                            "trace?); left out")
            continue
        kept.append((rank, inp, e, s))
        of_rank.setdefault(rank, []).append(kept[-1])
    return kept


def _timeline(root: Path, derived: Path, timelines: dict[str, dict[str, Any]],
              rank_dirs: list[Path], notes: dict[Path, str]) -> pa.Table | None:
    """One rank's step timeline (the tables `timeline_table` made of the steps.jsonl of its
    folders; a step in two folders: the first folder's), one row per step; None when it has
    none. Cut-off or unreadable timelines go to `notes`."""
    parts = []
    for rd in rank_dirs:
        e = timelines.get(rd.relative_to(root).as_posix())
        if e is None:  # no steps.jsonl
            continue
        if e.get("status") != "ok":
            notes[rd] = e.get("message") or f"{rd / STEPS_JSONL}: could not be read"
            continue
        if e.get("truncated"):
            notes[rd] = (f"{rd / STEPS_JSONL}: ends with a cut-off line; "
                         f"{e.get('rows')} whole steps kept")
        if e.get("skipped"):
            notes[rd] = "; ".join(filter(None, (notes.get(rd), e["skipped"])))
        if e.get("rows"):
            parts.append(read_timeline(derived, e["key"]))
    return _first_per_step(pa.concat_tables(parts)) if parts else None


def _first_per_step(t: pa.Table) -> pa.Table:
    """The first row of each step, in order of first appearance."""
    _, first = np.unique(t.column("step").to_numpy(), return_index=True)
    return t.take(np.sort(first)) if len(first) < t.num_rows else t


def _steps(derived: Path, rank: int, items: list[Item], timeline: pa.Table | None) -> pa.Table:
    """RUN_STEP_SCHEMA rows of one rank, by step: its traces' steps (a step in two traces: the
    first's), with the host window of its step timeline where that has both ends; and the
    timeline's other steps (untraced: host window and data wait only)."""
    parts = []
    for inp, e, _ in items:
        t = read_input_table(derived, e["key"], STEPS_FILE)
        parts.append(_conform(t.append_column("trace", pa.array([inp.rel] * t.num_rows,
                                                                pa.string())), rank, True))
    steps = _first_per_step(pa.concat_tables(parts)) if parts else \
        RUN_STEP_SCHEMA.empty_table()
    if timeline is not None and timeline.num_rows:
        window = timeline.take(pc.index_in(steps.column("step"), value_set=timeline["step"]))
        both = pc.and_(window.column("host_start_ns").is_valid(),
                       window.column("host_end_ns").is_valid())
        for col in ("host_start_ns", "host_end_ns"):  # the timeline's window replaces the trace's
            steps = steps.set_column(steps.schema.get_field_index(col), col, pc.if_else(
                both, window.column(col), steps.column(col)))
        rest = timeline.filter(pc.invert(pc.is_in(timeline["step"], value_set=steps["step"])))
        steps = pa.concat_tables([steps, _conform(
            rest.select(["step", "host_start_ns", "host_end_ns", "data_wait_ns"]), rank, False)])
    steps = steps.sort_by("step")
    return steps.set_column(RUN_STEP_SCHEMA.get_field_index("step_time_ns"), "step_time_ns",
                            pc.subtract(steps.column("host_end_ns"),
                                        steps.column("host_start_ns")))


def _conform(t: pa.Table, rank: int, traced: bool) -> pa.Table:
    """`t` as RUN_STEP_SCHEMA rows of `rank` (columns it lacks: null)."""
    n = t.num_rows
    given = {"rank": pa.array(np.full(n, rank), pa.int64()),
             "traced": pa.array(np.full(n, traced), pa.bool_())}
    return pa.table([given[f.name] if f.name in given else
                     t.column(f.name).cast(f.type) if f.name in t.column_names else
                     pa.nulls(n, f.type) for f in RUN_STEP_SCHEMA], schema=RUN_STEP_SCHEMA)


def _per_trace(derived: Path, rank: int, items: list[Item], name: str,
               schema: pa.Schema, optional: bool = False) -> list[pa.Table]:
    """One rank's rows of the per-input table `name` (collectives, operators, modules, memory),
    one table per trace, with its rank and trace columns: the run-level table's rows
    (`schema`). An `optional` table an input lacks gives no rows."""
    parts = []
    for inp, e, _ in items:
        try:
            t = read_input_table(derived, e["key"], name)
        except FileNotFoundError:
            if not optional:
                raise
            continue
        t = t.add_column(0, "rank", pa.array(np.full(t.num_rows, rank), pa.int64()))
        t = t.append_column("trace", pa.array([inp.rel] * t.num_rows, pa.string()))
        parts.append(t.cast(schema))
    return parts


def _rank_row(rank: int, items: list[Item], steps: pa.Table) -> dict[str, Any]:
    """One rank's RANK_SCHEMA row: its traces' breakdown summed, with its shares (none for a
    rank known from its step timeline only), and the median and p90 of its step times."""
    totals: dict[str, int | None] = {f: sum(int(s[f]) for _, _, s in items)
                                      for f in BREAKDOWN_FIELDS}
    pct = M.percentages(*(totals[f] for f in BREAKDOWN_FIELDS))  # type: ignore[arg-type]
    if not items:  # known from the step timeline only
        totals = dict.fromkeys(totals)
        pct = dict.fromkeys(pct)
    times = steps.column("step_time_ns").drop_null().to_numpy().astype(np.float64)
    modes = {s["mode"] for _, _, s in items}
    return {
        "rank": rank,
        "mode": ("device" if "device" in modes else "cpu") if items else None,
        "device_type": next((s["device_type"] for _, _, s in items
                             if s["mode"] == "device"), "cpu" if items else None),
        "host": next((s["host"] for _, _, s in items if s.get("host")), None),
        "traces": len(items),
        "steps": steps.num_rows,
        **totals,
        **pct,
        "step_time_median_ms": round(float(np.median(times)) / 1e6, 3) if times.size else None,
        "step_time_p90_ms": round(float(np.percentile(times, 90)) / 1e6, 3) if times.size
        else None,
    }
