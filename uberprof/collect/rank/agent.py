"""The rank agent: the part of uberprof that lives inside one training process.

It turns step boundaries into the step timeline and trace windows, writes the rank's metadata, and
accounts for its own time on the training thread. Hooks call it through `activation`; every entry
point here is wrapped so that an exception inside uberprof is logged and swallowed.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from uberprof._version import __version__
from uberprof.collect import diskfull
from uberprof.collect.config import CollectConfig, describe_ranks
from uberprof.collect.rank import clock
from uberprof.collect.rank.backend import default_backend
from uberprof.collect.rank.capture import Capture
from uberprof.collect.rank.flight_log import FlightLog, ring_size
from uberprof.collect.rank.layout import LayoutKey, layout_key, parallel_layout, process_groups
from uberprof.collect.rank.requests import RequestInbox
from uberprof.collect.rank.steps import StepDetector, StepSource
from uberprof.collect.rank.timeline import StepTimeline
from uberprof.collect.rank.windows import TraceWindows
from uberprof.collect.safety import AgentLog
from uberprof.rundir import LOG_FILE, RANK_FILE, STEPS_FILE, TRACES_DIR, RunDir
from uberprof.rundir.layout import FLIGHT_LOG_FILE, REQUESTS_DIR, TRACE_ANSWERS_FILE


class RankAgent:
    def __init__(
        self,
        run: RunDir,
        run_id: str,
        node: str | None,
        config: CollectConfig,
        identity: dict[str, Any],
        log: AgentLog,
        first_activity_ns: int | None,
    ) -> None:
        self.pid = os.getpid()
        self.log = log
        self.rank: int = identity["rank"]
        self.run = run
        diskfull.configure(run.root)
        self.dir: Path = run.claim_rank_dir(self.rank)
        log.set_path(self.dir / LOG_FILE)
        self._cuda: Any = None
        self._cuda_possible = True
        self._meta_lock = threading.Lock()
        self._write_lock = threading.RLock()  # re-entered by a signal handler: no deadlock
        self._layout_due = False  # the process group exists: record the layout at a step's end
        self._layout_key: LayoutKey | None = None  # (groups, apis) as last recorded
        self.meta: dict[str, Any] = {
            **identity,
            "run_id": run_id,
            "job_id": run_id,
            "node": node,
            "host": socket.gethostname(),
            "pid": self.pid,
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "uberprof_version": __version__,
            "torch_version": _torch_version(),
            "cpu": _cpu(),
            "start_ns": time.time_ns(),
            "end_ns": None,
            "exit": None,
            "clock": clock.clock_reference(),
            # ranks: --trace-ranks (None: all); selected: whether this rank records the
            # schedule's windows (the others keep the step timeline and Flight Recorder only)
            "trace": {"schedule": config.trace.describe(), "disabled_reason": None,
                      "ranks": None if config.trace_ranks is None
                      else describe_ranks(config.trace_ranks),
                      "selected": config.traces_rank(self.rank)},
        }
        self._write_meta()
        self.timeline = StepTimeline(self.dir / STEPS_FILE, start_ns=first_activity_ns,
                                     on_error=lambda e: log.error("writing the step timeline", e))
        self.flight_log = FlightLog(lambda: self.dir / FLIGHT_LOG_FILE, log, ring_size())
        self._config = config
        inbox = RequestInbox(run.root / REQUESTS_DIR, lambda: self.dir / TRACE_ANSWERS_FILE, log)
        self.windows = TraceWindows(config, self.dir / TRACES_DIR, log, self.rank,
                                    on_stop=self._window_stopped, on_export=self._trace_export,
                                    inbox=inbox)
        self.detector = StepDetector(self._boundary)
        self.closed = False
        self.windows.step_started(0)
        self.capture = Capture(self, log)
        captured = self.capture.arm()
        with self._meta_lock:
            self.meta["capture"] = captured
        self._write_meta()

    # ---- called from hooks on the training thread -------------------------------------------

    def optimizer_stepped(self, optimizer: Any) -> None:
        t0, c0 = time.perf_counter_ns(), self.timeline.own_start()
        self.detector.optimizer_stepped(id(optimizer), time.time_ns())
        self.timeline.own_end(c0)
        self.timeline.uberprof_ns += time.perf_counter_ns() - t0

    def profiler_stepped(self) -> None:
        t0, c0 = time.perf_counter_ns(), self.timeline.own_start()
        self.detector.profiler_stepped(time.time_ns())
        self.timeline.own_end(c0)
        self.timeline.uberprof_ns += time.perf_counter_ns() - t0

    def explicit_step(self) -> None:
        t0, c0 = time.perf_counter_ns(), self.timeline.own_start()
        self.detector.explicit_step(time.time_ns())
        self.timeline.own_end(c0)
        self.timeline.uberprof_ns += time.perf_counter_ns() - t0

    def data_waited(self, ns: int, end_ns: int, overhead_ns: int) -> None:
        self.timeline.add_data_wait(ns, end_ns)
        self.timeline.uberprof_ns += overhead_ns

    def user_profiler_started(self) -> None:
        self.windows.user_profiler_seen()
        with self._meta_lock:
            self.meta["trace"]["disabled_reason"] = self.windows.disabled_reason
        self._write_meta()

    def cuda_in_use(self) -> Any:
        """torch.cuda once the script has initialised CUDA; uberprof never initialises it."""
        if self._cuda is None and self._cuda_possible:
            torch = sys.modules.get("torch")
            self._cuda_possible = torch is not None and torch.cuda.is_available()
            if self._cuda_possible and torch.cuda.is_initialized():
                self._cuda = torch.cuda
                self.timeline.mark_gpu_start(torch.cuda)
                self._describe_device(torch)
        return self._cuda

    def _boundary(self, t_ns: int, source: StepSource) -> None:
        cuda = self.cuda_in_use()
        ended = self.timeline.boundary(t_ns, source.name.lower(), cuda)
        self.windows.step_ended(ended)  # what this costs is the calling hook's, timed there
        self.flight_log.step_ended(ended)
        self.windows.step_started(ended + 1)
        if self._layout_due:  # the first step's end after init_process_group: its subgroups
            self._record_layout()  # (a device mesh's) were made before training started

    def _window_stopped(self) -> None:
        """A trace window's profiler stopped: read the Flight Recorder's ring where the job
        already pays for uberprof's teardown (before the trace is written), and record the
        parallel layout again if the process made groups or imported a parallel API since."""
        self.flight_log.dump(self.timeline.step - 1, "window")
        if self._layout_key is not None:
            try:
                dist = sys.modules.get("torch.distributed")
                if dist is not None and dist.is_initialized() and layout_key(dist) != \
                        self._layout_key:
                    self._record_layout()
            except Exception as exc:  # noqa: BLE001
                self.log.error("checking the parallel layout", exc)

    def _trace_export(self) -> None:
        """As a window's export starts and ends (windows.py): rank.json names the
        window in flight (`trace.exporting`) and the traces written so far, so that a rank
        killed while writing its trace says which one it lost."""
        with self._meta_lock:
            exporting = self.windows.exporting
            self.meta["trace"]["exporting"] = list(exporting) if exporting else None
            self.meta["trace"]["windows"] = [list(w) for w in self.windows.windows_written]
            self.meta["trace"]["cut_short"] = list(self.windows.cut_short)
            self.meta["trace"]["triggers"] = list(self.windows.triggers)
        # bounded: an exit that waits for this thread may come from a signal handler on the
        # training thread while it writes rank.json itself
        self._write_meta(lock_wait_s=5.0)

    def _record_layout(self) -> None:
        """Write the process groups of this rank and the parallel APIs the process imported
        (`layout.py`) into rank.json; never raises."""
        self._layout_due = False
        try:
            dist = sys.modules.get("torch.distributed")
            if dist is None or not dist.is_initialized():
                return
            layout = parallel_layout(dist)
            with self._meta_lock:
                self.meta["process_groups"] = layout["process_groups"]
                self.meta["parallel_apis"] = layout["apis"]
            self._layout_key = layout_key(dist)
        except Exception as exc:  # noqa: BLE001 - private torch.distributed state
            self.log.error("recording the parallel layout", exc)
            return
        self._write_meta()

    # ---- process group, clock, exit -----------------------------------------------------------

    def process_group_ready(self) -> None:
        import torch.distributed as dist

        info = process_group_info(dist)
        if info["rank"] != self.rank or self.dir.name != str(info["rank"]):
            self._move_to_rank(info["rank"])
        with self._meta_lock:
            self.meta.update(info)
        self._write_meta()
        self._layout_due = True
        store = _default_store(dist)
        if store is None:
            return
        clock.start_offset_estimate(
            store,
            self.rank,
            info["world_size"],
            self.meta.get("local_rank") or 0,
            self.meta["host"],
            self.meta["run_id"],
            on_result=self._clock_result,
            on_error=lambda exc: self.log.write(f"clock offset estimate failed: {exc!r}"),
        )

    def _move_to_rank(self, rank: int) -> None:
        """The agent started before the process group (the script stepped its own profiler,
        as Lightning does) under a rank taken from an environment that had none (no RANK): move
        the folder to the rank torch.distributed gives. Open files follow the rename."""
        target = self.run.claim_rank_dir(rank)
        if rank == self.rank and target.name != str(rank):  # its own name is still taken: stay
            os.rmdir(target)
            return
        try:
            os.rename(self.dir, target)  # onto the empty folder just claimed
        except OSError as exc:
            self.log.error(f"moving rank {self.rank}'s folder to {target}", exc)
            try:
                os.rmdir(target)
            except OSError:
                pass
            return
        self.log.set_path(target / LOG_FILE)
        self.windows.moved_to(target / TRACES_DIR, rank)
        self.dir, self.rank = target, rank
        with self._meta_lock:
            self.meta["trace"]["selected"] = self._config.traces_rank(rank)

    def _clock_result(self, result: dict[str, Any]) -> None:
        with self._meta_lock:
            self.meta["job_id"] = result.pop("job_id", self.meta["job_id"])
            self.meta["clock"].update(result)
        self._write_meta()

    def new_group(self, ranks: Any, backend: Any) -> None:
        if self._layout_key is not None:  # the layout was recorded: record it again now
            self._record_layout()
            return
        with self._meta_lock:
            groups = self.meta.setdefault("process_groups", [])
            groups.append({"ranks": list(ranks) if ranks is not None else None,
                           "backend": str(backend) if backend else None})
        self._write_meta()

    def close(self, exit_reason: str = "exit") -> None:
        if self.closed or os.getpid() != self.pid:
            return
        self.closed = True
        self.capture.close()
        # Said at once: what follows (the trace window's export, the Flight Recorder's dump) can
        # take seconds on a busy machine, and the node's watchdog must not read a rank winding
        # down as a hang (it did, with a 5 s timeout, in a CI job).
        with self._meta_lock:
            self.meta["closing_ns"] = time.time_ns()
        self._write_meta(lock_wait_s=1.0)
        if self.capture.exception_seen:
            exit_reason = "exception"
        self.detector.flush()
        if self._layout_due:  # no step ended after the process group was made
            self._record_layout()
        last_step = self.timeline.step - 1
        self.windows.close(last_step)
        self.flight_log.dump(last_step, "exit")
        self.timeline.close(self._cuda)
        with self._meta_lock:
            self.meta["end_ns"] = time.time_ns()
            self.meta["exit"] = exit_reason
            self.meta["steps"] = self.timeline.steps_written
            self.meta["flight_log"] = self.flight_log.status()
            self.meta["trace"]["windows"] = [list(w) for w in self.windows.windows_written]
            self.meta["trace"]["cut_short"] = list(self.windows.cut_short)
            self.meta["trace"]["triggers"] = list(self.windows.triggers)
            self.meta["trace"]["not_reached"] = [list(w)
                                                 for w in self.windows.not_reached(last_step)]
        self._write_meta(final=True)

    def _describe_device(self, torch: Any) -> None:
        try:
            idx = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            device = {"type": "cuda", "index": idx, "name": props.name,
                      "uuid": str(getattr(props, "uuid", "")) or None,
                      "total_memory_bytes": props.total_memory,
                      "hip": bool(getattr(torch.version, "hip", None))}
        except Exception as exc:  # noqa: BLE001
            device = {"type": "cuda", "error": repr(exc)}
        with self._meta_lock:
            self.meta["device"] = device
        self._write_meta()

    def _write_meta(self, final: bool = False, lock_wait_s: float = -1) -> None:
        """After a full disk, only the last write is tried (in place), to record the end.
        `lock_wait_s`: how long to wait for another thread's write (-1: as long as it takes);
        past it this write is skipped."""
        if diskfull.is_full() and not final:
            return
        # One write at a time (the exporter and clock threads write too): the last snapshot
        # taken is the last one renamed into place.
        if not self._write_lock.acquire(timeout=lock_wait_s):
            return
        try:
            with self._meta_lock:
                snapshot = {**self.meta, "trace": dict(self.meta["trace"])}
            try:
                diskfull.write_json_final(self.dir / RANK_FILE, snapshot)
            except OSError as exc:
                self.log.error("writing rank metadata", exc)
        finally:
            self._write_lock.release()


def process_group_info(dist: Any) -> dict[str, Any]:
    """Rank, world and the process groups so far (the default group, first), as
    torch.distributed sees them."""
    info: dict[str, Any] = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": default_backend(dist),
    }
    try:
        info["process_groups"] = process_groups(dist)
    except Exception:  # noqa: BLE001 - private torch.distributed state: the default group only
        info["process_groups"] = [{"name": "default", "ranks": list(range(info["world_size"])),
                                   "backend": info["backend"]}]
    return info


def _default_store(dist: Any) -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - some backends have no store; no estimate then
        return None


def _cpu() -> dict[str, int | None]:
    """The cores this process may run on and torch's intra-op threads: CPU ranks that fill
    their cores contend for them, which `whatif` says its projections cannot model."""
    try:
        cores: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count()
    torch = sys.modules.get("torch")
    try:
        threads = int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # noqa: BLE001 - never harm the job for a figure
        threads = None
    return {"cores": cores, "torch_threads": threads}


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", None) if torch else None
