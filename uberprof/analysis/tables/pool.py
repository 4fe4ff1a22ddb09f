"""The map's processes: every trace (and rank step timeline) of an analysis run, and each rank's
part of the diagnosis, on forked workers that are replaced once a job leaves them big, or on any
`concurrent.futures` executor (a process pool, a Dask cluster's: `analyze_shared`). Each
analysis job writes its tables under the derived folder itself and sends back only a status;
a diagnosis job sends back its rank's small tables.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from uberprof.analysis.tables.derived import FORMAT_VERSION, SUMMARY_FILE
from uberprof.analysis.tables.rank import analyze_input, timeline_table
from uberprof.ingest.gz import json_size

__all__ = ["Job", "analyze_shared", "keep_pandas_out", "map_calls", "map_jobs"]


@dataclass
class Job:
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


def _status(res: dict[str, Any]) -> dict[str, Any]:
    """A job's result as the manifest keeps it."""
    return {k: v for k, v in res.items() if k not in _NOT_KEPT}


def map_jobs(todo: list[Job], workers: int | None,
             executor: Executor | None) -> Iterator[tuple[Job, dict[str, Any]]]:
    """Run every job; yields (job, {"status", "message", ...}): what its manifest entry keeps.

    Default (Linux): `_forked`, forked workers that are replaced once a trace leaves them big.
    `executor` (any concurrent.futures Executor: a process pool, Dask's) replaces that.
    """
    if not todo:
        return
    if workers is None:
        # Forking the warmed-up workers costs ~20 ms of wall time: below some work, one
        # process is faster.
        small = sum(map(_json_bytes, todo)) < SERIAL_BELOW_BYTES
        workers = 1 if small else min(os.cpu_count() or 1, len(todo))
    if executor is None and (workers <= 1 or len(todo) == 1):
        for job in todo:
            yield job, _status(_run(*job.args()))
        return
    if executor is None and _can_fork():
        for i, ok, res in _forked([(_run, j.args()) for j in todo], workers, warm_up=True):
            yield todo[i], res if ok else _died(todo[i].path, res)
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
            yield job, _status(res)
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
    return {**_status(res), "host": host, "format": FORMAT_VERSION}


def _visible(job: Job, res: dict[str, Any]) -> dict[str, Any]:
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


# Of JSON text. One process reads ~150 MB/s (2 cores: 8 ranks of 21 MB in all took 0.18 s in one
# process, 0.145 s in two; 8 of 2.9 MB 0.06 s in one, 0.075 s in two).
SERIAL_BELOW_BYTES = 8 << 20


def _json_bytes(job: Job) -> int:
    """A job's JSON text (a gzipped trace's from its trailer: they compress 8-15x)."""
    return json_size(job.src) if job.trace else job.entry.get("size") or 0


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


def _worker(conn: Any, parent_end: Any = None) -> None:
    """Run the calls sent through `conn` until told to stop, or until one left this process
    more than RECYCLE_BYTES bigger than it started (then the parent starts a new one), or
    until the parent is gone. `parent_end`, the parent's end of the pipe (inherited by the
    fork), is closed first: held here, it kept this process waiting for ever once its parent
    died (a dashboard stopped with Ctrl-C while it diagnosed).

    Freed memory is given back to the system only when the process has grown past that bound:
    trimming after every call cost ~6 ms a call on this VM (the trim, then the next call's
    page faults for the same memory again), about a third of a small trace's analysis."""
    if parent_end is not None:
        parent_end.close()
    keep_pandas_out()
    start = _rss()
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):  # the parent is gone: nobody to answer
            return
        if call is None:
            return
        fn, args = call
        res = fn(*args)
        if fn is _run:
            res = _status(res)
        retire = _rss() - start > RECYCLE_BYTES
        if retire:  # perhaps only what the allocators keep for the next call: give it back
            _give_back_memory()
            retire = _rss() - start > RECYCLE_BYTES
        try:
            conn.send((res, retire))
        except OSError:  # the parent is gone (BrokenPipeError)
            return
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


