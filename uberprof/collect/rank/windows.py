"""torch.profiler windows on the same steps on every rank.

A window starts at the boundary that opens its first step and stops at the boundary that ends its
last, with `ProfilerStep#N` annotations numbered like uberprof's steps, so traces from all ranks and
the step timeline share one step index. If the script runs a profiler of its own, uberprof backs
off for the rest of the run: Kineto allows one at a time.

What the window's end costs the training thread (docs/overhead.md has the measurements): the
profiler's stop, which must run on the thread that started the profiler (stopped from another
thread, torch 2.13 leaves its callbacks on the training thread) and is most of the stall (Kineto
collects and converts the window's events; operator input shapes, `record_shapes`, make it about
3x slower), and the Flight Recorder's dump (about a millisecond). The trace's export and its
compression run on an exporter thread, one window at a time: Kineto writes `<name>.tmp` and
renames it, and the gzip goes through `<name>.gz.tmp` the same way, so readers see whole files
or none. The export holds the GIL while Kineto writes (a pybind call), so the training thread
may still wait for it where it needs the GIL, but not where it runs without it (backward,
collectives' waits) or on another core. Exits wait for the trace in flight: atexit and
`os._exit` (activation.py); a SIGKILL cannot, and rank.json's `trace.exporting`, written before
the job goes on, then names the window lost.

Windows open for two reasons, each recorded with the window (`triggers`, rank.json's
`trace.triggers`, and the trace's `uberprof_trigger` metadata): the schedule (`--trace-steps`,
`--trace-every`), on the ranks `--trace-ranks` selects, and a request on demand (`uberprof
trace`, read through `requests.py` at each step's start), on the ranks it names. A request is
refused, with its reason in the rank's answer, when it would share a step with a window
recording, requested or scheduled, or when tracing is off for the run (the script's own
profiler, a full disk).

A window whose rank's memory grows past its budget stops at that step's end
(`window_memory.py`: with shapes the profiler holds each operator's tensors until the window
stops); `cut_short` records it, and rank.json's `trace.cut_short`.

Shapes are recorded where the analysis needs them, on CPU ranks and on GPU ranks whose default
group runs Gloo (Gloo collectives' sizes come only from them), and not on NCCL ranks, whose kernels
carry their own sizes, unless asked (`uberprof run --record-shapes on`).
"""

from __future__ import annotations

import gzip
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uberprof.collect import diskfull
from uberprof.collect.config import CollectConfig
from uberprof.collect.rank.modules import ModuleMarks
from uberprof.collect.rank.requests import RequestInbox
from uberprof.collect.rank.window_memory import MB, WindowMemory
from uberprof.collect.safety import AgentLog
from uberprof.rundir import trace_file_name

EXPORTER_NAME = "uberprof-trace-export"
SYNC_EXPORT_ENV = "UBERPROF_SYNC_EXPORT"
EXIT_WAIT_S = 300.0  # the most an exit waits for the trace in flight (a big window: minutes)


