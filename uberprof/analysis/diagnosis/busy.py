"""Busy time per step: the compute evidence that tells a straggler from a rank the OS delayed.

Arrival order alone cannot tell them apart: on oversubscribed cores a healthy rank that the
scheduler keeps off a core is alone last as often as a rank that computes 1.3x as long (seed
22 of the accuracy benchmark: 23 of 38, chance 1.5e-5). What differs is the work: a compute
straggler's training thread spends more CPU time per step, a delayed one the same.

- **Busy time** (`busy_kind`, the one rule of what it is, for rows, tables and followers): the
  training thread's CPU time per step (`cpu_ns` of steps.jsonl, `time.thread_time_ns` at each
  step boundary), the job's own: uberprof's CPU time on that thread (its hooks) is written apart
  (`uberprof_cpu_ns`) and not in it (runs recorded before issue 54 still count it; 84-114 µs
  a step on each rank of a tiny job, alike on every rank: benchmarks/README.md).
  Device runs have no busy time here: their `gpu_time_ns` is the device time between two step
  boundaries, which includes the collectives' wait for a late peer (the same on every rank of a
  synchronous job), and a host thread that waits on the device may spin (CPU time that is no
  work). Runs from agents that did not record `cpu_ns` have none either: the straggler test
  then decides exactly as before.
- **Compute-excess test** (`BusyTimes.excess`): each step is one instance and the rank with
  the most busy time in it is "alone last" (`stragglers.matrix_lateness`); the frequency is
  the straggler test's own (sole-last count, Poisson-binomial, Bonferroni over the ranks), the
  excess its lead (the rank's busy time minus the others' median, median over the steps).
  Material at `MATERIAL_EXCESS` of the median step. Confirmed: frequency at the false-alarm
  rate and material. No excess: below the material size, and no data-wait excess of that size
  either (a rank whose loader sleeps is late by its own doing while its CPU time is the
  others').
- **Off the CPU, by its own doing or the OS's** (`run_wait_ns` of steps.jsonl: the training
  thread's time runnable but waiting for a core, per step): a late rank with no excess of CPU
  time or data wait spent its extra time off the CPU. Saying "the OS delayed it" needs evidence:
  it was *delayed by the OS* when its run-queue wait per step exceeds the others' median by at
  least half its lateness (and the material size): the scheduler kept it from a core for most of
  it. A sleeping rank on a loaded host also waits for a core after each wake-up (4-9 ms a step
  against a 35-57 ms lead with a CPU hog beside a 2-rank job), not for most of its lateness.
  Otherwise it waited off the CPU by itself (sleep, blocking I/O, a lock): `off_cpu`, a
  straggler whose cause is its own behaviour.
  Involuntary context switches were tried first and do not tell them apart: on a loaded host a
  sleeping rank is preempted about as often as the others when it runs. Without the run-queue
  wait (older agents, not Linux) the old reading stands: cleared.
- **More delayed than working** (`BusyExcess.outweighed_by_os`): a rank whose CPU-time excess is
  confirmed, but whose extra wait for a core per step, beyond what that extra work itself waits
  on cores shared as the others' are (the others' wait per CPU ns times the excess: a rank with
  8x the forward work, 4 ranks on 2 cores, waited +108 ms a step for +77 ms of CPU where the
  others waited 2.9 ns per ns of CPU), is at least that excess, was held back by
  other load on its host more than by its own work, and its extra CPU time may itself be that
  load's doing (the same operators, called as often, running slower between preemptions). It is
  at most a suspected straggler, cause `preempted`. A healthy 4-rank job on two cores shared with
  three other heavy processes was confirmed a compute straggler on +5.8 ms of CPU time a step
  beside +16.2 ms of run-queue wait (its excess operators ran as many times as the others'); the
  injected 1.3x compute stragglers (110 runs, 2 and 4 ranks, with and without a CPU hog) waited
  at most 0.76x their CPU excess for a core.
- **Slight extra work** (`BusyExcess.slight`): healthy ranks' cores are not alike. On the 2-core
  development VM a healthy rank's training thread used 5.0% and 6.8% more CPU time a step than
  the other's for the same work (gradient-accumulation runs, 150 ms of CPU a step; the most in
  22 of 27 steps): a persistent difference that the arrivals confirm as a straggler. The
  smallest straggler the accuracy benchmark injects (1.3x compute) showed +15% to +56% (110
  kept runs). A rank late by its work (its CPU excess at least half its lead) whose excess is
  under `SLIGHT_EXCESS` of the others' CPU time is at most a suspected straggler: no more work
  than a slower core explains.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.evidence import FALSE_ALARM_RATE, MIN_STEPS, chance_words
from uberprof.analysis.diagnosis.lateness import Series, matrix_lateness, rank_frequency, rank_lead
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.schemas import TIMELINE_SCHEMA
from uberprof.rundir import RunDir, ranks_by_id
from uberprof.rundir.ranks import StepTimeline
from uberprof.rundir.step_table import read_step_table

if TYPE_CHECKING:
    from uberprof.rundir.follow import RunFollower

__all__ = ["KIND_CPU", "MATERIAL_EXCESS", "SLIGHT_EXCESS", "BusyExcess", "BusyTimes",
           "RankBusy", "busy_kind", "busy_of_ranks", "busy_series", "busy_times",
           "excess_over_others", "followed_busy", "followed_run_wait", "is_slight",
           "os_outweighs", "table_busy", "wait_per_cpu"]

KIND_CPU = "cpu"  # the training thread's CPU time (steps.jsonl `cpu_ns`)
MATERIAL_EXCESS = 0.03  # of the median step: the excess that counts as more work
SLIGHT_EXCESS = 0.10  # of the others' busy time: below it, no more than a slower core
_WORDS = {KIND_CPU: "CPU time"}


def busy_kind(has_device_time: bool, has_cpu_time: bool) -> str | None:
    """What a run's busy time is, or None where it has none (an older agent; a device run,
    whose `gpu_time_ns` is no busy time: module docstring). The one rule, for every reader."""
    return KIND_CPU if has_cpu_time and not has_device_time else None


def busy_series(timeline: StepTimeline) -> tuple[str, dict[int, int]] | None:
    """A rank's busy time per step and its kind, or None where its timeline has none."""
    cpu = timeline.values("cpu_ns")
    kind = busy_kind(bool(timeline.values("gpu_time_ns")), bool(cpu))
    return (kind, cpu) if kind is not None else None


