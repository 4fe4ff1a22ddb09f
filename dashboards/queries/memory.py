"""What `/memory` shows: each rank's memory summary from the saved run document
(`run.memory`, `analysis/diagnosis/memory.py`), the GPU's peak and in-use bytes per step from
the step timeline the analysis saved (`read.OpenedRun.step_timelines`), and each rank process's
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
import pyarrow.compute as pc

from uberprof.analysis.read import sql_table
from uberprof.dashboards.data import RunData

__all__ = ["MAX_LINES", "MAX_POINTS", "GpuSeries", "WindowSeries", "basis", "gpu_series",
           "rss_series", "summary", "timeline_entries", "timeline_note", "timeline_series"]

MAX_LINES = 16  # ranks drawn: the highest peaks (and the selected rank); the table has all
MAX_POINTS = 4000  # points drawn per line of the memory timeline (thinned beyond)


@dataclass(frozen=True)
class GpuSeries:
    """One rank's GPU memory at each step boundary (bytes)."""

    rank: int
    steps: np.ndarray
    peak: np.ndarray  # all-time peak allocated so far (NaN where not read)
    in_use: np.ndarray  # allocated at the boundary


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
    return (d.run.get(key) if d is not None else None) or {}


def _memory(data: RunData) -> dict[str, Any]:
    return _run_doc(data, "memory")


def summary(data: RunData) -> list[dict[str, Any]]:
    """`run.memory.ranks`: one row per rank (docs/json.md), in rank order."""
    return list(_memory(data).get("ranks") or [])


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
    without any are left out."""
    def build() -> Any:
        return data.opened.step_timelines(["gpu_mem_peak_bytes", "gpu_mem_bytes"]) \
            if data.opened is not None else None
    t = data.once("memory-timelines", build)
    if t is None or not t.num_rows:
        return []
    out = []
    for r in ranks:
        x = t.filter(pc.equal(t.column("rank"), r))
        if not x.num_rows or x.column("gpu_mem_bytes").null_count == x.num_rows:
            continue
        out.append(GpuSeries(
            rank=r, steps=x.column("step").to_numpy(),
            peak=x.column("gpu_mem_peak_bytes").to_numpy(zero_copy_only=False).astype(float),
            in_use=x.column("gpu_mem_bytes").to_numpy(zero_copy_only=False).astype(float)))
    return out


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
