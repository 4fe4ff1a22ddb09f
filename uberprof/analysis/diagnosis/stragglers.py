"""Stragglers: who arrives last at the collectives, persistently, and why (docs/DESIGN.md).

- `lateness`: per matched instance and rank, its start minus the earliest start among the
  participants, on aligned clocks; and the split of its time in the collective into waiting
  for peers (before the last arrival) and transfer (after it).
- `straggler_test`: two criteria, both stated with their numbers (`StragglerTest`).
  *Frequency*: the rank most often alone last, against chance (`evidence.poisson_binomial_sf`:
  a healthy rank is sole last in instance i with probability at most 1/n_i), Bonferroni over
  the ranks tested; confirmed at 1% per run, suspected at 5%. *Materiality* (the effect is
  large enough to matter): it is alone last in most instances (at least 1/2 + 1/(2n) of them
  with n participants: 62.5% of 4 ranks, 75% of 2), its median lead over the others' median
  lateness is at least 100 µs and 3% of the median step and, with 3 or more participants,
  twice the others' own spread (robust sigma of their lateness around each instance's median;
  with 2 ranks there are no others to take a spread from, and the suspect's own lead is not
  one), and the delay it alone adds is at least 5% of the analysed wall time. Frequency alone
  is not enough: on oversubscribed cores one healthy rank can be last more often than chance
  (12 of 20 with 4 ranks) without being the one that holds the job back. Every traced
  collective instance counts, not one per step.
- The test's *basis* is every arrival the run recorded, each instance once
  (`combined_straggler_test`): the traced window's matched collectives and the Flight
  Recorder's arrivals over every untraced step (analysis/diagnosis/arrivals.py), pooled into
  one test. Neither basis overrules the other: a clear straggler in the traced window is not
  cleared by a few untraced instances that cannot tell it from chance, and a traced window the
  profiler skewed (it slows ranks unevenly) is outweighed by many untraced steps where the
  rank is not late. And where the larger basis alone says more than the pool (the Flight
  Recorder's 38 untraced instances confirm a rank that a skewed traced window of 20 dilutes
  below the materiality rules), the larger basis decides: a weaker basis never overrules a
  stronger one. Each basis's own test is kept beside the verdict (`alone`) and said where
  it decides otherwise. A run with one basis (no Flight Recorder: older runs, plain
  traces) is tested on it. Where the bases *disagree* (one alone clears the candidate or
  names another rank) and its lead is within twice the others' spread (with two ranks, its
  own lead's spread), the evidence is thin:
  the verdict is at most suspected (`disputed`) unless the delay is large (`DISPUTED_SHARE`)
  or its own work accounts for its lead. Healthy 2-rank runs were confirmed this way (a
  traced window the profiler skewed: last at 20 of 20 there, 27 of 38 elsewhere; leads of
  0.6-0.9x the spread), at 8-12% of the wall time; the injected stragglers whose bases
  disagreed added 20-31%. A large delay does not save a verdict *by elimination* (no extra CPU
  time or data wait, no extra wait for a core: late off the CPU, `off_cpu`): nothing in it
  says the rank did anything, so a basis that contradicts it leaves it suspected (a healthy
  2-rank run beside a CPU hog was late by 18.9 ms at 29 of 38 untraced collectives, level over
  the traced window, with 4% more CPU time: confirmed off the CPU at 24% of the time). The
  cost is measured on the basis that decided: the delay the rank alone adds as a share of the
  wall time of the steps its verdict read, applied to the analysed (traced) steps
  (`Straggler.share_of`): a straggler confirmed at 52 of 58 collectives over 28 steps was not
  last in its two traced steps, where the profiler slowed the ranks unevenly, and had cost
  nothing by the traced delay alone. The cause and the split of collective time into wait and
  transfer come from the traced steps.
- *Busy time* (analysis/diagnosis/busy.py: the training thread's CPU time per step, where the step
  timelines have it): arrival order cannot tell a rank that computes more from one the OS
  scheduler delayed. For a candidate whose busy-time excess is confirmed: the frequency may
  also be shown by a second look (it arrived after most of the others, each instance's chance
  floor(n/2)/n; corrected x2 for the look), as the others' scatter on oversubscribed cores
  takes many of its "alone last", or by its work alone where that excess, the most in at
  least 90% of the steps, takes more wall time than its median lead on cores shared as the
  others' are (`BusyExcess.accounts_for_lead`: with two ranks
  beside a CPU hog, the second look is the first one again); it needs no last-fraction, and
  its lead need not exceed twice the others' spread (the spread rule tells chance from cause;
  its work is the cause): the lead's floors and the delay are still required (a rank
  persistent by its work meets the floors by its excess: `lead_by_work`). A candidate with no
  excess of its own time (busy time or data wait) is not named when the OS delayed it (a
  run-queue wait excess of at least half its lead, or no record of it); one the OS did not
  delay waited off the CPU by its own doing (sleep, I/O, a lock) and is named, cause
  `off_cpu`. A candidate whose extra work is confirmed but whose extra wait for a core is
  larger still (`BusyExcess.outweighed_by_os`: other load held it back more than its work) is
  at most suspected (`preempted`), cause `preempted`; so is one late by its work whose extra
  work is under a tenth of the others' (`BusyExcess.slight`: no more than a slower core).
  So is a compute (or host/launch) straggler whose busy-time excess is not confirmed and whose
  traced steps ran the same work as the others' (`hold_for_same_work`: the same operators on
  the same input shapes, as often, each slower; op_excess.same_work): four healthy ranks on two
  busy cores, one confirmed from its traced window (last at 15 of 20) on +14% CPU time that was
  the most in only 6 of 11 steps, every operator called as often as the others'.
- `find_straggler`: the named straggler (confirmed or suspected) or None. Its cost is the delay
  it alone adds (its lateness beyond the second-latest rank), per step the largest over the
  step's collectives: every other participant waits that long.
- `straggler_cause`: from its per-step breakdown against the other ranks' median on the same
  steps (compute, data wait, host/launch idle, transfer time), and from its GPU counters: more
  compute with lower SM clocks or throttle reasons set is `clock_throttle`.

The step timeline (steps.jsonl, every step) does not show a compute straggler: in synchronous
training every rank's step ends after the same gradient all-reduce, so step boundaries line up
on all ranks whoever was late; only the traced collectives carry the lateness.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.busy import SLIGHT_EXCESS
from uberprof.analysis.diagnosis.causes import STRAGGLER_CAUSES as _CAUSES
from uberprof.analysis.diagnosis.evidence import (
    FALSE_ALARM_RATE,
    SUSPECT_RATE,
    Test,
    chance_words,
    trace_more_hint,
)
from uberprof.analysis.diagnosis.lateness import (
    LATENESS_SCHEMA,
    later_than_most,
    lead_and_noise,
    pooled_lateness,
    sole_last_frequency,
)

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.busy import BusyExcess, BusyTimes

__all__ = [
    "BASIS_ARRIVALS",
    "BASIS_FLIGHT_RECORDER",
    "BASIS_STEP_TIMELINE",
    "BASIS_TRACES",
    "STRAGGLER_CAUSES",
    "ArrivalBasis",
    "Straggler",
    "StragglerTest",
    "basis_words",
    "combined_straggler_test",
    "find_straggler",
    "straggler_cause",
    "straggler_test",
]

STRAGGLER_CAUSES = tuple(_CAUSES)
ABS_MIN_LEAD_NS = 100_000
REL_MIN_LEAD = 0.03  # of the median step time
# of the analysed wall time: the delay a straggler must add. A healthy job has a rank a few
# percent slower throughout (its core, its neighbours), persistently enough for the frequency
# test: healthy 4-rank runs with a core per rank confirmed such ranks at 2.4% and 3.2% of the
# wall time, and healthy runs' candidates came to 1.2-6.1% on an oversubscribed VM, where the
# injected stragglers named (1.3x compute, 30 ms off the CPU a step) added 8.6-25%
# (benchmarks/README.md, accuracy.py)
MATERIAL_SHARE = 0.05
# of the analysed wall time: the delay that confirms a straggler whose bases disagree (module
# docstring; healthy runs so confirmed came to 8.4-12.3%, injected ones to 19.9-30.6%,
# benchmarks/accuracy.py, 2 ranks on 2 cores)
DISPUTED_SHARE = 0.15
PARTS = 3  # a persistent straggler leads in each third of its steps (`_transient`)
MIN_PART_STEPS = 3  # steps in each third to judge it
SIGMA_FACTOR = 2.0  # its lead over the others' spread (3 or more participants)
BASIS_TRACES = "traces"  # the traced window's matched collectives
BASIS_FLIGHT_RECORDER = "flight_recorder"  # untraced steps' arrivals (diagnosis/arrivals.py)
BASIS_ARRIVALS = "arrivals"  # both of the above pooled, each instance once
BASIS_STEP_TIMELINE = "step_timeline"  # live: per step, the longest (diagnosis/step_signals.py)
DECIDED_BY_BUSY = "busy time"  # no excess of its own time cleared the candidate
_BASIS_WORDS = {BASIS_TRACES: "traced window",
                BASIS_FLIGHT_RECORDER: "Flight Recorder (untraced steps)",
                BASIS_ARRIVALS: "traced window and Flight Recorder (untraced steps) together",
                BASIS_STEP_TIMELINE: "step timelines of the last steps every rank finished"}


def basis_words(basis: str) -> str:
    """A test basis in words, as the test's sentence and the finding's title say it."""
    return _BASIS_WORDS.get(basis, basis)

@dataclass
class Straggler:
    rank: int
    instances: int  # instances the rank took part in
    last: int  # instances where it alone arrived last (LATENESS_SCHEMA `sole_last`)
    steps: list[int]  # steps where it arrived last in at least one collective
    median_lateness_ns: int
    median_lead_ns: int  # over the others' median lateness in the same instance
    noise_ns: int  # robust sigma of the others' lateness
    delay_ns: int  # total wall-clock delay it added over the analysed steps
    others_wait_ns: int  # the same, summed over the ranks that waited
    steps_analysed: int
    cause: str | None = None
    factors: dict[str, int] = field(default_factory=dict)  # per-step excess over the others
    counters: dict[str, Any] = field(default_factory=dict)
    confidence: str = "confirmed"  # confirmed | suspected (StragglerTest.decision)
    test: dict[str, Any] = field(default_factory=dict)  # evidence.Test.as_dict()
    basis: str = BASIS_TRACES  # where `instances` and `last` come from (module docstring)
    # the delay it adds as a share of the wall time of the steps its verdict read, where that
    # basis is not the traced window alone (None there): what its time at stake is measured by
    basis_share: float | None = None

    @property
    def last_fraction(self) -> float:
        return self.last / self.instances if self.instances else 0.0

    def share_of(self, wall_ns: float) -> float:
        """The share of the analysed (traced) steps' wall time `wall_ns` that it costs: the
        delay it added there, or, where its verdict read more steps than those, the share it
        added over them (module docstring, the cost)."""
        if self.basis_share is not None:
            return min(1.0, self.basis_share)
        return self.delay_ns / wall_ns if wall_ns else 0.0


@dataclass
class StragglerTest:
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
    basis: str = BASIS_TRACES  # where the instances come from (module docstring)
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
    # time over every step does not single it out: suspected (`hold_for_same_work`)
    same_work: bool = False

    def _alone_words(self) -> str:
        """Each pooled basis's own test, where one alone would decide otherwise."""
        if not any(t is not None and (t.decision, t.rank) != (self.decision, self.rank)
                   for t in self.alone.values()):
            return ""
        said = [f"{basis_words(b)}: " + ("no matched instance" if t is None else
                                         f"rank {t.rank} alone last at {t.last} of "
                                         f"{t.instances}, {t.decision}")
                for b, t in self.alone.items()]
        how = ("decided by the larger basis alone: pooled with the smaller one it would say "
               "less, and a weaker basis does not overrule a stronger one"
               if self.overrules_pool else
               "pooled, every instance counts once and neither basis overrules the other")
        return " (each basis alone: " + "; ".join(said) + "; " + how + ")"

    def _confirm_hint(self) -> str:
        if self.basis in (BASIS_FLIGHT_RECORDER, BASIS_ARRIVALS):
            return "run more steps (the Flight Recorder covers every untraced step)"
        if self.basis == BASIS_STEP_TIMELINE:
            return "wait for more steps"
        return trace_more_hint([self.first_step] if self.first_step is not None else [])

    def as_test(self) -> Test:
        r = self.rank
        alone = (f"was alone the slowest at {self.last} of {self.instances} steps"
                 if self.basis == BASIS_STEP_TIMELINE else
                 f"alone arrived last at {self.last} of {self.instances} collectives over "
                 f"{self.steps} step(s)")
        freq = (f"rank {r} {alone}, {basis_words(self.basis)}; "
                "the chance of this for a healthy rank is "
                f"{chance_words(self.p_value)} (corrected for {self.ranks_tested} ranks)")
        if self.later_than_most is not None:
            k, p = self.later_than_most
            freq += (f", and it arrived after most of the others at {k} of {self.instances} "
                     f"(chance {chance_words(p)}, corrected for {self.ranks_tested} ranks and "
                     "this second look, taken because its work is confirmed in excess)")
        if self.by_work and self.busy is not None:
            b = self.busy
            freq += (f"; but its own work accounts for its lateness whatever the order of "
                     f"arrival: the most busy time of all ranks in {b.most} of {b.steps} "
                     f"steps, {b.excess_ns / 1e6:.3g} ms a step over the others' median"
                     + (f" ({b.work_wall_ns / 1e6:.3g} ms of wall time on cores where each ms "
                        f"of CPU also waits {b.wait_per_cpu:.2g} ms for a core, as the others')"
                        if b.wait_per_cpu > 0 else "") + ", more than its median lead")
        waived = "; waived: its work is confirmed in excess" if self.fraction_waived else ""
        spread = (f"; twice the others' spread, {2 * self.noise_ns / 1e6:.3g} ms, waived: its "
                  "work is confirmed in excess" if self.spread_waived else
                  f"; the others' spread {self.noise_ns / 1e6:.3g} ms")
        lead = (f"last in {100 * self.last / max(self.instances, 1):.0f}% (needs >= "
                f"{100 * self.need_fraction:.1f}%{waived}), median lead "
                f"{self.median_lead_ns / 1e6:.3g} "
                f"ms (needs >= {self.need_lead_ns / 1e6:.3g} ms{spread}"
                + (f"; met by its work's excess, {self.busy.excess_ns / 1e6:.3g} ms a step"
                   if self.lead_by_work and self.busy is not None else "") + ")")
        if self.share is not None:
            lead += f", adds {100 * self.share:.1f}% of the analysed time (needs >= " \
                    f"{100 * MATERIAL_SHARE:.0f}%)"
        rate = f"{100 * FALSE_ALARM_RATE:.0f}%"
        work = f"; {self.busy.words()}" if self.busy is not None else ""
        if self.decided_by == DECIDED_BY_BUSY:
            sentence = (f"no straggler: {freq}, but {self.busy.words() if self.busy else ''}: "
                        "the OS delayed it, not its work (nor its data loading)"
                        + ("" if self.busy is None or self.busy.preempted is not None else
                           " (no record of its wait for a core to prove it)"))
        elif self.decision == "confirmed":
            below = "" if self.by_work else f", below the {rate} false-alarm rate"
            sentence = f"{freq}{below}; {lead}{work}: confirmed"
        elif self.outweighed_by_os:
            sentence = (f"{freq}, below the {rate} false-alarm rate; {lead}{work}: suspected, "
                        "not confirmed: other load on its host kept it from a core longer "
                        "than it worked extra, and that load may also be what slowed its "
                        "work — to confirm, run it again with its cores free of other "
                        "processes")
        elif self.slight:
            pct = f" ({self.busy.excess_pct:+.1f}%)" if self.busy is not None else ""
            sentence = (f"{freq}, below the {rate} false-alarm rate; {lead}{work}: suspected, "
                        "not confirmed: it is late by its own work, but that work is under "
                        f"{100 * SLIGHT_EXCESS:.0f}% more than the others'{pct}, which "
                        "healthy ranks on cores of one host differ by — to confirm, "
                        "swap its cores or host with another rank's and see whether the "
                        "lateness follows the rank")
        elif self.same_work:
            sentence = (f"{freq}, below the {rate} false-alarm rate; {lead}{work}: suspected, "
                        "not confirmed: in its traced steps it ran the same operators on the "
                        "same input shapes as often as the others, each slower, and its CPU "
                        "time over every step does not single it out: the same work run "
                        "slower (its cores shared or slower), not more work — to confirm, "
                        "give each rank cores of its own and see whether the lateness stays")
        elif self.transient is not None:
            (a, b), half = self.transient
            sentence = (f"{freq}, below the {rate} false-alarm rate; {lead}{work}: suspected, "
                        f"not confirmed: over steps {a}-{b} its median lead is only "
                        f"{half / 1e6:.3g} ms, under the {self.need_lead_ns / 1e6:.3g} ms it "
                        "needs: late in part of the run only (a warm-up, a passing slowdown), "
                        "not persistently — to confirm, run more steps")
        elif self.disputed:
            small = (f"the delay it adds is under {100 * DISPUTED_SHARE:.0f}% of the analysed "
                     "time" if self.share is None or self.share < DISPUTED_SHARE else
                     "the delay it adds is large, but it is late off the CPU by elimination "
                     "alone (no extra work, no extra wait for a core)")
            sentence = (f"{freq}, below the {rate} false-alarm rate; {lead}{work}: suspected, "
                        "not confirmed: its bases disagree (below), its lead is within twice "
                        f"the spread above, {small}, and no excess of its own work accounts "
                        "for its lead — to confirm, " + self._confirm_hint())
        elif self.decision == "suspected":
            sentence = (f"{freq}: not below the {rate} false-alarm rate, too few instances "
                        f"to tell it from chance; {lead}{work}: suspected — to confirm, "
                        + self._confirm_hint())
        elif self.decided_by == "frequency":
            sentence = (f"no straggler: the rank most often last, {freq}, not below the "
                        f"{100 * SUSPECT_RATE:.0f}% needed to suspect it")
            if self.last >= 0.75 * self.instances and self.need_lead_ns <= self.median_lead_ns:
                sentence += ("; too few instances to tell a persistent straggler from "
                             "chance: " + self._confirm_hint())
        else:
            sentence = (f"no straggler: {freq}, but it is not material: {lead}{work}")
        sentence += self._alone_words()
        return Test(name="sole-last frequency (Poisson-binomial, Bonferroni over ranks) and "
                         "materiality of the lead"
                         + (", with its busy-time excess" if self.busy is not None else ""),
                    statistic=f"last at {self.last}/{self.instances}; {lead}",
                    instances=self.instances,
                    threshold=(f"p <= {FALSE_ALARM_RATE:g} confirmed, p <= "
                               f"{SUSPECT_RATE:g} suspected (corrected); last in >= "
                               f"{100 * self.need_fraction:.1f}%, lead >= "
                               f"{self.need_lead_ns / 1e6:.3g} ms and delay >= "
                               f"{100 * MATERIAL_SHARE:.0f}% of the analysed time"),
                    sentence=sentence, p_value=self.p_value, p_uncorrected=self.p_uncorrected,
                    decided_by=self.decided_by)

    def test_doc(self) -> dict[str, Any]:
        """`evidence["test"]`: `as_test()`'s, with the busy-time test where there is one."""
        doc = self.as_test().as_dict()
        if self.busy is not None:
            doc["busy_time"] = {**self.busy.as_dict(), "last_fraction_waived":
                                self.fraction_waived, "spread_waived": self.spread_waived}
        if self.later_than_most is not None:
            k, p = self.later_than_most
            doc["later_than_most"] = {"instances": k, "of": self.instances,
                                      "p_value": float(f"{p:.3g}")}
        if self.by_work:
            doc["by_work"] = True
        if self.disputed:
            doc["disputed"] = True
        if self.lead_by_work:
            doc["lead_by_work"] = True
        if self.outweighed_by_os:
            doc["outweighed_by_os"] = True
        if self.transient is not None:
            (a, b), half = self.transient
            doc["transient"] = {"steps": [a, b], "median_lead_ms": round(half / 1e6, 3)}
        if self.slight:
            doc["slight"] = True
        if self.same_work:
            doc["same_work"] = True
        if self.alone:
            doc["bases"] = {b: None if t is None else t.brief() for b, t in self.alone.items()}
        return doc

    def brief(self) -> dict[str, Any]:
        """The decision and its main numbers, for one basis of a pooled test."""
        return {"rank": self.rank, "decision": self.decision, "last_in": self.last,
                "instances": self.instances, "steps": self.steps,
                "p_value": float(f"{self.p_value:.3g}"),
                "median_lead_ms": round(self.median_lead_ns / 1e6, 3)}

    def as_dict(self) -> dict[str, Any]:
        """`run.straggler_test` of the report document: the decision, even when it is none."""
        return {"rank": self.rank, "decision": self.decision, "last_in": self.last,
                "instances": self.instances, "steps": self.steps, "basis": self.basis,
                "median_lead_ms": round(self.median_lead_ns / 1e6, 3),
                "others_spread_ms": round(self.noise_ns / 1e6, 3),
                "min_lead_ms": round(self.need_lead_ns / 1e6, 3),
                "delay_ms": round(self.delay_ns / 1e6, 3),
                "share_pct": round(100 * self.share, 1) if self.share is not None else None,
                "test": self.test_doc()}