class TraceWindows:
    def __init__(self, config: CollectConfig, traces_dir: Path, log: AgentLog, rank: int,
                 on_stop: Callable[[], None] | None = None,
                 on_export: Callable[[], None] | None = None,
                 inbox: RequestInbox | None = None) -> None:
        self._schedule = config.trace
        # called once a window's profiler stopped, before its trace is written and compressed
        # (the compressing thread, at the lowest priority, can hold the GIL for a long time on
        # a busy machine: what runs after it may wait)
        self._on_stop = on_stop
        # called when an export starts (on the training thread) and ends (on the exporter's):
        # `exporting` and `windows_written` changed; the agent records them in rank.json, so
        # that a rank killed while its trace was being written says which window it lost
        self._on_export = on_export
        self._config = config
        self._dir = traces_dir
        self._log = log
        self._rank = rank
        self._prof: Any = None
        self._window: tuple[int, int] | None = None
        self._step_annotation: Any = None
        self._exporter: threading.Thread | None = None  # the window's export, in flight
        self._lock = threading.Lock()
        self.exporting: tuple[int, int] | None = None  # the window whose trace is being written
        # benchmarks/overhead.py --sync-baseline: the training thread waits for the export, the
        # cost the window had before the exporter thread, measured beside it in the same run
        self._sync_export = os.environ.get(SYNC_EXPORT_ENV) == "1"
        self.disabled_reason: str | None = None
        self.windows_written: list[tuple[int, int]] = []
        self._modules = ModuleMarks(log) if config.modules else None  # --modules
        self._memory = WindowMemory(config.window_memory_mb, _local_ranks())
        # windows stopped early for memory: {"window", "last", "grown_mb", "budget_mb"}
        self.cut_short: list[dict[str, Any]] = []
        self._inbox = inbox  # requests on demand (uberprof trace)
        self._pending: dict[str, Any] | None = None  # an accepted request's window, to come
        # what opened each window: {"first", "last", "trigger": "schedule"|"on demand", "request"}
        self.triggers: list[dict[str, Any]] = []

    @property
    def active(self) -> bool:
        return self._prof is not None

    @property
    def selected(self) -> bool:
        """Whether the schedule's windows are this rank's (`--trace-ranks`)."""
        return self._config.traces_rank(self._rank)

    def step_started(self, step: int) -> None:
        if self._inbox is not None:
            self._read_requests(step)
        if self._prof is not None:
            self._annotate(step)
            return
        if self.disabled_reason is not None:
            return
        pending = self._pending
        if pending is not None and step >= pending["first"]:
            self._pending = None
            if step > pending["last"]:  # never reached its first step's boundary: too late
                self._log.write(f"trace request {pending['request']}: window "
                                f"{pending['first']}-{pending['last']} missed")
            elif not diskfull.run_is_full():
                self._start((step, pending["last"]), step, pending)
            return
        if not self._schedule.enabled or not self.selected:
            return
        window = self._schedule.window_at(step)
        if window is not None and not diskfull.run_is_full():
            self._start(window, step, {"trigger": "schedule", "request": None})

    def _read_requests(self, step: int) -> None:
        """New requests on demand, each answered once (`requests.py`); never raises."""
        try:
            for req in self._inbox.poll():  # type: ignore[union-attr]
                ranks = req.get("ranks")
                if ranks is not None and self._rank not in ranks:
                    continue
                self._inbox.answer(self._consider(req, step))  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - the job goes on without the window
            self._log.error("reading trace requests", exc)

    def _consider(self, req: dict[str, Any], step: int) -> dict[str, Any]:
        """Accept a request (its window becomes the pending one) or say why not. A rank already
        past the request's first step starts at this step, `step`, and says so (`late`)."""
        late = step > req["first"]
        first = step if late else req["first"]
        last = first + req["steps"] - 1
        answer: dict[str, Any] = {"id": req["id"], "time_ns": time.time_ns(), "step": step,
                                  "window": [first, last], "late": late}
        reason = None
        if self.disabled_reason is not None:
            reason = f"tracing is off on this rank: {self.disabled_reason}"
        elif diskfull.run_is_full():
            reason = "the disk holding the run directory is full"
        elif self._window is not None and self._window[1] >= first:
            reason = (f"a trace window is already recording (steps {self._window[0]}-"
                      f"{self._window[1]})")
        elif self._pending is not None:
            reason = (f"a trace window is already requested (steps {self._pending['first']}-"
                      f"{self._pending['last']})")
        elif self.selected and (clash := self._schedule.overlapping(first, last)) is not None:
            reason = f"it would overlap the scheduled trace window at steps {clash[0]}-{clash[1]}"
        if reason is not None:
            self._log.write(f"trace request {req['id']} refused: {reason}")
            return {**answer, "status": "refused", "reason": reason}
        self._pending = {"first": first, "last": last,
                         "trigger": str(req.get("trigger") or "on demand"), "request": req["id"]}
        self._log.write(f"trace request {req['id']} accepted: steps {first}-{last}"
                        + (f" (past step {req['first']} when read)" if late else ""))
        return {**answer, "status": "accepted"}

    def moved_to(self, traces_dir: Path, rank: int | None = None) -> None:
        """The rank's folder was renamed (its real rank became known)."""
        self._dir = traces_dir
        if rank is not None:
            self._rank = rank

    def step_ended(self, step: int) -> None:
        if self._window is None:
            return
        if step >= self._window[1]:
            self._stop(self._window[0], step)
            return
        try:
            cut = self._memory.over()
        except Exception as exc:  # noqa: BLE001 - the window goes on as asked
            self._log.error("reading the window's memory", exc)
            return
        if cut is not None:
            first, last = self._window
            self.cut_short.append({"window": [first, last], "last": step,
                                   "grown_mb": round(cut.grown / MB, 1),
                                   "budget_mb": round(cut.budget / MB)})
            self._log.notice(f"trace window {first}-{last} stopped after step {step}: "
                             f"{cut.words()} (uberprof run --window-memory-mb sets it)",
                             key="window-memory")
            self._stop(first, step)

    def user_profiler_seen(self) -> None:
        """The script started its own profiler: finish ours now and stay out of the way."""
        self.wait_for_export()  # one Kineto session at a time, our export included
        if self.disabled_reason is None:
            self.disabled_reason = "the script runs its own torch.profiler"
            self._log.notice(
                "the script runs its own torch.profiler; uberprof will not start a second one "
                "(steps are still timed; ProfilerStep#N marks the steps)",
                key="user-profiler",
            )
        if self._prof is not None and self._window is not None:
            self._stop(self._window[0], None)

    def close(self, last_step: int) -> None:
        if self._prof is not None and self._window is not None:
            first = self._window[0]
            # A job that ends where a window starts opened it on no step: nothing to keep.
            self._stop(first, last_step if last_step >= first else None)
        if not self.wait_for_export(EXIT_WAIT_S):
            self._log.notice(f"the trace of steps {self.exporting} was still being written "
                             f"{EXIT_WAIT_S:.0f} s after the job's end; it may be incomplete",
                             key="trace-export-late")

    def not_reached(self, last_step: int) -> list[tuple[int, int]]:
        """The scheduled windows the job ended before (`last_step` was its last step), so that
        `run` and `info` can say why there is no trace instead of failing silently."""
        if self.disabled_reason is not None or not self._schedule.enabled or not self.selected:
            return []
        missed = [w for w in self._schedule.windows if w[0] > last_step]
        every, active = self._schedule.every, self._schedule.active
        if every and every > last_step:
            missed.append((every, every + active - 1))
        return missed

    def _start(self, window: tuple[int, int], step: int, why: dict[str, Any]) -> None:
        import torch
        from torch.autograd import profiler as autograd_profiler
        from torch.profiler import ProfilerActivity

        if getattr(autograd_profiler, "_is_profiler_enabled", False):
            self.user_profiler_seen()
            return
        self.wait_for_export()  # the previous window's trace first: one in Kineto's hands
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        shapes = self._config.record_shapes
        prof = _OwnProfile(
            activities=activities,
            record_shapes=_sizes_need_shapes(ProfilerActivity.CUDA in activities)
            if shapes is None else shapes,
            with_stack=self._config.with_stack,
            profile_memory=self._config.profile_memory,
        )
        prof.start()
        try:
            self._memory.start()
        except Exception as exc:  # noqa: BLE001 - no budget for this window
            self._log.error("reading the memory at the window's start", exc)
        if self._modules is not None:
            self._modules.start()
        prof.add_metadata("uberprof_window", f"{window[0]}-{window[1]}")
        prof.add_metadata("uberprof_trigger", why["trigger"])
        self.triggers.append({"first": window[0], "last": window[1], "trigger": why["trigger"],
                              "request": why.get("request")})
        self._prof = prof
        self._window = window
        self._annotate(step)

    def _annotate(self, step: int) -> None:
        import torch

        self._end_annotation()
        rf = torch.profiler.record_function(f"ProfilerStep#{step}")
        rf.__enter__()
        self._step_annotation = rf

    def _end_annotation(self) -> None:
        if self._step_annotation is not None:
            self._step_annotation.__exit__(None, None, None)
            self._step_annotation = None

    def _stop(self, first: int, last: int | None) -> None:
        """End the window on the training thread: the profiler must stop on the thread that
        started it (module docstring), and the Flight Recorder's dump holds
        the GIL; the trace's export and compression go to the window's exporter thread."""
        prof, self._prof, self._window = self._prof, None, None
        self._end_annotation()
        if self._modules is not None:
            self._modules.stop()
        t0 = time.perf_counter_ns()
        try:
            prof.stop()
        except Exception as exc:  # noqa: BLE001
            self._log.error("stopping the profiler", exc)
            return
        stop_ns = time.perf_counter_ns() - t0
        if self._on_stop is not None:
            self._on_stop()
        if last is None or diskfull.is_full():
            return  # the user's own profiler interrupted it, it holds no step, or no disk left
        # At most one export in flight: a window that ends before the previous one's trace is
        # written waits for it here (bounded memory: one profile's events at a time).
        self.wait_for_export()
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / trace_file_name(first, last)
        self.exporting = (first, last)
        self._exported()  # in rank.json before the job goes on: a rank killed now names it
        written = threading.Event()
        t = threading.Thread(target=self._export,
                             args=(prof, path, first, last, stop_ns, written),
                             name=EXPORTER_NAME, daemon=True)
        self._exporter = t
        t.start()
        if self._sync_export:  # as before the exporter thread: the training thread waits for
            written.wait(EXIT_WAIT_S)  # the trace to be written (not for its compression)

    def wait_for_export(self, timeout_s: float | None = None) -> bool:
        """Wait for the trace in flight, if any, to be written (and compressed); True when none
        is left. The process's exit paths call it, so that no trace is lost to an exit."""
        t = self._exporter
        if t is None or t is threading.current_thread():
            return True
        t.join(timeout_s)
        if t.is_alive():
            return False
        self._exporter = None
        return True

    def _export(self, prof: Any, path: Path, first: int, last: int, stop_ns: int,
                written: threading.Event) -> None:
        """The exporter thread: Kineto writes `<name>.tmp` and renames it, so readers see the
        whole trace or none; then it is compressed the same way. Never raises."""
        try:
            t0 = time.perf_counter_ns()
            prof.export_chrome_trace(str(path))
            export_ns = time.perf_counter_ns() - t0
            written.set()
            del prof  # the window's events: freed before the compression
            if not path.exists():  # Kineto logs its failure and raises nothing; it leaves a .tmp
                full = _no_room_left(self._dir)  # before the .tmp goes and frees its room
                _unlink(path.with_name(path.name + ".tmp"))
                if full:
                    diskfull.declare()
                else:
                    self._log.notice(f"torch.profiler could not write the trace {path}",
                                     key="trace-export")
                return
            with self._lock:
                self.windows_written.append((first, last))
            self._log.write(f"trace window steps {first}-{last} -> {path} (profiler stop "
                            f"{stop_ns / 1e6:.1f} ms on the training thread, export "
                            f"{export_ns / 1e6:.1f} ms on {EXPORTER_NAME})")
            _gzip_in_place(path, self._log)
        except Exception as exc:  # noqa: BLE001 - the job goes on without this trace
            self._log.error(f"writing the trace of steps {first}-{last}", exc)
        finally:
            written.set()
            self.exporting = None
            self._exported()

    def _exported(self) -> None:
        if self._on_export is not None:
            try:
                self._on_export()
            except Exception as exc:  # noqa: BLE001
                self._log.error("recording the trace export", exc)


