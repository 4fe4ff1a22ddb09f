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

import numpy as np
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
    path: dict[str, Any] | None = None  # run.critical_path of the base replay
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


def _gain_of(doc: dict[str, Any], change: Change, stake_ms: float) -> dict[str, Any]:
    """The finding's projection, bounded by its own time at stake (docs/whatif.md, "What fixing
    each finding gains"): a fix cannot give back more of the step than the finding accounts
    for. Where the replay removes more (the change also removes time another finding counts,
    or that no finding counts), the projection is the bound and `replay_gain_ms` the replay's
    own figure, with a note that says so."""
    notes = [c["note"] for c in doc.get("changes") or [] if c.get("note")]
    out = {"change": change.describe(), "baseline_step_ms": doc["baseline_step_ms"],
           "projected_step_ms": doc["projected_step_ms"], "gain_ms": doc["gain_ms"],
           "gain_pct": doc["gain_pct"], "interval_ms": doc["interval_ms"],
           "replay_gain_ms": None}
    base, gain = doc["baseline_step_ms"], doc["gain_ms"] or 0.0
    if gain > stake_ms + 1e-3:
        step = round(base - stake_ms, 3)
        lo, hi = doc["interval_ms"] or (step, step)
        out.update(projected_step_ms=step, gain_ms=round(stake_ms, 3),
                   gain_pct=round(100 * stake_ms / base, 1) if base else None,
                   interval_ms=[max(lo, step), max(hi, step)], replay_gain_ms=gain)
        notes.append(f"the replay removes {gain:.1f} ms, more than this finding's own "
                     f"{stake_ms:.1f} ms at stake (the change also removes time that other "
                     "findings or none count): shown bounded by its time at stake")
    out["sentence"] = gain_sentence(out)
    out["note"] = "; ".join(notes) or None
    return out


def _no_gain_why(doc: dict[str, Any], path: dict[str, Any] | None, device: bool) -> str:
    """Why the replay of a finding's change gives the step nothing back: what the change found
    to remove (its entry in `changes`), and what holds the steps instead."""
    parts = []
    for c in doc.get("changes") or []:
        if c.get("note"):
            parts.append(c["note"])
            continue
        found = [f"{k.removesuffix('_ms').replace('_', ' ')} {v:g} ms" for k, v in c.items()
                 if k.endswith("_ms") and isinstance(v, (int, float))]
        parts.append("it removes " + (", ".join(found) or "what the change names") +
                     " from the step graph, none of it on a step's critical path")
    why = "the replay projects no shorter step: " + "; ".join(parts)
    if path and path.get("kind"):
        why += f" ({path['summary']})"
    if device:
        why += ("; on a GPU rank a step ends when both its host window and its device work "
                "end, so device time removed while the host is still busy with the step (or "
                "the device still waits for its launches) shortens no step")
    return why


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
        f.projected_gain = _gain_of(doc, change, f.time_at_stake_ms)
        f.projected_gain_why = None
        if (f.projected_gain["gain_ms"] or 0.0) <= 0.0:
            f.projected_gain_why = _no_gain_why(doc, proj.path, bool(proj.graph.device_lanes))


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
    # the projections read the base replay's times only: its deciding edges (one array of 2n
    # events, 29 MB at 512 ranks) went into the critical path above and are let go
    r.start_by = r.end_by = np.zeros(0, np.int64)
    return Projector(g, r, traced, rp, dict(stages), cp), cp, rp


def unfit_why(rp: dict[str, Any] | None) -> str:
    """Why no finding's gain is projected, from `run.replay`."""
    if rp is None:
        return "no step graph: no traced step on any rank's lane"
    return f"the replay is unfit for projection: {rp.get('why')}"
