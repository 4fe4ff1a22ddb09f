"""Shapes more than one page draws: a rank x step heatmap (binned or on the steps present),
and an even sample of a long table (what a scatter or a histogram can show)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from uberprof.analysis.read import Heatmap, RankSeries, heatmap_of_series

__all__ = ["Heatmap", "RankSeries", "dense_heatmap", "evenly", "heatmap_of_series"]


# The binned heat map is defined once, in the analysis (the reduce saves the overview's):
# `uberprof.analysis.tables.overview`, read through `uberprof.analysis.read`.


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
