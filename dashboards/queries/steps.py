"""What `/steps` shows of one step: every rank's device activity on aligned clocks (the sets of
`uberprof.analysis.tables.metrics.device_activity`, clipped to the rank's device window of the step
and merged to about a pixel), its idle gaps, each rank's arrival at every collective, the
step's per-rank lateness summary (`uberprof.analysis.diagnosis.summaries.rank_lateness`), and every
rank's host step time and data wait."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.summaries import rank_lateness, sql_table
from uberprof.analysis.tables import intervals as iv
from uberprof.analysis.tables import metrics as M
from uberprof.dashboards.data import RunData

__all__ = ["RankTimeline", "StepTimeline", "step_lateness", "step_ranks", "step_timeline"]

STEP_COLUMNS = ("rank", "step", "host_start_ns", "host_end_ns", "step_time_ns", "data_wait_ns",
                "traced")
PIXELS = 1500.0  # a wide screen: what a timeline's resolution is set to


@dataclass
class RankTimeline:
    """One rank's device activity in one step, on the aligned clock, in ms from the step start."""

    rank: int
    host: str | None
    parts: dict[str, tuple[np.ndarray, np.ndarray]]  # role -> (starts, ends) in ms
    window: tuple[float, float]
    gaps: list[dict[str, Any]]  # start/end ms, cause, before, after


@dataclass
class StepTimeline:
    step: int
    ranks: list[RankTimeline]
    arrivals: list[dict[str, Any]]  # instance, name, rank, start_ms, lateness_ms, last (alone)
    resolution_ms: float
    left_out: int = 0  # ranks not drawn (too many to show)


def step_ranks(run: RunData, step: int) -> pa.Table:
    """Every rank's host step time and data wait for one step (traced or not)."""
    t = run.steps.filter(pc.equal(run.steps.column("step"), step))
    return t.select([c for c in STEP_COLUMNS if c in t.schema.names]).sort_by("rank")


def step_lateness(run: RunData, step: int) -> list[dict[str, Any]]:
    """Per rank, its lateness at this step's matched collectives: the diagnosis's per-rank
    summary (median, p90, times alone last, instances) restricted to the step, and its worst
    (ms); latest first."""
    d = run.diagnose()
    if d is None or d.lateness.num_rows == 0:
        return []
    lat = d.lateness.filter(pc.equal(d.lateness.column("step"), step))
    if lat.num_rows == 0:
        return []
    worst = sql_table("SELECT rank, max(lateness_ns) AS m FROM l GROUP BY rank", l=lat)
    worst_of = dict(zip(worst.column("rank").to_pylist(), worst.column("m").to_pylist()))
    rows = [{"rank": r["rank"], "instances": r["instances"], "last_in": r["last_in"],
             "median_ms": (r["median_ns"] or 0) / 1e6, "p90_ms": (r["p90_ns"] or 0) / 1e6,
             "max_ms": worst_of[r["rank"]] / 1e6} for r in rank_lateness(lat).to_pylist()]
    return sorted(rows, key=lambda r: (-r["median_ms"], r["rank"]))


def aligned_instances(run: RunData) -> pa.Table | None:
    """Matched collective instances with start/end on the reference clock."""
    def build() -> pa.Table | None:
        d = run.diagnose()
        if d is None:
            return None
        return d.alignment.apply(d.matched.instances, ("start_ns", "end_ns"))
    return run.once("aligned_instances", build)


def step_timeline(run: RunData, step: int, focus: int | None = None,
                  max_ranks: int = 48) -> StepTimeline | None:
    """Compute / communication / memory intervals of every rank in one traced step, on
    aligned clocks, merged to about a pixel (kept for the last few steps asked for)."""
    return run.recent(("timeline", step, focus, max_ranks),
                      lambda: _step_timeline(run, step, focus, max_ranks))


