"""What `/memory` shows: each rank's memory summary from the saved run document
(`run.memory`, `analysis/diagnosis/memory.py`), the GPU's peak and in-use bytes per step from
the step timeline the analysis saved (`read.OpenedRun.step_timelines`), and each rank process's
resident set size over time from the counters (`proc` `mem.rss`, `rank:<r>`). The analysis
made every number; this module picks them out, so a diagnosis saved without `memory` (an older
uberprof) reads as "nothing to show"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from uberprof.dashboards.data import RunData

__all__ = ["MAX_LINES", "GpuSeries", "basis", "gpu_series", "rss_series", "summary"]

MAX_LINES = 16  # ranks drawn: the highest peaks (and the selected rank); the table has all


@dataclass(frozen=True)
class GpuSeries:
    """One rank's GPU memory at each step boundary (bytes)."""

    rank: int
    steps: np.ndarray
    peak: np.ndarray  # all-time peak allocated so far (NaN where not read)
    in_use: np.ndarray  # allocated at the boundary


def _memory(data: RunData) -> dict[str, Any]:
    d = data.diagnose()
    return (d.run.get("memory") if d is not None else None) or {}


def summary(data: RunData) -> list[dict[str, Any]]:
    """`run.memory.ranks`: one row per rank (docs/json.md), in rank order."""
    return list(_memory(data).get("ranks") or [])


def basis(data: RunData) -> str | None:
    return _memory(data).get("basis")


def drawn_ranks(data: RunData, selected: int | None = None) -> list[int]:
    """The ranks drawn: all up to MAX_LINES, else the highest GPU (else host) peaks, with the
    selected rank among them."""
    rows = summary(data)
    ranks = [r["rank"] for r in rows]
    if len(ranks) <= MAX_LINES:
        return ranks
    key = "gpu_peak_bytes" if any(r.get("gpu_peak_bytes") for r in rows) else "rss_peak_bytes"
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
