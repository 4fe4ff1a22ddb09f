"""`uberprof analyze`: map every trace file to its tables (in parallel), then reduce across ranks.

The map is `uberprof.analysis.rank.analyze_input` per trace and `timeline_table` per rank folder
of a run directory, run on a process pool (or on any `concurrent.futures` executor, such as a
Dask cluster's: `analyze_shared`); each writes its tables under the derived folder and returns
only a status. The reduce reads only the small per-input tables (steps,
summaries, collectives) and the run directory's step timelines, decides which rank each trace
belongs to, and writes the run-level tables:

    <derived>/manifest.json         the inputs analysed (size, mtime) and how each went
    <derived>/inputs/<key>/         events.parquet, steps.parquet, collectives.parquet, summary.json
    <derived>/timelines/<key>.parquet   a rank's step timeline (steps.jsonl), as a table
    <derived>/steps.parquet         one row per rank and step: host and device windows, breakdown
    <derived>/ranks.parquet         one row per rank: whole-trace breakdown (HTA-compatible)
    <derived>/collectives.parquet   one row per collective instance on each rank
    <derived>/summary.json          the `uberprof analyze --json` document
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from uberprof.analysis import metrics as M
from uberprof.analysis.rank import (
    BREAKDOWN_FIELDS,
    COLLECTIVE_SCHEMA,
    COLLECTIVES_FILE,
    STEP_SCHEMA,
    STEPS_FILE,
    SUMMARY_FILE,
    analyze_input,
)
from uberprof.ingest.discover import Source, TraceInput, discover
from uberprof.rundir import DERIVED_DIR, read_steps, write_json_atomic
from uberprof.rundir import STEPS_FILE as STEPS_JSONL

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "RANK_SCHEMA",
    "RUN_STEP_SCHEMA",
    "Analysis",
    "analyze",
    "analyze_shared",
    "derived_dir_for",
    "keep_pandas_out",
    "timeline_table",
]

FORMAT_VERSION = 2  # bump when derived tables change: inputs are analysed again
MANIFEST_FILE = "manifest.json"
INPUTS_DIR = "inputs"
TIMELINES_DIR = "timelines"

TIMELINE_SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("host_start_ns", pa.int64()),
    ("host_end_ns", pa.int64()),
    ("data_wait_ns", pa.int64()),
])

Progress = Callable[[int, int, str], None]

RUN_STEP_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    *STEP_SCHEMA,
    ("traced", pa.bool_()),  # False: the step is known from the step timeline only
    ("step_time_ns", pa.int64()),  # host window length
    ("trace", pa.string()),  # the input it comes from (relative path)
])

RANK_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    ("mode", pa.string()),  # device or cpu
    ("device_type", pa.string()),
    ("host", pa.string()),
    ("traces", pa.int64()),
    ("steps", pa.int64()),
    *[(f, pa.int64()) for f in BREAKDOWN_FIELDS],
    ("idle_pct", pa.float64()),
    ("compute_pct", pa.float64()),
    ("non_compute_pct", pa.float64()),
    ("overlap_pct", pa.float64()),
    ("exposed_comm_pct", pa.float64()),
    ("memory_pct", pa.float64()),
    ("step_time_median_ms", pa.float64()),
    ("step_time_p90_ms", pa.float64()),
])


@dataclass
class Analysis:
    """What `analyze` produced: where the tables are, the summary document, and its numbers."""

    source: Path
    derived: Path
    summary: dict[str, Any]  # the --json document
    ranks: list[dict[str, Any]]  # RANK_SCHEMA rows
    inputs: dict[str, dict[str, Any]]  # manifest entries of this source's inputs, by rel path
    analysed: int = 0  # inputs analysed this time (the others were up to date)
    notices: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether at least one rank could be analysed."""
        return bool(self.ranks)


def derived_dir_for(source: Source, out: Path | None) -> tuple[Path, str | None]:
    """Where derived tables go: `--out`, else beside the data, else (read-only data) a cache."""
    if out is not None:
        return Path(out), None
    beside = source.root / DERIVED_DIR
    # The data folder itself decides: a derived/ left inside a read-only folder does not count.
    if _writable(source.root) and _writable(beside):
        return beside, None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha1(str(source.root.resolve()).encode()).hexdigest()[:10]
    cache = base / "uberprof" / "derived" / f"{_safe(source.root.name)}-{digest}"
    return cache, (f"{source.root} is read-only: derived tables go to {cache} "
                   "(choose another place with --out)")