@dataclass(frozen=True)
class ArrivalBasis:
    """One source of arrivals for the straggler test: its lateness (LATENESS_SCHEMA) with the
    median step time and wall time of the steps it covers."""

    name: str  # BASIS_TRACES | BASIS_FLIGHT_RECORDER
    lateness: pa.Table
    median_step_ns: float | None
    wall_ns: float | None


def combined_straggler_test(bases: list[ArrivalBasis], median_step_ns: float | None,
                            busy: BusyTimes | None = None
                            ) -> tuple[StragglerTest | None, pa.Table]:
    """The one straggler test of a run over all its arrivals (module docstring), and the
    lateness it was made on. `bases` cover different steps; `median_step_ns` is that of all
    the steps they cover. With two bases or more the test is made on them pooled, each
    instance once, and each basis's own test is kept in `alone`."""
    used = [b for b in bases if b.lateness.num_rows]
    if not used:
        return None, LATENESS_SCHEMA.empty_table()
    if len(used) == 1:
        b = used[0]
        return straggler_test(b.lateness, b.median_step_ns, b.wall_ns, b.name, busy), b.lateness
    pooled = pooled_lateness([b.lateness for b in used])
    wall = sum(b.wall_ns or 0 for b in used) or None
    # persistence is judged on the untraced steps: the profiler slows ranks unevenly, and a
    # 1.3x straggler was level with the other rank over a traced window (accuracy.py, s6)
    untraced = {int(s) for b in used if b.name != BASIS_TRACES
                for s in b.lateness.column("step").to_pylist()}
    test = straggler_test(pooled, median_step_ns, wall, BASIS_ARRIVALS, busy,
                          persistence_on=untraced or None)
    alone = {b.name: straggler_test(b.lateness, b.median_step_ns, b.wall_ns, b.name, busy)
             for b in bases}
    largest = max(used, key=lambda b: b.lateness.num_rows)
    big = alone[largest.name]
    held = test is not None and (test.outweighed_by_os or test.slight or
                                 test.transient is not None)
    if big is not None and (test is None or (_STRENGTH[big.decision] > _STRENGTH[test.decision]
                                             and not held)):
        # the larger basis alone says more than the pool: the smaller one (a traced window
        # the profiler skewed, say) must not dilute it. Not where the pool was held back by
        # what only all its steps show (its work slight or the OS's delay larger over them,
        # or a lead that fades in a part of the run): that is no dilution of arrivals
        big.alone, big.overrules_pool = alone, True
        return _dispute(big), largest.lateness
    if test is not None:
        test.alone = alone
    return _dispute(test), pooled


