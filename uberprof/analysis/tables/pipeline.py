"""`uberprof analyze`: map every trace file to its tables (in parallel), then reduce across ranks.

The map is `uberprof.analysis.tables.rank.analyze_input` per trace and `timeline_table` per
rank folder of a run directory, run by `pool` (forked workers, or any `concurrent.futures`
executor such as a Dask cluster's: `analyze_shared`); each writes its tables under the derived
folder and returns only a status. `reduce` then writes the run-level tables. Layout, manifest
and freshness of the derived folder are `derived`'s.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from uberprof.analysis.progress import READING_TIMELINES, Progress
from uberprof.analysis.tables.derived import (
    DIAGNOSIS_DIR,
    DIAGNOSIS_STATE_FILE,
    FORMAT_VERSION,
    INPUTS_DIR,
    MANIFEST_FILE,
    SUMMARY_FILE,
    TIMELINES_DIR,
    Analysis,
    derived_dir_for,
    entry_key,
    input_dir,
    input_entry,
    is_fresh,
    read_manifest,
    timeline_file,
    write_manifest,
)
from uberprof.analysis.tables.pool import Job, analyze_shared, keep_pandas_out, map_jobs
from uberprof.analysis.tables.rank import analyze_input, timeline_table
from uberprof.analysis.tables.reduce import reduce_run
from uberprof.analysis.tables.schemas import RANK_SCHEMA, RUN_STEP_SCHEMA
from uberprof.ingest.discover import Source, discover
from uberprof.rundir import STEPS_FILE as STEPS_JSONL
from uberprof.rundir import is_utf8

__all__ = [
    "FORMAT_VERSION",
    "INPUTS_DIR",
    "MANIFEST_FILE",
    "RANK_SCHEMA",
    "RUN_STEP_SCHEMA",
    "TIMELINES_DIR",
    "Analysis",
    "analyze",
    "analyze_input",
    "analyze_shared",
    "derived_dir_for",
    "keep_pandas_out",
    "timeline_table",
]

SAVE_EVERY_S = 5  # an interrupted analysis keeps what it finished


def analyze(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
            workers: int | None = None, progress: Progress | None = None,
            force: bool = False, executor: Executor | None = None) -> Analysis:
    """Analyse every trace under `path` (run directory, trace folder or file).

    Inputs already analysed (same size and mtime) are reused unless `force`. `workers`: processes
    for the per-trace map (default: one per CPU, at most one per input; 1 = in this process).
    `executor` replaces the pool (any concurrent.futures Executor, e.g.
    `uberprof.analysis.tables.distributed.dask_executor`): its workers must see the traces and the
    derived folder at the same paths as this process. The cross-rank step (`reduce_run`) makes
    each rank's part on the same workers (or here, for a small run without `executor`) and
    writes the run-level tables here.
    """
    source = discover(Path(path))
    derived, notice = derived_dir_for(source, Path(out) if out is not None else None)
    derived.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(derived)
    entries: dict[str, dict[str, Any]] = manifest.setdefault("inputs", {})

    todo = _trace_jobs(source, derived, entries, force)
    total = len(todo)
    if force:  # the tables are made again under the same manifest: no saved diagnosis holds
        (derived / DIAGNOSIS_DIR / DIAGNOSIS_STATE_FILE).unlink(missing_ok=True)
    todo += _timeline_jobs(source, derived, manifest.setdefault("timelines", {}), force)
    _run_jobs(todo, total, derived, manifest, workers, executor, progress)

    # Read back when no input changed and the last reduce read the same (not after --force).
    result = reduce_run(source, derived, entries, manifest["timelines"],
                        reuse=not force and not todo, workers=workers, executor=executor,
                        progress=progress)
    result.analysed = total
    if notice:
        result.notices.append(notice)
    return result


def _trace_jobs(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
                force: bool) -> list[Job]:
    """The map's traces to read: each input not analysed with its size and mtime (every one
    with `force`); one that cannot be read is entered in `entries` as an error instead."""
    todo: list[Job] = []
    for inp in source.inputs:
        if not is_utf8(inp.rel):  # cannot be stored: the reduce names it
            continue
        try:
            st = inp.path.stat()
        except OSError as exc:
            entries[inp.rel] = {"key": entry_key(inp.rel), "path": inp.rel, "size": None,
                                "mtime_ns": None, "status": "error",
                                "message": f"{inp.path}: cannot read ({exc})"}
            continue
        entry = input_entry(inp.rel, st)
        old = entries.get(inp.rel)
        if not force and is_fresh(old, st, input_dir(derived, entry["key"]) / SUMMARY_FILE):
            assert old is not None
            old["path"] = inp.rel  # older manifests kept it relative to their working directory
            continue
        # Absolute paths: a worker elsewhere (Dask) has another working directory.
        todo.append(Job(inp.rel, entries, entry, str(inp.path), os.path.abspath(inp.path),
                        os.path.abspath(input_dir(derived, entry["key"])), trace=True))
    return todo


def _run_jobs(todo: list[Job], total: int, derived: Path, manifest: dict[str, Any],
              workers: int | None, executor: Executor | None, progress: Progress | None
              ) -> None:
    """The map: run `todo` (its first `total` jobs traces, then step timelines), each result
    entered in the manifest, saved every SAVE_EVERY_S and at the end; told to `progress`."""
    timelines = len(todo) - total
    if progress:
        progress(0, total, "")
    saved = time.monotonic()
    n = m = told = 0
    for job, res in map_jobs(todo, workers, executor):
        job.entry.update(res)
        job.table[job.rel] = job.entry
        # The timelines come after the traces in `todo`, but the workers finish a few of them
        # before the last trace: they are told once the traces are done, so the count never
        # goes back to an earlier stage (a 512-rank run's timelines took 5 s of its 20).
        if job.trace:
            n += 1
            if progress:
                progress(n, total, job.rel)
        else:
            m += 1
        if progress and n == total and m > told:
            progress(m, timelines, job.rel, READING_TIMELINES)
            told = m
        if time.monotonic() - saved > SAVE_EVERY_S:
            write_manifest(derived, manifest)
            saved = time.monotonic()
    write_manifest(derived, manifest)


def _timeline_jobs(source: Source, derived: Path, table: dict[str, dict[str, Any]],
                   force: bool) -> list[Job]:
    """Jobs for the step timelines that changed since they were last read (a live run's)."""
    jobs = []
    for rank, rd in source.rank_dirs:
        if rank is None:
            continue
        rel = rd.relative_to(source.root).as_posix()
        try:
            st = (rd / STEPS_JSONL).stat()
        except OSError:
            table.pop(rel, None)
            continue
        entry = input_entry(rel, st)
        out = timeline_file(derived, entry["key"])
        old = table.get(rel)
        if not force and is_fresh(old, st, out):
            assert old is not None
            old["path"] = rel
            continue
        jobs.append(Job(rel, table, entry, str(rd / STEPS_JSONL), os.path.abspath(rd),
                        os.path.abspath(out), trace=False))
    return jobs