def analyze(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
            workers: int | None = None, progress: Progress | None = None,
            force: bool = False, executor: Executor | None = None) -> Analysis:
    """Analyse every trace under `path` (run directory, trace folder or file).

    Inputs already analysed (same size and mtime) are reused unless `force`. `workers`: processes
    for the per-trace map (default: one per CPU, at most one per input; 1 = in this process).
    `executor` replaces the pool (any concurrent.futures Executor, e.g.
    `uberprof.analysis.distributed.dask_executor`): its workers must see the traces and the
    derived folder at the same paths as this process; the cross-rank step runs here.
    """
    source = discover(Path(path))
    derived, notice = derived_dir_for(source, Path(out) if out is not None else None)
    derived.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(derived)
    entries: dict[str, dict[str, Any]] = manifest.setdefault("inputs", {})

    todo: list[_Job] = []
    for inp in source.inputs:
        try:
            st = inp.path.stat()
        except OSError as exc:
            entries[inp.rel] = {"key": _key(inp.rel), "size": None, "mtime_ns": None,
                                "status": "error", "message": f"{inp.path}: cannot read ({exc})"}
            continue
        key = _key(inp.rel)
        old = entries.get(inp.rel)
        fresh = (not force and old is not None and old.get("version") == FORMAT_VERSION
                 and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
                 and (old.get("status") == "error"
                      or (derived / INPUTS_DIR / key / SUMMARY_FILE).exists()))
        entry = {"key": key, "path": str(inp.path), "size": st.st_size,
                 "mtime_ns": st.st_mtime_ns, "version": FORMAT_VERSION}
        if fresh:
            continue
        # Absolute paths: a worker elsewhere (Dask) has another working directory.
        todo.append(_Job(inp.rel, entries, entry, str(inp.path), os.path.abspath(inp.path),
                         os.path.abspath(derived / INPUTS_DIR / key), trace=True))
    total = len(todo)
    todo += _timeline_jobs(source, derived, manifest.setdefault("timelines", {}), force)

    manifest["format"] = "uberprof-derived"
    manifest["version"] = FORMAT_VERSION
    if progress:
        progress(0, total, "")
    saved = time.monotonic()
    n = 0
    for job, res in _map(todo, workers, executor):
        job.entry.update({k: v for k, v in res.items() if k not in _NOT_KEPT})
        job.table[job.rel] = job.entry
        if job.trace:
            n += 1
            if progress:
                progress(n, total, job.rel)
        if time.monotonic() - saved > 5:  # an interrupted analysis keeps what it finished
            write_json_atomic(derived / MANIFEST_FILE, manifest)
            saved = time.monotonic()
    write_json_atomic(derived / MANIFEST_FILE, manifest)

    result = _reduce(source, derived, entries, manifest["timelines"])
    result.analysed = total
    if notice:
        result.notices.append(notice)
    return result


# --- the map ------------------------------------------------------------------------------------

@dataclass
class _Job:
    """One unit of the map: a trace (`analyze_input`) or a rank's step timeline
    (`timeline_table`), and the manifest entry its outcome goes to (`table[rel]`)."""

    rel: str
    table: dict[str, dict[str, Any]]  # the manifest section the entry belongs in
    entry: dict[str, Any]
    path: str  # as the user named it (messages)
    src: str  # absolute
    out: str  # absolute
    trace: bool

    def args(self) -> tuple[str, str, bool]:
        """What `_run` takes: plain values that any worker can receive."""
        return self.src, self.out, self.trace


def _run(src: str, out: str, trace: bool) -> dict[str, Any]:
    return analyze_input(src, out) if trace else timeline_table(src, out)


# Fields of a map result that stay out of the manifest (the summary has its own file).
_NOT_KEPT = ("summary", "problems", "host", "format")


