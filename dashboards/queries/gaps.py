"""What `/gaps` shows: idle time by rank and cause (the diagnosis's summaries), gap durations
for a histogram, and the longest gaps with what the host was doing
(`uberprof.analysis.diagnosis.gaps.gap_context`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.summaries import sql_table
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
    """The longest gaps with what the host was doing (of one rank, or of the whole run)."""
    d = run.diagnose()
    if _gaps_of(run, None) is None:
        return []
    if rank is None:
        return run.once("largest_gaps", lambda: sorted(d.top_gaps,
                                                       key=lambda g: -g["dur_ns"])[:limit])

    def build() -> list[dict[str, Any]]:
        from uberprof.analysis.diagnosis.gaps import gap_context

        mine = _gaps_of(run, rank)
        if mine is None or mine.num_rows == 0:
            return []
        try:
            events = run.ctx.events(rank)
        except (KeyError, OSError):
            return [{**g, "host": None} for g in mine.sort_by(
                [("dur_ns", "descending")]).slice(0, limit).to_pylist()]
        return [{**g, "rank": rank} for g in gap_context(events, mine, limit)]
    return run.once(f"largest_gaps:{rank}:{limit}", build)
