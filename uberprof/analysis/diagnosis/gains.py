"""What fixing each finding would gain: the finding's remedy as a what-if change
(`whatif_changes.Change`), replayed once on the step graph the diagnosis already built, and
what fixing the top two findings together would give (one composed replay: gains do not add).

The mapping, finding kind -> change (`finding_change`):

| finding | change |
|---|---|
| `straggler` | its rank's extra work at the others' median (`--remove straggler`) |
| `data_stall` | data-loader waits removed (`--remove data`) |
| `exposed_comm` | communication hidden where the graph allows (`--remove exposed-comm`) |
| `tp_exposed_comm` | the same, for the tensor-parallel groups' collectives only |
| `bandwidth` | its class's transfers (its message size) at the link's peak (`--link-scale`) |
| `launch_bound` | launch overhead removed (`--remove launch`) |
| `idle` (cause `sync`) | host synchronisation waits removed (`--remove sync`) |
| `pipeline_imbalance` | stages' compute at their mean (`--balance-stages`) |

Every other finding (a hang or crash, host work or another stream as idle causes, throttled
clocks, a saturated host) has no change the replay can make: its `projected_gain` is null and
`projected_gain_why` says so; so is every finding's when the replay is unfit for projection.
Cost: one replay per distinct change (cached), on the graph and base replay of the report's
critical path; no second analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from uberprof.analysis.diagnosis.busy import BusyTimes
from uberprof.analysis.diagnosis.model import CONTEXT_KINDS, FAILURE_KINDS, Finding
from uberprof.analysis.diagnosis.whatif import project, run_graph_docs
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.graph import StepGraph
from uberprof.analysis.tables.replay import Replay

__all__ = ["Projector", "attach_gains", "finding_change", "gain_sentence", "run_projector",
           "top_two", "unfit_why"]


def finding_change(f: Finding) -> tuple[Change | None, str]:
    """The change that fixing `f` amounts to in the replay (module docstring), or None and
    why there is none."""
    ev = f.evidence or {}
    if f.kind in FAILURE_KINDS:
        return None, "a job that stops: there is no step to replay without it"
    if f.kind == "straggler" and f.ranks:
        return Change("straggler", rank=int(f.ranks[0])), ""
    if f.kind == "data_stall":
        return Change("data"), ""
    if f.kind == "exposed_comm":
        return Change("exposed-comm"), ""
    if f.kind == "tp_exposed_comm":
        groups = tuple(tuple(int(r) for r in g) for g in ev.get("tp_groups") or [] if g)
        return (Change("exposed-comm", groups=groups), "") if groups else \
            (None, "the tensor-parallel groups are not known: nothing to scope the change to")
    if f.kind == "bandwidth":
        peak, bus, size = ev.get("peak_gbit_s"), ev.get("busbw_gbit_s"), ev.get("bytes")
        if not peak or not bus or not size:
            return None, ("no peak known for its link: nothing to scale its transfers to "
                          "(uberprof calibrate measures one)")
        return Change("link", max(float(peak) / float(bus), 1.0), sizes=(int(size),)), ""
    if f.kind == "launch_bound":
        return Change("launch"), ""
    if f.kind == "idle" and f.cause == "sync":
        return Change("sync"), ""
    if f.kind == "pipeline_imbalance":
        return Change("balance"), ""
    if f.kind == "idle":
        return None, (f"no what-if change models idle time of cause '{f.cause}' (uberprof "
                      "whatif --op projects a faster operator)")
    if f.kind in CONTEXT_KINDS:
        return None, "it explains other findings and stakes no time of its own"
    return None, f"no what-if change models a '{f.kind}' finding"


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
