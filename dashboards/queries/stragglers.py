"""What `/stragglers` shows: lateness per rank and step, the ranks ordered by lateness (the
diagnosis's per-rank summaries, `Diagnosis.summaries`), the rank of median lateness that the
straggler is set beside, and the straggler's excess per step by factor."""

from __future__ import annotations

from typing import Any

from uberprof.analysis.read import sql_table
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries.tables import Heatmap, dense_heatmap

__all__ = ["lateness_heatmap", "lateness_ranking", "median_rank", "straggler_factors"]


def lateness_heatmap(run: RunData) -> Heatmap | None:
    """Rank x step of each rank's largest lateness (ms) over the step's collectives."""
    def build() -> Heatmap | None:
        d = run.diagnose()
        if d is None or d.lateness.num_rows == 0:
            return None
        per = sql_table("SELECT rank, step, max(lateness_ns) AS lateness_ns FROM l GROUP BY ALL",
                        l=d.lateness)
        return dense_heatmap(per, "lateness_ns")
    return run.once("lateness_heatmap", build)


def lateness_ranking(run: RunData) -> list[dict[str, Any]]:
    """Ranks ordered by how late they arrive: median and p90 lateness, times alone last
    (the diagnosis's per-rank summaries)."""
    def build() -> list[dict[str, Any]]:
        d = run.diagnose()
        if d is None or d.summaries.lateness.num_rows == 0:
            return []
        rows = sql_table("""
            SELECT rank, instances, median_ns / 1e6 AS median_ms, p90_ns / 1e6 AS p90_ms,
                   last_in, delay_ns / 1e6 AS delay_ms
            FROM l ORDER BY median_ms DESC, rank
        """, l=d.summaries.lateness).to_pylist()
        return [{**row, "host": run.host_of(row["rank"])} for row in rows]
    return run.once("lateness_ranking", build)


def median_rank(run: RunData) -> int | None:
    """The rank of median lateness (the straggler's yardstick), never the straggler."""
    straggler = run.straggler_rank()
    ranking = [r for r in lateness_ranking(run) if r["rank"] != straggler]
    if not ranking:
        others = [r for r in run.ranks() if r != straggler]
        return others[len(others) // 2] if others else None
    return ranking[len(ranking) // 2]["rank"]


def straggler_factors(run: RunData) -> dict[str, Any]:
    """The straggler's per-step excess over the others, by factor (ms), and its counters."""
    s = run.straggler()
    if s is None:
        return {}
    return {"factors_ms": {k: v / 1e6 for k, v in s.factors.items()},
            "counters": dict(s.counters)}
