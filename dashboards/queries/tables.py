"""Shapes more than one page draws: a rank x step heatmap (binned or on the steps present),
and an even sample of a long table (what a scatter or a histogram can show)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["Heatmap", "RankSeries", "dense_heatmap", "evenly", "heatmap_of_series"]


@dataclass
class Heatmap:
    """A rank x step matrix, binned so the browser draws at most a few hundred columns."""

    ranks: list[int]
    x: list[int]  # first step of each column
    z: np.ndarray  # [rows, columns], NaN where no data
    steps: np.ndarray  # [rows, columns] the step behind each cell (its maximum)
    bin_steps: int  # steps per column
    bin_ranks: int  # ranks per row


RankSeries = tuple[int, np.ndarray, np.ndarray]
"""(rank, its steps, a value per step in ns): one row of a heat map before binning."""


def heatmap_of_series(series: list[RankSeries], max_cols: int, max_rows: int
                      ) -> Heatmap | None:
    """Rank x step matrix in ms, the maximum over each bin so that a slow step is never
    averaged away, with the step behind each cell for drill-down. Linear in the rows (a dense
    matrix reshaped into bins, no sort): a 64-rank x 100,000-step run in a fraction of a
    second, what a page following a running job redraws every few seconds."""
    parts = []
    for r, s, v in series:
        s = np.asarray(s)
        v = np.asarray(v, dtype=np.float64)  # a None became NaN
        ok = (s >= 0) & np.isfinite(v)
        if ok.any():
            parts.append((int(r), s[ok].astype(np.int64), v[ok]))
    if not parts:
        return None
    s0 = min(int(s.min()) for _, s, _ in parts)
    s1 = max(int(s.max()) for _, s, _ in parts)
    r0 = min(r for r, _, _ in parts)
    r1 = max(r for r, _, _ in parts)
    bs = max(1, -(-(s1 - s0 + 1) // max_cols))
    br = max(1, -(-(r1 - r0 + 1) // max_rows))
    n_s = (s1 - s0) // bs + 1
    n_r = (r1 - r0) // br + 1
    # float32 ms and int32 steps: half the bytes (and memory here), and precise enough
    dense = np.full((n_r, n_s * bs), -np.inf, dtype=np.float32)
    for r, s, v in parts:
        ms = (v / 1e6).astype(np.float32)
        if br == 1:  # one rank per row: a plain assignment
            dense[r - r0, s - s0] = ms
        else:
            row = dense[(r - r0) // br]  # a rank's steps are distinct: no repeated index
            row[s - s0] = np.maximum(row[s - s0], ms)
    cells = dense.reshape(n_r, n_s, bs)
    arg = cells.argmax(axis=2)
    z = np.take_along_axis(cells, arg[..., None], axis=2)[..., 0]
    empty = ~np.isfinite(z)
    z[empty] = np.nan
    at = (s0 + np.arange(n_s, dtype=np.int64)[None, :] * bs + arg).astype(np.int32)
    at[empty] = -1
    return Heatmap(ranks=[r0 + i * br for i in range(n_r)], x=[s0 + j * bs for j in range(n_s)],
                   z=z, steps=at, bin_steps=bs, bin_ranks=br)


def dense_heatmap(t: pa.Table, column: str) -> Heatmap | None:
    """Like `heatmap_of_series`, but one column per step present (traced steps are sparse)."""
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
