"""Scoring `uberprof report --json` documents against what a scenario injected: the statistics of
benchmarks/accuracy.py, kept apart from the runs so that they are tested on synthetic reports.

A scenario's ground truth (`Truth`) lists the findings that must appear (`Expect`, each with
alternatives: a slow data loader may be named as a data stall or as a straggler with cause
`data`) and the findings that must not (`forbid`). A finding is a true positive when it matches
an expectation, a false positive when it matches a forbidden claim and no expectation, and is
left unjudged otherwise (a CPU run's idle gaps are real, but no scenario injected them).
Findings marked `"confidence": "suspected"` are not verdicts: they are counted apart, never
as hits or false alarms. Precision is per finding key (the finding's kind, with its cause for
kinds whose cause names a different diagnosis), recall per expectation key.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Claim", "ConditionTarget", "Expect", "KindRow", "RunScore", "Truth",
           "condition_targets", "false_stragglers", "finding_key", "is_suspected", "scenario_of",
           "score_run", "tally"]

CAUSE_KINDS = ("straggler", "bandwidth")  # kinds whose cause is part of the diagnosis


def finding_key(f: Mapping[str, Any]) -> str:
    """The row a finding is scored under: `straggler:compute`, `bandwidth:latency-bound`,
    `data_stall`, ..."""
    kind = str(f.get("kind"))
    return f"{kind}:{f.get('cause')}" if kind in CAUSE_KINDS and f.get("cause") else kind


def is_suspected(f: Mapping[str, Any]) -> bool:
    """A finding that says its evidence is too thin for a verdict."""
    return f.get("confidence") == "suspected"


@dataclass(frozen=True)
class Claim:
    """A pattern over findings: its kind, and where given its cause and one of its ranks."""

    kind: str
    cause: str | None = None
    ranks: frozenset[int] | None = None  # the finding names at least one of these

    def matches(self, f: Mapping[str, Any]) -> bool:
        if f.get("kind") != self.kind or (self.cause is not None and f.get("cause") != self.cause):
            return False
        return self.ranks is None or bool(self.ranks & set(f.get("ranks") or ()))


@dataclass(frozen=True)
class Expect:
    """A finding that must appear, scored for recall under `key`, in any of its forms."""

    key: str
    any_of: tuple[Claim, ...]

    def met_by(self, f: Mapping[str, Any]) -> bool:
        return any(c.matches(f) for c in self.any_of)


@dataclass(frozen=True)
class Truth:
    """What a scenario injected: expected findings, forbidden ones, and the ranks really slow
    (a straggler naming another rank is a false straggler)."""

    expect: tuple[Expect, ...] = ()
    forbid: tuple[Claim, ...] = ()
    slow_ranks: frozenset[int] = frozenset()


@dataclass
class RunScore:
    """One run scored: per expectation key whether it was met (confirmed findings only), and
    per finding key the true/false positives, confirmed and suspected."""

    scenario: str
    met: dict[str, bool] = field(default_factory=dict)
    met_suspected: dict[str, bool] = field(default_factory=dict)  # met by a suspected finding
    tp: Counter[str] = field(default_factory=Counter)
    fp: Counter[str] = field(default_factory=Counter)
    suspected_fp: Counter[str] = field(default_factory=Counter)
    unjudged: Counter[str] = field(default_factory=Counter)
    false_straggler: bool = False
    suspected_false_straggler: bool = False
    stake_over_wall: bool = False  # findings' time at stake adds up to more than the wall time
    error: str | None = None  # the run or its report failed: not scored

    def as_dict(self) -> dict[str, Any]:
        return {f.name: dict(v) if isinstance(v, Counter) else v
                for f in dataclasses.fields(self) for v in (getattr(self, f.name),)}


def score_run(scenario: str, truth: Truth, report: Mapping[str, Any]) -> RunScore:
    """Score one `uberprof report --json` document against `truth`."""
    s = RunScore(scenario)
    findings = list(report.get("findings") or [])
    for e in truth.expect:
        s.met[e.key] = any(e.met_by(f) for f in findings if not is_suspected(f))
        s.met_suspected[e.key] = not s.met[e.key] and any(
            e.met_by(f) for f in findings if is_suspected(f))
    for f in findings:
        key, suspected = finding_key(f), is_suspected(f)
        if any(e.met_by(f) for e in truth.expect):
            if not suspected:
                s.tp[key] += 1
        elif any(c.matches(f) for c in truth.forbid):
            (s.suspected_fp if suspected else s.fp)[key] += 1
        elif not suspected:
            s.unjudged[key] += 1
        if f.get("kind") == "straggler" and not truth.slow_ranks & set(f.get("ranks") or ()):
            if suspected:
                s.suspected_false_straggler = True
            else:
                s.false_straggler = True
    wall = (report.get("run") or {}).get("analysed_wall_ms")
    stake = sum(float(f.get("time_at_stake_ms") or 0) for f in findings)
    s.stake_over_wall = bool(wall) and stake > float(wall) * 1.001
    return s


@dataclass
class KindRow:
    """Totals for one finding key over many runs."""

    key: str
    expected: int = 0  # runs in which it was expected
    found: int = 0  # ... and named by a confirmed finding
    found_suspected: int = 0  # ... or only by a suspected one
    tp: int = 0  # confirmed findings of this key that were right
    fp: int = 0  # ... that were false alarms
    suspected_fp: int = 0
    unjudged: int = 0

    @property
    def recall(self) -> float | None:
        return self.found / self.expected if self.expected else None

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "expected": self.expected, "found": self.found,
                "found_suspected": self.found_suspected, "recall": self.recall,
                "true_positives": self.tp, "false_positives": self.fp,
                "suspected_false_positives": self.suspected_fp, "unjudged": self.unjudged,
                "precision": self.precision}


def tally(scores: Iterable[RunScore]) -> dict[str, KindRow]:
    """Per finding key, over the scored runs (failed runs are left out)."""
    rows: dict[str, KindRow] = {}

    def row(k: str) -> KindRow:
        return rows.setdefault(k, KindRow(k))

    for s in scores:
        if s.error:
            continue
        for k, ok in s.met.items():
            row(k).expected += 1
            row(k).found += ok
            row(k).found_suspected += s.met_suspected.get(k, False)
        for attr in ("tp", "fp", "suspected_fp", "unjudged"):
            for k, n in getattr(s, attr).items():
                setattr(row(k), attr, getattr(row(k), attr) + n)
    return dict(sorted(rows.items()))


def false_stragglers(scores: Iterable[RunScore], scenarios: set[str] | None = None
                     ) -> tuple[int, int, int]:
    """(runs with a confirmed false straggler, with a suspected one only, runs scored), over
    the runs of `scenarios` (all when None)."""
    ok = [s for s in scores if not s.error and (scenarios is None or s.scenario in scenarios)]
    firm = sum(s.false_straggler for s in ok)
    soft = sum(s.suspected_false_straggler and not s.false_straggler for s in ok)
    return firm, soft, len(ok)


HOG = "+hog"  # a condition's suffix: the scenario run beside a CPU hog


def scenario_of(condition: str) -> str:
    """The scenario a condition runs: `healthy+hog` -> `healthy`."""
    return condition.removesuffix(HOG)


@dataclass
class ConditionTarget:
    """Issue 29's target for one condition (a scenario, with or without a CPU hog): a healthy
    condition must name no confirmed straggler in `need` runs; an injected one must name the
    straggler, with its cause, in at least `need_found` of `need` runs (the same share when
    more ran)."""

    condition: str
    healthy: bool
    key: str | None  # injected: the expectation scored (`straggler:off_cpu`)
    runs: int = 0  # scored runs (failed ones left out)
    failed: int = 0
    false: int = 0  # healthy: runs with a confirmed false straggler
    suspected: int = 0  # ... with a suspected one only
    found: int = 0  # injected: runs where the straggler was named with the right cause
    other_straggler: int = 0  # ... runs not found that named a straggler all the same
    need: int = 20
    need_found: int = 19

    @property
    def met(self) -> bool:
        if self.runs < self.need:
            return False
        if self.healthy:
            return self.false == 0
        return self.found * self.need >= self.need_found * self.runs

    def line(self) -> str:
        """One line for the summary: the counts, the target and whether it was met."""
        if self.healthy:
            what = (f"{self.false} false confirmed straggler(s) in {self.runs} run(s)"
                    + (f" (+{self.suspected} suspected only)" if self.suspected else "")
                    + f"; target 0 in >= {self.need}")
        else:
            what = (f"{self.key} named in {self.found} of {self.runs} run(s)"
                    + (f" ({self.other_straggler} named another straggler)"
                       if self.other_straggler else "")
                    + f"; target >= {self.need_found} of {self.need}")
        verdict = "MET" if self.met else (
            f"not met (only {self.runs} run(s))" if self.runs < self.need
            and (self.false == 0 if self.healthy
                 else self.found * self.need >= self.need_found * self.runs)
            else "not met")
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.condition}: {what}{failed} -> {verdict}"

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "met": self.met}


def condition_targets(scores: Iterable[RunScore], healthy: Iterable[str],
                      injected: Mapping[str, str], need: int = 20, need_found: int = 19
                      ) -> list[ConditionTarget]:
    """Per condition (`RunScore.scenario`, e.g. `off-cpu+hog`) whose scenario is healthy or
    injected (`injected` maps a scenario to its expectation key), in the order first seen."""
    healthy = set(healthy)
    out: dict[str, ConditionTarget] = {}
    for s in scores:
        base = scenario_of(s.scenario)
        if base not in healthy and base not in injected:
            continue
        t = out.setdefault(s.scenario, ConditionTarget(
            s.scenario, base in healthy, injected.get(base), need=need, need_found=need_found))
        if s.error:
            t.failed += 1
            continue
        t.runs += 1
        if t.healthy:
            t.false += s.false_straggler
            t.suspected += s.suspected_false_straggler and not s.false_straggler
        elif s.met.get(t.key or ""):
            t.found += 1
        elif any(k.startswith("straggler") for k in s.fp):
            t.other_straggler += 1
    return list(out.values())
