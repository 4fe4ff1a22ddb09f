"""The step table's summary that the dashboard's overview draws, made once by the reduce and saved
beside the step table (`derived/overview.json` and `derived/overview_heatmap.parquet`), so that a
dashboard of an analysed run reads kilobytes instead of every rank's every step (5 M rows at 512
ranks x 10,000 steps: seconds of its start-up).

One definition of each figure, used by the reduce (saved) and by the dashboard when there is no
saved summary to read (a run followed while its job runs, a run without traces):

- `heatmap_of_series`: the rank x step heat map of a value, binned (the maximum over each bin);
- `step_quantiles`: host step time over every step of every rank (median, p90), the steps'
  count and range, the median data wait;
- the ranks present, every step present, and the traced steps.

The summary names the reduce that made it (the key `derived/reduce.json` holds, which that
reduce writes last): when the last reduce is another one (the run grew, or a reduce stopped
half-way), it is stale and nothing is read from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables import quantiles as Q
from uberprof.analysis.tables.derived import (
    OVERVIEW_FILE,
    OVERVIEW_HEATMAP_FILE,
    REDUCE_FILE,
    STEPS_FILE,
    read_whole,
    write_parquet,
)
from uberprof.rundir import write_json_atomic

__all__ = ["HEATMAP_COLS", "HEATMAP_ROWS", "OVERVIEW_COLUMNS", "Heatmap", "OverviewSummary",
           "RankSeries", "heatmap_of_series", "in_rank_step_order", "read_overview", "series_of",
           "step_quantiles", "summarise", "write_overview"]

# The overview's heat map: at most this many step columns and rank rows (binned beyond).
HEATMAP_COLS = 250
HEATMAP_ROWS = 256
OVERVIEW_COLUMNS = ["rank", "step", "step_time_ns", "data_wait_ns", "traced"]  # step table's
_VERSION = 1  # of the saved summary's layout


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


def in_rank_step_order(t: pa.Table) -> pa.Table:
    """`t` in rank and step order: itself when it already is (the reduce writes the step table
    so; sorting 5 M rows of a 512-rank x 10,000-step run took a second of a dashboard's
    start), else sorted."""
    rank, step = t.column("rank"), t.column("step")
    if t.num_rows > 1 and not rank.null_count and not step.null_count:
        r, s = rank.to_numpy(), step.to_numpy()
        if bool(((r[1:] > r[:-1]) | ((r[1:] == r[:-1]) & (s[1:] >= s[:-1]))).all()):
            return t
    return t.sort_by([("rank", "ascending"), ("step", "ascending")]) if t.num_rows > 1 else t


def series_of(t: pa.Table, column: str) -> list[RankSeries]:
    """Per rank (rank, steps, `column`), in step order, from a table of `rank`, `step` and
    `column` (sorted by rank and step here unless it already is: the reduce writes it so)."""
    if t.num_rows == 0:
        return []
    t = in_rank_step_order(t)
    r = t.column("rank").to_numpy(zero_copy_only=False)
    # in rank order: each rank's rows start where the rank changes (np.unique sorted 5 M rows
    # again for this: 0.3 s of the reduce's serial time at 512 ranks x 10,000 steps)
    first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    ranks, cut = r[first], first[1:]
    return list(zip(ranks.tolist(),
                    np.split(t.column("step").to_numpy(zero_copy_only=False), cut),
                    np.split(t.column(column).to_numpy(zero_copy_only=False), cut)))


def step_quantiles(steps: pa.Table) -> dict[str, Any]:
    """Host step time over every step (>= 0) of every rank: its median and p90 in ms, the
    number of distinct steps, the first and last, and the median data wait in ms (None where
    nothing is left to take them from). Numpy, not a query: `quantiles.py` says why."""
    s = steps.filter(pc.and_(pc.is_valid(steps.column("step_time_ns")),
                             pc.greater_equal(steps.column("step"), 0)))  # null: dropped
    step = s.column("step").to_numpy()
    time_ns = s.column("step_time_ns").to_numpy()
    ms, p90 = Q.quantile_cont(time_ns, 0.5), Q.quantile_cont(time_ns, 0.9)
    wait_med = Q.quantile_cont(s.column("data_wait_ns").drop_null().to_numpy(), 0.5)
    return {"step_ms_median": None if ms is None else ms / 1e6,
            "step_ms_p90": None if p90 is None else p90 / 1e6,
            "steps": pc.count_distinct(s.column("step")).as_py(),
            "first_step": int(step.min()) if step.size else None,
            "last_step": int(step.max()) if step.size else None,
            "data_wait_ms_median": None if wait_med is None else wait_med / 1e6}


def _unique_sorted(a: pa.ChunkedArray) -> list[int]:
    return sorted(x for x in pc.unique(a).to_pylist() if x is not None)


@dataclass
class OverviewSummary:
    """What the overview draws from the step table: the ranks and steps present, the traced
    steps, `step_quantiles` and the heat map of host step time."""

    ranks: list[int]
    all_steps: list[int]
    traced_steps: list[int]
    quantiles: dict[str, Any]
    heatmap: Heatmap | None


def summarise(steps: pa.Table) -> OverviewSummary:
    """The overview's summary of a step table (`rank`, `step`, `step_time_ns`, `data_wait_ns`,
    `traced`: the run's steps as the dashboard reads them)."""
    traced = steps.filter(pc.equal(steps.column("traced"), True)) if steps.num_rows else steps
    return OverviewSummary(
        ranks=_unique_sorted(steps.column("rank")) if steps.num_rows else [],
        all_steps=_unique_sorted(steps.column("step")),
        traced_steps=_unique_sorted(traced.column("step")),
        quantiles=step_quantiles(steps),
        heatmap=heatmap_of_series(series_of(steps.select(["rank", "step", "step_time_ns"]),
                                            "step_time_ns"), HEATMAP_COLS, HEATMAP_ROWS))


