"""How a straggler verdict is said: the test's sentence, its document and the notes on the
cause. Nothing here decides; every clause reads a field the decision set (test.py, cause.py).

`TestWording` is the wording half of `test.StragglerTest` (which inherits it): it reads only
the test's fields. The sentence is: the frequency clause, the materiality clause, the busy
time, then the verdict in the order the rules apply (docs/findings.md, the decision table),
then each basis's own test where one alone would decide otherwise."""

from __future__ import annotations

from typing import Any

from uberprof.analysis.diagnosis.busy import SLIGHT_EXCESS
from uberprof.analysis.diagnosis.evidence import (
    FALSE_ALARM_RATE,
    SUSPECT_RATE,
    Test,
    chance_words,
    trace_more_hint,
)
from uberprof.analysis.diagnosis.stragglers import rules

__all__ = ["TestWording", "basis_words", "traced_view_words", "unexplained_lead_words"]

_BASIS_WORDS = {rules.BASIS_TRACES: "traced window",
                rules.BASIS_FLIGHT_RECORDER: "Flight Recorder (untraced steps)",
                rules.BASIS_ARRIVALS: "traced window and Flight Recorder (untraced steps) together",
                rules.BASIS_STEP_TIMELINE: "step timelines of the last steps every rank finished"}
_RATE = f"{100 * FALSE_ALARM_RATE:.0f}%"


def basis_words(basis: str) -> str:
    """A test basis in words, as the test's sentence and the finding's title say it."""
    return _BASIS_WORDS.get(basis, basis)


