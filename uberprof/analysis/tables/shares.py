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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables import quantiles as Q

__all__ = ["COLLECTIVE_KINDS_SCHEMA", "TIME_SHARES_SCHEMA", "collective_kinds", "read_run_breakdown", "read_time_shares", "run_breakdown",
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


COLLECTIVE_KINDS_SCHEMA = pa.schema([("name", pa.string()), ("bytes", pa.int64()),
                                     ("calls", pa.int64()), ("ranks", pa.int64()),
                                     ("total_ms", pa.float64()), ("median_ms", pa.float64())])


def _kind_groups(c: pa.Table) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """Each collective's kind: (the kinds' names, their sizes, each row's kind index), the name
    being the collective's (the event's where it has none), the size its input bytes (else
    output). One kind per distinct (name, size), nulls included as values of their own."""
    name = pc.coalesce(c.column("name"), c.column("event")).combine_chunks().dictionary_encode()
    size = pc.coalesce(c.column("in_bytes"), c.column("out_bytes")).combine_chunks()
    n_idx = name.indices.fill_null(-1).to_numpy().astype(np.int64)
    s_val = size.fill_null(0).to_numpy().astype(np.int64)
    s_null = size.is_null().to_numpy(zero_copy_only=False).astype(np.int64)
    keys = np.stack([n_idx, s_null, s_val], axis=1)
    uniq, first, group = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    names = pc.take(name.dictionary, pa.array(np.where(uniq[:, 0] < 0, None, uniq[:, 0]),
                                                pa.int64()))
    sizes = pc.take(size, pa.array(first, pa.int64()))
    return names, sizes, group.reshape(-1)


def collective_kinds(c: pa.Table) -> pa.Table:
    """Per collective kind (`_kind_groups`) of the collectives table `c`: the calls, the ranks,
    total and median time in ms, by total time (then name and size, for a stable order)."""
    if c.num_rows == 0:
        return COLLECTIVE_KINDS_SCHEMA.empty_table()
    names, sizes, group = _kind_groups(c)
    n = len(names)
    dur = pc.subtract(c.column("end_ns"), c.column("start_ns")).combine_chunks()
    ok = dur.is_valid().to_numpy(zero_copy_only=False)
    d = dur.fill_null(0).to_numpy().astype(np.int64)
    timed = np.bincount(group[ok], minlength=n)
    totals = np.zeros(n, dtype=np.int64)
    np.add.at(totals, group[ok], d[ok])
    rank = c.column("rank").combine_chunks()
    pairs = np.unique(np.stack([group, rank.fill_null(-1).to_numpy().astype(np.int64)], 1)
                      [rank.is_valid().to_numpy(zero_copy_only=False)], axis=0)
    medians = Q.group_quantiles(group[ok], d[ok], n, 0.5)
    t = pa.table({
        "name": names, "bytes": sizes, "calls": np.bincount(group, minlength=n),
        "ranks": np.bincount(pairs[:, 0], minlength=n) if len(pairs) else np.zeros(n, np.int64),
        "total_ms": pa.array(totals / 1e6, mask=timed == 0),
        "median_ms": pa.array(medians / 1e6, mask=timed == 0)}, schema=COLLECTIVE_KINDS_SCHEMA)
    return t.sort_by([("total_ms", "descending"), ("name", "ascending"),
                      ("bytes", "ascending")])


def write_collective_kinds(derived: Path) -> None:
    """derived/collective_kinds.parquet: `collective_kinds` of the run's collectives table."""
    D.write_collective_kinds(derived, collective_kinds(D.read_collectives(derived)))