WORK_CAUSES = ("compute", "host_launch")  # causes that say the rank does more work


def hold_for_same_work(test: StragglerTest, s: Straggler, same: bool | None) -> bool:
    """Hold a confirmed straggler late by work (`WORK_CAUSES`) at suspected where its traced
    steps ran the others' work (`same`: op_excess.same_work) and its busy time over every
    step does not confirm it works longest (module docstring); whether it did. Not where
    there is no busy time (device runs: a slower GPU on the same kernels is a straggler)."""
    work = test.busy
    if s.confidence != "confirmed" or same is not True or s.cause not in WORK_CAUSES or \
            work is None or work.rank != s.rank or work.confirmed:
        return False
    test.decision, test.same_work = "suspected", True
    s.confidence, s.test = "suspected", test.test_doc()
    return True


def _dispute(test: StragglerTest | None) -> StragglerTest | None:
    """A confirmed pooled verdict that a basis alone contradicts (clears its rank, or names
    another) is suspected unless its lead stands clear of the others' spread, the delay is at
    least `DISPUTED_SHARE` (not for a verdict by elimination: late off the CPU) or its own work
    accounts for its lead (module docstring)."""
    by_elimination = test is not None and test.busy is not None and test.busy.off_cpu
    # its work accounts for its lead whether or not the frequency needed it to (`by_work` is
    # set only where it did): a 4-rank 1.3x straggler, +34% CPU time the most in 27 of 27
    # steps, frequent by its arrivals, was held at suspected on a lead 0.1 ms inside the spread
    by_own_work = test is not None and test.busy is not None and test.busy.accounts_for_lead
    if test is None or test.decision != "confirmed" or test.by_work or by_own_work or \
            test.median_lead_ns >= SIGMA_FACTOR * test.noise_ns or \
            (test.share is not None and test.share >= DISPUTED_SHARE and not by_elimination):
        return test
    if any(t is not None and (t.decision == "none" or t.rank != test.rank)
           for t in test.alone.values()):
        test.decision, test.disputed = "suspected", True
    return test


