"""Cores shared by CPU ranks: how much slower each rank's work runs when a change lets more of it
run at once (processor sharing), for the replay of a what-if (`diagnosis/whatif.py`).

A replay keeps every recorded duration, so a change that lets ranks compute at the same time
where the recording had them take turns (a data wait or a straggler's extra work removed) would
project them as fast as alone. On a host whose ranks fill its cores they are not: the data
pair's projections came out 7% optimistic on an idle 2-core VM and 25% beside a CPU hog, where
the fixed steps waited 15-20 ms more a step for a core (benchmarks/README, `whatif.py`).

**The model.** A host has `C` cores. At any moment its ranks' running work (the `compute` and
`host` segments of CPU ranks' lanes, each keeping `weight` threads busy: torch's intra-op
threads for compute, one for host work) adds up to a load `L`; other runnable threads (the
ranks' own helpers, the OS, other jobs) are a Poisson number `B` of mean `background`. Each
running thread progresses at the rate `E[min(1, C / (L + B))]`. The Poisson background keeps
the rate smooth in `L`: a rank alone on two cores that waited 5% of its time for a core is not
read as facing a whole extra thread that would slow it by a third once its peer runs too.

**The background** is fitted per host to what the recording shows: the ranks' training threads'
CPU time against their CPU time plus run-queue wait over the traced steps (`cpu_ns`,
`run_wait_ns` of the step timelines) is the rate their running work had; `background` is the
mean for which the model, over the recorded load, gives that rate (0 where they never waited).

**A projection** replays the changed graph, reads each running segment's mean rate there against
its recorded one, scales its work toward their ratio and replays again, `SHARING_ROUNDS`
times. The step is damped (`SHARING_DAMPING` of the way): undamped, two ranks of 40 and 38 ms
of work at once on one core swing between ending at 76 and 80 ms round after round, where
processor sharing ends them at 78 and 76; damped, 8 rounds land within 0.01 ms. Unchanged,
every rate is its recorded one and the replay is the recorded run.

**A busy host** (`busy_hosts`) is one whose fitted background is at least `BUSY_PER_CORE` of
its cores: other work took a share of them through the recording. There the model is not
enough: once the cores are full, the ranks' work shares them whatever its split, so removing
an imbalance frees little, and `--balance-stages` projections came out 10-19% optimistic
(`tests/jobs/test_whatif_in_job.py`'s pipeline, 2-core VM: background 0.06-0.11 quiet, 1.4-1.6
beside one CPU hog, 1.4-4.4 beside a 4-rank job; the split cost 26-34% quiet, -1..+14% busy).
`whatif` and the report then say so (`whatif.caveats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BUSY_PER_CORE", "SHARING_DAMPING", "SHARING_ROUNDS", "CoreSharing", "fit_background",
           "load_profile", "mean_rates", "sharing_rate"]

SHARING_ROUNDS = 8  # rounds of replay and rate toward the fixed point
SHARING_DAMPING = 0.7  # of the way from a round's factors to the next's
_MAX_BACKGROUND = 64.0
BUSY_PER_CORE = 0.25  # fitted background threads per core from which a host is busy


@dataclass(frozen=True)
class CoreSharing:
    """Which nodes of a step graph share which host's cores (module docstring)."""

    host: np.ndarray  # int64 per node: its host's index, -1 where it takes no core of ours
    weight: np.ndarray  # float64 per node: the threads it keeps busy while it runs
    cores: np.ndarray  # float64 per host
    background: np.ndarray  # float64 per host: mean number of other runnable threads
    names: list[str]  # per host

    def running(self) -> np.ndarray:
        return self.host >= 0

    def busy_hosts(self) -> list[tuple[str, int, float]]:
        """(host, cores, background) of each busy host (module docstring)."""
        return [(h, int(c), float(b)) for h, c, b in zip(self.names, self.cores, self.background)
                if _busy(c, b)]

    def as_dict(self) -> dict[str, Any]:
        return {"model": "processor sharing, Poisson background (docs/whatif.md)",
                "hosts": [{"host": h, "cores": int(c), "background_threads": round(float(b), 2),
                           "busy": _busy(c, b)}
                          for h, c, b in zip(self.names, self.cores, self.background)]}


def _busy(cores: float, background: float) -> bool:
    """A host whose fitted background is at least `BUSY_PER_CORE` of its cores."""
    return bool(background >= BUSY_PER_CORE * cores)


def sharing_rate(load: np.ndarray, cores: float, background: float) -> np.ndarray:
    """`E[min(1, cores / (load + B))]`, B Poisson of mean `background`, for each load."""
    load = np.asarray(load, np.float64)
    if background <= 0:
        return np.minimum(1.0, cores / np.maximum(load, 1e-12))
    kmax = int(background + 10 * np.sqrt(background) + 12)
    k = np.arange(kmax + 1, dtype=np.float64)
    logp = k * np.log(background) - background - np.cumsum(np.r_[0.0, np.log(k[1:])])
    p = np.exp(logp)
    p /= p.sum()
    r = np.minimum(1.0, cores / np.maximum(load[:, None] + k[None, :], 1e-12))
    return r @ p


def _segments(start: np.ndarray, end: np.ndarray, weight: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """The load of intervals [start, end) with `weight` each, as a step function: the times
    where it changes and the load from each of them to the next (the last is 0)."""
    t = np.r_[start, end]
    d = np.r_[weight, -weight]
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    times, first = np.unique(t, return_index=True)
    load = np.add.reduceat(d, first) if t.size else np.zeros(0)
    return times, np.maximum(np.cumsum(load), 0.0)


def load_profile(sh: CoreSharing, start: np.ndarray, end: np.ndarray, host: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Thread-time (ns) the host's running work spent at each load: (loads, thread-ns)."""
    m = (sh.host == host) & (end > start)
    times, load = _segments(start[m], end[m], sh.weight[m])
    if times.size < 2:
        return np.zeros(0), np.zeros(0)
    dt = np.diff(times).astype(np.float64)
    lv = load[:-1]
    keep = lv > 0
    return lv[keep], dt[keep] * lv[keep]


def fit_background(loads: np.ndarray, thread_ns: np.ndarray, cores: float,
                   observed_rate: float) -> float:
    """The mean background for which the running work, at the recorded `loads`, progresses at
    `observed_rate` (CPU time over CPU time plus run-queue wait); 0 where it never waited."""
    total = float(thread_ns.sum())
    if total <= 0 or not np.isfinite(observed_rate):
        return 0.0

    def rate(b: float) -> float:
        return float(sharing_rate(loads, cores, b) @ thread_ns) / total

    if observed_rate >= rate(0.0):
        return 0.0
    lo, hi = 0.0, _MAX_BACKGROUND
    if rate(hi) > observed_rate:
        return hi
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if rate(mid) > observed_rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def mean_rates(sh: CoreSharing, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per node, the mean rate its work progressed at between its `start` and `end` (1 for
    nodes that take no core of ours, or take no time)."""
    out = np.ones(start.size, np.float64)
    for h in range(sh.cores.size):
        m = np.flatnonzero((sh.host == h) & (end > start))
        if m.size == 0:
            continue
        times, load = _segments(start[m], end[m], sh.weight[m])
        rate = sharing_rate(load[:-1], float(sh.cores[h]), float(sh.background[h]))
        area = np.r_[0.0, np.cumsum(rate * np.diff(times))]  # integral of the rate at `times`
        a = area[np.searchsorted(times, start[m])]
        b = area[np.searchsorted(times, end[m])]
        out[m] = (b - a) / (end[m] - start[m])
    return out