def followed_busy(follower: RunFollower, window: int) -> list[Series] | None:
    """The busy time of a run being followed, per rank (rank, steps, ns) over its latest
    `window` steps that have it, or None where `busy_kind` says the run has none."""
    tails = [(r, s[-2 * window:], v[-2 * window:]) for r, s, v in follower.series("cpu_ns")]
    kind = busy_kind(follower.gpu_times_seen(), any(bool((v >= 0).any()) for _, _, v in tails))
    if kind is None:
        return None
    return [(r, s[v >= 0], v[v >= 0]) for r, s, v in tails]


def followed_run_wait(follower: RunFollower, window: int) -> list[Series]:
    """The run-queue wait per step of a run being followed, per rank (rank, steps, ns), over
    its latest `window` steps that have it (none for older agents, not Linux)."""
    tails = [(r, s[-2 * window:], v[-2 * window:]) for r, s, v in follower.series("run_wait_ns")]
    return [(r, s[v >= 0], v[v >= 0]) for r, s, v in tails]


def excess_over_others(values: np.ndarray, i: int) -> int:
    """Row `i`'s excess over the other rows' median, median over the columns ([rank, step])."""
    return int(np.median(values[i] - np.median(np.delete(values, i, axis=0), axis=0)))


def is_slight(excess_ns: float, others_ns: float) -> bool:
    """Whether an excess of busy time is under SLIGHT_EXCESS of the others' (module docstring,
    "Slight extra work"): the one rule, for the diagnosis and the live views."""
    return excess_ns < SLIGHT_EXCESS * others_ns


def wait_per_cpu(run_wait: np.ndarray, cpu: np.ndarray) -> float:
    """The run-queue wait a rank's thread pays per ns of CPU time on this host, from the other
    ranks' medians ([rank, step] each): on cores shared k ways, about k - 1."""
    c = float(np.median(cpu)) if cpu.size else 0.0
    return max(0.0, float(np.median(run_wait)) / c) if c > 0 else 0.0


def os_outweighs(run_wait_excess_ns: float | None, excess_ns: float, need_ns: float,
                 per_cpu: float = 0.0) -> bool:
    """Whether a rank's extra wait for a core per step, beyond what its extra CPU time brings
    on cores shared as the others' are (`per_cpu` x the excess: more work waits more), is
    material and at least that extra CPU time (module docstring, "More delayed than working"):
    the one rule, for the diagnosis (`BusyExcess.outweighed_by_os`) and the live views
    (step_signals.py)."""
    if run_wait_excess_ns is None:
        return False
    unexplained = run_wait_excess_ns - per_cpu * max(excess_ns, 0.0)
    return unexplained >= max(need_ns, excess_ns)