def _map(todo: list[_Job], workers: int | None, executor: Executor | None):
    """Run every job; yields (job, {"status", "message", ...}).

    Default (Linux): `_forked`, forked workers that are replaced once a trace leaves them big.
    `executor` (any concurrent.futures Executor: a process pool, Dask's) replaces that.
    """
    if not todo:
        return
    if workers is None:
        # Starting a worker costs ~0.1-0.3 s of CPU (page faults of a fresh heap, lazy set-up
        # in the libraries): below some work, one process is faster.
        small = sum(_json_bytes(j.entry) for j in todo) < SERIAL_BELOW_BYTES
        workers = 1 if small else min(os.cpu_count() or 1, len(todo))
    if executor is None and (workers <= 1 or len(todo) == 1):
        for job in todo:
            yield job, _run(*job.args())
        return
    if executor is None and _can_fork():
        yield from _forked(todo, workers)
        return
    own = executor is None
    if own:
        executor = ProcessPoolExecutor(max_workers=workers, initializer=keep_pandas_out)
    assert executor is not None
    try:
        futures = {executor.submit(analyze_shared, *job.args()): job for job in todo}
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                res = _visible(job, fut.result())
            except Exception as exc:  # noqa: BLE001 - a worker died (killed, out of memory)
                res = _died(job.path, f"{type(exc).__name__}: {exc}")
            yield job, res
    finally:
        if own:
            executor.shutdown(wait=True, cancel_futures=True)


def analyze_shared(path: str, out: str, trace: bool = True) -> dict[str, Any]:
    """The map's work (`analyze_input` of a trace, or `timeline_table` of a rank folder) for a
    worker that may run on another machine (Dask): says so when the input or the derived folder
    is not visible there, returns only a status (the tables stay on the shared file system),
    and gives freed memory back since the worker lives on."""
    host = socket.gethostname()
    status = {"status": "error", "host": host, "format": FORMAT_VERSION}
    if not os.path.exists(path):
        return {**status, "message": f"{path}: not found on worker {host}: every worker must "
                "see the traces at the same path as the machine running uberprof analyze (a "
                "shared file system)"}
    folder = Path(out) if trace else Path(out).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return {**status, "message": f"{path}: worker {host} cannot write its tables to "
                f"{folder} ({exc}): the derived folder (--out) must be on a file system that "
                "every worker can write and the machine running uberprof analyze can read"}
    res = _run(path, out, trace)
    _give_back_memory()
    return {**{k: v for k, v in res.items() if k not in _NOT_KEPT}, "host": host,
            "format": FORMAT_VERSION}


def _visible(job: _Job, res: dict[str, Any]) -> dict[str, Any]:
    """A worker's result, checked from here: same table format, and its tables readable."""
    if res.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        return {"status": "error", "message": f"{job.path}: worker {res.get('host')} writes "
                f"derived format {res.get('format')}, this machine reads {FORMAT_VERSION}: "
                "install the same uberprof version on every worker"}
    made = Path(job.out) / SUMMARY_FILE if job.trace else Path(job.out)
    if res.get("status") == "ok" and not made.exists():
        return {"status": "error", "message": f"{job.path}: analysed on worker "
                f"{res.get('host')}, but its tables are not visible here ({job.out}): the "
                "derived folder (--out) must be on a file system shared by every worker and "
                "this machine"}
    return res


def timeline_table(rank_dir: str, out_file: str) -> dict[str, Any]:
    """A rank's step timeline (`ranks/<r>/steps.jsonl`) as a Parquet table of TIMELINE_SCHEMA,
    one row per step: parsed here, in the map, so that the cross-rank step reads a small
    columnar table per rank rather than every JSON line of every rank. Never raises.

    Returns {"status", "message", "rows": whole rows read, "truncated": cut-off last line}.
    """
    try:
        rows, truncated = read_steps(Path(rank_dir))
        first: dict[int, dict[str, Any]] = {}
        for r in rows:
            if isinstance(r.get("step"), int):
                first.setdefault(r["step"], r)
        cols = {name: [v if isinstance(v := r.get(name), int) and not isinstance(v, bool)
                       else None for r in first.values()]
                for name in TIMELINE_SCHEMA.names[1:]}
        table = pa.table({"step": list(first), **cols}, schema=TIMELINE_SCHEMA)
        out = Path(out_file)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, out)
        return {"status": "ok", "message": None, "rows": len(rows), "truncated": truncated}
    except Exception as exc:  # noqa: BLE001 - one bad file must not stop the other ranks
        return {"status": "error", "rows": 0, "truncated": False,
                "message": f"{Path(rank_dir) / STEPS_JSONL}: could not be read "
                           f"({type(exc).__name__}: {exc}); step times of this rank left out"}


