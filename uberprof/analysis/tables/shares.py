"""What the reduce saves beside the rank and collective tables for views that would otherwise
work it out themselves (DESIGN §1: a view computes nothing):

- `time_shares`: per rank with an analysed trace, the parts that tile its traced window
  (`metrics.window_shares`) and HTA's overlap ratio (`metrics.percentages`), from the
  whole-trace breakdown;
- `run_breakdown`: the whole run's `metrics.percentages`, of its traced ranks' totals together;
- `collective_kinds`: per collective name and message size, calls, ranks, total and median
  time.

Saved as `derived/shares.json` (the first two) and `derived/collective_kinds.parquet`; read
back through `derived.read_shares` and `derived.read_collective_kinds`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables import metrics as M

__all__ = ["TIME_SHARES_SCHEMA", "read_run_breakdown", "read_time_shares", "run_breakdown",
           "time_shares", "write_collective_kinds", "write_shares"]

_TOTALS = ("window", "compute", "comm", "overlap", "exposed_comm", "memory", "idle")

TIME_SHARES_SCHEMA = pa.schema([("rank", pa.int64()), ("window_ns", pa.int64()),
                                *((f"{k}_ns", pa.int64()) for k in M.WINDOW_PARTS),
                                *((f"{k}_pct", pa.float64()) for k in M.WINDOW_PARTS),
                                ("overlap_pct", pa.float64())])


def _traced(rank_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows (RANK_SCHEMA) of the ranks with an analysed trace."""
    return [r for r in rank_rows if (r.get("traces") or 0) > 0]


def time_shares(rank_rows: list[dict[str, Any]]) -> pa.Table:
    """Per rank of `rank_rows` (RANK_SCHEMA, whole-trace breakdown): the ns of each
    metrics.WINDOW_PARTS part (`<part>_ns`), its share of the window (`<part>_pct`), and
    `overlap_pct`, |compute ∩ comm| / |comm| (HTA's ratio), by rank (TIME_SHARES_SCHEMA)."""
    rows = []
    for r in rank_rows:
        v = {c: int(r.get(f"{c}_ns") or 0) for c in _TOTALS}
        part_ns = dict(zip(M.WINDOW_PARTS, (v["compute"] - v["overlap"], v["overlap"],
                                            v["exposed_comm"], v["memory"], v["idle"])))
        rows.append({
            "rank": r["rank"], "window_ns": v["window"],
            **{f"{k}_ns": x for k, x in part_ns.items()},
            **M.window_shares(v["window"], v["compute"], v["overlap"], v["exposed_comm"],
                              v["memory"], v["idle"]),
            "overlap_pct": M.percentages(**v)["overlap_pct"],
        })
    rows.sort(key=lambda x: x["rank"])
    return pa.Table.from_pylist(rows, schema=TIME_SHARES_SCHEMA)


def run_breakdown(rank_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`metrics.percentages` of the totals of `rank_rows` together (compute_pct,
    exposed_comm_pct, idle_pct, ...)."""
    return M.percentages(**{p: sum(r.get(f"{p}_ns") or 0 for r in rank_rows) for p in _TOTALS})


def write_shares(derived: Path, rank_rows: list[dict[str, Any]]) -> None:
    """derived/shares.json: the traced ranks' `time_shares` and the run's breakdown (both
    null without a traced rank)."""
    traced = _traced(rank_rows)
    D.write_shares(derived, {"ranks": time_shares(traced).to_pylist() if traced else None,
                             "run": run_breakdown(traced) if traced else None})


def read_time_shares(derived: Path) -> pa.Table | None:
    """The saved `time_shares` of the traced ranks; None without one (or none saved)."""
    rows = (D.read_shares(derived) or {}).get("ranks")
    return pa.Table.from_pylist(rows, schema=TIME_SHARES_SCHEMA) if rows else None


def read_run_breakdown(derived: Path) -> dict[str, Any] | None:
    """The saved `run_breakdown`; None without a traced rank (or none saved)."""
    return (D.read_shares(derived) or {}).get("run")


def write_collective_kinds(derived: Path) -> None:
    """derived/collective_kinds.parquet from the run's collectives table: per collective name
    (the event's where it has none) and message size (input bytes, else output), the calls, the
    ranks, total and median time in ms, by total time."""
    with duckdb.connect() as con:
        con.register("c", D.read_collectives(derived))
        t = con.sql("""
            SELECT coalesce(name, event) AS name, coalesce(in_bytes, out_bytes) AS bytes,
                   count(*) AS calls, count(DISTINCT rank) AS ranks,
                   sum(end_ns - start_ns) / 1e6 AS total_ms,
                   median(end_ns - start_ns) / 1e6 AS median_ms
            FROM c GROUP BY ALL ORDER BY total_ms DESC
        """).to_arrow_table()
    D.write_collective_kinds(derived, t)