@dataclass
class BusyExcess:
    """The compute-excess test of one rank (module docstring), with its numbers."""

    rank: int
    kind: str
    most: int  # steps where it alone had the most busy time
    steps: int  # steps with every rank's busy time
    ranks_tested: int
    p_value: float  # chance of `most` or more for a rank with no excess, x ranks (Bonferroni)
    p_uncorrected: float
    median_ns: int  # the others' median busy time per step (median over steps)
    excess_ns: int  # its busy time minus the others' median, median over the steps
    data_excess_ns: int  # the same for its data wait
    need_ns: int  # the material excess: MATERIAL_EXCESS of the median step
    run_wait_excess_ns: int | None = None  # its run-queue wait minus the others' median
    lead_ns: float | None = None  # its lateness at collectives (the straggler test's lead)
    wait_per_cpu: float = 0.0  # the others' run-queue wait per ns of CPU time (medians)

    @property
    def confirmed(self) -> bool:
        """More work, persistently and materially."""
        return self.p_value <= FALSE_ALARM_RATE and self.excess_ns >= self.need_ns

    @property
    def accounts_for_lead(self) -> bool:
        """Confirmed more work than any other rank in at least 90% of the steps, and more of it
        a step than its median lead at collectives: late by its own work, whatever order the
        arrivals take (a CPU hog beside the job shuffles them: a 1.3x compute straggler with 34-47%
        more CPU time in 27 of 27 steps was alone last at only 57-67% of its collectives). The
        extra work is weighed as the wall time it takes on cores shared as the others' are
        (`work_wall_ns`): beside a hog, +19.1 ms of CPU time a step stood behind a 23 ms lead
        where the others waited 0.74 ns for a core per ns of CPU: 33.4 ms of wall time."""
        return (self.confirmed and self.lead_ns is not None and self.lead_ns > 0
                and self.work_wall_ns >= self.lead_ns and self.most >= 0.9 * self.steps)

    @property
    def work_wall_ns(self) -> float:
        """The wall time its extra CPU time takes a step where each ns of CPU also waits
        `wait_per_cpu` for a core (as the others' does): the lateness its work explains."""
        return max(self.excess_ns, 0) * (1.0 + self.wait_per_cpu)

    @property
    def cleared(self) -> bool:
        """No material excess of its own time (busy or data wait): it is not late by its work."""
        return self.excess_ns < self.need_ns and self.data_excess_ns < self.need_ns

    @property
    def preempted(self) -> bool | None:
        """Whether the OS kept it from a core longer than the others by enough to explain its
        lateness (at least half its lead, and material); None without run-queue waits."""
        if self.run_wait_excess_ns is None:
            return None
        return self.run_wait_excess_ns >= max(self.need_ns, 0.5 * (self.lead_ns or 0.0))

    @property
    def slight(self) -> bool:
        """Late by its work (its excess at least half its lead), but that work within what a
        slower core explains (module docstring): under SLIGHT_EXCESS of the others'."""
        return (self.lead_ns is not None and self.excess_ns >= max(self.need_ns,
                                                                   0.5 * self.lead_ns)
                and is_slight(self.excess_ns, self.median_ns)
                and self.data_excess_ns < self.need_ns)

    @property
    def outweighed_by_os(self) -> bool:
        """Confirmed more work, but a longer extra wait for a core than that work (module
        docstring): other load delayed it more than its own work did."""
        return self.confirmed and os_outweighs(self.run_wait_excess_ns, self.excess_ns,
                                               self.need_ns, self.wait_per_cpu)

    @property
    def off_cpu(self) -> bool:
        """Late by waiting off the CPU on its own (sleep, I/O, a lock): no excess of CPU time
        or data wait, and no evidence that the OS preempted it."""
        return self.cleared and self.preempted is False

    def waited_off_cpu(self, late_by_ns: float) -> bool:
        """Late mostly off the CPU by its own doing, weighed against `late_by_ns` (its lead, or
        the host gaps the traced steps blame where larger): its extra CPU time and wait for a
        core explain under half of it, the OS did not keep it from a core, its data wait is the
        others', and it does no more work than a slower core gives (`is_slight`). A rank with
        confirmed, more than slight extra work is late by that work whatever else holds it: a
        2x compute straggler (+100% CPU time a step) on a busy CI host had a lead over twice its
        extra CPU time and run-queue wait, time its host took from it unseen."""
        if self.confirmed and not is_slight(self.excess_ns, self.median_ns):
            return False
        return (self.preempted is False and self.data_excess_ns < self.need_ns
                and self.explained_ns < 0.5 * late_by_ns)

    @property
    def explained_ns(self) -> int:
        """Per step, the lateness its own record explains (ns): its extra CPU time and its extra
        wait for a core."""
        return self.excess_ns + max(self.run_wait_excess_ns or 0, 0)

    @property
    def excess_pct(self) -> float:
        return 100 * self.excess_ns / self.median_ns if self.median_ns else 0.0

    def words(self) -> str:
        """The test in words: "its CPU time per step is the others' +31% (8.2 ms; ...)"."""
        what = _WORDS.get(self.kind, self.kind)
        data = (f"; its data wait {self.data_excess_ns / 1e6:+.3g} ms per step over the "
                "others'" if self.data_excess_ns >= self.need_ns else "")
        switches = ""
        if self.outweighed_by_os:
            assert self.run_wait_excess_ns is not None
            switches = (f"; but its wait for a core (run queue) per step is the others' "
                        f"{self.run_wait_excess_ns / 1e6:+.3g} ms, more than its extra "
                        f"{what}: other load on its host delayed it more than its own work")
        elif self.run_wait_excess_ns is not None and self.excess_ns < self.need_ns:
            switches = (f"; its wait for a core (run queue) per step is the others' "
                        f"{self.run_wait_excess_ns / 1e6:+.3g} ms: "
                        + ("delayed by the OS (other load)" if self.preempted else
                           "not delayed by the OS, so it waited off the CPU by itself (sleep, "
                           "I/O, a lock)"))
        return (f"its {what} per step is the others' {self.excess_pct:+.1f}% "
                f"({self.excess_ns / 1e6:+.3g} ms; material from {self.need_ns / 1e6:.3g} ms, "
                f"{100 * MATERIAL_EXCESS:.0f}% of the step), the most at {self.most} of "
                f"{self.steps} steps (chance {chance_words(self.p_value)}, corrected for "
                f"{self.ranks_tested} ranks){data}{switches}")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "most_in": self.most,
                "steps": self.steps, "p_value": float(f"{self.p_value:.3g}"),
                "p_uncorrected": float(f"{self.p_uncorrected:.3g}"),
                "others_median_ms": round(self.median_ns / 1e6, 3),
                "excess_ms": round(self.excess_ns / 1e6, 3),
                "excess_pct": round(self.excess_pct, 1),
                "data_wait_excess_ms": round(self.data_excess_ns / 1e6, 3),
                "min_excess_ms": round(self.need_ns / 1e6, 3),
                "run_wait_excess_ms": (round(self.run_wait_excess_ns / 1e6, 3)
                                       if self.run_wait_excess_ns is not None else None),
                "preempted": self.preempted,
                "outweighed_by_os": self.outweighed_by_os, "slight": self.slight,
                "decision": ("confirmed" if self.confirmed else "off_cpu" if self.off_cpu else
                             "none" if self.cleared else "not confirmed")}


