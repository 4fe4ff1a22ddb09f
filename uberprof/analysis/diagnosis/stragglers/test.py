"""The straggler test on one set of arrivals (`straggler_test`): the candidate, its frequency,
its materiality and the holds that keep a verdict at suspected, as a `StragglerTest` (its
wording: wording.py). The rules in the order they apply are docs/findings.md's decision table.

- *Frequency*: the rank most often alone last, against chance (`evidence.poisson_binomial_sf`:
  a healthy rank is sole last in instance i with probability at most 1/n_i), Bonferroni over
  the ranks tested; confirmed at 1% per run, suspected at 5%. With its extra work confirmed,
  also a second look (after most of the others, chance floor(n/2)/n, x2 for the look), or its
  work alone where that accounts for its lead (`by_work`).
- *Materiality*: alone last in at least 1/2 + 1/(2n) of the instances, a median lead of at
  least max(100 us, 3% of the step) and, with 3+ participants, twice the others' spread, and
  a delay of at least 5% of the wall time; confirmed extra work waives the fraction and the
  spread, and meets the floor by its excess (`lead_by_work`).
- *Holds* (confirmed -> suspected): its CPU time alone shows it (`cpu_alone`: neither its
  arrivals nor its wall-clock lead do), the OS delayed it more than it worked extra
  (`outweighed_by_os`), its extra work is slight, or its lead fades in a third of its steps
  (`transient`). Busy time without any excess of its own clears it (`DECIDED_BY_BUSY`) unless
  it waited off the CPU by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.evidence import FALSE_ALARM_RATE, SUSPECT_RATE
from uberprof.analysis.diagnosis.lateness import (
    later_than_most,
    lead_and_noise,
    sole_last_frequency,
)
from uberprof.analysis.diagnosis.stragglers import rules
from uberprof.analysis.diagnosis.stragglers.cost import delay_per_step
from uberprof.analysis.diagnosis.stragglers.wording import TestWording

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.busy import BusyExcess, BusyTimes

__all__ = ["StragglerTest", "straggler_test"]


@dataclass
class StragglerTest(TestWording):
    """The straggler test of a run: its candidate (the rank most often alone last), both
    criteria with their numbers, and the decision (confirmed | suspected | none)."""

    rank: int
    last: int  # instances where it alone arrived last
    instances: int
    steps: int  # steps those instances span
    ranks_tested: int
    p_value: float  # chance of `last` or more for a healthy rank, x ranks tested (Bonferroni)
    p_uncorrected: float
    median_lead_ns: int  # over the others' median lateness, per instance
    noise_ns: int  # the others' robust spread (reported, not a criterion)
    need_lead_ns: int  # the materiality threshold on the lead
    delay_ns: int  # the wall-clock delay it alone added over the analysed steps
    share: float | None  # delay_ns / analysed wall time
    decision: str  # confirmed | suspected | none
    decided_by: str  # frequency | materiality | both
    first_step: int | None = None
    need_fraction: float = 0.5  # the share of instances it must be alone last in
    basis: str = rules.BASIS_TRACES  # where the instances come from (rules.BASIS_*)
    busy: BusyExcess | None = None  # its compute-excess test, where there is busy time
    fraction_waived: bool = False  # the last-fraction rule waived by a confirmed excess
    spread_waived: bool = False  # the lead's 2x-spread rule waived by a confirmed excess
    later_than_most: tuple[int, float] | None = None  # (instances, corrected p): second look
    by_work: bool = False  # persistent by its busy-time excess, which accounts for its lead
    alone: dict[str, StragglerTest | None] = field(default_factory=dict)  # pooled: per basis
    overrules_pool: bool = False  # the larger basis alone decided: the pool said less
    disputed: bool = False  # confirmed by the pool, but a basis alone disagreed: suspected
    lead_by_work: bool = False  # the lead's floor met by its work's excess (by_work)
    outweighed_by_os: bool = False  # confirmed, but the OS delayed it more than it worked
    slight: bool = False  # confirmed, but late by work no more than a slower core's: suspected
    # confirmed, but its lead fell under the floor in a third of its steps: (steps, lead ns)
    # of that part; suspected
    transient: tuple[tuple[int, int], int] | None = None
    # confirmed by its arrivals, but it ran the others' work (op_excess.same_work) and its busy
    # time over every step does not single it out: suspected (cause.hold_for_same_work)
    same_work: bool = False
    # the median lead that shows a straggler on the wall clock without its arrivals: the lead's
    # floors and the others' spread (twice it with 3+ participants, as the lead rule; with two,
    # the spread of its own lead), no waiver by its work
    clear_lead_ns: int = 0
    # confirmed, but only by its CPU time: its arrivals are not frequent below the false-alarm
    # rate (`by_work`) and its lead is under `clear_lead_ns`: suspected (issue 54: a healthy
    # tiny job's rank "confirmed" on +0.275 ms of CPU a step, its arrivals at 14% chance and
    # its lead 0.088 ms, under the 0.1 ms floor and the others' spread, 0.254 ms)
    cpu_alone: bool = False

    @property
    def lead_shows(self) -> bool:
        """Whether the wall clock shows it without its arrivals' order: a median lead clear of
        the floors and the spread (`clear_lead_ns`), or a delay of at least rules.DISPUTED_SHARE of
        the analysed time (the share a disputed verdict needs, rules.py)."""
        return self.median_lead_ns >= self.clear_lead_ns or \
            (self.share is not None and self.share >= rules.DISPUTED_SHARE)

    @property
    def held(self) -> bool:
        """Held at suspected by what only all its steps show (its work slight or outweighed
        by the OS's delay over them, or a lead that fades in a part of the run)."""
        return self.outweighed_by_os or self.slight or self.transient is not None


@dataclass
class _Reading:
    """The lateness table's columns, then the candidate's rows (`mine`), its lead per instance,
    its median and the lead it needs (floats: the test's fields are rounded)."""

    iid: np.ndarray
    rank: np.ndarray
    late: np.ndarray
    n_part: np.ndarray
    step: np.ndarray
    delay: np.ndarray
    sole_last: np.ndarray
    mine: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    lead: np.ndarray = field(default_factory=lambda: np.zeros(0))
    med_lead: float = 0.0
    need_lead: float = 0.0

    @classmethod
    def of(cls, lat: pa.Table) -> _Reading:
        return cls(iid=lat.column("instance").to_numpy(), rank=lat.column("rank").to_numpy(),
                   late=lat.column("lateness_ns").to_numpy().astype(np.float64),
                   n_part=lat.column("participants").to_numpy(),
                   step=lat.column("step").to_numpy(), delay=lat.column("delay_ns").to_numpy(),
                   sole_last=lat.column("sole_last").to_numpy(zero_copy_only=False)
                   .astype(bool))


def straggler_test(lat: pa.Table, median_step_ns: float | None,
                   wall_ns: float | None = None, basis: str = rules.BASIS_TRACES,
                   busy: BusyTimes | None = None,
                   persistence_on: Collection[int] | None = None) -> StragglerTest | None:
    """The straggler test of a run (module docstring; `uberprof.analysis.diagnosis.evidence`): the
    candidate rank, both criteria and the decision. None without matched collectives.
    `median_step_ns` and `wall_ns` are those of the steps `lat` covers; `busy`, the ranks'
    busy time per step (analysis/diagnosis/busy.py), is read over those steps;
    `persistence_on`, the steps its persistence is judged on (`_transient`; all when None: a
    pool judges it on its untraced steps, which the profiler did not skew). In stages: the
    candidate and its numbers, the frequency (with the second look), materiality, the
    decision, then the holds."""
    if lat.num_rows == 0:
        return None
    a = _Reading.of(lat)
    t = _measure(a, median_step_ns, wall_ns, basis, busy)
    frequent, maybe, t.later_than_most, t.by_work = _frequency(t, a)
    material = _material(t, a, frequent)
    t.decision, t.decided_by = _decision(frequent, maybe, material, t.busy)
    _hold(t, a, busy, persistence_on)
    return t


def _measure(a: _Reading, median_step_ns: float | None, wall_ns: float | None, basis: str,
             busy: BusyTimes | None) -> StragglerTest:
    """The candidate and its numbers, undecided: its sole-last count and chance, its lead and
    the lead it needs (kept in `a`), the delay it adds and its busy-time excess."""
    ranks = np.unique(a.rank).tolist()
    r, p_raw = _candidate(ranks, a.rank, a.late, a.sole_last, a.n_part)
    a.mine = mine = a.rank == r
    k, n, _ = sole_last_frequency(mine, a.sole_last, a.n_part)
    a.lead, noise = lead_and_noise(a.iid, a.rank, a.late, a.n_part, r)
    a.med_lead = float(np.median(a.lead)) if a.lead.size else 0.0
    steps = sorted({int(s) for s in a.step[mine].tolist()})
    work = busy.excess(r, set(a.step.tolist()), median_step_ns, a.med_lead) \
        if busy is not None else None
    a.need_lead, spread_waived = _needed_lead(median_step_ns, a.n_part[mine], noise,
                                              a.med_lead, work is not None and work.confirmed)
    spread = (rules.SIGMA_FACTOR if float(np.median(a.n_part[mine])) >= 3 else 1.0) * noise
    clear = max(rules.ABS_MIN_LEAD_NS, rules.REL_MIN_LEAD * (median_step_ns or 0.0), spread)
    delay_wall = sum(d for d, _ in delay_per_step(a.step[mine], a.delay[mine],
                                                  a.n_part[mine]).values())
    return StragglerTest(
        rank=r, last=k, instances=n, steps=len(steps), ranks_tested=len(ranks),
        p_value=min(1.0, p_raw * len(ranks)), p_uncorrected=p_raw,
        median_lead_ns=int(a.med_lead), noise_ns=int(noise), need_lead_ns=int(a.need_lead),
        delay_ns=int(delay_wall), share=delay_wall / wall_ns if wall_ns else None,
        decision="none", decided_by="", first_step=steps[0] if steps else None,
        need_fraction=0.5 + 0.5 / max(float(np.median(a.n_part[mine])), 2.0), basis=basis,
        busy=work, spread_waived=spread_waived, clear_lead_ns=int(clear))


def _candidate(ranks: list[int], rank: np.ndarray, late: np.ndarray, sole_last: np.ndarray,
               n_part: np.ndarray) -> tuple[int, float]:
    """The candidate: the rank least likely to be alone last so often by chance (then the one
    alone last in the largest share of its instances, then the latest by median), with that
    chance, uncorrected."""
    best: tuple[tuple[float, float, float], int, float] | None = None
    for r in ranks:
        mine = rank == r
        k, n, p = sole_last_frequency(mine, sole_last, n_part)
        key = (-p, k / max(n, 1), float(np.median(late[mine])))
        if best is None or key > best[0]:
            best = (key, int(r), p)
    assert best is not None
    _, r, p_raw = best
    return r, p_raw


def _needed_lead(median_step_ns: float | None, n_part: np.ndarray, noise: float,
                 med_lead: float, more_work: bool) -> tuple[float, bool]:
    """The median lead the candidate needs to be material (its floors, and with 3 or more
    participants twice the others' spread), and whether the spread rule was waived for it."""
    need_lead = max(rules.ABS_MIN_LEAD_NS, rules.REL_MIN_LEAD * (median_step_ns or 0.0))
    spread_waived = False
    if float(np.median(n_part)) >= 3 and rules.SIGMA_FACTOR * noise > need_lead:
        # the spread rule tells a lead of chance from one of cause; confirmed extra work
        # is the cause, so the floors alone remain (said only where it decides)
        spread_waived = more_work and med_lead < rules.SIGMA_FACTOR * noise
        if not spread_waived:
            need_lead = rules.SIGMA_FACTOR * noise
    return need_lead, spread_waived


def _frequency(t: StragglerTest, a: _Reading
               ) -> tuple[bool, bool, tuple[int, float] | None, bool]:
    """The frequency criterion: (confirmed, suspected, the second look's instances and
    corrected chance, or None where it was not taken, and whether its work decided: a rank
    whose own extra work accounts for its lead in nearly every step is persistent by that
    test, whose chance is its own, however the arrivals were shuffled)."""
    work = t.busy
    more_work = work is not None and work.confirmed
    frequent = t.p_value <= FALSE_ALARM_RATE
    maybe = t.p_value <= SUSPECT_RATE
    later: tuple[int, float] | None = None
    if more_work and not frequent:
        # a second look, only for a rank whose extra work is confirmed (hence x2 more in the
        # correction): on oversubscribed cores the others' scatter makes it alone last in
        # fewer than half of the collectives, but it still comes after most of them
        k_later, p_later = later_than_most(a.iid, a.rank, a.late, a.n_part, t.rank)
        later = (k_later, min(1.0, 2 * p_later * t.ranks_tested))
        frequent = later[1] <= FALSE_ALARM_RATE
        maybe = maybe or later[1] <= SUSPECT_RATE
    by_work = not frequent and work is not None and work.accounts_for_lead
    return frequent or by_work, maybe or by_work, later, by_work


def _material(t: StragglerTest, a: _Reading, frequent: bool) -> bool:
    """The materiality criterion (sets `lead_by_work` and `fraction_waived`): its lead, its
    delay's share and the fraction of instances it is alone last in."""
    work = t.busy
    more_work = work is not None and work.confirmed
    # a rank persistent by its work (`by_work`) meets the lead's floor by that work: beside a
    # CPU hog the others' scatter shrinks its median lead (1.3 ms) while it computes 11 ms a
    # step more in 26 of 27 steps and adds 16% of the wall time (benchmarks/accuracy.py)
    t.lead_by_work = t.by_work and a.med_lead < a.need_lead and work is not None and \
        work.excess_ns >= a.need_lead
    big_lead = a.med_lead >= a.need_lead or t.lead_by_work
    big_share = t.share is None or t.share >= rules.MATERIAL_SHARE
    k, n = t.last, t.instances
    t.fraction_waived = k < t.need_fraction * n and frequent and more_work
    return big_lead and big_share and (k >= t.need_fraction * n or t.fraction_waived)


def _decision(frequent: bool, maybe: bool, material: bool,
              work: BusyExcess | None) -> tuple[str, str]:
    """(decision, decided_by) from both criteria; a candidate the busy time cleared (no excess
    of its own time) is no straggler."""
    if frequent and material:
        decision, decided = "confirmed", "both"
    elif maybe and material:
        decision, decided = "suspected", "frequency"
    else:
        decision = "none"
        decided = "frequency" if not maybe else "materiality"
    if decision != "none" and work is not None and work.cleared and not work.off_cpu:
        decision, decided = "none", rules.DECIDED_BY_BUSY
    return decision, decided


def _hold(t: StragglerTest, a: _Reading, busy: BusyTimes | None,
          persistence_on: Collection[int] | None) -> None:
    """The holds of a confirmed verdict: its CPU time alone shows it (`cpu_alone`); the OS
    delayed it more than it worked extra (`outweighed_by_os`), its extra work is slight, or
    (unless one of those, or its work met the lead's floor) its lead fades in a third of its
    steps (`transient`); any of them makes it suspected."""
    if t.decision != "confirmed":
        return
    work = t.busy
    # a straggler is confirmed by what the job's wall clock shows: its arrivals (frequent by
    # themselves, or at the second look), a lead clear of the floors and the spread, or a delay
    # of at least rules.DISPUTED_SHARE of the time (healthy 2-rank runs came to 8.4-12.3%, injected
    # stragglers beside a hog, whose scatter hides their lead, to 16-31%)
    t.cpu_alone = t.by_work and not t.lead_shows
    t.outweighed_by_os = work is not None and work.outweighed_by_os
    t.slight = not t.outweighed_by_os and work is not None and work.slight
    if not (t.outweighed_by_os or t.slight or t.lead_by_work):
        judged = np.ones(a.lead.size, bool) if not persistence_on else \
            np.isin(a.step[a.mine], list(persistence_on))
        t.transient = _transient(a.step[a.mine][judged], a.lead[judged], a.need_lead,
                                 None if busy is None or work is None else
                                 (lambda p: busy.excess_in(t.rank, p.tolist())),
                                 work.need_ns if work is not None else 0.0)
    if t.held or t.cpu_alone:
        t.decision = "suspected"


def _transient(steps: np.ndarray, lead: np.ndarray, need_lead: float,
               work_in: Callable[[np.ndarray], int | None] | None = None,
               need_work: float = 0.0) -> tuple[tuple[int, int], int] | None:
    """The part of the run where the candidate no longer leads, as ((first step, last step),
    its median lead there), or None where it leads in each third of its steps (split by step),
    or a third has fewer than rules.MIN_PART_STEPS steps. A third counts as led where its median
    lead reaches the floor, or, with busy time, where its extra work there is still material
    (`work_in(steps)` >= `need_work`: beside a CPU hog a 1.3x straggler's lead scatters, its
    work does not). Healthy 2-rank runs had one rank ~50% slower over the first 20 of 30
    steps and like the other after them (benchmarks/accuracy.py, seeds 302 and 316)."""
    if lead.size != steps.size or not steps.size:
        return None
    parts = np.array_split(np.unique(steps), rules.PARTS)
    if min(p.size for p in parts) < rules.MIN_PART_STEPS:
        return None
    for p in parts:
        med = float(np.median(lead[np.isin(steps, p)]))
        if med >= need_lead:
            continue
        work = work_in(p) if work_in is not None else None
        if work is not None and work >= need_work:
            continue
        return (int(p.min()), int(p.max())), int(med)
    return None
