"""What `/steps` shows of one step: every rank's device activity on aligned clocks (what the
analysis counted, `read.OpenedRun.activity`, clipped to the rank's device window of the step
and merged to about a pixel for drawing), its idle gaps, each rank's arrival at every
collective, the step's per-rank lateness (the diagnosis's lateness table, grouped by rank), and
every rank's host step time and data wait."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.read import sql_table
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
    """Per rank, its lateness at this step's matched collectives: the diagnosis's lateness
    rows of the step grouped by rank (median, p90, times alone last, instances, and its worst,
    in ms); latest first."""
    d = run.diagnose()
    if d is None or d.lateness.num_rows == 0:
        return []
    rows = sql_table(f"""
        SELECT rank, count(*) AS instances, count(*) FILTER (WHERE sole_last) AS last_in,
               quantile_cont(lateness_ns, 0.5) / 1e6 AS median_ms,
               quantile_cont(lateness_ns, 0.9) / 1e6 AS p90_ms,
               max(lateness_ns) / 1e6 AS max_ms
        FROM l WHERE step = {int(step)} GROUP BY rank
    """, l=d.lateness).to_pylist()
    for r in rows:
        r["median_ms"], r["p90_ms"] = r["median_ms"] or 0.0, r["p90_ms"] or 0.0
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
        act = run.opened.activity(rank, lo, hi) if run.opened is not None else None
        if act is None:
            continue
        off = offset(rank) - t0
        g = []
        if gaps is not None and gaps.num_rows:
            for x in gaps.filter(pc.equal(gaps.column("rank"), rank)).to_pylist():
                g.append({"start": (x["start_ns"] + off) / 1e6, "end": (x["end_ns"] + off) / 1e6,
                          "cause": x["cause"], "before": x["before"], "after": x["after"],
                          "ms": x["dur_ns"] / 1e6})
        out.append(RankTimeline(rank=rank, host=run.host_of(rank), parts=_drawn(act, res, off),
                                window=((lo + off) / 1e6, (hi + off) / 1e6), gaps=g))
    return StepTimeline(step=step, ranks=out, arrivals=_arrivals(run, step, {r.rank for r in out},
                                                                 t0),
                        resolution_ms=res / 1e6, left_out=left_out)


def _drawn(act: pa.Table, res: int, off: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per role, the intervals of `act` as bars (starts, ends in ms, `off` ns onto the aligned
    clock), those less than a pixel (`res` ns) apart drawn as one."""
    parts = {}
    for role in ("compute", "comm", "memory"):
        mine = act.filter(pc.equal(act.column("role"), role))
        if mine.num_rows == 0:
            continue
        s = mine.column("start_ns").to_numpy()
        order = np.argsort(s, kind="stable")
        s = s[order]
        reach = np.maximum.accumulate(mine.column("end_ns").to_numpy()[order] + res)
        first = np.flatnonzero(np.concatenate(([True], s[1:] > reach[:-1])))
        last = np.append(first[1:] - 1, s.size - 1)
        parts[role] = ((s[first] + off) / 1e6, (reach[last] - res + off) / 1e6)
    return parts


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
