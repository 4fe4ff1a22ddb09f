"""Per-rank summaries, computed once by the diagnosis and read by every view.

- `rank_lateness`: per rank, its lateness at the matched collectives: median, p90, how often
  it alone arrived last (`last_in`, LATENESS_SCHEMA `sole_last`: a tie for last is nobody's
  fault), in how many instances, and the delay it added. The straggler finding, the report's
  rank rows, the dashboard's ranking and the trace export all read these numbers.
- `idle_by_cause`: per rank and gap cause, the idle time in gaps over the threshold and their
  count.
(Each rank's time shares are the analysis's, saved by the reduce: `tables/shares.py`.)

Kept as small Arrow tables so that the saved diagnosis stores them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from uberprof.analysis.diagnosis.causes import GAP_CAUSES

__all__ = [
    "IDLE_SCHEMA",
    "RANK_LATENESS_SCHEMA",
    "RankSummaries",
    "idle_by_cause",
    "rank_lateness",
    "sql_rows",
    "sql_table",
    "summarise",
]

RANK_LATENESS_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    ("instances", pa.int64()),  # matched instances it took part in
    ("median_ns", pa.float64()),  # median lateness (continuous quantile)
    ("p90_ns", pa.float64()),
    ("last_in", pa.int64()),  # instances where it alone arrived last
    ("delay_ns", pa.int64()),  # the delay it alone added, summed over instances
])

IDLE_SCHEMA = pa.schema([
    ("rank", pa.int64()),
    ("cause", pa.string()),
    ("idle_ns", pa.int64()),  # time in gaps over the threshold
    ("gaps", pa.int64()),
])


def sql_table(query: str, **tables: pa.Table) -> pa.Table:
    """A DuckDB query over Arrow tables, as an Arrow table (a connection per call)."""
    # imported where used: 45-90 ms that a start reading saved tables (the dashboard's) never needs
    import duckdb

    con = duckdb.connect()
    try:
        for name, t in tables.items():
            con.register(name, t)
        return con.sql(query).to_arrow_table()
    finally:
        con.close()


def sql_rows(query: str, **tables: pa.Table) -> list[tuple[Any, ...]]:
    """Rows of a DuckDB query over Arrow tables (aggregations over per-event tables)."""
    t = sql_table(query, **tables)
    return list(zip(*(c.to_pylist() for c in t.columns)))


def rank_lateness(lat: pa.Table) -> pa.Table:
    """RANK_LATENESS_SCHEMA rows, one per rank present in `lat` (LATENESS_SCHEMA), by rank."""
    if lat.num_rows == 0:
        return RANK_LATENESS_SCHEMA.empty_table()
    t = sql_table("""
        SELECT rank, count(*) AS instances,
               quantile_cont(lateness_ns, 0.5) AS median_ns,
               quantile_cont(lateness_ns, 0.9) AS p90_ns,
               count(*) FILTER (WHERE sole_last) AS last_in,
               sum(delay_ns) AS delay_ns
        FROM l GROUP BY rank ORDER BY rank
    """, l=lat)
    return t.cast(RANK_LATENESS_SCHEMA)


def idle_by_cause(gaps: pa.Table) -> pa.Table:
    """IDLE_SCHEMA rows: idle time and gap count per rank and cause (causes without a gap are
    left out), by rank and cause."""
    if gaps.num_rows == 0:
        return IDLE_SCHEMA.empty_table()
    t = sql_table("SELECT rank, cause, sum(dur_ns) AS idle_ns, count(*) AS gaps FROM g "
             "GROUP BY rank, cause ORDER BY rank, cause", g=gaps)
    return t.cast(IDLE_SCHEMA)


@dataclass
class RankSummaries:
    """The diagnosis's per-rank tables (see the module docstring)."""

    lateness: pa.Table  # RANK_LATENESS_SCHEMA
    idle: pa.Table  # IDLE_SCHEMA

    @cached_property
    def _lateness_by_rank(self) -> dict[int, dict[str, Any]]:
        return {row["rank"]: row for row in self.lateness.to_pylist()}

    @cached_property
    def _idle_by_rank(self) -> dict[int, tuple[dict[str, int], int]]:
        out: dict[int, tuple[dict[str, int], int]] = {}
        for row in self.idle.to_pylist():
            ns, n = out.get(row["rank"], ({c: 0 for c in GAP_CAUSES}, 0))
            ns[row["cause"]] = row["idle_ns"]
            out[row["rank"]] = (ns, n + row["gaps"])
        return out

    def lateness_of(self, rank: int) -> dict[str, Any]:
        """A rank's lateness (ns), zeros and None when it took part in no matched instance."""
        return self._lateness_by_rank.get(rank) or {
            "rank": rank, "instances": 0, "median_ns": None, "p90_ns": None, "last_in": 0,
            "delay_ns": 0}

    def idle_of(self, rank: int) -> tuple[dict[str, int], int]:
        """A rank's idle ns by cause (every cause, 0 when none) and its number of gaps."""
        return self._idle_by_rank.get(rank) or ({c: 0 for c in GAP_CAUSES}, 0)


def summarise(lat: pa.Table, gaps: pa.Table) -> RankSummaries:
    """The per-rank summaries of a diagnosis's lateness and gap tables."""
    return RankSummaries(lateness=rank_lateness(lat), idle=idle_by_cause(gaps))
