"""What `/gaps` shows: idle time by rank and cause (the diagnosis's summaries), gap durations
for a histogram, and the longest gaps with what the host was doing (the diagnosis's
`top_gaps`: each rank's longest, with their host context)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.read import sql_table
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries.tables import evenly

__all__ = ["gap_durations", "gaps_by_rank", "largest_gaps"]


def gaps_by_rank(run: RunData) -> pa.Table | None:
    """Idle time (ms) and gap count by rank and cause (the diagnosis's summaries)."""
    def build() -> pa.Table | None:
        d = run.diagnose()
        if d is None:
            return None
        return sql_table("SELECT rank, cause, idle_ns / 1e6 AS ms, gaps FROM g "
                         "ORDER BY rank, cause", g=d.summaries.idle)
    return run.once("gaps_by_rank", build)


def _gaps_of(run: RunData, rank: int | None) -> pa.Table | None:
    d = run.diagnose()
    if d is None or d.gaps.num_rows == 0:
        return None
    return d.gaps if rank is None else d.gaps.filter(pc.equal(d.gaps.column("rank"), rank))


def gap_durations(run: RunData, rank: int | None = None, limit: int = 20_000
                  ) -> pa.Table | None:
    """Gap durations (ns) with cause, for a histogram (evenly sampled beyond `limit`)."""
    g = _gaps_of(run, rank)
    return None if g is None else evenly(g, limit).select(["rank", "step", "cause", "dur_ns"])


def largest_gaps(run: RunData, rank: int | None = None, limit: int = 15) -> list[dict[str, Any]]:
    """The longest gaps with what the host was doing, longest first: of the whole run, or of
    one rank (the diagnosis keeps each rank's 5 longest: `Diagnosis.top_gaps`)."""
    d = run.diagnose()
    if d is None or _gaps_of(run, None) is None:
        return []
    mine = [g for g in d.top_gaps if rank is None or g["rank"] == rank]
    return sorted(mine, key=lambda g: -g["dur_ns"])[:limit]