@dataclass
class BusyTimes:
    """Every rank's busy time and data wait per step, over the steps every rank has."""

    kind: str
    ranks: list[int]
    steps: np.ndarray  # step numbers, increasing
    busy: np.ndarray  # ns, [rank, step]
    data_wait: np.ndarray  # ns, [rank, step]
    run_wait: np.ndarray | None = None  # run-queue wait (ns), [rank, step]; NaN: unknown

    def excess(self, rank: int, steps: Iterable[int] | None, median_step_ns: float | None,
               lead_ns: float | None = None) -> BusyExcess | None:
        """The compute-excess test of `rank` over `steps` (all when None), or None without
        busy evidence there (the rank missing, fewer than evidence.MIN_STEPS steps). `lead_ns`:
        its lateness, which the OS's delay must explain half of to count (`preempted`)."""
        if rank not in self.ranks or len(self.ranks) < 2:
            return None
        keep = np.isin(self.steps, list(steps)) if steps is not None else \
            np.ones(self.steps.size, bool)
        if int(keep.sum()) < MIN_STEPS:
            return None
        s, b, w = self.steps[keep], self.busy[:, keep], self.data_wait[:, keep]
        lat = matrix_lateness(self.ranks, s, b, self.kind)
        most, n, p = rank_frequency(lat, rank)
        lead, _ = rank_lead(lat, rank)
        data_lead, _ = rank_lead(matrix_lateness(self.ranks, s, w, "data wait"), rank)
        i = self.ranks.index(rank)
        others = np.delete(b, i, axis=0)
        need = MATERIAL_EXCESS * (median_step_ns or float(np.median(b)))
        wait_excess, per_cpu = None, 0.0
        if self.run_wait is not None:
            rw = self.run_wait[:, keep]
            if not np.isnan(rw).any():
                wait_excess = excess_over_others(rw, i)
                per_cpu = wait_per_cpu(np.delete(rw, i, axis=0), others)
        return BusyExcess(
            rank=rank, kind=self.kind, most=most, steps=n, ranks_tested=len(self.ranks),
            p_value=min(1.0, p * len(self.ranks)), p_uncorrected=p,
            median_ns=int(np.median(np.median(others, axis=0))),
            excess_ns=int(np.median(lead)), data_excess_ns=int(np.median(data_lead)),
            need_ns=int(need), run_wait_excess_ns=wait_excess, lead_ns=lead_ns,
            wait_per_cpu=per_cpu)


    def excess_in(self, rank: int, steps: Iterable[int]) -> int | None:
        """`rank`'s busy time over the others' median, median over those of `steps` it has
        (ns); None where it has none of them (or no other rank to compare with)."""
        if rank not in self.ranks or len(self.ranks) < 2:
            return None
        keep = np.isin(self.steps, list(steps))
        if not keep.any():
            return None
        return excess_over_others(self.busy[:, keep], self.ranks.index(rank))


