"""What fixing each finding would gain: the finding's remedy as a what-if change
(`whatif_changes.Change`), replayed once on the step graph the diagnosis already built, and
what fixing the top two findings together would give (one composed replay: gains do not add).

Which change fixing a finding amounts to, or why none models it, is declared by its kind
(`findings/kind.py`, `FindingKind.change`; docs/findings.md lists them); a finding without one
has a null `projected_gain` and says why in `projected_gain_why`, and so does every finding
when the replay is unfit for projection.
Cost: one replay per distinct change (cached), on the graph and base replay of the report's
critical path; no second analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from uberprof.analysis.diagnosis.busy import BusyTimes
from uberprof.analysis.diagnosis.findings import kind_of
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.diagnosis.whatif import project, run_graph_docs
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.graph import StepGraph
from uberprof.analysis.tables.replay import Replay

__all__ = ["Projector", "attach_gains", "finding_change", "gain_sentence", "run_projector",
           "top_two", "unfit_why"]


def finding_change(f: Finding) -> tuple[Change | None, str]:
    """The change that fixing `f` amounts to in the replay, or None and why there is none, as
    its kind declares."""
    return kind_of(f.kind).change(f)


@dataclass
class Projector:
    """The diagnosis's step graph, its base replay and fitness, and each change set's
    projection once (cached)."""

    graph: StepGraph
    base: Replay
    traced: pa.Table
    fit: dict[str, Any]
    stages: dict[int, int] = field(default_factory=dict)
    cache: dict[tuple[Change, ...], dict[str, Any]] = field(default_factory=dict)

    def project(self, changes: list[Change]) -> dict[str, Any]:
        key = tuple(sorted(changes, key=repr))
        if key not in self.cache:
            self.cache[key] = project(self.graph, self.traced, list(key), None, base=self.base,
                                      stages=self.stages, fit=self.fit)
        return self.cache[key]


def gain_sentence(doc: dict[str, Any], who: str = "fixing this") -> str:
    """"fixing this: step 48.0 -> 41.2 ms, -14.2%" from a projection."""
    return (f"{who}: step {doc['baseline_step_ms']:.1f} -> {doc['projected_step_ms']:.1f} ms, "
            f"{-(doc['gain_pct'] or 0.0):+.1f}%")


def _gain_of(doc: dict[str, Any], change: Change) -> dict[str, Any]:
    notes = [c["note"] for c in doc.get("changes") or [] if c.get("note")]
    return {"change": change.describe(), "baseline_step_ms": doc["baseline_step_ms"],
            "projected_step_ms": doc["projected_step_ms"], "gain_ms": doc["gain_ms"],
            "gain_pct": doc["gain_pct"], "interval_ms": doc["interval_ms"],
            "sentence": gain_sentence(doc), "note": "; ".join(notes) or None}


def attach_gains(findings: list[Finding], proj: Projector | None, unfit_why: str) -> None:
    """Each finding's `projected_gain` (or None and `projected_gain_why`): its change replayed
    by `proj`; None for all when there is no graph or the replay is unfit (`unfit_why`)."""
    for f in findings:
        change, why = finding_change(f)
        if change is None:
            f.projected_gain, f.projected_gain_why = None, why
            continue
        if proj is None or not proj.fit.get("fit_for_projection"):
            f.projected_gain, f.projected_gain_why = None, unfit_why
            continue
        doc = proj.project([change])
        if doc.get("projected_step_ms") is None:
            f.projected_gain, f.projected_gain_why = None, "no traced step could be projected"
            continue
        f.projected_gain, f.projected_gain_why = _gain_of(doc, change), None


def top_two(findings: list[Finding], proj: Projector | None) -> dict[str, Any] | None:
    """What fixing the first two findings with a positive projected gain (in report order)
    together gives: one replay with both changes, against the two gains apart. None when
    fewer than two findings have a gain."""
    picked = [(i, f) for i, f in enumerate(findings)
              if f.projected_gain and (f.projected_gain.get("gain_ms") or 0) > 0][:2]
    if proj is None or len(picked) < 2:
        return None
    changes = [c for _, f in picked for c in [finding_change(f)[0]] if c is not None]
    doc = proj.project(changes)
    if doc.get("projected_step_ms") is None:
        return None
    apart = [f.projected_gain["gain_ms"] for _, f in picked]  # type: ignore[index]
    pct = [f.projected_gain["gain_pct"] for _, f in picked]  # type: ignore[index]
    (i, a), (j, b) = picked
    return {"findings": [i, j], "kinds": [a.kind, b.kind],
            "changes": [c.describe() for c in changes],
            "baseline_step_ms": doc["baseline_step_ms"],
            "projected_step_ms": doc["projected_step_ms"], "gain_ms": doc["gain_ms"],
            "gain_pct": doc["gain_pct"], "interval_ms": doc["interval_ms"],
            "separate_gain_ms": apart, "sum_of_separate_gain_ms": round(sum(apart), 3),
            "sentence": gain_sentence(doc, f"fixing findings {i + 1} and {j + 1} together")
            + f" (apart: {-pct[0]:+.1f}% and {-pct[1]:+.1f}%; gains do not add)"}


def run_projector(ctx: RunContext, traced: pa.Table, instances: pa.Table,
                  offsets: dict[int, int], pairs: pa.Table | None, stages: dict[int, int],
                  busy: BusyTimes | None
                  ) -> tuple[Projector | None, dict[str, Any] | None, dict[str, Any] | None]:
    """The diagnosis's step graph built once: the projector of the findings' gains, and the
    report's `run.critical_path` and `run.replay` from the same replay (`busy`: the run's busy
    times, which the straggler test read)."""
    g, r, cp, rp = run_graph_docs(ctx, traced, instances, offsets, pairs, busy)
    if g is None or r is None or rp is None:
        return None, cp, rp
    return Projector(g, r, traced, rp, dict(stages)), cp, rp


def unfit_why(rp: dict[str, Any] | None) -> str:
    """Why no finding's gain is projected, from `run.replay`."""
    if rp is None:
        return "no step graph: no traced step on any rank's lane"
    return f"the replay is unfit for projection: {rp.get('why')}"