_STRENGTH = {"none": 0, "suspected": 1, "confirmed": 2}


def _delay_per_step(step: np.ndarray, delay: np.ndarray, n_part: np.ndarray
                    ) -> dict[int, tuple[int, int]]:
    """Per step, the largest delay one rank alone added to any of the step's collectives
    (every other participant waits that long), with that collective's participants."""
    per_step: dict[int, tuple[int, int]] = {}
    for s, d, m in zip(step.tolist(), delay.tolist(), n_part.tolist()):
        if d > per_step.get(s, (0, 0))[0]:
            per_step[s] = (d, m)
    return per_step


def straggler_test(lat: pa.Table, median_step_ns: float | None,
                   wall_ns: float | None = None, basis: str = BASIS_TRACES,
                   busy: BusyTimes | None = None,
                   persistence_on: Collection[int] | None = None) -> StragglerTest | None:
    """The straggler test of a run (module docstring; `uberprof.analysis.diagnosis.evidence`): the
    candidate rank, both criteria and the decision. None without matched collectives.
    `median_step_ns` and `wall_ns` are those of the steps `lat` covers; `busy`, the ranks'
    busy time per step (analysis/diagnosis/busy.py), is read over those steps;
    `persistence_on`, the steps its persistence is judged on (`_transient`; all when None: a
    pool judges it on its untraced steps, which the profiler did not skew). In stages: the
    candidate, its lead and the lead it needs, the delay it adds, the frequency (with the
    second look), then materiality and the decision."""
    if lat.num_rows == 0:
        return None
    iid = lat.column("instance").to_numpy()
    rank = lat.column("rank").to_numpy()
    late = lat.column("lateness_ns").to_numpy().astype(np.float64)
    n_part = lat.column("participants").to_numpy()
    step = lat.column("step").to_numpy()
    delay = lat.column("delay_ns").to_numpy()
    sole_last = lat.column("sole_last").to_numpy(zero_copy_only=False).astype(bool)
    ranks = np.unique(rank).tolist()
    r, p_raw = _candidate(ranks, rank, late, sole_last, n_part)
    mine = rank == r
    k, n, _ = sole_last_frequency(mine, sole_last, n_part)
    p_adj = min(1.0, p_raw * len(ranks))
    lead, noise = lead_and_noise(iid, rank, late, n_part, r)
    med_lead = float(np.median(lead)) if lead.size else 0.0
    steps = sorted({int(s) for s in step[mine].tolist()})
    work = busy.excess(r, set(step.tolist()), median_step_ns, med_lead) \
        if busy is not None else None
    more_work = work is not None and work.confirmed
    need_lead, spread_waived = _needed_lead(median_step_ns, n_part[mine], noise, med_lead,
                                            more_work)
    per_step = _delay_per_step(step[mine], delay[mine], n_part[mine])
    delay_wall = sum(d for d, _ in per_step.values())
    share = delay_wall / wall_ns if wall_ns else None
    frequent, maybe, later, by_work = _frequency(p_adj, work, iid, rank, late, n_part, r,
                                                 len(ranks))
    # a rank persistent by its work (`by_work`) meets the lead's floor by that work: beside a
    # CPU hog the others' scatter shrinks its median lead (1.3 ms) while it computes 11 ms a
    # step more in 26 of 27 steps and adds 16% of the wall time (benchmarks/accuracy.py)
    lead_by_work = by_work and med_lead < need_lead and work is not None and \
        work.excess_ns >= need_lead
    big_lead = med_lead >= need_lead or lead_by_work
    big_share = share is None or share >= MATERIAL_SHARE
    need_frac = 0.5 + 0.5 / max(float(np.median(n_part[mine])), 2.0)
    waived = k < need_frac * n and frequent and more_work
    material = big_lead and big_share and (k >= need_frac * n or waived)
    decision, decided = _decision(frequent, maybe, material, work)
    outweighed = decision == "confirmed" and work is not None and work.outweighed_by_os
    slight = decision == "confirmed" and not outweighed and work is not None and work.slight
    transient = None
    if decision == "confirmed" and not (outweighed or slight or lead_by_work):
        judged = np.ones(lead.size, bool) if not persistence_on else \
            np.isin(step[mine], list(persistence_on))
        transient = _transient(step[mine][judged], lead[judged], need_lead,
                               None if busy is None or work is None else
                               (lambda p: busy.excess_in(r, p.tolist())),
                               work.need_ns if work is not None else 0.0)
    if outweighed or slight or transient is not None:
        decision = "suspected"
    return StragglerTest(
        rank=r, last=k, instances=n, steps=len(steps), ranks_tested=len(ranks),
        p_value=p_adj, p_uncorrected=p_raw, median_lead_ns=int(med_lead), noise_ns=int(noise),
        need_lead_ns=int(need_lead), delay_ns=int(delay_wall), share=share,
        decision=decision, decided_by=decided, first_step=steps[0] if steps else None,
        need_fraction=need_frac, basis=basis, busy=work, fraction_waived=waived,
        spread_waived=spread_waived, later_than_most=later, by_work=by_work,
        lead_by_work=lead_by_work, outweighed_by_os=outweighed, slight=slight,
        transient=transient)