RankBusy = tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One rank's busy time: its kind, and per step (in step order) the step number, the busy time
and the data wait (0 where unknown), ns, and the run-queue wait (ns; NaN: unknown)."""


def table_busy(table: pa.Table) -> RankBusy | None:
    """A rank's busy time from its timeline table (TIMELINE_SCHEMA), by `busy_kind`."""
    cpu, gpu = table.column("cpu_ns"), table.column("gpu_time_ns")
    kind = busy_kind(gpu.null_count < len(gpu), cpu.null_count < len(cpu))
    if kind is None:
        return None
    has = cpu.is_valid()
    run_wait = (table.column("run_wait_ns").filter(has).cast(pa.float64())
                .fill_null(float("nan")).to_numpy() if "run_wait_ns" in table.column_names else
                np.full(int(pc.sum(has).as_py() or 0), np.nan))
    return (kind, table.column("step").filter(has).to_numpy(),
            cpu.filter(has).to_numpy().astype(np.float64),
            pc.fill_null(table.column("data_wait_ns"), 0).filter(has).to_numpy()
            .astype(np.float64), run_wait)


def busy_of_ranks(ranks: Iterable[tuple[int, RankBusy | None]]) -> BusyTimes | None:
    """The busy times of the ranks, over the steps every rank with busy time has; None unless
    every rank has busy time, of one kind, and at least two share steps. Ranks come one at a
    time, already reduced to arrays (10,000 steps x 512 ranks never sit in rows at once)."""
    series: dict[int, RankBusy] = {}
    seen = 0
    for r, b in ranks:
        seen += 1
        if b is not None:
            series[r] = b
    kinds = {k for k, *_ in series.values()}
    if len(series) < 2 or len(kinds) != 1 or len(series) < seen:
        return None
    ranks_ = sorted(series)
    common = series[ranks_[0]][1]
    for r in ranks_[1:]:
        common = np.intersect1d(common, series[r][1])  # sorted, unique
    if not common.size:
        return None

    def at_common(r: int, values: np.ndarray) -> np.ndarray:
        return values[np.searchsorted(series[r][1], common)]  # timelines are in step order

    return BusyTimes(
        kind=kinds.pop(), ranks=ranks_, steps=common.astype(np.int64),
        busy=np.array([at_common(r, series[r][2]) for r in ranks_], np.float64),
        data_wait=np.array([at_common(r, series[r][3]) for r in ranks_], np.float64),
        run_wait=np.array([at_common(r, series[r][4]) for r in ranks_], np.float64))


def busy_times(ctx: RunContext) -> BusyTimes | None:
    """The busy times of a run directory's ranks (the analysed ones), or None: plain traces,
    device runs, runs recorded before `cpu_ns` (module docstring). Each rank's timeline is the
    analysis's table of it (read from the JSON lines, the same way, only where it has none),
    one rank at a time."""
    if not ctx.is_run_dir:
        return None
    metas = ranks_by_id(RunDir(ctx.root))

    def busy(folder: Path) -> RankBusy | None:
        table = ctx.run.timeline(folder) if ctx.run is not None else None
        if table is None:
            table = read_step_table(folder, TIMELINE_SCHEMA.names).table
        return table_busy(table)

    return busy_of_ranks((r, busy(m.folder)) for r, m in metas.items() if r in ctx.ranks)
