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

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from uberprof._version import __version__
from uberprof.analysis.progress import COMBINING_RANKS, Progress
from uberprof.analysis.tables.derived import (
    COLLECTIVE_KINDS_FILE,
    COLLECTIVES_FILE,
    FORMAT_VERSION,
    MEMORY_FILE,
    MODULES_FILE,
    OPERATORS_FILE,
    OVERVIEW_FILE,
    PARTS_PREFIX,
    RANKS_FILE,
    REDUCE_FILE,
    SHARES_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    Analysis,
    ParquetOut,
    read_input_summary,
    read_whole,
)
from uberprof.analysis.tables.overview import OVERVIEW_COLUMNS, write_overview
from uberprof.analysis.tables.pool import map_calls
from uberprof.analysis.tables.reduce_rank import (
    PER_TRACE,
    Item,
    RankPart,
    rank_part,
    spill,
    unspill,
)
from uberprof.analysis.tables.schemas import (
    BREAKDOWN_FIELDS,
    RANK_SCHEMA,
    RUN_STEP_SCHEMA,
)
from uberprof.analysis.tables.shares import write_collective_kinds, write_shares
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
from uberprof.rundir.damage import damage_problems

__all__ = ["reduce_run"]

_WRITES = (STEPS_FILE, COLLECTIVES_FILE, OPERATORS_FILE, MODULES_FILE, MEMORY_FILE, RANKS_FILE,
           SUMMARY_FILE, OVERVIEW_FILE, SHARES_FILE, COLLECTIVE_KINDS_FILE)


def reduce_run(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
               timelines: dict[str, dict[str, Any]], reuse: bool = True,
               workers: int | None = None, executor: Executor | None = None,
               progress: Progress | None = None) -> Analysis:
    """Decide each trace's rank, then write the run-level tables and summary.json from the
    inputs' and timelines' tables (`entries`, `timelines`: the manifest's sections); or, with
    `reuse`, read them back when none of that changed since the last time. `workers` and
    `executor` as for the map: a big run's per-rank parts are made there; `progress` is told
    of each rank's (COMBINING_RANKS)."""
    key = _reduce_key(source, entries, timelines)
    done = _reduced_before(source, derived, entries, key) if reuse else None
    if done is not None:
        done.timelines = timelines
        return done
    result = _reduce(source, derived, entries, timelines, key, workers, executor, progress)
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
           "skipped": source.skipped, "timelines": timelines, "folders": folders}
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


Ranked = tuple[int, TraceInput, dict[str, Any], dict[str, Any]]  # rank, then as Item