def _transient(steps: np.ndarray, lead: np.ndarray, need_lead: float,
               work_in: Callable[[np.ndarray], int | None] | None = None,
               need_work: float = 0.0) -> tuple[tuple[int, int], int] | None:
    """The part of the run where the candidate no longer leads, as ((first step, last step),
    its median lead there), or None where it leads in each third of its steps (split by step),
    or a third has fewer than MIN_PART_STEPS steps. A third counts as led where its median
    lead reaches the floor, or, with busy time, where its extra work there is still material
    (`work_in(steps)` >= `need_work`: beside a CPU hog a 1.3x straggler's lead scatters, its
    work does not). Healthy 2-rank runs had one rank ~50% slower over the first 20 of 30
    steps and like the other after them (benchmarks/accuracy.py, seeds 302 and 316)."""
    if lead.size != steps.size or not steps.size:
        return None
    parts = np.array_split(np.unique(steps), PARTS)
    if min(p.size for p in parts) < MIN_PART_STEPS:
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
    need_lead = max(ABS_MIN_LEAD_NS, REL_MIN_LEAD * (median_step_ns or 0.0))
    spread_waived = False
    if float(np.median(n_part)) >= 3 and SIGMA_FACTOR * noise > need_lead:
        # the spread rule tells a lead of chance from one of cause; confirmed extra work
        # is the cause, so the floors alone remain (said only where it decides)
        spread_waived = more_work and med_lead < SIGMA_FACTOR * noise
        if not spread_waived:
            need_lead = SIGMA_FACTOR * noise
    return need_lead, spread_waived