def _timeline_jobs(source: Source, derived: Path, table: dict[str, dict[str, Any]],
                   force: bool) -> list[_Job]:
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
        key = _key(rel)
        old = table.get(rel)
        out = derived / TIMELINES_DIR / f"{key}.parquet"
        if (not force and old is not None and old.get("version") == FORMAT_VERSION
                and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
                and (old.get("status") == "error" or out.exists())):
            continue
        entry = {"key": key, "path": str(rd), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                 "version": FORMAT_VERSION}
        jobs.append(_Job(rel, table, entry, str(rd / STEPS_JSONL), os.path.abspath(rd),
                         os.path.abspath(out), trace=False))
    return jobs


SERIAL_BELOW_BYTES = 64 << 20  # of JSON (compressed traces count ~8x their size)


def _json_bytes(entry: dict[str, Any]) -> int:
    size = entry.get("size") or 0
    return size * 8 if str(entry.get("path", "")).endswith(".gz") else size


# A worker is replaced when a trace leaves it this much bigger than it started: freed memory
# stays with the process (allocator arenas), and the next trace's peak would come on top.
RECYCLE_BYTES = 24 << 20


def _can_fork() -> bool:
    import multiprocessing as mp

    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods()


def _died(path: str, why: str) -> dict[str, Any]:
    return {"status": "error", "summary": None, "problems": [],
            "message": f"{path}: the process analysing it died ({why}); out of memory?"}


def _rss() -> int:
    """Anonymous resident memory (statm resident - shared): what a trace leaves behind. Not the
    whole RSS: a forked worker's first trace faults in ~25 MB of shared library pages (Arrow's
    Parquet writer, ...) that cost nothing, and counting them retired every worker after one
    trace, paying the page faults again (2-5x the trace's own time) in each new one."""
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _give_back_memory() -> None:
    """Return freed memory to the system where the allocators allow it (glibc, Arrow's pool)."""
    try:
        pa.default_memory_pool().release_unused()
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _worker(conn: Any) -> None:
    """Analyse the inputs sent through `conn` until told to stop, or until a trace left this
    process more than RECYCLE_BYTES bigger than it started (then the parent starts a new one)."""
    keep_pandas_out()
    start = _rss()
    while True:
        job = conn.recv()
        if job is None:
            return
        res = _run(*job)
        _give_back_memory()
        retire = _rss() - start > RECYCLE_BYTES
        conn.send(({k: v for k, v in res.items() if k not in _NOT_KEPT}, retire))
        if retire:
            return


_WARM_UP_TRACE = (
    b'{"baseTimeNanoseconds": 1700000000000000000, "distributedInfo": {"rank": 0},'
    b' "traceEvents": ['
    b'{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,'
    b' "ts": 0, "dur": 100, "args": {}},'
    b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 9,'
    b' "args": {"External id": 1}},'
    b'{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,'
    b' "ts": 2, "dur": 3, "args": {"correlation": 7}},'
    b'{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10, "dur": 20,'
    b' "args": {"stream": 7, "correlation": 7}},'
    b'{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2,'
    b' "ts": 40, "dur": 20, "args": {"Input Dims": [[4]], "Input type": ["float"]}}]}'
)


def _prepare_fork() -> None:
    """Before forking workers: do the libraries' one-off set-up here, once, rather than in each
    worker (Arrow's Parquet writer, msgspec, numpy: ~0.2 s), and freeze what this process has
    allocated so that the workers' garbage collector never touches (and copies) those pages."""
    try:
        with tempfile.TemporaryDirectory(prefix="uberprof-warm-up-") as d:
            trace = Path(d) / "warm-up.json"
            trace.write_bytes(_WARM_UP_TRACE)
            analyze_input(str(trace), str(Path(d) / "out"))
    except OSError:
        pass
    gc.collect()
    gc.freeze()


