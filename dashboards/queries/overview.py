"""What the overview (`/`) shows: the numbers behind its cards and its rank x step heatmap of
step time. The findings and the per-rank breakdown come from the core (`RunData.findings`,
`RunData.breakdown_by_rank`)."""

from __future__ import annotations

from typing import Any

from uberprof.analysis.read import HEATMAP_COLS, HEATMAP_ROWS, step_quantiles
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries.tables import Heatmap, heatmap_of_series

__all__ = ["health", "step_heatmap"]


def health(run: RunData) -> dict[str, Any]:
    """The numbers behind the overview's cards: ranks, hosts, steps, host step time over every
    step of every rank (median, p90), the run's breakdown (`read.OpenedRun.run_breakdown`: the
    ranks' totals together), the straggler and the findings by severity. While the diagnosis is
    made in the background (`RunData.diagnosis_pending`), without them and not kept."""
    if run.diagnosis_pending():
        return _health(run, pending=True)
    return run.once("health", lambda: _health(run))


def _health(run: RunData, pending: bool = False) -> dict[str, Any]:
    ranks = run.ranks()
    hosts = sorted({h for h in (run.host_of(r) for r in ranks) if h})
    saved = run.saved_overview()
    # the analysis' step-time quantiles: saved by the reduce, else of the steps shown now
    quantiles = saved.quantiles if saved is not None else step_quantiles(run.steps)
    out: dict[str, Any] = {
        "run_id": run.label, "path": str(run.root),
        "ranks": len(ranks), "hosts": len(hosts), "host_names": hosts,
        **quantiles,
        "traced_steps": run.traced_steps(),
        "device": None, "backend": None, "breakdown": None,
        "findings": {"high": 0, "medium": 0, "low": 0},
        "straggler": None, "diagnosis_error": run.diagnosis_error,
        "diagnosis_pending": pending,
    }
    rt = run.rank_table()
    if rt is not None and run.opened is not None:
        out["breakdown"] = run.opened.run_breakdown()
        modes = set(rt.column("mode").to_pylist())
        out["device"] = next((d for d, m in zip(rt.column("device_type").to_pylist(),
                                                rt.column("mode").to_pylist())
                              if m == "device"), None) or ("cpu" if modes else None)
    d = None if pending else run.diagnose()
    if d is not None:
        out["backend"] = d.run["backend"]
        for f in d.findings:
            out["findings"][f.severity] = out["findings"].get(f.severity, 0) + 1
        s = d.straggler
        if s is not None:
            named = next((f for f in d.findings if f.kind == "straggler"), None)
            out["straggler"] = {"rank": s.rank, "cause": s.cause, "last": s.last,
                                "instances": s.instances, "lead_ms": s.median_lead_ns / 1e6,
                                "delay_ms": s.delay_ns / 1e6, "host": run.host_of(s.rank),
                                "confidence": named.confidence if named else "confirmed"}
        # what the straggler test decided and why, also when it named nobody
        out["straggler_test"] = d.run["straggler_test"]
        out["analysed_wall_ms"] = d.run["analysed_wall_ms"]
        out["residual_us"] = max((h.residual_ns or 0 for h in d.alignment.hosts),
                                 default=0) / 1e3
    return out


def step_heatmap(run: RunData, column: str = "step_time_ns", max_cols: int = HEATMAP_COLS,
                 max_rows: int = HEATMAP_ROWS) -> Heatmap | None:
    """Rank x step matrix of `column` in ms (`tables.heatmap_of_series`), built once (per
    refresh of a run followed while its job runs: from the steps read since, no table)."""
    saved = run.saved_overview()
    if saved is not None and (column, max_cols, max_rows) == ("step_time_ns", HEATMAP_COLS,
                                                              HEATMAP_ROWS):
        return saved.heatmap  # binned by the analysis, the same way
    return run.once(f"heatmap:{column}:{max_cols}:{max_rows}",
                    lambda: heatmap_of_series(run.step_series(column), max_cols, max_rows))