def _ranks_drawn(rows: list[dict[str, Any]], keep_too: tuple[int | None, ...],
                 max_ranks: int) -> tuple[list[dict[str, Any]], int]:
    """An even sample of `rows` (by rank) when there are more than `max_ranks`, with the
    ranks in `keep_too` always among them; and how many were left out."""
    if len(rows) <= max_ranks:
        return rows, 0
    keep = {r["rank"] for r in rows[:: -(-len(rows) // (max_ranks - 2))]}
    keep |= {r for r in keep_too if r is not None}
    return [r for r in rows if r["rank"] in keep], len(rows) - len(keep)


def _step_timeline(run: RunData, step: int, focus: int | None, max_ranks: int
                   ) -> StepTimeline | None:
    d = run.diagnose()
    if run.ctx is None:
        return None
    rows = run.steps.filter(pc.and_(pc.equal(run.steps.column("step"), step),
                                    pc.equal(run.steps.column("traced"), True)))
    rows = rows.filter(pc.is_valid(rows.column("device_start_ns"))).to_pylist()
    if not rows:
        return None
    rows.sort(key=lambda r: r["rank"])
    rows, left_out = _ranks_drawn(rows, (focus, run.straggler_rank()), max_ranks)
    offset = (lambda r: d.alignment.offset_of(r)) if d is not None else (lambda r: 0)
    t0 = min(r["device_start_ns"] + offset(r["rank"]) for r in rows)
    t1 = max(r["device_end_ns"] + offset(r["rank"]) for r in rows)
    res = int(max((t1 - t0) / PIXELS, 1_000.0))
    gaps = d.gaps.filter(pc.equal(d.gaps.column("step"), step)) if d is not None else None
    out = []
    for r in rows:
        rank, lo, hi = r["rank"], r["device_start_ns"], r["device_end_ns"]
        try:
            act = M.device_activity(run.ctx.events(rank))
        except (KeyError, OSError):
            continue
        off = offset(rank) - t0
        parts = {}
        for role, s in (("compute", act.compute), ("comm", act.comm), ("memory", act.memory)):
            c = iv.clip(s, lo, hi)
            if len(c):
                m = iv.union(c.starts, c.ends + res)  # merge what a pixel cannot split
                parts[role] = ((m.starts + off) / 1e6, (m.ends - res + off) / 1e6)
        g = []
        if gaps is not None and gaps.num_rows:
            for x in gaps.filter(pc.equal(gaps.column("rank"), rank)).to_pylist():
                g.append({"start": (x["start_ns"] + off) / 1e6, "end": (x["end_ns"] + off) / 1e6,
                          "cause": x["cause"], "before": x["before"], "after": x["after"],
                          "ms": x["dur_ns"] / 1e6})
        out.append(RankTimeline(rank=rank, host=run.host_of(rank), parts=parts,
                                window=((lo + off) / 1e6, (hi + off) / 1e6), gaps=g))
    return StepTimeline(step=step, ranks=out, arrivals=_arrivals(run, step, {r.rank for r in out},
                                                                 t0),
                        resolution_ms=res / 1e6, left_out=left_out)


def _arrivals(run: RunData, step: int, shown: set[int], t0: int) -> list[dict[str, Any]]:
    """Each drawn rank's entry into each matched collective of the step (aligned clock, ms from
    `t0`), with its lateness and whether it alone came last (the diagnosis's lateness)."""
    d = run.diagnose()
    inst = aligned_instances(run)
    if inst is None or inst.num_rows == 0 or d is None:
        return []
    mine = inst.filter(pc.equal(inst.column("step"), step))
    lat = d.lateness.filter(pc.equal(d.lateness.column("step"), step))
    late = {(a, b): (c, e) for a, b, c, e in zip(
        *(lat.column(k).to_pylist() for k in ("instance", "rank", "lateness_ns", "sole_last")))}
    out = []
    for i, name, rank, s, e in zip(*(mine.column(k).to_pylist() for k in
                                     ("instance", "name", "rank", "start_ns", "end_ns"))):
        if rank not in shown:
            continue
        ln, last = late.get((i, rank), (0, False))
        out.append({"instance": i, "name": name, "rank": rank, "start_ms": (s - t0) / 1e6,
                    "end_ms": (e - t0) / 1e6, "lateness_ms": ln / 1e6, "last": bool(last)})
    return out
