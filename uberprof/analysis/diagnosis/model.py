"""What a diagnosis is: findings and the tables behind them. A leaf: the producers of findings,
the saved form and every view import it; it imports nothing that makes a finding.

A finding's `time_at_stake_ms` is the wall-clock time of the analysed (traced) steps it accounts
for, an upper bound on what fixing it saves there; `observed_ms` is the whole time it observed,
and `caused_by` links the part another finding already counts ({index, kind, ms}). Severity is
its own share of the analysed wall time (`severity_of`). `SCHEMA_VERSION` is the version of the
saved diagnosis and of the `uberprof report --json` document (docs/json.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

# re-exported for the views, which take from the analysis only what tests/unit/test_architecture.py
# allows them (this model among it); analysis/progress.py defines them
from uberprof.analysis.progress import READING_TRACES, WRITING_RANKS, Progress
from uberprof.units import fmt_ms

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.bandwidth import BandwidthClass
    from uberprof.analysis.diagnosis.stragglers import Straggler
    from uberprof.analysis.diagnosis.summaries import RankSummaries
    from uberprof.analysis.tables.align import Alignment
    from uberprof.analysis.tables.collectives import Matched

__all__ = [
    "MIN_SHARE",
    "RANKING_RULE",
    "READING_TRACES",
    "SCHEMA_VERSION",
    "WRITING_RANKS",
    "Diagnosis",
    "Finding",
    "Progress",
    "field_doc",
    "ranks_text",
    "severity_of",
]

SCHEMA_VERSION = 1
MIN_SHARE = 0.02  # a per-rank problem below this share of the analysed time is not a finding


# The report's one ranking in one line (advisor.finding_order; the terminal's header says it).
RANKING_RULE = ("ranked by severity (own share of the analysed time), then by the step time a "
                "fix is projected to save, or the time at stake where no change models it")


def severity_of(share: float) -> str:
    """A finding's severity from its own share of the analysed wall time."""
    return "high" if share >= 0.15 else "medium" if share >= 0.05 else "low"


def field_doc(text: str) -> dict[str, str]:
    """A document field's metadata: its one-line meaning (docs/json.md's tables are generated
    from it, `schema_doc.py`). Every typed part of the report document describes its fields
    with it."""
    return {"doc": text}