def _forked(jobs: list[_Job], workers: int):
    """At most `workers` forked processes, each fed one input at a time through a pipe.

    Own processes instead of a concurrent.futures pool because a worker must be replaceable:
    a crash or an out-of-memory kill costs only the input it was reading, and a worker left
    big by a large trace is retired, so memory stays at about one trace per worker. Forking
    (not spawning) keeps startup at milliseconds and never re-imports the caller's script.
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork")
    _prepare_fork()
    pending = list(reversed(jobs))
    idle: list[tuple[Any, Any]] = []  # (process, connection)
    busy: dict[Any, tuple[Any, _Job]] = {}  # connection -> (process, job)
    alive = 0
    try:
        while pending or busy:
            while pending and (idle or alive < workers):
                if idle:
                    proc, conn = idle.pop()
                else:
                    conn, child = ctx.Pipe()
                    proc = ctx.Process(target=_worker, args=(child,), daemon=True)
                    proc.start()
                    child.close()
                    alive += 1
                job = pending.pop()
                conn.send(job.args())
                busy[conn] = (proc, job)
            for conn in wait(list(busy)):
                proc, job = busy.pop(conn)
                try:
                    res, retire = conn.recv()
                except (EOFError, OSError):
                    proc.join()
                    code = proc.exitcode
                    res, retire = _died(job.path, f"signal {-code}" if code and code < 0
                                        else f"exit code {code}"), True
                if retire:
                    conn.close()
                    proc.join()
                    alive -= 1
                else:
                    idle.append((proc, conn))
                yield job, res
    finally:
        for proc, conn in idle:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        for proc, _ in busy.values():
            proc.terminate()
        for proc in [p for p, _ in idle] + [p for p, _ in busy.values()]:
            proc.join(timeout=10)
        gc.unfreeze()


class _NoPandas:
    """Import hook that keeps pandas out of a process that does not need it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("uberprof keeps pandas out of trace-reading processes")


def keep_pandas_out() -> None:
    """pyarrow imports pandas, if installed, on its first conversions (0.5 s and 40 MB per
    process) though nothing here needs it. Analysis workers and the CLI call this; a process
    that already has pandas keeps it."""
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())


# --- the reduce ---------------------------------------------------------------------------------