def _frequency(p_adj: float, work: BusyExcess | None, iid: np.ndarray, rank: np.ndarray,
               late: np.ndarray, n_part: np.ndarray, r: int, n_ranks: int
               ) -> tuple[bool, bool, tuple[int, float] | None, bool]:
    """The frequency criterion: (confirmed, suspected, the second look's instances and
    corrected chance, or None where it was not taken, and whether its work decided: a rank
    whose own extra work accounts for its lead in nearly every step is persistent by that
    test, whose chance is its own, however the arrivals were shuffled)."""
    more_work = work is not None and work.confirmed
    frequent = p_adj <= FALSE_ALARM_RATE
    maybe = p_adj <= SUSPECT_RATE
    later: tuple[int, float] | None = None
    if more_work and not frequent:
        # a second look, only for a rank whose extra work is confirmed (hence x2 more in the
        # correction): on oversubscribed cores the others' scatter makes it alone last in
        # fewer than half of the collectives, but it still comes after most of them
        k_later, p_later = later_than_most(iid, rank, late, n_part, r)
        later = (k_later, min(1.0, 2 * p_later * n_ranks))
        frequent = later[1] <= FALSE_ALARM_RATE
        maybe = maybe or later[1] <= SUSPECT_RATE
    by_work = not frequent and work is not None and work.accounts_for_lead
    return frequent or by_work, maybe or by_work, later, by_work


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
        decision, decided = "none", DECIDED_BY_BUSY
    return decision, decided


