"""The node's counter sampler: background threads in the node agent, one sampler per host.

Two threads, so that nothing slow delays the cheap counters: the fast thread samples host, NIC,
InfiniBand, process and cheap NVML counters at `sample_hz` and flushes the tables; the slow thread
first sets up the GPU backends (NVML init, GPM buffers, DCGM can each take a while) and then
samples the expensive set (PCIe, ECC, GPM, DCGM, link speeds and caps, the process tree) at a
lower rate. Everything runs beside the job, never in its processes, and every failure degrades
to fewer counters with at most one line on stderr.

With one `uberprof run` per rank (srun), the agents of one host race for a host-wide lock
(`hostlock.HostLock`: a `flock` in a private per-user folder); the winner samples, the others
record which node did.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from uberprof.collect import diskfull
from uberprof.collect.counters.hostlock import HostLock
from uberprof.collect.safety import AgentLog
from uberprof.rundir import COUNTERS_DIR, RunDir

MODES = ("auto", "host", "dcgm", "none")
"""auto: host + NVML + GPM where present; host: host counters only; dcgm: auto + DCGM
profiling fields; none: no sampling (the baseline for measuring uberprof's cost)."""

DEFAULT_HZ = 2.0
MAX_SOURCE_ERRORS = 10


@dataclass(frozen=True)
class CounterSettings:
    """What `uberprof run --counters/--sample-hz` asked for, and the rates derived from it."""

    mode: str = "auto"
    sample_hz: float = DEFAULT_HZ
    flush_s: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--counters must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not 0 < self.sample_hz <= 100:
            raise ValueError("--sample-hz must be in (0, 100]")

    @property
    def period_s(self) -> float:
        return 1.0 / self.sample_hz

    @property
    def slow_period_s(self) -> float:
        """PCIe/ECC/GPM/DCGM: at most 1 Hz; GPM needs >= 0.1 s between its two samples."""
        return max(1.0, 2.0 / self.sample_hz)

    @property
    def pcie_period_s(self) -> float:
        """nvmlDeviceGetPcieThroughput blocks ~20 ms per call and GPU: every 5 s at most."""
        return max(5.0, self.slow_period_s)

    @property
    def link_period_s(self) -> float:
        """Link speeds and tc caps (runs `tc`): rarely change."""
        return max(10.0, self.slow_period_s)

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "slow_period_s": self.slow_period_s,
                "pcie_period_s": self.pcie_period_s, "link_period_s": self.link_period_s}


# ---- the sampler --------------------------------------------------------------------------------


@dataclass
class _Task:
    source: str
    fn: Callable[[], list[Any]]
    errors: int = 0
    disabled: bool = False