def _reduce(source: Source, derived: Path, entries: dict[str, dict[str, Any]],
            timelines: dict[str, dict[str, Any]]) -> Analysis:
    problems: list[str] = []
    loaded: list[tuple[TraceInput, dict[str, Any], dict[str, Any]]] = []
    for inp in source.inputs:
        e = entries.get(inp.rel)
        if e is None:
            continue
        if e.get("status") != "ok":
            problems.append(e.get("message") or f"{inp.path}: could not be analysed")
            continue
        try:
            doc = orjson.loads((derived / INPUTS_DIR / e["key"] / SUMMARY_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            problems.append(f"{inp.path}: its derived tables are unreadable ({exc}); "
                            "run uberprof analyze --force")
            continue
        problems.extend(doc.get("problems") or [])
        summary = doc["summary"]
        # Only what the reduce uses: a summary's process groups list every rank of each group,
        # and keeping them for every input would grow with ranks squared.
        loaded.append((inp, e, {k: summary.get(k) for k in _REDUCE_KEYS}))

    # Which rank each trace belongs to: the trace itself, then the run directory, then its name.
    assigned: list[tuple[int, TraceInput, dict[str, Any], dict[str, Any]]] = []
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

    kept = _drop_duplicates(assigned, problems)
    ranks_info: dict[int, list[tuple[TraceInput, dict[str, Any], dict[str, Any]]]] = {}
    for rank, inp, e, s in kept:
        ranks_info.setdefault(rank, []).append((inp, e, s))

    # One rank at a time: its step rows and collectives are written out before the next rank's
    # are read, so memory holds one rank's tables (plus one small row per rank), however many.
    dirs: dict[int, list[Path]] = {}
    for rank, rd in source.rank_dirs:
        if rank is not None:
            dirs.setdefault(rank, []).append(rd)
    cut: dict[Path, str] = {}  # step timelines cut off or unreadable
    rank_rows: list[dict[str, Any]] = []
    untraced: list[int] = []
    coll_schema = pa.schema([("rank", pa.int64()), *COLLECTIVE_SCHEMA, ("trace", pa.string())])
    with _ParquetOut(derived / "steps.parquet", RUN_STEP_SCHEMA) as steps_out, \
            _ParquetOut(derived / "collectives.parquet", coll_schema) as coll_out:
        for rank in sorted(set(ranks_info) | set(dirs)):
            items = ranks_info.get(rank, [])
            timeline = _timeline(source.root, derived, timelines, dirs.get(rank, []), cut)
            if not items and timeline is None:
                continue
            rows = _steps(derived, rank, items, timeline or {})
            steps_out.write(pa.Table.from_pylist(rows, schema=RUN_STEP_SCHEMA))
            for part in _collectives(derived, rank, items, coll_schema):
                coll_out.write(part)
            rank_rows.append(_rank_row(rank, items, rows))
            if not items:
                untraced.append(rank)
    problems.extend(cut[rd] for _, rd in source.rank_dirs if rd in cut)
    if untraced and not source.inputs:
        problems.append(f"{source.root}: no trace windows in this run (recorded with "
                        "--no-trace?): step times only, no breakdown")
    elif untraced:
        problems.append(f"rank(s) {', '.join(map(str, untraced))}: no usable trace window, "
                        "step times only")

    if not rank_rows and not problems:
        problems.append(f"{source.root}: nothing to analyse: no trace and no step timeline")
    with _ParquetOut(derived / "ranks.parquet", RANK_SCHEMA) as out:
        out.write(pa.Table.from_pylist(rank_rows, schema=RANK_SCHEMA))
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
    rank_of = {inp.rel: rank for rank, inp, _, _ in kept}
    inputs = {}
    for inp in source.inputs:
        if inp.rel in entries:
            inputs[inp.rel] = {**entries[inp.rel], "rank": rank_of.get(inp.rel)}
    return Analysis(source=source.root, derived=derived, summary=summary, ranks=rank_rows,
                    inputs=inputs)


_REDUCE_KEYS = ("trace_rank", "first_ns", "last_ns", "mode", "device_type", "host",
                *BREAKDOWN_FIELDS)


def _drop_duplicates(assigned: list[tuple[int, TraceInput, dict[str, Any], dict[str, Any]]],
                     problems: list[str]) -> list[tuple[int, TraceInput, dict[str, Any],
                                                        dict[str, Any]]]:
    """Several traces of one rank are fine when they cover different times (several windows);
    traces of one rank over the same time come from two jobs or copies: keep the first."""
    kept: list[tuple[int, TraceInput, dict[str, Any], dict[str, Any]]] = []
    of_rank: dict[int, list[tuple[int, TraceInput, dict[str, Any], dict[str, Any]]]] = {}
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


Item = tuple[TraceInput, dict[str, Any], dict[str, Any]]  # input, manifest entry, summary


def _timeline(root: Path, derived: Path, timelines: dict[str, dict[str, Any]],
              rank_dirs: list[Path], notes: dict[Path, str]) -> dict[int, dict[str, Any]] | None:
    """One rank's step timeline (the tables `timeline_table` made of the steps.jsonl of its
    folders), by step; None when it has none. Cut-off or unreadable timelines go to `notes`."""
    steps: dict[int, dict[str, Any]] | None = None
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
        if not e.get("rows"):
            continue
        steps = {} if steps is None else steps
        t = pq.read_table(derived / TIMELINES_DIR / f"{e['key']}.parquet")
        for r in t.to_pylist():
            steps.setdefault(r["step"], r)
    return steps


def _steps(derived: Path, rank: int, items: list[Item],
           timeline: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """RUN_STEP_SCHEMA rows of one rank: its traces' steps, completed by its step timeline."""
    by_step: dict[int, dict[str, Any]] = {}
    for inp, e, _ in items:
        t = pq.read_table(derived / INPUTS_DIR / e["key"] / STEPS_FILE)
        for r in t.to_pylist():
            if r["step"] in by_step:
                continue
            r.update(rank=rank, traced=True, trace=inp.rel)
            by_step[r["step"]] = r
    for step, tl in timeline.items():
        start, end = tl.get("host_start_ns"), tl.get("host_end_ns")
        if step in by_step:
            r = by_step[step]
            if isinstance(start, int) and isinstance(end, int):
                r["host_start_ns"], r["host_end_ns"] = start, end
            continue
        by_step[step] = {"rank": rank, "step": step, "traced": False, "trace": None,
                         "host_start_ns": start, "host_end_ns": end,
                         "data_wait_ns": tl.get("data_wait_ns")}
    rows = []
    for step in sorted(by_step):
        r = by_step[step]
        s, e = r.get("host_start_ns"), r.get("host_end_ns")
        r["step_time_ns"] = e - s if isinstance(s, int) and isinstance(e, int) else None
        rows.append(r)
    return rows


def _collectives(derived: Path, rank: int, items: list[Item], schema: pa.Schema) -> list[pa.Table]:
    """One rank's collectives (one table per trace), with its rank and trace columns."""
    parts = []
    for inp, e, _ in items:
        t = pq.read_table(derived / INPUTS_DIR / e["key"] / COLLECTIVES_FILE)
        t = t.add_column(0, "rank", pa.array(np.full(t.num_rows, rank), pa.int64()))
        t = t.append_column("trace", pa.array([inp.rel] * t.num_rows, pa.string()))
        parts.append(t.cast(schema))
    return parts


class _ParquetOut:
    """A run-level table written in pieces (one rank's rows at a time, in row groups of at least
    GROUP_ROWS), to a temporary file renamed into place once complete: readers never see half
    a table, and the writer never holds the whole one."""

    GROUP_ROWS = 1 << 14

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.writer = pq.ParquetWriter(self.tmp, schema)
        self.pending: list[pa.Table] = []
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.rows += table.num_rows
        if self.rows >= self.GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.concat_tables(self.pending))
        self.pending, self.rows = [], 0

    def __enter__(self) -> _ParquetOut:  # noqa: PYI034 - final class
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is None:
                self._flush()
        finally:
            self.writer.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


def _rank_row(rank: int, items: list[Item], steps: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, int | None] = {f: sum(int(s[f]) for _, _, s in items)
                                      for f in BREAKDOWN_FIELDS}
    pct = M.percentages(*(totals[f] for f in BREAKDOWN_FIELDS))  # type: ignore[arg-type]
    if not items:  # known from the step timeline only
        totals = dict.fromkeys(totals)
        pct = dict.fromkeys(pct)
    times = np.array([r["step_time_ns"] for r in steps if r.get("step_time_ns") is not None],
                     dtype=np.float64)
    modes = {s["mode"] for _, _, s in items}
    return {
        "rank": rank,
        "mode": ("device" if "device" in modes else "cpu") if items else None,
        "device_type": next((s["device_type"] for _, _, s in items
                             if s["mode"] == "device"), "cpu" if items else None),
        "host": next((s["host"] for _, _, s in items if s.get("host")), None),
        "traces": len(items),
        "steps": len(steps),
        **totals,
        **pct,
        "step_time_median_ms": round(float(np.median(times)) / 1e6, 3) if times.size else None,
        "step_time_p90_ms": round(float(np.percentile(times, 90)) / 1e6, 3) if times.size
        else None,
    }


# --- small helpers ------------------------------------------------------------------------------

def _read_manifest(derived: Path) -> dict[str, Any]:
    try:
        m = orjson.loads((derived / MANIFEST_FILE).read_bytes())
        return m if isinstance(m, dict) and m.get("version") == FORMAT_VERSION else {}
    except (OSError, orjson.JSONDecodeError):
        return {}


def _key(rel: str) -> str:
    digest = hashlib.sha1(rel.encode()).hexdigest()[:8]
    return f"{_safe(rel)[-80:]}-{digest}"


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "x"


def _writable(d: Path) -> bool:
    """Whether we may write `d`: permission bits are honoured even for root, so a folder made
    read-only on purpose (chmod a-w) is never written into."""
    probe = d
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    try:
        if not os.access(probe, os.W_OK) or not probe.stat().st_mode & 0o222:
            return False
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".write-test-"):
            pass
        return True
    except OSError:
        return False
