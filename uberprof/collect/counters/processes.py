"""The job's own processes: CPU and resident memory of each process the node agent started,
and of the ranks on this host that another agent started, with their sum for the job.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import psutil

from uberprof.collect.counters.store import Row
from uberprof.rundir import RunDir, read_rank

__all__ = ["ProcessSource"]

MAX_PROCESSES = 128


class ProcessSource:
    """CPU and resident memory of every process the node agent started (launcher, ranks, data
    loader workers), plus ranks on this host that another agent started (srun: one agent per
    rank). Devices are `pid:<pid>` (stable for a process's life; a rank's rank.json may appear
    after its process does) and `job` for the sum; `read_counters` labels rank pids `rank:<r>`."""

    name = "proc"

    def __init__(self, run: RunDir | None, root_pid: int | None = None,
                 rank_scan_s: tuple[float, float, float] = (2.0, 120.0, 30.0)) -> None:
        self.run = run
        self.root_pid = root_pid or os.getpid()
        self.host = socket.gethostname()
        # Look for new rank.json files every 2 s for the first 2 minutes (ranks start), then
        # every 30 s: listing ranks/ on a shared file system from every node has a cost.
        self.rank_scan_s = rank_scan_s
        self._t0 = time.monotonic()
        self._procs: dict[int, psutil.Process] = {}
        self._ranks: dict[int, int] = {}  # pid -> rank
        self._seen_rank_dirs: set[str] = set()
        self._last_rank_scan = -1e18
        self.processes: dict[str, dict[str, Any]] = {}
        self.changed = False

    def refresh(self) -> None:
        """Find the current process tree (cheap: /proc walk of our own children)."""
        now = time.monotonic()
        early, start_phase, late = self.rank_scan_s
        every = early if now - self._t0 < start_phase else late
        if self.run is not None and now - self._last_rank_scan >= every:
            self._last_rank_scan = now
            self._scan_ranks()
        try:
            tree = psutil.Process(self.root_pid).children(recursive=True)
        except psutil.Error:
            tree = []
        pids = {p.pid for p in tree} | set(self._ranks)
        pids = set(sorted(pids)[:MAX_PROCESSES])
        procs = dict(self._procs)
        for pid in set(procs) - pids:
            del procs[pid]
        for pid in pids - set(procs):
            try:
                p = psutil.Process(pid)
                p.cpu_percent(None)  # start its CPU accounting
                procs[pid] = p
                self.processes[str(pid)] = {"name": _safe(p.name), "ppid": _safe(p.ppid),
                                            "rank": self._ranks.get(pid)}
                self.changed = True
            except psutil.Error:
                continue
        for pid, rank in self._ranks.items():
            entry = self.processes.get(str(pid))
            if entry is not None and entry.get("rank") != rank:
                entry["rank"] = rank
                self.changed = True
        self._procs = procs

    def _scan_ranks(self) -> None:
        assert self.run is not None
        try:
            names = os.listdir(self.run.ranks_dir)
        except OSError:
            return
        if len(names) == len(self._seen_rank_dirs):
            return  # nothing new (a listing is cheap; reading every rank.json is not)
        for d in self.run.rank_dirs():
            if d.name in self._seen_rank_dirs:
                continue
            meta = read_rank(d)
            if not meta.readable:
                continue  # not written yet: look again next time
            self._seen_rank_dirs.add(d.name)
            if meta.host == self.host and meta.pid is not None:
                self._ranks[meta.pid] = meta.rank

    def prime(self) -> None:
        self.refresh()

    def sample(self) -> list[Row]:
        rows: list[Row] = []
        total_cpu = total_rss = 0.0
        for pid, p in list(self._procs.items()):
            try:
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped
                        raise psutil.NoSuchProcess(pid)
                    cpu = p.cpu_percent(None)
                    rss = p.memory_info().rss
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            label = f"pid:{pid}"
            rows += [(label, "cpu.util", cpu, "%"), (label, "mem.rss", rss, "B")]
            total_cpu += cpu
            total_rss += rss
        if self._procs:
            rows += [("job", "cpu.util", total_cpu, "%"), ("job", "mem.rss", total_rss, "B")]
        return rows

    def describe(self) -> dict[str, Any]:
        return {"processes": self.processes}


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except psutil.Error:
        return None