class NodeSampler:
    def __init__(self, run: RunDir, run_id: str, node_dir: Path, settings: CounterSettings,
                 log: AgentLog, nvml_module: ModuleType | None = None,
                 host: str | None = None, root_pid: int | None = None) -> None:
        self.run = run
        self.run_id = run_id
        self.node_dir = node_dir
        self.settings = settings
        self.log = log
        self.host = host or socket.gethostname()
        self.root_pid = root_pid  # whose process tree is the job's: this process by default
        self._nvml_module = nvml_module
        self.notes: list[str] = []
        self.sampled_by: str | None = None
        self.sources: set[str] = set()
        self._proc: Any = None
        self._lock: HostLock | None = None
        self._store: Any = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fast: list[_Task] = []
        self._slow: list[_Task] = []
        self._describers: list[Callable[[], dict[str, Any]]] = []
        self._closers: list[Callable[[], None]] = []
        self._gpu_ready = threading.Event()
        self._meta_lock = threading.Lock()
        self.started_ns: int | None = None
        self.stopped_ns: int | None = None
        self.cpu_s: dict[str, float] = {}  # CPU time of each sampling thread (self-accounting)

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> bool:
        """Begin sampling in the background; returns at once. False when nothing is sampled
        here (mode none, or another agent on this host already samples)."""
        if self.settings.mode == "none":
            return False
        try:
            path = HostLock.path_for(self.run, self.run_id, self.host)
            self._lock, other = HostLock.acquire(path, f"{self.node_dir.name} pid {os.getpid()}")
        except OSError as exc:  # an unsafe lock folder or file: sample anyway, at worst twice
            self.log.notice(f"counters: no host-wide lock ({exc}); sampling without it",
                            key="counters-lock")
            self._lock, other = None, None
        if self._lock is None and other is not None:
            self.sampled_by = other
            self.log.write(f"counters: {other} samples this host; this agent does not")
            return False
        try:
            self._start_threads()
        except BaseException:
            if self._lock is not None:
                self._lock.release()  # let another agent of this host sample instead
                self._lock = None
            raise
        return True

    def _start_threads(self) -> None:
        from uberprof.collect.counters.host import HostSource
        from uberprof.collect.counters.infiniband import InfinibandSource
        from uberprof.collect.counters.nic import NicSource
        from uberprof.collect.counters.processes import ProcessSource
        from uberprof.collect.counters.store import CounterStore

        self._store = CounterStore(self.node_dir / COUNTERS_DIR)
        host, nic, ib = HostSource(), NicSource(), InfinibandSource()
        proc = ProcessSource(self.run, self.root_pid)
        for src in (host, nic, proc):
            src.prime()
            self._fast.append(_Task(src.name, src.sample))
            self._describers.append(src.describe)
        self._slow.append(_Task(proc.name, _no_rows(proc.refresh)))
        self._slow.append(_Task(nic.name, self._every(self.settings.link_period_s,
                                                      nic.sample_links)))
        if ib.present():
            ib.prime()
            self._fast.append(_Task(ib.name, ib.sample))
            self._slow.append(_Task(ib.name, self._every(self.settings.link_period_s,
                                                         ib.sample_links)))
            self._describers.append(ib.describe)
        self._proc = proc
        self.started_ns = time.time_ns()
        self._write_meta()
        for name, target in (("fast", self._fast_loop), ("slow", self._slow_loop)):
            t = threading.Thread(target=target, name=f"uberprof-counters-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 3.0) -> None:
        """Stop, take a last fast sample (so the tables reach the end of the run), close."""
        if not self._threads:
            if self._lock is not None:
                self._lock.release()
            return
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.stopped_ns = time.time_ns()
        slow_done = not any(t.is_alive() for t in self._threads)
        if slow_done:
            for close in self._closers:
                try:
                    close()
                except Exception as exc:  # noqa: BLE001
                    self.log.write(f"counters: closing a backend: {exc!r}")
        self._write_meta()
        try:
            self._store.close()
        except Exception as exc:  # noqa: BLE001
            self.log.error("closing the counter tables", exc)
        error = self._store.error
        if error is not None and diskfull.is_disk_full_error(error):
            diskfull.declare(error)
        elif error is not None:
            self.log.notice(f"counters could not be written to {self._store.dir} "
                            f"({self._store.error}); the job is not affected", key="counters-io")
        self._threads = []
        if self._lock is not None:
            self._lock.release()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Block until set-up (pyarrow, GPU backends) is done; for tests and benchmarks."""
        return self._gpu_ready.wait(timeout_s)

    def status(self) -> dict[str, Any]:
        """For node.json: what this agent did about counters."""
        wall = ((self.stopped_ns or 0) - (self.started_ns or 0)) / 1e9
        cpu = self.cpu_s.get("fast", 0.0) + self.cpu_s.get("slow", 0.0)  # steady state
        return {**self.settings.describe(), "sampling": self._store is not None,
                "sampled_by": self.sampled_by, "sources": sorted(self.sources),
                "notes": list(self.notes), "cpu_s": dict(self.cpu_s),
                "cpu_share": cpu / wall if wall > 0 and "fast" in self.cpu_s else None}

    # ---- loops ----------------------------------------------------------------------------------

    def _fast_loop(self) -> None:
        """Cheap counters only: no file I/O and no imports here, so ticks stay on time."""
        period = self.settings.period_s
        next_t = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self._tick(self._fast)
            next_t = _next_deadline(next_t, period, time.monotonic())
        self._tick(self._fast)  # the end of the run
        self.cpu_s["fast"] = time.thread_time()

    def _slow_loop(self) -> None:
        """GPU set-up, then the expensive counters and the writing of the tables."""
        try:
            self._store.warm_up()  # the first flush should not pay pyarrow's start-up
        except Exception as exc:  # noqa: BLE001
            self.log.error("loading pyarrow for the counter tables", exc)
        try:
            self._setup_gpu()
        except Exception as exc:  # noqa: BLE001
            self.log.error("setting up GPU counters", exc)
        self._gpu_ready.set()
        self._write_meta()
        self.cpu_s["setup"] = time.thread_time()  # once: importing pyarrow, NVML/GPM/DCGM init
        slow_due = flush_due = time.monotonic()
        while not self._stop.wait(max(0.0, min(slow_due, flush_due) - time.monotonic())):
            now = time.monotonic()
            if now >= slow_due:
                self._tick(self._slow)
                if getattr(self._proc, "changed", False):
                    self._proc.changed = False
                    self._write_meta()
                slow_due = _next_deadline(slow_due, self.settings.slow_period_s, time.monotonic())
            if now >= flush_due:
                if diskfull.run_is_full():
                    self._store.stop_writing(OSError(errno.ENOSPC, "the disk is full"))
                self._store.flush()
                flush_due = _next_deadline(flush_due, self.settings.flush_s, time.monotonic())
        self.cpu_s["slow"] = time.thread_time() - self.cpu_s["setup"]

    def _tick(self, tasks: list[_Task]) -> None:
        ts = time.time_ns()
        for task in list(tasks):
            if task.disabled:
                continue
            try:
                rows = task.fn()
                task.errors = 0
            except Exception as exc:  # noqa: BLE001 - a broken source must not stop the others
                task.errors += 1
                self.log.error(f"sampling {task.source} counters", exc)
                if task.errors >= MAX_SOURCE_ERRORS:
                    task.disabled = True
                    self.log.write(f"counters: {task.source} disabled after "
                                   f"{task.errors} errors in a row")
                continue
            if rows:
                self.sources.add(task.source)
                self._store.add(task.source, ts, rows)

    def _every(self, period_s: float, fn: Callable[[], list[Any]]) -> Callable[[], list[Any]]:
        last = [-1e18]

        def run() -> list[Any]:
            now = time.monotonic()
            if now - last[0] < period_s:
                return []
            last[0] = now
            rows = fn()
            self._write_meta()
            return rows

        return run

    # ---- GPU backends ---------------------------------------------------------------------------

    def _setup_gpu(self) -> None:
        if self.settings.mode == "host":
            return
        from uberprof.collect import capabilities
        from uberprof.collect.counters.gpm import GpmSource
        from uberprof.collect.counters.nvml import Nvml, NvmlSource, NvmlUnavailable

        try:
            nvml = Nvml.open(self._nvml_module)
        except NvmlUnavailable as exc:
            if capabilities.torch_build_has_gpu() is False:  # no GPU expected: a note, no warning
                self._note("a CPU-only torch build: host counters only", loud=False)
            else:
                self._note(f"no NVIDIA GPU (NVML: {exc}): host counters only")
            return
        self._closers.append(nvml.close)
        gpm = GpmSource(nvml)
        try:
            gpm.setup()
        except Exception as exc:  # noqa: BLE001
            self.log.write(f"counters: GPM setup failed: {exc!r}")
        source = NvmlSource(nvml, self.settings.pcie_period_s, pcie_from_gpm=gpm.covers_pcie)
        source.prime()
        self._closers.insert(0, source.close)
        self._closers.insert(0, gpm.close)
        self._describers += [source.describe, gpm.describe]
        self._slow.append(_Task(source.name, source.sample_slow))
        if gpm.supported:
            self._slow.append(_Task(gpm.name, gpm.sample))
        if self.settings.mode == "dcgm":
            self._setup_dcgm(nvml)
        # last: the list is read by the fast thread
        self._fast.append(_Task(source.name, source.sample))

    def _setup_dcgm(self, nvml: Any) -> None:
        from uberprof.collect.counters.dcgm import DcgmSource, DcgmUnavailable

        dcgm = DcgmSource(self.settings.slow_period_s,
                          gpu_labels={g.index: g.label for g in nvml.gpus})
        try:
            dcgm.setup()
        except DcgmUnavailable as exc:
            self._note(f"{exc}: continuing without DCGM")
            return
        except Exception as exc:  # noqa: BLE001
            self._note(f"DCGM failed to start ({exc}): continuing without DCGM")
            return
        self._closers.insert(0, dcgm.close)
        self._describers.append(dcgm.describe)
        self._slow.append(_Task(dcgm.name, dcgm.sample))

    def _note(self, message: str, loud: bool = True) -> None:
        """For node.json (info, dashboard); also one line on stderr when `loud`."""
        self.notes.append(message)
        if loud:
            self.log.notice(message)
        else:
            self.log.write(message)

    def _write_meta(self) -> None:
        if self._store is None:
            return
        meta: dict[str, Any] = {
            "host": self.host,
            "node": self.node_dir.name,
            "pid": os.getpid(),
            "settings": self.settings.describe(),
            "started_ns": self.started_ns,
            "stopped_ns": self.stopped_ns,
            "gpu_setup_done": self._gpu_ready.is_set(),
            "notes": list(self.notes),
            "cpu_s": dict(self.cpu_s),
        }
        for describe in list(self._describers):
            try:
                meta.update(describe())
            except Exception as exc:  # noqa: BLE001
                self.log.write(f"counters: describing a source: {exc!r}")
        with self._meta_lock:
            self._store.write_meta(meta)


def _no_rows(fn: Callable[[], None]) -> Callable[[], list[Any]]:
    """A slow-tier chore that writes no rows (finding the job's processes)."""

    def run() -> list[Any]:
        fn()
        return []

    return run


def _next_deadline(next_t: float, period: float, now: float) -> float:
    """The next tick on the original phase; ticks missed while busy are skipped, not bunched."""
    next_t += period
    if next_t < now:
        next_t += period * (int((now - next_t) / period) + 1)
    return next_t
