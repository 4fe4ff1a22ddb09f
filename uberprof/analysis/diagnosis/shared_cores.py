"""Which work of a run's step graph shares which host's cores, and how loaded those cores were
besides (`tables/contention.py` is the model): what lets a projection see the contention a
change adds where CPU ranks fill their cores.

Only CPU ranks take part: a device rank's work is on its device, and its host thread's waits
for it are no load. A rank's `compute` segments keep torch's intra-op threads busy (at most its
cores), its `host` segments one thread; `data` and `waiting` segments wait off the CPU (a loader
that sleeps, a thread blocked in a collective), and comm nodes are its transfers. The background
of each host is fitted to the run-queue wait its ranks' training threads recorded over the
traced steps (`busy.busy_times`); a run without it (plain traces, agents before `run_wait_ns`)
gets no model, and its projections keep the recorded durations as before.
"""

from __future__ import annotations

import numpy as np

from uberprof.analysis.diagnosis.busy import BusyTimes
from uberprof.analysis.tables.contention import CoreSharing, fit_background, load_profile
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.graph import StepGraph
from uberprof.analysis.tables.lanes import COMPUTE, HOST

__all__ = ["core_sharing"]


def core_sharing(ctx: RunContext, g: StepGraph, busy: BusyTimes | None) -> CoreSharing | None:
    """The graph's CPU ranks grouped by host, with each host's fitted background (module
    docstring) from the run's busy times (`busy.busy_times`); None where no CPU rank's cores
    or run-queue wait are known."""
    if busy is None or busy.run_wait is None:
        return None
    hosts: dict[str, list[int]] = {}
    for r in g.lanes:
        info = ctx.ranks.get(r)
        if info is None or info.mode != "cpu" or not info.cpu_cores or r in g.device_lanes \
                or r not in busy.ranks:
            continue
        hosts.setdefault(info.host or "?", []).append(r)
    if not hosts:
        return None
    names = sorted(hosts)
    host = np.full(g.n, -1, np.int64)
    weight = np.zeros(g.n, np.float64)
    cores = np.zeros(len(names), np.float64)
    for h, name in enumerate(names):
        for r in hosts[name]:
            info = ctx.ranks[r]
            c = int(info.cpu_cores or 1)
            cores[h] = max(cores[h], c)
            lo, hi = g.lanes[r]
            kind = g.kind[lo:hi]
            run = (kind == COMPUTE) | (kind == HOST)
            host[lo:hi][run] = h
            weight[lo:hi] = np.where(kind == COMPUTE, min(int(info.torch_threads or 1), c),
                                     np.where(kind == HOST, 1.0, 0.0))
    start, end = g.start, g.start + g.dur
    sh = CoreSharing(host, weight, cores, np.zeros(len(names)), names)
    background = np.zeros(len(names), np.float64)
    for h, name in enumerate(names):
        rate = _observed_rate(busy, hosts[name], g)
        if rate is None:
            return None
        loads, thread_ns = load_profile(sh, start, end, h)
        background[h] = fit_background(loads, thread_ns, float(cores[h]), rate)
    return CoreSharing(host, weight, cores, background, names)


def _observed_rate(busy: BusyTimes, ranks: list[int], g: StepGraph) -> float | None:
    """CPU time over CPU time plus run-queue wait of `ranks`' training threads over the graph's
    steps; None where a step's wait is unknown or none of them is there."""
    steps = np.unique(g.step[g.step >= 0])
    keep = np.isin(busy.steps, steps)
    rows = [busy.ranks.index(r) for r in ranks]
    if not keep.any() or not rows or busy.run_wait is None:
        return None
    cpu = busy.busy[np.ix_(rows, keep)].astype(np.float64)
    wait = busy.run_wait[np.ix_(rows, keep)].astype(np.float64)
    if np.isnan(wait).any() or cpu.sum() <= 0:
        return None
    return float(cpu.sum() / (cpu.sum() + np.maximum(wait, 0).sum()))