def _prepare_fork(warm_up: bool) -> None:
    """Before forking workers: with `warm_up`, do the trace reader's one-off set-up here, once,
    rather than in each worker (Arrow's Parquet writer, msgspec, numpy: ~0.2 s); then freeze
    what this process has allocated so that the workers' garbage collector never touches (and
    copies) those pages."""
    if warm_up:
        try:
            with tempfile.TemporaryDirectory(prefix="uberprof-warm-up-") as d:
                trace = Path(d) / "warm-up.json"
                trace.write_bytes(_WARM_UP_TRACE)
                analyze_input(str(trace), str(Path(d) / "out"))
        except OSError:
            pass
    gc.collect()
    gc.freeze()


Call = tuple[Callable[..., Any], tuple[Any, ...]]


def map_calls(fn: Callable[..., Any], arg_lists: Sequence[tuple[Any, ...]], workers: int,
              executor: Executor | None = None) -> Iterator[tuple[int, Any]]:
    """`fn(*args)` for each of `arg_lists` (fn top-level, arguments and result picklable), on
    the same workers as the analysis: forked here, or `executor` (Dask's). Yields (index,
    result) as they finish; a call whose process died yields (index, RuntimeError(why))."""
    if executor is None and (workers <= 1 or len(arg_lists) <= 1 or not _can_fork()):
        for i, args in enumerate(arg_lists):
            yield i, fn(*args)
        return
    if executor is None:
        for i, ok, res in _forked([(fn, a) for a in arg_lists], workers):
            yield i, res if ok else RuntimeError(f"the process running it died ({res})")
        return
    futures = {executor.submit(fn, *a): i for i, a in enumerate(arg_lists)}
    for fut in as_completed(futures):
        try:
            yield futures[fut], fut.result()
        except Exception as exc:  # noqa: BLE001 - a worker died (killed, out of memory)
            yield futures[fut], RuntimeError(f"{type(exc).__name__}: {exc}")


def _forked(calls: list[Call], workers: int, warm_up: bool = False
            ) -> Iterator[tuple[int, bool, Any]]:
    """At most `workers` forked processes, each fed one call at a time through a pipe; yields
    (index, True, result), or (index, False, why) when its process died.

    Own processes instead of a concurrent.futures pool because a worker must be replaceable:
    a crash or an out-of-memory kill costs only the call it was running, and a worker left
    big by a large trace is retired, so memory stays at about one trace per worker. Forking
    (not spawning) keeps startup at milliseconds and never re-imports the caller's script.
    `warm_up`: do the trace reader's one-off set-up before forking (`_prepare_fork`).
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork")
    _prepare_fork(warm_up)
    pending = list(reversed(range(len(calls))))
    idle: list[tuple[Any, Any]] = []  # (process, connection)
    busy: dict[Any, tuple[Any, int]] = {}  # connection -> (process, index)
    alive = 0
    try:
        while pending or busy:
            while pending and (idle or alive < workers):
                if idle:
                    proc, conn = idle.pop()
                else:
                    conn, child = ctx.Pipe()
                    proc = ctx.Process(target=_worker, args=(child, conn), daemon=True)
                    proc.start()
                    child.close()
                    alive += 1
                i = pending.pop()
                conn.send(calls[i])
                busy[conn] = (proc, i)
            for conn in wait(list(busy)):
                proc, i = busy.pop(conn)
                try:
                    res, retire = conn.recv()
                    ok = True
                except (EOFError, OSError):
                    proc.join()
                    code = proc.exitcode
                    ok, retire = False, True
                    res = f"signal {-code}" if code and code < 0 else f"exit code {code}"
                if retire:
                    conn.close()
                    proc.join()
                    alive -= 1
                else:
                    idle.append((proc, conn))
                yield i, ok, res
    finally:
        _stop_workers(idle, busy)
        gc.unfreeze()


def _stop_workers(idle: list[tuple[Any, Any]], busy: dict[Any, tuple[Any, int]]) -> None:
    """`_forked`'s end: idle workers are told to stop (a None call), busy ones terminated (the
    caller stopped early), and all of them joined."""
    for _, conn in idle:
        try:
            conn.send(None)
        except OSError:
            pass
        conn.close()
    for proc, _ in busy.values():
        proc.terminate()
    for proc in [p for p, _ in idle] + [p for p, _ in busy.values()]:
        proc.join(timeout=10)


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
