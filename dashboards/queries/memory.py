"""What `/memory` shows: each rank's memory summary from the saved run document
(`run.memory`, `analysis/diagnosis/memory.py`), the GPU's peak and in-use bytes per step from
the step timeline the analysis saved (`read.OpenedRun.step_timelines`' rows, of the drawn ranks
only), and each rank process's
resident set size over time from the counters (`proc` `mem.rss`, `rank:<r>`). The analysis
made every number; this module picks them out, so a diagnosis saved without `memory` (an older
uberprof) reads as "nothing to show".

The memory timeline of the trace windows (`uberprof run --profile-memory`): the allocator's
allocated bytes after each allocation and free, per rank, from the memory table the analysis
saved (`derived/memory.parquet`, read through the run's tables), over the steps the diagnosis's
`run.memory_timeline` entry covers, and that entry's peak (its moment, step and operator). A
long window is thinned for drawing to each time bucket's lowest and highest points, so the
peak and the troughs stay where they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.read import sql_table
from uberprof.dashboards.data import RunData

__all__ = ["MAX_LINES", "MAX_POINTS", "MAX_TABLE_ROWS", "GpuSeries", "WindowSeries", "basis",
           "gpu_series", "rss_series", "summary", "table_rows", "timeline_entries",
           "timeline_note", "timeline_series"]

MAX_LINES = 16  # ranks drawn: the highest peaks (and the selected rank)
MAX_TABLE_ROWS = 16  # ranks in the page's table: the highest peaks (and the selected rank);
# every cell is a Dash component, and Dash's renderer checks every component at each store
# update: 64 rows (932 components) kept Chromium busy ~7 s at 512 ranks, 16 rows ~1 s
MAX_POINTS = 4000  # points drawn per line of the memory timeline (thinned beyond)
STEP_BUCKETS = 300  # GPU memory per step: beyond this many steps, each bucket's extremes drawn


@dataclass(frozen=True)
class GpuSeries:
    """One rank's GPU memory at each step boundary (bytes)."""

    rank: int
    steps: np.ndarray
    peak: np.ndarray  # all-time peak allocated so far (NaN where not read)
    in_use: np.ndarray  # allocated at the boundary
    thinned: bool = False  # only each bucket of steps' lowest and highest points (drawing)


@dataclass(frozen=True)
class WindowSeries:
    """One rank's (and device's) allocated bytes over its trace window, and the saved peak."""

    rank: int
    device: str
    ms: np.ndarray  # from the start of its first analysed step (`start_ns`)
    allocated: np.ndarray  # bytes after each event
    peak_ms: float
    peak_bytes: int
    peak_step: int | None
    peak_operator: str | None
    thinned: bool  # the line keeps each time bucket's lowest and highest points only


def _run_doc(data: RunData, key: str) -> dict[str, Any]:
    """`run.<key>` of the saved diagnosis, {} when there is none."""
    d = data.diagnose()
    return (d.run[key] if d is not None else None) or {}


def _memory(data: RunData) -> dict[str, Any]:
    return _run_doc(data, "memory")


def summary(data: RunData) -> list[dict[str, Any]]:
    """`run.memory.ranks`: one row per rank (docs/json.md), in rank order."""
    return list(_memory(data).get("ranks") or [])


def table_rows(data: RunData, selected: int | None = None) -> list[dict[str, Any]]:
    """The summary rows the page's table shows, in rank order: every rank up to
    MAX_TABLE_ROWS, else the highest GPU (else host) peaks, with the selected rank among them.
    A 512-row table (6,656 cells) kept the browser busy for minutes at 512 ranks, 64 rows
    for seconds; every rank is in `run.memory.ranks` (`uberprof report --json`)."""
    rows = summary(data)
    if len(rows) <= MAX_TABLE_ROWS:
        return rows
    key = "gpu_peak_bytes" if any(r.get("gpu_peak_bytes") for r in rows) else "rss_peak_bytes"
    keep = sorted(rows, key=lambda r: -(r.get(key) or 0))[:MAX_TABLE_ROWS]
    if selected is not None and all(r["rank"] != selected for r in keep):
        keep = keep[:-1] + [r for r in rows if r["rank"] == selected]
    return sorted(keep, key=lambda r: r["rank"])


def basis(data: RunData) -> str | None:
    return _memory(data).get("basis")