def ranks_text(ranks: list[int]) -> str:
    """"rank 3" or "ranks 0, 1, 2 (+5)": how a finding's title names its ranks."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:8])) + \
        (f" (+{len(ranks) - 8})" if len(ranks) > 8 else "")


@dataclass
class Finding:
    """One thing that holds the job back, in the user's terms."""

    kind: str = field(metadata=field_doc(
        "its kind: one of the table in [findings.md](findings.md#how-to-read-any-finding)"))
    severity: str = field(metadata=field_doc(
        "`high` (own share of the analysed wall time ≥ 15%), `medium` (≥ 5%), `low`; "
        "hangs and crashes are always `high`"))
    title: str = field(metadata=field_doc(
        "one line for people"))
    ranks: list[int] = field(metadata=field_doc(
        "the ranks concerned (the straggler; the affected ranks; the stuck ranks; the "
        "first failing rank; empty for a bandwidth class)"))
    steps: list[int] = field(metadata=field_doc(
        "the steps concerned (for a hang or crash, the step that never finished)"))
    cause: str | None = field(metadata=field_doc(
        "the kind's cause, or null (table below)"))
    time_at_stake_ms: float = field(metadata=field_doc(
        "wall time of the analysed steps this finding alone accounts for: an upper "
        "bound on what fixing it saves there. 0 for hangs, crashes and `host_cpu`"))
    evidence: dict[str, Any] = field(metadata=field_doc(
        "the numbers behind it, with its test (below)"))
    remedy: str = field(metadata=field_doc(
        "what to do, in words fitted to the run (CPU runs get CPU remedies)"))
    confidence: str = field(default="confirmed", metadata=field_doc(
        "`confirmed`, or `suspected` (`evidence.test.sentence` says what would confirm "
        "it)"))
    observed_ms: float | None = field(default=None, metadata=field_doc(
        "the whole time it observed: its own time at stake plus what `caused_by` "
        "attributes to other findings"))
    caused_by: list[dict[str, Any]] = field(default_factory=list, metadata=field_doc(
        "`[{index, kind, ms, part}]`: the part of `observed_ms` that another finding "
        "already counts: its `index` in `findings`, its `kind`, the ms, and which part "
        "in words (\"waiting for the straggler\", \"transfer of a latency-bound class\", "
        "\"idle on the straggler, rank 3: ...\")"))
    projected_gain: dict[str, Any] | None = field(default=None, metadata=field_doc(
        "what fixing it gains in the replay "
        "([whatif.md](whatif.md#what-fixing-each-finding-gains)): `change` (its remedy "
        "as a what-if change, in words), `baseline_step_ms`, `projected_step_ms`, "
        "`gain_ms`, `gain_pct`, `interval_ms` (95% interval of the projected median, or"
        " the range), `sentence` (\"fixing this: step 48.0 -> 41.2 ms, -14.2%\"), `note` "
        "(what the change could not touch, or where the projection was bounded; or null), "
        "`replay_gain_ms` (the replay's own gain where it exceeded the finding's time at "
        "stake, which then bounds `gain_ms`; null otherwise); null when it cannot be "
        "projected. `gain_ms` is at most `time_at_stake_ms`; it is the measured median step "
        "less the projected median, so it can be slightly negative where the change gains "
        "nothing (then `projected_gain_why` says why)"))
    projected_gain_why: str | None = field(default=None, metadata=field_doc(
        "why `projected_gain` is null (no change models the kind, or the replay is "
        "unfit for projection), or why it gains nothing (what the change removed and what "
        "holds the steps instead); null otherwise"))
    accounts_for: dict[str, dict[str, float]] = field(default_factory=dict, metadata=field_doc(
        "rank (as a string) → `{exposed_comm_ms, idle_ms}`: the part of that rank's own "
        "exposed communication and idle time in the analysed steps this finding explains "
        "(observed on the rank, not wall time: ranks run in parallel). Over the findings, each "
        "rank's parts add up to at most its own time; the rest is its "
        "`ranks[].accounted.*.unexplained_ms`"))
    # what its kind declares (findings/kind.py), stamped when it is made and saved with it, so
    # that every view prints the same words and no view names a kind
    role: str = field(default="verdict", metadata=field_doc(
        "what its kind declares it is "
        "([findings.md](findings.md#how-to-read-any-finding)): `failure` (the job "
        "stopped: ranked first), `context` (explains other findings, no time of its "
        "own) or `verdict`"))
    page: str = field(default="/", metadata=field_doc(
        "the dashboard page where its kind is looked at in detail (`/stragglers`, "
        "`/gaps`, ...)"))
    evidence_sentence: str = field(default="", metadata=field_doc(
        "its evidence in one sentence, made by its kind from `evidence`: what the "
        "terminal and HTML reports, the dashboard and the export print"))
    details: list[str] = field(default_factory=list, metadata=field_doc(
        "supporting lines a reader checks the verdict with (a stuck or failing rank's "
        "stack, innermost last; the collective the others wait in; mismatches; "
        "victims); empty for most kinds"))
    # keys `as_dict` adds that are not fields: (name, type, meaning), for docs/json.md's table
    DERIVED: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("own_pct", "number", "`time_at_stake_ms` as a share of `observed_ms` (100 when nothing is caused by another finding)"),)

    def stake_words(self, short: bool = False) -> str:
        """Its time at stake as every view says it ("12.3 ms at stake"; `short`: "12.3 ms"),
        or, for a finding that counts no time of its own (role `context`), that it explains
        the others."""
        if self.role == "context" and self.time_at_stake_ms <= 0:
            return "explains others" if short else \
                "no time of its own: it explains other findings"
        ms = fmt_ms(self.time_at_stake_ms)
        return ms if short else f"{ms} at stake"

    def as_dict(self) -> dict[str, Any]:
        observed = self.observed_ms if self.observed_ms is not None else self.time_at_stake_ms
        return {"kind": self.kind, "severity": self.severity, "title": self.title,
                "ranks": self.ranks, "steps": self.steps, "cause": self.cause,
                "time_at_stake_ms": round(self.time_at_stake_ms, 3),
                "evidence": self.evidence, "remedy": self.remedy,
                "confidence": self.confidence, "observed_ms": round(observed, 3),
                "own_pct": round(100 * self.time_at_stake_ms / observed, 1) if observed else
                100.0,
                "caused_by": self.caused_by, "accounts_for": self.accounts_for,
                "projected_gain": self.projected_gain,
                "projected_gain_why": self.projected_gain_why, "role": self.role,
                "page": self.page, "evidence_sentence": self.evidence_sentence,
                "details": self.details}


@dataclass
class Diagnosis:
    """Everything the diagnosis found: findings plus the tables behind them (for plots)."""

    run: dict[str, Any]
    ranks: list[dict[str, Any]]
    findings: list[Finding]
    alignment: Alignment
    matched: Matched
    lateness: pa.Table  # LATENESS_SCHEMA (aligned clocks)
    gaps: pa.Table  # GAP_SCHEMA (each rank's own clock)
    bandwidth: pa.Table  # BANDWIDTH_SCHEMA
    classes: list[BandwidthClass]
    straggler: Straggler | None
    steps: pa.Table  # the analysed (traced) steps, RUN_STEP_SCHEMA
    summaries: RankSummaries  # per-rank lateness and idle by cause: every view reads these
    top_gaps: list[dict[str, Any]] = field(default_factory=list)  # each rank's TOP_GAPS longest
    derived: Path | None = None  # the run's derived-tables folder
    inputs: list[str] = field(default_factory=list)  # the traces diagnosed (relative paths)
    p2p: pa.Table | None = None  # matched send/recv pairs, aligned clocks (p2p.PAIR_SCHEMA)

    def to_json(self) -> dict[str, Any]:
        """The `uberprof report --json` document (docs/json.md)."""
        return {"run": self.run, "ranks": self.ranks,
                "findings": [f.as_dict() for f in self.findings]}