def _gzip_in_place(path: Path, log: AgentLog) -> None:
    """`trace.json` -> `trace.json.gz`, the original kept until the archive is complete.

    The exporter thread lowers its own priority for this (Linux nice values are per thread), so
    compression uses idle CPU rather than time the training steps need. It holds the GIL only
    between zlib's calls, which release it.
    """
    tmp = path.with_name(path.name + ".gz.tmp")
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
    try:
        with open(path, "rb") as src, gzip.open(tmp, "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, path.with_name(path.name + ".gz"))
        os.unlink(path)
    except Exception as exc:  # noqa: BLE001 - the uncompressed trace stays readable
        _unlink(tmp)
        log.error(f"compressing {path.name}", exc)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sizes_need_shapes(device_traced: bool) -> bool:
    """Whether collectives' sizes can come only from operator input shapes: on CPU ranks, and
    on GPU ranks whose default process group runs Gloo (no NCCL metadata in the trace)."""
    if not device_traced:
        return True
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized()
                    and dist.get_backend() == "gloo")
    except Exception:  # noqa: BLE001 - a guess at a cost, never worth failing the window
        return False


def _no_room_left(directory: Path) -> bool:
    """Whether the file system holding `directory` has no room left (under 1 MiB)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def _own_profile_class() -> type:
    from torch.profiler import profile

    class OwnProfile(profile):
        """Marks uberprof's profiler so the hook on `profile.start` can tell it from the user's."""

    return OwnProfile


class _LazyOwnProfile:
    cls: type | None = None

    def __call__(self, **kwargs: Any) -> Any:
        if self.cls is None:
            self.cls = _own_profile_class()
        return self.cls(**kwargs)

    def is_own(self, obj: Any) -> bool:
        return self.cls is not None and isinstance(obj, self.cls)


_OwnProfile = _LazyOwnProfile()
is_own_profiler = _OwnProfile.is_own


def _local_ranks() -> int:
    """The ranks on this host, which share its memory (torchrun's LOCAL_WORLD_SIZE; 1 unknown)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