def drawn_ranks(data: RunData, selected: int | None = None) -> list[int]:
    """The ranks drawn: all up to MAX_LINES, else the highest GPU (else host, else trace
    window) peaks, with the selected rank among them."""
    rows = summary(data)
    if not rows:  # only the trace window's timeline (a CPU run without counters)
        rows = [{"rank": e["rank"], "window_peak": e.get("peak_allocated_bytes")}
                for e in timeline_entries(data)]
        rows = list({r["rank"]: r for r in sorted(rows, key=lambda r: r["window_peak"] or 0)
                     }.values())
    ranks = sorted(r["rank"] for r in rows)
    if len(ranks) <= MAX_LINES:
        return ranks
    key = ("gpu_peak_bytes" if any(r.get("gpu_peak_bytes") for r in rows) else
           "rss_peak_bytes" if any(r.get("rss_peak_bytes") for r in rows) else "window_peak")
    keep = [r["rank"] for r in sorted(rows, key=lambda r: -(r.get(key) or 0))[:MAX_LINES]]
    if selected in ranks and selected not in keep:
        keep[-1] = selected
    return sorted(keep)


def gpu_series(data: RunData, ranks: list[int]) -> list[GpuSeries]:
    """Per rank in `ranks`, its GPU memory per step from the saved step timeline; ranks
    without any are left out. Only the drawn ranks' timelines are read (each once): at 512
    ranks x 10,000 steps reading every rank's took 7.7 of the page's 9.9 s."""
    out = []
    for r in ranks:
        x = data.once(f"memory-timeline:{r}", lambda r=r: _gpu_timeline(data, r))
        if x is None or not x.num_rows or x.column("gpu_mem_bytes").null_count == x.num_rows:
            continue
        steps = x.column("step").to_numpy(zero_copy_only=False)
        peak = x.column("gpu_mem_peak_bytes").to_numpy(zero_copy_only=False).astype(float)
        in_use = x.column("gpu_mem_bytes").to_numpy(zero_copy_only=False).astype(float)
        keep = _bucket_extremes(in_use, peak)
        out.append(GpuSeries(rank=r, steps=steps[keep], peak=peak[keep], in_use=in_use[keep],
                             thinned=keep.size < steps.size))
    return out


def _bucket_extremes(in_use: np.ndarray, peak: np.ndarray,
                     buckets: int = STEP_BUCKETS) -> np.ndarray:
    """Which steps to draw: all of them up to 3 x `buckets`, else in each of `buckets` runs
    of consecutive steps the lowest and highest in-use points, the highest peak and the last
    step, so a spike, a trough and the peak's climb stay where they are. 10,000 steps of 16
    ranks drawn whole (320,000 points, dashed half of them) kept Chromium busy for minutes."""
    n = in_use.size
    if n <= 3 * buckets:
        return np.arange(n)
    b = np.arange(n) * buckets // n
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    ends = np.r_[starts[1:], n] - 1
    picks = [ends]
    for v in (in_use, -in_use, -peak):
        order = np.lexsort((np.nan_to_num(v, nan=np.inf), b))  # bucket, then value (NaN last)
        picks.append(order[starts])
    return np.unique(np.concatenate(picks))


def _rank_folder(data: RunData, rank: int) -> Any:
    """The rank's folder in the run directory (`rundir.ranks_by_id`'s), None for a folder of
    traces. The folder named after the rank when its rank.json says so (one small read, not
    512 of them), else the run's map of every folder."""
    from uberprof.rundir import RunDir, ranks_by_id, read_rank

    if not data.is_run_dir:
        return None
    first = read_rank(RunDir(data.root).ranks_dir / str(rank))
    if first.rank == rank:
        return first.folder
    folders = data.once("memory-rank-folders",
                        lambda: {r: m.folder for r, m in ranks_by_id(data.root).items()})
    return folders.get(rank)


def _gpu_timeline(data: RunData, rank: int) -> pa.Table | None:
    """One rank's step timeline as the analysis saved it: `step` and the GPU memory columns
    (the rows `OpenedRun.step_timelines` has for it); None without one."""
    folder = _rank_folder(data, rank)
    if folder is None or data.ctx is None or data.ctx.run is None:
        return None
    t = data.ctx.run.timeline(folder)
    if t is None or not t.num_rows:
        return None
    return t.select(["step", "gpu_mem_peak_bytes", "gpu_mem_bytes"])