class TestWording:
    """The sentences and documents of a `StragglerTest` (its fields are declared there)."""

    rank: int
    last: int
    instances: int
    steps: int
    ranks_tested: int
    p_value: float
    p_uncorrected: float
    median_lead_ns: int
    noise_ns: int
    need_lead_ns: int
    delay_ns: int
    share: float | None
    decision: str
    decided_by: str
    first_step: int | None
    need_fraction: float
    basis: str
    busy: Any  # busy.BusyExcess | None
    fraction_waived: bool
    spread_waived: bool
    later_than_most: tuple[int, float] | None
    by_work: bool
    alone: dict[str, Any]  # basis -> StragglerTest | None
    overrules_pool: bool
    disputed: bool
    lead_by_work: bool
    outweighed_by_os: bool
    slight: bool
    transient: tuple[tuple[int, int], int] | None
    same_work: bool
    clear_lead_ns: int
    cpu_alone: bool
    lead_shows: bool

    def as_test(self) -> Test:
        """The test as `evidence.Test`: its numbers, thresholds and sentence."""
        freq, lead = self._frequency_words(), self._lead_words()
        work = f"; {self.busy.words()}" if self.busy is not None else ""
        sentence = self._verdict_words(freq, lead, work) + self._alone_words()
        return Test(name="sole-last frequency (Poisson-binomial, Bonferroni over ranks) and "
                         "materiality of the lead"
                         + (", with its busy-time excess" if self.busy is not None else ""),
                    statistic=f"last at {self.last}/{self.instances}; {lead}",
                    instances=self.instances,
                    threshold=(f"p <= {FALSE_ALARM_RATE:g} confirmed, p <= "
                               f"{SUSPECT_RATE:g} suspected (corrected); last in >= "
                               f"{100 * self.need_fraction:.1f}%, lead >= "
                               f"{self.need_lead_ns / 1e6:.3g} ms and delay >= "
                               f"{100 * rules.MATERIAL_SHARE:.0f}% of the analysed time"),
                    sentence=sentence, p_value=self.p_value, p_uncorrected=self.p_uncorrected,
                    decided_by=self.decided_by)

    def _frequency_words(self) -> str:
        """The frequency criterion: how often it was alone last and the chance of that, the
        second look, and its work where that decided its persistence (`by_work`)."""
        alone = (f"was alone the slowest at {self.last} of {self.instances} steps"
                 if self.basis == rules.BASIS_STEP_TIMELINE else
                 f"alone arrived last at {self.last} of {self.instances} collectives over "
                 f"{self.steps} step(s)")
        freq = (f"rank {self.rank} {alone}, {basis_words(self.basis)}; "
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
        return freq

    def _lead_words(self) -> str:
        """The materiality criterion: last fraction, lead and delay against what they need."""
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
                    f"{100 * rules.MATERIAL_SHARE:.0f}%)"
        return lead

    def _verdict_words(self, freq: str, lead: str, work: str) -> str:
        """The verdict, in the order the rules apply: cleared by its busy time, confirmed,
        held at suspected (and why), suspected on its frequency, or none."""
        if self.by_work and self.busy is not None and self.decision != "none":
            return self._by_basis_words()
        if self.decided_by == rules.DECIDED_BY_BUSY:
            return (f"no straggler: {freq}, but {self.busy.words() if self.busy else ''}: "
                    "the OS delayed it, not its work (nor its data loading)"
                    + ("" if self.busy is None or self.busy.preempted is not None else
                       " (no record of its wait for a core to prove it)"))
        if self.decision == "confirmed":
            below = "" if self.by_work else f", below the {_RATE} false-alarm rate"
            return f"{freq}{below}; {lead}{work}: confirmed"
        held = self._held_words()
        if held is not None:
            return (f"{freq}, below the {_RATE} false-alarm rate; {lead}{work}: suspected, "
                    "not confirmed: " + held)
        if self.decision == "suspected":
            return (f"{freq}: not below the {_RATE} false-alarm rate, too few instances "
                    f"to tell it from chance; {lead}{work}: suspected — to confirm, "
                    + self._confirm_hint())
        if self.decided_by == "frequency":
            sentence = (f"no straggler: the rank most often last, {freq}, not below the "
                        f"{100 * SUSPECT_RATE:.0f}% needed to suspect it")
            if self.last >= 0.75 * self.instances and self.need_lead_ns <= self.median_lead_ns:
                sentence += ("; too few instances to tell a persistent straggler from "
                             "chance: " + self._confirm_hint())
            return sentence
        return f"no straggler: {freq}, but it is not material: {lead}{work}"

    def _by_basis_words(self) -> str:
        """A verdict its CPU time took part in (`by_work`: its arrivals alone were not
        frequent enough): the verdict, then one clause per basis, each with its own verdict
        (the arrivals, the wall-clock lead, the CPU time), so that no clause says "confirmed"
        of a basis another clause calls chance (issue 54)."""
        b = self.busy
        if self.decision == "confirmed":
            verdict = (f"rank {self.rank}: confirmed by its wall-clock lead and its CPU time "
                       "(its arrivals alone are not significant)")
        else:
            held = ("only its CPU time shows it, not its arrivals or its wall-clock lead — to "
                    "confirm, " + self._confirm_hint()
                    if self.cpu_alone else self._held_words() or "")
            verdict = f"rank {self.rank}: suspected, not confirmed: {held}"
        later = ""
        if self.later_than_most is not None:
            k, p = self.later_than_most
            later = f", after most of the others at {k} (chance {chance_words(p)})"
        arrivals = (f"arrivals ({basis_words(self.basis)}): alone last at {self.last} of "
                    f"{self.instances} collectives over {self.steps} step(s){later}, chance "
                    f"for a healthy rank {chance_words(self.p_value)} (corrected for "
                    f"{self.ranks_tested} ranks): not below the {_RATE} false-alarm rate")
        share = (f", its delay {100 * self.share:.1f}% of the analysed time (shows it from "
                 f"{100 * rules.DISPUTED_SHARE:.0f}%)" if self.share is not None else "")
        lead = (f"wall-clock lead: median {self.median_lead_ns / 1e6:.3g} ms (shows it from "
                f"{self.clear_lead_ns / 1e6:.3g} ms: its floors and the others' spread, "
                f"{self.noise_ns / 1e6:.3g} ms){share}: "
                + ("shows it" if self.lead_shows else "does not show it"))
        wall = (f" ({b.work_wall_ns / 1e6:.3g} ms of wall time where each ms of CPU also waits "
                f"{b.wait_per_cpu:.2g} ms for a core)" if b.wait_per_cpu > 0 else "")
        cpu = (f"CPU time: {b.words()}{wall}: more than its median lead, in "
               f"{b.most} of {b.steps} steps")
        return f"{verdict}; {arrivals}; {lead}; {cpu}"

    def _held_words(self) -> str | None:
        """Why a verdict its arrivals confirm is held at suspected, by the first hold that
        applies (preempted, slight, same work, transient, disputed); None where none does."""
        if self.outweighed_by_os:
            return ("other load on its host kept it from a core longer than it worked extra, "
                    "and that load may also be what slowed its work — to confirm, run it "
                    "again with its cores free of other processes")
        if self.slight:
            pct = f" ({self.busy.excess_pct:+.1f}%)" if self.busy is not None else ""
            return ("it is late by its own work, but that work is under "
                    f"{100 * SLIGHT_EXCESS:.0f}% more than the others'{pct}, which healthy "
                    "ranks on cores of one host differ by — to confirm, swap its cores or host "
                    "with another rank's and see whether the lateness follows the rank")
        if self.same_work:
            return ("in its traced steps it ran the same operators on the same input shapes "
                    "as often as the others, each slower, and its CPU time over every step "
                    "does not single it out: the same work run slower (its cores shared or "
                    "slower), not more work — to confirm, give each rank cores of its own and "
                    "see whether the lateness stays")
        if self.transient is not None:
            (a, b), half = self.transient
            return (f"over steps {a}-{b} its median lead is only {half / 1e6:.3g} ms, under "
                    f"the {self.need_lead_ns / 1e6:.3g} ms it needs: late in part of the run "
                    "only (a warm-up, a passing slowdown), not persistently — to confirm, run "
                    "more steps")
        if self.disputed:
            small = (f"the delay it adds is under {100 * rules.DISPUTED_SHARE:.0f}% of the "
                     "analysed time" if self.share is None or self.share < rules.DISPUTED_SHARE else
                     "the delay it adds is large, but it is late off the CPU by elimination "
                     "alone (no extra work, no extra wait for a core)")
            return ("its bases disagree (below), its lead is within twice the spread above, "
                    f"{small}, and no excess of its own work accounts for its lead — to "
                    "confirm, " + self._confirm_hint())
        return None

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
        if self.basis in (rules.BASIS_FLIGHT_RECORDER, rules.BASIS_ARRIVALS):
            return "run more steps (the Flight Recorder covers every untraced step)"
        if self.basis == rules.BASIS_STEP_TIMELINE:
            return "wait for more steps"
        return trace_more_hint([self.first_step] if self.first_step is not None else [])

    def test_doc(self) -> dict[str, Any]:
        """`evidence["test"]`: `as_test()`'s, with the busy-time test where there is one, and
        each rule that decided (docs/json.md)."""
        doc = self.as_test().as_dict()
        if self.busy is not None:
            doc["busy_time"] = {**self.busy.as_dict(), "last_fraction_waived":
                                self.fraction_waived, "spread_waived": self.spread_waived}
        if self.later_than_most is not None:
            k, p = self.later_than_most
            doc["later_than_most"] = {"instances": k, "of": self.instances,
                                      "p_value": float(f"{p:.3g}")}
        for flag in ("by_work", "disputed", "lead_by_work", "outweighed_by_os"):
            if getattr(self, flag):
                doc[flag] = True
        if self.transient is not None:
            (a, b), half = self.transient
            doc["transient"] = {"steps": [a, b], "median_lead_ms": round(half / 1e6, 3)}
        for flag in ("slight", "same_work", "cpu_alone"):
            if getattr(self, flag):
                doc[flag] = True
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


def unexplained_lead_words(explained_ns: float, late_by_ns: float) -> str:
    """How much of its lateness a straggler's extra work leaves unexplained (cause.py)."""
    return (f"; its extra CPU time and wait for a core explain {explained_ns / 1e6:.3g} ms of "
            f"the {late_by_ns / 1e6:.3g} ms it is late by: the rest it spent off the CPU "
            "(waits of its own, or time its host did not give it)")


def traced_view_words(rank: int, other_rank_traced: bool, no_excess: str | None,
                      by_busy: bool) -> tuple[str, str]:
    """Where the traced steps, which the cause is read from, disagree with a verdict made on
    more steps (cause.py): the sentence to add and the note alone ("" where none). With
    `other_rank_traced` the traced steps alone do not show `rank` most often last; with
    `no_excess` (a cause) its traced breakdown shows no excess of it; `by_busy`: the cause was
    read from its busy time over every step."""
    notes = []
    if other_rank_traced:
        notes.append(f"the traced steps alone do not show rank {rank} most often last")
    if no_excess is not None:
        notes.append(f"its per-step breakdown in the traced steps shows no excess "
                     f"{no_excess} over the others: the cause is uncertain")
    sentence = ("; cause read from its busy time over every step (the traced steps' "
                "breakdown weighs less)" if by_busy else
                "; cause read from the traced steps' breakdown")
    if notes:
        sentence += " (" + "; ".join(notes) + ")"
    return sentence, "; ".join(notes)