def _reduce_key(derived: Path) -> str | None:
    """The key of the last reduce (`derived/reduce.json`, written after its tables)."""
    doc = orjson.loads((derived / REDUCE_FILE).read_bytes())
    return doc.get("key") if isinstance(doc, dict) else None


def write_overview(derived: Path, key: str, steps: pa.Table | None = None) -> OverviewSummary:
    """Summarise the run's step table (`derived/steps.parquet`, just written by the reduce whose
    key is `key`; or `steps`, its OVERVIEW_COLUMNS as the reduce wrote them) and save the
    summary beside it: the heat map first, then the document that names the reduce."""
    if steps is None:
        steps = read_whole(derived / STEPS_FILE, OVERVIEW_COLUMNS)
    s = summarise(steps)
    hm = s.heatmap
    if hm is not None:
        n_r, n_s = hm.z.shape
        write_parquet(pa.table({
            "rank": pa.array(hm.ranks, pa.int64()),
            "z": pa.FixedSizeListArray.from_arrays(pa.array(hm.z.reshape(-1), pa.float32()),
                                                   n_s),
            "step": pa.FixedSizeListArray.from_arrays(
                pa.array(hm.steps.reshape(-1), pa.int32()), n_s)}),
            derived / OVERVIEW_HEATMAP_FILE)
        assert n_r == len(hm.ranks)
    else:
        (derived / OVERVIEW_HEATMAP_FILE).unlink(missing_ok=True)
    write_json_atomic(derived / OVERVIEW_FILE, {
        "version": _VERSION, "reduce_key": key,
        "ranks": s.ranks, "all_steps": s.all_steps, "traced_steps": s.traced_steps,
        "quantiles": s.quantiles,
        "heatmap": None if hm is None else {"x": hm.x, "bin_steps": hm.bin_steps,
                                            "bin_ranks": hm.bin_ranks}})
    return s


def read_overview(derived: Path) -> OverviewSummary | None:
    """The saved summary, or None when there is none, it is unreadable, or it was made by
    another reduce than the last one (`reduce.json`: its tables are not the summary's)."""
    try:
        doc = orjson.loads((derived / OVERVIEW_FILE).read_bytes())
        if not isinstance(doc, dict) or doc.get("version") != _VERSION or \
                doc.get("reduce_key") != _reduce_key(derived):
            return None
        hm = None
        if doc.get("heatmap") is not None:
            h = doc["heatmap"]
            t = read_whole(derived / OVERVIEW_HEATMAP_FILE)
            n_r, n_s = t.num_rows, len(h["x"])
            z = t.column("z").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            at = t.column("step").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            hm = Heatmap(ranks=t.column("rank").to_pylist(), x=list(h["x"]),
                         z=z.reshape(n_r, n_s).astype(np.float32, copy=True),
                         steps=at.reshape(n_r, n_s).astype(np.int32, copy=True),
                         bin_steps=int(h["bin_steps"]), bin_ranks=int(h["bin_ranks"]))
        return OverviewSummary(ranks=list(doc["ranks"]), all_steps=list(doc["all_steps"]),
                               traced_steps=list(doc["traced_steps"]),
                               quantiles=dict(doc["quantiles"]), heatmap=hm)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