def rss_series(data: RunData, ranks: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank in `ranks`, its process's RSS over time (s from the run's first step, bytes),
    averaged into at most a few hundred points; ranks without any are left out."""
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        node = data.node_of_rank(r)
        if node is not None:
            by_node.setdefault(node, []).append(r)
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for node, rs in by_node.items():
        cs = data.counter_series(node, "proc", "mem.rss", devices=[f"rank:{r}" for r in rs])
        if cs is None:
            continue
        for r in rs:
            if f"rank:{r}" in cs.devices:
                t, v = cs.devices[f"rank:{r}"]
                live = v > 0  # 0: the process had exited (as `run.memory` reads it)
                if live.any():
                    out[r] = (t[live], v[live])
    return out


def _timeline(data: RunData) -> dict[str, Any]:
    return _run_doc(data, "memory_timeline")


def timeline_entries(data: RunData) -> list[dict[str, Any]]:
    """`run.memory_timeline.ranks`: per rank and device, the window's peak (docs/json.md)."""
    return list(_timeline(data).get("ranks") or [])


def timeline_note(data: RunData) -> str | None:
    """What the timeline's totals count (its basis and why it has no categories)."""
    doc = _timeline(data)
    parts = [p for p in (doc.get("basis"), doc.get("categories_note")) if p]
    return "; ".join(parts) or None


def timeline_series(data: RunData, ranks: list[int]) -> list[WindowSeries]:
    """The memory timeline of each entry of `timeline_entries` on `ranks` (accelerators
    first, as the document has them); entries without saved events are left out."""
    entries = [e for e in timeline_entries(data) if e["rank"] in ranks and e.get("peak_ns")]
    if not entries or data.ctx is None:
        return []
    table = data.once("memory-window-events", lambda: data.ctx.memory_timeline())
    if table is None or not table.num_rows:
        return []
    out = []
    for e in entries:
        ts, allocated, thinned = _window_points(table, e)
        if not ts.size:
            continue
        start = e.get("start_ns") or int(ts[0])
        out.append(WindowSeries(
            rank=e["rank"], device=e["device"], ms=(ts - start) / 1e6, allocated=allocated,
            peak_ms=(e["peak_ns"] - start) / 1e6, peak_bytes=e["peak_allocated_bytes"],
            peak_step=e.get("peak_step"), peak_operator=e.get("peak_operator"),
            thinned=thinned))
    return out


def _window_points(table: pa.Table, e: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, bool]:
    """The saved events of entry `e` (its rank, device and steps) in time order: every one,
    or beyond MAX_POINTS each time bucket's lowest and highest."""
    lo, hi = (e.get("steps") or [None, None])[:2]
    where = (f"rank = {int(e['rank'])} AND device = {_quote(e['device'])}"
             + (f" AND step BETWEEN {int(lo)} AND {int(hi)}" if lo is not None else ""))
    n = sql_table(f"SELECT count(*) AS n, min(ts) AS t0, max(ts) AS t1 FROM m WHERE {where}",
                  m=table).to_pylist()[0]
    if not n["n"]:
        return np.zeros(0), np.zeros(0), False
    thinned = n["n"] > MAX_POINTS
    if not thinned:
        t = sql_table(f"SELECT ts, total_allocated FROM m WHERE {where} ORDER BY ts", m=table)
    else:
        width = max((int(n["t1"]) - int(n["t0"])) // (MAX_POINTS // 2) + 1, 1)
        t = sql_table(f"""
            WITH b AS (SELECT (ts - {int(n['t0'])}) // {width} AS k, ts, total_allocated
                       FROM m WHERE {where}),
                 e AS (SELECT arg_min(ts, total_allocated) AS t_lo, min(total_allocated) AS v_lo,
                              arg_max(ts, total_allocated) AS t_hi, max(total_allocated) AS v_hi
                       FROM b GROUP BY k)
            SELECT ts, total_allocated FROM (SELECT t_lo AS ts, v_lo AS total_allocated FROM e
                                             UNION SELECT t_hi, v_hi FROM e)
            ORDER BY ts""", m=table)
    return (t.column("ts").to_numpy(zero_copy_only=False).astype(np.int64),
            t.column("total_allocated").to_numpy(zero_copy_only=False).astype(np.float64),
            thinned)


def _quote(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"