def _reduce(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
            timelines: dict[str, dict[str, Any]], key: str = "", workers: int | None = None,
            executor: Executor | None = None, progress: Progress | None = None) -> Analysis:
    """The reduce, in stages: choose the rank folders to read (one per rank), read the inputs'
    summaries, decide each trace's rank and drop duplicates, write the per-rank steps and
    collectives, then the rank table and the summary document. Every stage adds its problems
    to one list, in this order: the order the summary gives them in."""
    problems: list[str] = list(source.skipped)
    metas = list_ranks(source.root) if source.kind == "run" else []
    problems.extend(folder_problems(metas))
    read = {m.folder for m in ranks_by_id(metas).values()}
    left_out = {rd for _, rd in source.rank_dirs if rd not in read}
    loaded = _read_summaries(source, derived, entries, left_out, problems)
    kept = _drop_duplicates(_assign_ranks(source, loaded, problems), problems)
    rank_rows, damage, overview_rows = _write_rank_steps(
        source, derived, timelines, kept, left_out, metas, problems, workers, executor, progress)
    problems[:0] = damage  # run.json, node.json, flight logs, counters: named first, not fatal
    write_overview(derived, key, overview_rows)  # what the dashboard's overview draws
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
    if unranked and len(source.inputs) == 1:  # companion files are not inputs (discover)
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
                      problems: list[str], workers: int | None = None,
                      executor: Executor | None = None, progress: Progress | None = None
                      ) -> tuple[list[dict[str, Any]], list[str], pa.Table]:
    """Stage 3: the run's steps, collectives and operators tables (through ParquetOut), one
    rank at a time in rank order: each rank's part (`reduce_rank.rank_part`: its step rows,
    collectives, operators, modules and memory rows) is written out as it comes, so memory
    holds a few ranks' tables (plus one small row per rank), however many. A rank counts with
    a trace or a step timeline. Returns the ranks' rows (RANK_SCHEMA) and the lines naming a
    run directory's damaged files (`damage_problems`, checked beside the ranks' parts: at 64
    nodes it reads every counters file, 1-2 s), and the step rows' OVERVIEW_COLUMNS (copied
    as they pass: reading them back from the table just written took 0.7 s of the reduce's
    serial time at 512 ranks x 10,000 steps, for the same memory); cut-off timelines and ranks
    without a trace go to `problems`."""
    calls = _rank_calls(source, derived, timelines, kept, left_out)
    damage: list[str] = []
    cut: dict[Path, str] = {}  # step timelines cut off or unreadable
    rank_rows: list[dict[str, Any]] = []
    untraced: list[int] = []
    last_step: int | None = None  # the last step any rank finished or traced
    overview: list[pa.Table] = []
    # The step table uncompressed: at 512 ranks x 10,000 steps it is written in 0.65 s of the
    # reduce's serial time instead of 1.2 s and read by the pages in half the time, for 248 MB
    # on disk instead of 148 MB.
    with ParquetOut(derived / STEPS_FILE, RUN_STEP_SCHEMA, compression="none") as steps_out, \
            contextlib.ExitStack() as stack:
        outs = {name: stack.enter_context(ParquetOut(derived / name, schema))
                for name, schema, _, _ in PER_TRACE}
        ranks = sum(c[0] == "rank" for c in calls)
        done = 0
        for part in _in_order(calls, workers, executor, derived):
            if not isinstance(part, RankPart):
                damage = part
                continue
            done += 1
            if progress and ranks >= PARALLEL_RANKS:  # a small run's reduce is instant
                progress(done, ranks, f"rank {part.rank}", COMBINING_RANKS)
            cut.update(part.notes)
            if part.steps is None or part.row is None:
                continue
            steps_out.write(part.steps)
            if part.steps.num_rows:
                top = pc.max(part.steps.column("step")).as_py()
                last_step = top if last_step is None else max(last_step, top)
                # copies: the rows may be mapped from a file that goes with the part
                overview.append(pa.table({c: pa.concat_arrays(part.steps.column(c).chunks)
                                          for c in OVERVIEW_COLUMNS}))
            for name, tables in part.per_trace.items():
                for t in tables:
                    outs[name].write(t)
            rank_rows.append(part.row)
            if not part.traced:
                untraced.append(part.rank)
    problems.extend(cut[rd] for _, rd in source.rank_dirs if rd in cut)
    problems.extend(_untraced_problems(source, metas, rank_rows, untraced, last_step))
    rows = pa.concat_tables(overview) if overview else \
        RUN_STEP_SCHEMA.empty_table().select(OVERVIEW_COLUMNS)
    return rank_rows, damage, rows


def _rank_calls(source: Source, derived: Path, timelines: dict[str, dict[str, Any]],
                kept: list[Ranked], left_out: set[Path]) -> list[tuple[Any, ...]]:
    """Stage 3's plan: the damage check of a run directory, then one `rank_part` call per rank
    (its kept inputs and its rank folders' timelines), in rank order."""
    ranks_info: dict[int, list[Item]] = {}
    for rank, inp, e, s in kept:
        ranks_info.setdefault(rank, []).append((inp, e, s))
    dirs: dict[int, list[tuple[Path, dict[str, Any] | None]]] = {}
    for rank, rd in source.rank_dirs:
        if rank is not None and rd not in left_out:
            dirs.setdefault(rank, []).append(
                (rd, timelines.get(rd.relative_to(source.root).as_posix())))
    calls: list[tuple[Any, ...]] = [("damage", source.root)] if source.kind == "run" else []
    calls += [("rank", derived, rank, ranks_info.get(rank, []), dirs.get(rank, []))
              for rank in sorted(set(ranks_info) | set(dirs))]
    return calls


def _untraced_problems(source: Source, metas: list[RankMeta], rank_rows: list[dict[str, Any]],
                       untraced: list[int], last_step: int | None) -> list[str]:
    """The line saying which ranks had no usable trace window (and why, when none had)."""
    if untraced and not source.inputs:
        why = _why_untraced(metas, rank_rows, _still_running(source.root), last_step)
        return [(f"{source.root}: no trace window in this run: {why}; "
                 "step times only, no breakdown")]
    if untraced := [r for r in untraced if r not in _left_out_by_choice(metas)]:
        return [(f"rank(s) {', '.join(map(str, untraced))}: no usable trace window, "
                 "step times only")]
    return []