def find_straggler(lat: pa.Table, median_step_ns: float | None,
                   wall_ns: float | None = None, test: StragglerTest | None = None,
                   basis: pa.Table | None = None) -> Straggler | None:
    """The persistent straggler, confirmed or suspected, or None (see `straggler_test`).
    `test` made on `basis` (the Flight Recorder's lateness) decides when given; the delay it
    added is `lat`'s, over the analysed (traced) steps, and its share of the time is the
    test's where the test read more steps (`Straggler.share_of`)."""
    t = test if test is not None else straggler_test(lat, median_step_ns, wall_ns)
    if t is None or t.decision == "none":
        return None
    src = lat if basis is None else basis
    mine = src.column("rank").to_numpy() == t.rank
    step = src.column("step").to_numpy()[mine]
    sole_last = src.column("sole_last").to_numpy(zero_copy_only=False)[mine]
    last_steps = sorted({int(s) for s, sl in zip(step.tolist(), sole_last.tolist()) if sl})
    cost = lat.column("rank").to_numpy() == t.rank
    per_step = _delay_per_step(lat.column("step").to_numpy()[cost],
                               lat.column("delay_ns").to_numpy()[cost],
                               lat.column("participants").to_numpy()[cost])
    late = src.column("lateness_ns").to_numpy()[mine]
    return Straggler(
        rank=t.rank, instances=t.instances, last=t.last, steps=last_steps,
        median_lateness_ns=int(np.median(late)) if late.size else 0,
        median_lead_ns=t.median_lead_ns, noise_ns=t.noise_ns,
        delay_ns=int(sum(d for d, _ in per_step.values())),
        others_wait_ns=int(sum(d * (k - 1) for d, k in per_step.values())),
        steps_analysed=t.steps, confidence=t.decision, test=t.test_doc(),
        basis=t.basis, basis_share=t.share if t.basis != BASIS_TRACES else None)


