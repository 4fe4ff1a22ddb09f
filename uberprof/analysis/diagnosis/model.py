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
from typing import TYPE_CHECKING, Any

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

__all__ = ["MIN_SHARE", "READING_TRACES", "SCHEMA_VERSION",
           "WRITING_RANKS", "Diagnosis", "Finding", "Progress", "ranks_text", "severity_of"]

SCHEMA_VERSION = 1
MIN_SHARE = 0.02  # a per-rank problem below this share of the analysed time is not a finding


def severity_of(share: float) -> str:
    """A finding's severity from its own share of the analysed wall time."""
    return "high" if share >= 0.15 else "medium" if share >= 0.05 else "low"


def ranks_text(ranks: list[int]) -> str:
    """"rank 3" or "ranks 0, 1, 2 (+5)": how a finding's title names its ranks."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:8])) + \
        (f" (+{len(ranks) - 8})" if len(ranks) > 8 else "")


@dataclass
class Finding:
    """One thing that holds the job back, in the user's terms."""

    kind: str
    severity: str  # high | medium | low
    title: str  # one line for people
    ranks: list[int]
    steps: list[int]
    cause: str | None
    time_at_stake_ms: float
    evidence: dict[str, Any]
    remedy: str
    confidence: str = "confirmed"  # confirmed | suspected (evidence["test"] says why)
    observed_ms: float | None = None  # the whole time it observed (own + caused_by)
    caused_by: list[dict[str, Any]] = field(default_factory=list)  # {index, kind, ms}
    # what fixing it gains in the replay (diagnosis/gains.py): baseline and projected step ms,
    # gain, interval, sentence; None with `projected_gain_why` when it cannot be projected
    projected_gain: dict[str, Any] | None = None
    projected_gain_why: str | None = None
    # what its kind declares (findings/kind.py), stamped when it is made and saved with it, so
    # that every view prints the same words and no view names a kind: its role (failure: the
    # job stopped; context: explains others, no time of its own; verdict: costs time), the
    # dashboard page that shows it, its evidence in one sentence, and supporting lines (stacks)
    role: str = "verdict"
    page: str = "/"
    evidence_sentence: str = ""
    details: list[str] = field(default_factory=list)

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
                "caused_by": self.caused_by, "projected_gain": self.projected_gain,
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
