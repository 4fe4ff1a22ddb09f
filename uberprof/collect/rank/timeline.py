"""The cheap, always-on step timeline of one rank, appended to `steps.jsonl` as steps end.

Each finished step is written and flushed at once, so a rank killed with `kill -9` leaves every
step it finished on disk. GPU times come from CUDA events recorded at step boundaries and are
read only once the GPU has passed them (`Event.query()`), so the training thread never waits; they
land as separate `gpu` rows a step or two later.

`cpu_ns` is the CPU time the thread that ends steps (the training thread) spent since the
previous boundary (`time.thread_time_ns`, about 1 µs a step), less uberprof's own: the job's
work, whatever the OS scheduler did to its wall time. uberprof's own CPU time on that thread
(its hooks: the step boundary, trace windows starting, stopping and exporting, the Flight
Recorder's ring read; `own_start`/`own_end`) is measured the same way and written apart, as
`uberprof_cpu_ns` (issue 54: a rank's extra CPU time must be the job's to make it a straggler).
The work uberprof cannot time on the thread (the profiler's callbacks inside a traced
window's operators, the data-loader wrapper's few µs) stays in `cpu_ns`, alike on every rank.
It tells a rank that computes more from one the OS delayed (analysis/diagnosis/busy.py). It is left out for the first two steps (step 0 pays start-up, and the
optimizer detector places its boundary an iteration late, when it ends step 1 too: the CPU
time at that boundary is not known) and where the previous boundary was on another thread.
Beside it, on the same rows, `ctx_vol` and `ctx_invol`: the thread's voluntary and involuntary
context switches since the previous boundary (`getrusage(RUSAGE_THREAD)`, Linux; about 1 µs),
and `run_wait_ns`: the time it spent runnable but waiting for a core (the run queue,
`/proc/thread-self/schedstat`, about 2 µs). The run-queue wait is what tells a rank the OS
delayed from one that waits off the CPU by its own doing (sleep, I/O, a lock): a woken thread
that waits for a core counts no involuntary switch (analysis/diagnosis/busy.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from uberprof.collect import diskfull

try:
    import resource
except ImportError:  # not POSIX: no context switches
    resource = None  # type: ignore[assignment]

try:
    import orjson

    def _line(row: dict[str, Any]) -> bytes:
        return orjson.dumps(row) + b"\n"
except ImportError:  # the rank side works with the standard library alone

    def _line(row: dict[str, Any]) -> bytes:
        return (json.dumps(row, separators=(",", ":")) + "\n").encode()


class StepTimeline:
    def __init__(self, path: Path, start_ns: int | None = None,
                 on_error: Callable[[OSError], None] | None = None) -> None:
        self._file: IO[bytes] | None = open(path, "ab", buffering=0)
        self._on_error = on_error
        self.step = 0
        self.start_ns = start_ns if start_ns is not None else time.time_ns()
        self.data_wait_ns = 0
        self.uberprof_ns = 0
        self.steps_written = 0
        self._start_event: Any = None
        # Until the first boundary, data waits keep their times: the first boundary of an
        # optimizer-detected run is placed in the past, and later waits belong to step 1.
        self._early_waits: list[tuple[int, int]] | None = []
        self._pending_gpu: deque[tuple[int, Any, Any]] = deque()
        self._cpu_mark = (0, 0)  # (thread ident, its CPU time) at the previous boundary
        self._cpu_now = 0  # the thread's CPU time read at the latest boundary
        self._own_cpu = 0  # uberprof's CPU time in the hooks that ended, in all
        self._own_hook: tuple[int, int] | None = None  # (thread, CPU time) where a hook began
        self._own_mark = 0  # uberprof's CPU time in all at the previous boundary
        self._switch_mark: tuple[int, int] | None = None  # (voluntary, involuntary) then
        self._run_wait_mark: int | None = None  # run-queue wait (ns) at the previous boundary
        self._schedstat: int | None = None  # an open /proc/thread-self/schedstat (-1: none)

    def own_start(self) -> int:
        """An uberprof hook begins on this thread: its CPU time now (for `own_end`)."""
        c0 = time.thread_time_ns()
        self._own_hook = (threading.get_ident(), c0)
        return c0

    def own_end(self, c0: int) -> None:
        """The hook that began at CPU time `c0` (`own_start`) ends: its CPU time is uberprof's.
        A boundary inside it counts the part before it (`_own_since_mark`)."""
        self._own_cpu += time.thread_time_ns() - c0
        self._own_hook = None

    def _own_since_mark(self) -> int:
        """uberprof's CPU time on the thread since the previous boundary, up to this one's
        reading (`_cpu_now`), the hook now running counted so far."""
        total = self._own_cpu
        hook = self._own_hook
        if hook is not None and hook[0] == threading.get_ident():
            total += max(0, self._cpu_now - hook[1])
        own, self._own_mark = total - self._own_mark, total
        return own

    def add_data_wait(self, ns: int, end_ns: int) -> None:
        self.data_wait_ns += ns
        if self._early_waits is not None:
            self._early_waits.append((end_ns, ns))

    def first_activity(self, t_ns: int) -> None:
        if self.steps_written == 0:
            self.start_ns = t_ns

    def boundary(self, t_ns: int, source: str, torch_cuda: Any | None) -> int:
        """End the open step at `t_ns` (epoch ns) and open the next; returns the step ended."""
        ended = self.step
        cpu_ns = self._thread_cpu_ns()
        own_cpu = self._own_since_mark()
        switches = self._thread_switches()
        run_wait = self._thread_run_wait()
        carried = 0
        if self._early_waits is not None:
            carried = sum(ns for end, ns in self._early_waits if end > t_ns)
            self.data_wait_ns -= carried
            self._early_waits = None
        row: dict[str, Any] = {
            "kind": "step",
            "step": ended,
            "host_start_ns": self.start_ns,
            "host_end_ns": t_ns,
            "data_wait_ns": self.data_wait_ns,
            "uberprof_ns": self.uberprof_ns,
            "source": source,
        }
        if cpu_ns is not None:
            own_cpu = min(max(own_cpu, 0), cpu_ns)
            row["cpu_ns"] = cpu_ns - own_cpu
            row["uberprof_cpu_ns"] = own_cpu
            if switches is not None:
                row["ctx_vol"], row["ctx_invol"] = switches
            if run_wait is not None:
                row["run_wait_ns"] = run_wait
        self._write(row)
        self.steps_written += 1
        if torch_cuda is not None:
            self._mark_gpu(ended, torch_cuda)
        self.step = ended + 1
        self.start_ns = max(t_ns, self.start_ns)
        self.data_wait_ns = carried
        self.uberprof_ns = 0
        return ended

    def _thread_switches(self) -> tuple[int, int] | None:
        """The calling thread's (voluntary, involuntary) context switches since the previous
        boundary, or None where getrusage cannot say (not Linux) or there was none before.
        Written only beside `cpu_ns`, which says when the previous boundary was this thread's."""
        try:
            ru = resource.getrusage(resource.RUSAGE_THREAD)  # type: ignore[attr-defined]
        except (AttributeError, OSError, ValueError):
            return None
        now = (ru.ru_nvcsw, ru.ru_nivcsw)
        prev, self._switch_mark = self._switch_mark, now
        return None if prev is None else (now[0] - prev[0], now[1] - prev[1])

    def _thread_run_wait(self) -> int | None:
        """The calling thread's run-queue wait (ns) since the previous boundary, or None (not
        Linux, no schedstats, the first boundary). The file is opened once, by the thread that
        ends steps (a boundary on another thread gives no `cpu_ns`, so its value is unused)."""
        if self._schedstat is None:
            try:
                self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                self._schedstat = -1
        if self._schedstat < 0:
            return None
        try:
            now = int(os.pread(self._schedstat, 96, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None
        prev, self._run_wait_mark = self._run_wait_mark, now
        return None if prev is None else now - prev

    def _thread_cpu_ns(self) -> int | None:
        """The calling thread's CPU time since the previous boundary, or None: the first two
        steps (module docstring), a previous boundary on another thread (one at exit)."""
        tid, now = threading.get_ident(), time.thread_time_ns()
        self._cpu_now = now
        prev_tid, prev = self._cpu_mark
        self._cpu_mark = (tid if self.steps_written else 0, now)  # 0: no thread's
        return now - prev if tid == prev_tid else None

    def mark_gpu_start(self, torch_cuda: Any) -> None:
        """Record the GPU position where the first step starts (once CUDA is in use)."""
        if self._start_event is None:
            self._start_event = _record_event(torch_cuda)

    def _mark_gpu(self, step: int, torch_cuda: Any) -> None:
        end = _record_event(torch_cuda)
        if self._start_event is not None:
            self._pending_gpu.append((step, self._start_event, end))
        self._start_event = end
        self.poll_gpu(torch_cuda, block=False)

    def poll_gpu(self, torch_cuda: Any, block: bool) -> None:
        while self._pending_gpu:
            step, start, end = self._pending_gpu[0]
            if block:
                end.synchronize()
            elif not end.query():
                return
            self._pending_gpu.popleft()
            row: dict[str, Any] = {
                "kind": "gpu",
                "step": step,
                "gpu_time_ns": int(start.elapsed_time(end) * 1e6),
            }
            try:
                row["gpu_mem_peak_bytes"], row["gpu_mem_bytes"] = _allocated_bytes(torch_cuda)
            except Exception:  # noqa: BLE001 - memory stats are a bonus
                pass
            self._write(row)

    def write_event(self, row: dict[str, Any]) -> None:
        self._write(row)

    def close(self, torch_cuda: Any | None) -> None:
        if torch_cuda is not None:
            try:
                self.poll_gpu(torch_cuda, block=True)
            except Exception:  # noqa: BLE001 - at exit, the CUDA context may be gone
                pass
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._schedstat is not None and self._schedstat >= 0:
            try:
                os.close(self._schedstat)
            except OSError:  # at exit: nothing to lose
                pass
            self._schedstat = -1

    def _write(self, row: dict[str, Any]) -> None:
        """One whole line or nothing; after an I/O error (a full disk) the timeline stops: the
        lines already written stay readable, and the step count goes on in rank.json."""
        if self._file is None or diskfull.is_full():
            return
        try:
            self._file.write(_line(row))
        except OSError as exc:
            self._file.close()
            self._file = None
            if self._on_error is None:
                raise
            self._on_error(exc)


def _allocated_bytes(torch_cuda: Any) -> tuple[int, int]:
    """The caching allocator's peak and current allocated bytes on the current device.

    `torch.cuda.memory_stats()` flattens every statistic into a new dict in Python: 168 µs a
    call on an H100 (2026-11-25), a step's whole budget for uberprof on a 15 ms step. The
    nested statistics it flattens come from one C++ call that takes 22 µs; read the two values
    there, and go the public way only where that call is gone (another torch)."""
    raw = getattr(getattr(sys.modules.get("torch"), "_C", None), "_cuda_memoryStats", None)
    if raw is not None:
        allocated = raw(torch_cuda.current_device())["allocated_bytes"]["all"]
        return int(allocated["peak"]), int(allocated["current"])
    stats = torch_cuda.memory_stats()
    return stats.get("allocated_bytes.all.peak", 0), stats.get("allocated_bytes.all.current", 0)


def _record_event(torch_cuda: Any) -> Any:
    ev = torch_cuda.Event(enable_timing=True)
    ev.record()
    return ev