# From this many ranks the ranks' parts are made on the analysis workers: at ~11 ms a rank
# (512 ranks x 10,000 steps), forking two workers (~20 ms) pays for itself well below it.
PARALLEL_RANKS = 32


def _in_order(calls: list[tuple[Any, ...]], workers: int | None, executor: Executor | None,
              derived: Path) -> Iterator[RankPart | list[str]]:
    """`_reduce_call(*call)` of every call: in this process for a small run, else on the
    analysis workers (forked, or `executor`'s), the ranks' parts handed on in the calls' order,
    each as soon as the ones before it are, and the damage check as soon as it is done (it
    came first and held every part back: a second of the reduce at 512 ranks). A worker that
    died fails the reduce, as it would here. Workers hand their parts' step rows over as
    files in a folder of `derived` (`spill`), removed when done."""
    if executor is None and (len(calls) < PARALLEL_RANKS or workers == 1):
        for call in calls:
            yield _reduce_call(*call)
        return
    n = workers or min(os.cpu_count() or 1, len(calls))
    waiting: dict[int, RankPart | list[str]] = {}
    upto = 0
    clear_stale_parts(derived)
    folder = derived / f"{PARTS_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    folder.mkdir()
    try:
        for i, res in map_calls(_spilled_call, [(str(folder), *c) for c in calls], n,
                                executor):
            if isinstance(res, RuntimeError):  # the process making it died
                what = "damage check" if calls[i][0] == "damage" else f"part of rank {calls[i][2]}"
                raise OSError(f"the reduce's {what}: {res}")
            if not isinstance(res, RankPart):
                yield res
                continue
            waiting[i] = unspill(res)
            while upto < len(calls) and (upto in waiting or calls[upto][0] != "rank"):
                if upto in waiting:
                    yield waiting.pop(upto)
                upto += 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def clear_stale_parts(derived: Path) -> None:
    """Remove the handed-over rows a reduce left behind when its process was killed (or a
    dashboard stopped mid-analysis exited at once): up to 1.5 MB a rank. A folder whose process
    still runs on this host is another reduce's, and kept. (psutil imported here, where a
    folder is found: every analysis paid for its import, 10-20 ms, to find none.)"""
    for folder in derived.glob(PARTS_PREFIX + "*"):
        import psutil

        pid = folder.name[len(PARTS_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and psutil.pid_exists(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _reduce_call(what: str, *args: Any) -> RankPart | list[str]:
    """One call of the reduce's stage 3: a rank's part (`rank_part`) or the run directory's
    damage check (`damage_problems`), so that both run on the workers side by side."""
    return damage_problems(*args) if what == "damage" else rank_part(*args)


def _spilled_call(folder: str, what: str, *args: Any) -> RankPart | list[str]:
    """`_reduce_call` on a worker: a rank part's step rows go to a file in `folder`."""
    res = _reduce_call(what, *args)
    return spill(res, Path(folder)) if isinstance(res, RankPart) else res


def _write_ranks(derived: Path, rank_rows: list[dict[str, Any]]) -> None:
    """Stage 4: the rank table (RANK_SCHEMA), one row per rank, HTA's whole-trace breakdown;
    the shares views draw from it and from the collectives (`tables/shares.py`)."""
    with ParquetOut(derived / RANKS_FILE, RANK_SCHEMA) as out:
        out.write(pa.Table.from_pylist(rank_rows, schema=RANK_SCHEMA))
    write_shares(derived, rank_rows)
    write_collective_kinds(derived)


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


def _left_out_by_choice(metas: list[RankMeta]) -> set[int]:
    """Ranks that were to record no window of their own: left out by `uberprof run
    --trace-ranks` (rank.json's `trace.selected` false), or in a run without a schedule
    (`--no-trace`) whose windows came on demand for other ranks (`uberprof trace --ranks`).
    A step timeline without a trace is what they were asked for."""
    return {m.rank for m in metas if m.rank is not None
            and (m.trace.get("selected") is False or m.trace.get("schedule") == "off")}


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
