"""Shapes more than one page draws: a rank x step heatmap (binned or on the steps present),
and an even sample of a long table (what a scatter or a histogram can show)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from uberprof.analysis.summaries import sql_table

__all__ = ["Heatmap", "binned_heatmap", "dense_heatmap", "evenly"]


@dataclass
class Heatmap:
    """A rank x step matrix, binned so the browser draws at most a few hundred columns."""

    ranks: list[int]
    x: list[int]  # first step of each column
    z: np.ndarray  # [rows, columns], NaN where no data
    steps: np.ndarray  # [rows, columns] the step behind each cell (its maximum)
    bin_steps: int  # steps per column
    bin_ranks: int  # ranks per row


def binned_heatmap(t: pa.Table, column: str, max_cols: int, max_rows: int) -> Heatmap | None:
    """Rank x step matrix of `column` (ns) in ms, the maximum over each bin so that a slow
    step is never averaged away, with the step behind each cell for drill-down."""
    if t.num_rows == 0 or column not in t.schema.names:
        return None
    lim = sql_table("SELECT min(step), max(step), min(rank), max(rank) FROM s WHERE step >= 0",
                    s=t).to_pylist()[0]
    s0, s1, r0, r1 = lim.values()
    if s0 is None:
        return None
    bs = max(1, -(-(s1 - s0 + 1) // max_cols))
    br = max(1, -(-(r1 - r0 + 1) // max_rows))
    q = sql_table(f"""
        SELECT (rank - {int(r0)}) // {int(br)} AS rb, (step - {int(s0)}) // {int(bs)} AS sb,
               max({column}) / 1e6 AS v, arg_max(step, {column}) AS at
        FROM s WHERE step >= 0 AND {column} IS NOT NULL GROUP BY ALL
    """, s=t)
    n_r = (r1 - r0) // br + 1
    n_s = (s1 - s0) // bs + 1
    # float32 ms and int32 steps: half the bytes to the browser, and precise enough
    z = np.full((n_r, n_s), np.nan, dtype=np.float32)
    at = np.full((n_r, n_s), -1, dtype=np.int32)
    rb = q.column("rb").to_numpy()
    sb = q.column("sb").to_numpy()
    z[rb, sb] = q.column("v").to_numpy(zero_copy_only=False)
    at[rb, sb] = q.column("at").to_numpy(zero_copy_only=False)
    return Heatmap(ranks=[r0 + i * br for i in range(n_r)], x=[s0 + j * bs for j in range(n_s)],
                   z=z, steps=at, bin_steps=bs, bin_ranks=br)


def dense_heatmap(t: pa.Table, column: str) -> Heatmap | None:
    """Like `binned_heatmap`, but one column per step present (traced steps are sparse)."""
    if t.num_rows == 0:
        return None
    ranks = sorted(set(t.column("rank").to_pylist()))
    steps = sorted(set(t.column("step").to_pylist()))
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: j for j, s in enumerate(steps)}
    z = np.full((len(ranks), len(steps)), np.nan)
    at = np.full((len(ranks), len(steps)), -1, dtype=np.int64)
    for r, s, v in zip(t.column("rank").to_pylist(), t.column("step").to_pylist(),
                       t.column(column).to_pylist()):
        z[ri[r], si[s]] = (v or 0) / 1e6
        at[ri[r], si[s]] = s
    return Heatmap(ranks=ranks, x=steps, z=z, steps=at, bin_steps=1, bin_ranks=1)


def evenly(t: pa.Table, limit: int) -> pa.Table:
    """At most `limit` rows of `t`, evenly spaced (all of them when there are fewer)."""
    if t.num_rows <= limit:
        return t
    return t.take(pa.array(np.linspace(0, t.num_rows - 1, limit).astype(np.int64)))