def straggler_cause(rank: int, per_step: dict[int, dict[int, dict[str, float]]],
                    clocks: dict[str, Any] | None = None,
                    busy_excess_ns: int | None = None,
                    run_wait_excess_ns: int | None = None) -> tuple[str, dict[str, int]]:
    """The straggler's cause and, per factor, its median per-step excess over the other ranks.

    `per_step[step][rank]` holds the factors of one rank in one step (ns): `compute`, `data`,
    `host_launch` and `network` (its time inside collectives after the last arrival). The
    factor with the largest excess wins; `compute` becomes `clock_throttle` when `clocks`
    says the rank's GPU ran slower clocks or had throttle reasons set and the others did not.
    `busy_excess_ns`, its confirmed busy-time excess (analysis/diagnosis/busy.py: every step,
    where the traced steps are a few), weighs for `compute` where it is larger than the traced
    excess. `run_wait_excess_ns`, its wait for a core beyond the others' (busy.py, CPU runs),
    weighs against `host_launch`: a thread the OS kept off a core between operators shows host
    gaps that are no launch overhead of its own (a 1.3x compute straggler on a loaded host
    waited 50 ms more per step for a core and showed 28 ms more host gaps than compute).
    """
    names = ("compute", "data", "host_launch", "network")
    excess: dict[str, list[float]] = {f: [] for f in names}
    for ranks in per_step.values():
        mine = ranks.get(rank)
        others = [v for r, v in ranks.items() if r != rank]
        if mine is None or not others:
            continue
        for f in names:
            excess[f].append(mine.get(f, 0.0) - float(np.median([o.get(f, 0.0) for o in others])))
    factors = {f: int(np.median(v)) if v else 0 for f, v in excess.items()}
    weight = dict(factors)
    if busy_excess_ns is not None:
        weight["compute"] = max(weight["compute"], busy_excess_ns)
    if run_wait_excess_ns is not None and run_wait_excess_ns > 0:
        weight["host_launch"] = max(0, weight["host_launch"] - run_wait_excess_ns)
    cause = max(names, key=lambda f: weight[f])
    if cause == "compute" and clocks and clocks.get("throttled"):
        cause = "clock_throttle"
    return cause, factors
