"""One run, or some of its steps, reduced to what a comparison needs (`RunProfile`), from the
run's context and diagnosis (`profile_of`), holding no open tables, so that two runs (even two
traces of one folder, which share a derived folder), or two trace windows of one run, are
profiled one after the other and then compared by a pure function. `profile.profile_run`
reads a run by its path; the diagnosis uses `profile_of` on its own windows
(`diagnosis/window_compare.py`), which is why this module reads no saved diagnosis.

Everything is a per-step average over the compared ranks and steps: two runs whose ranks or
traced steps do not line up (another world size, other steps traced) still compare, and the
comparison says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.gaps import CAUSES
from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.analysis.diff.comm import CollKey, CollStat, collective_stats
from uberprof.analysis.diff.counters import CounterStat, counter_stats
from uberprof.analysis.diff.metadata import run_metadata
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.operators import OpStat, rank_ops

__all__ = ["BREAKDOWN_PARTS", "NothingToCompare", "Progress", "RunProfile", "profile_of"]


class NothingToCompare(ValueError):
    """A run of which no rank could be analysed: comparing it would say everything is gone."""

# Per-step breakdown parts: (key, label, device). The device parts tile the step's device
# window (compute + exposed comm + memory + idle); `comm_overlapped` lies inside compute; the
# host parts (data wait, optimizer) overlap the device parts.
BREAKDOWN_PARTS: tuple[tuple[str, str, bool], ...] = (
    ("compute", "compute", True),
    ("comm_overlapped", "communication under compute", False),
    ("exposed_comm", "exposed communication", True),
    ("memory", "memory (copies, sets)", True),
    *((f"idle_{c}", f"idle: {c}", True) for c in CAUSES),
    ("idle_short", "idle: short gaps", True),
    ("data_wait", "data wait (host)", False),
    ("optimizer", "optimizer (host)", False),
)

Progress = Callable[[int, int, str], None]


@dataclass
class RunProfile:
    """A run as the comparison sees it (times in ns, per step)."""

    path: str
    kind: str  # "run" or "traces"
    run_id: str | None
    world_size: int
    ranks: list[int]  # compared ranks
    steps: list[int]  # compared steps ([-1]: traces without step marks, the whole trace)
    step_ns: list[float]  # per compared step, in order: the slowest rank's step time
    rank_step_ns: dict[int, list[float]]
    breakdown_ns: dict[str, float]  # BREAKDOWN_PARTS keys, per rank and step
    step_mean_ns: float | None
    ops: dict[tuple[str, str], OpStat]
    collectives: dict[CollKey, CollStat]
    counters: dict[tuple[str, str], CounterStat]
    counters_from: str  # "steps", "run" or "none"
    metadata: dict[str, str]
    findings: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """The `a`/`b` object of `uberprof diff --json`."""
        return {"path": self.path, "kind": self.kind, "run_id": self.run_id,
                "world_size": self.world_size, "ranks": self.ranks, "steps": self.steps,
                "notes": self.notes}


def profile_of(ctx: RunContext, d: Diagnosis, path: str | os.PathLike[str],
               ranks: set[int] | None = None, steps: tuple[int, int] | None = None,
               notes: list[str] | None = None) -> RunProfile:
    """What a comparison needs of the run `ctx` diagnosed as `d`: its analysed steps of
    `ranks` and `steps` (all when None), per step."""
    notes = [] if notes is None else notes
    traced = _select(d, ranks, steps, notes)
    rank_ids = sorted(set(traced.column("rank").to_pylist()))
    if not rank_ids and ranks is None and steps is None:
        problems = list(d.run.get("problems") or []) + notes
        raise NothingToCompare(f"{path}: no rank could be analysed"
                               + (f": {problems[0]}" if problems else ""))
    step_ids = sorted(set(traced.column("step").to_pylist()))
    by_step: dict[int, float] = {}
    per_rank: dict[int, list[float]] = {}
    for r, s, t in zip(*(traced.column(c).to_pylist() for c in ("rank", "step",
                                                                 "step_time_ns"))):
        if t is None:
            continue
        by_step[s] = max(by_step.get(s, 0.0), float(t))
        per_rank.setdefault(r, []).append(float(t))
    times = [by_step[s] for s in sorted(by_step)]
    ops = _ops(ctx, traced, rank_ids, whole=steps is None)
    window = _window(traced)
    counters, counters_from = counter_stats(ctx.root, window) if ctx.is_run_dir else ({}, "none")
    return RunProfile(
        path=str(ctx.root) if ctx.is_run_dir else str(path), kind=d.run.get("kind", "traces"),
        run_id=d.run.get("run_id"), world_size=len(ctx.rank_ids), ranks=rank_ids,
        steps=step_ids, step_ns=times, rank_step_ns=per_rank,
        breakdown_ns=_breakdown(traced, d.gaps), step_mean_ns=_mean(traced, "step_time_ns"),
        ops=ops, collectives=collective_stats(ctx, d, rank_ids, step_ids), counters=counters,
        counters_from=counters_from, metadata=_with_parallelism(run_metadata(ctx), d),
        findings=_findings_per_step(d), notes=notes)




def _with_parallelism(meta: dict[str, str], d: Diagnosis) -> dict[str, str]:
    """The run's metadata and its parallelism as the diagnosis read it (one reading for every
    command): two runs that divide the work differently say so first."""
    summary = (d.run.get("parallelism") or {}).get("summary")
    return {**meta, "parallelism": summary} if summary else meta


def _findings_per_step(d: Diagnosis) -> list[dict[str, Any]]:
    """The findings, with their time at stake per analysed step of the diagnosis (the time at
    stake is over all analysed steps, and two runs may have analysed different numbers)."""
    n = max(len(d.run.get("analysed_steps") or []), 1)
    return [{**f.as_dict(), "ms_per_step": round(f.time_at_stake_ms / n, 3)} for f in d.findings]


def _select(d: Diagnosis, ranks: set[int] | None, steps: tuple[int, int] | None,
            notes: list[str]) -> pa.Table:
    """The analysed steps of the asked ranks and steps; all of them, with a note, when the
    selection leaves none (a comparison never fails for want of lining up)."""
    t = d.steps
    if ranks is not None:
        picked = t.filter(pc.is_in(t.column("rank"), pa.array(sorted(ranks), pa.int64())))
        if picked.num_rows:
            t = picked
        else:
            notes.append(f"none of ranks {sorted(ranks)} here: all ranks compared")
    if steps is not None:
        s = t.column("step")
        picked = t.filter(pc.and_(pc.greater_equal(s, steps[0]), pc.less_equal(s, steps[1])))
        if picked.num_rows:
            t = picked
        else:
            notes.append(f"no analysed step in {steps[0]}-{steps[1]} here: all analysed steps "
                         "compared")
    return t


def _mean(t: pa.Table, col: str) -> float | None:
    v = pc.mean(t.column(col)).as_py() if t.num_rows else None
    return float(v) if v is not None else None


def _breakdown(traced: pa.Table, gaps: pa.Table) -> dict[str, float]:
    """Per rank and step averages of the BREAKDOWN_PARTS."""
    rows = max(traced.num_rows, 1)
    out = {"compute": _mean(traced, "compute_ns") or 0.0,
           "comm_overlapped": _mean(traced, "overlap_ns") or 0.0,
           "exposed_comm": _mean(traced, "exposed_comm_ns") or 0.0,
           "memory": _mean(traced, "memory_ns") or 0.0,
           "data_wait": _mean(traced, "data_wait_ns") or 0.0,
           "optimizer": _mean(traced, "optimizer_ns") or 0.0}
    idle = _mean(traced, "idle_ns") or 0.0
    keys = set(zip(traced.column("rank").to_pylist(), traced.column("step").to_pylist()))
    by_cause = {c: 0.0 for c in CAUSES}
    for r, s, dur, cause in zip(*(gaps.column(c).to_pylist()
                                  for c in ("rank", "step", "dur_ns", "cause"))):
        if (r, s) in keys and cause in by_cause:
            by_cause[cause] += float(dur or 0)
    for c in CAUSES:
        out[f"idle_{c}"] = by_cause[c] / rows
    out["idle_short"] = max(idle - sum(by_cause.values()) / rows, 0.0)
    return out


def _ops(ctx: RunContext, traced: pa.Table, ranks: list[int], whole: bool
         ) -> dict[tuple[str, str], OpStat]:
    """Per-step averages over `ranks`. Over all the analysed steps (`whole`), from the operator
    table `analyze` saved (the report's numbers, no event table read); for a chosen range of
    steps, from each rank's events (the table holds sums over all steps), one rank's event
    table in memory at a time."""
    saved = _saved_ops(ctx) if whole else None
    total: dict[tuple[str, str], OpStat] = {}
    for r in ranks:
        mine = traced.filter(pc.equal(traced.column("rank"), r))
        steps = set(mine.column("step").to_pylist())
        n = max(len(steps), 1)
        if saved is not None:
            stats = saved.get(r, {})
        else:
            try:
                events = ctx.events(r)
            except (KeyError, OSError):
                continue
            stats = rank_ops(events, None if steps == {-1} else steps)
            del events
        for key, st in stats.items():
            acc = total.setdefault(key, OpStat(st.kind, st.name))
            acc.calls += st.calls / n
            acc.self_ns += st.self_ns / n
            acc.incl_ns += st.incl_ns / n
    k = max(len(ranks), 1)
    for st in total.values():
        st.calls /= k
        st.self_ns /= k
        st.incl_ns /= k
    return total


def _saved_ops(ctx: RunContext) -> dict[int, dict[tuple[str, str], OpStat]] | None:
    """rank -> its operators' totals over its analysed steps, from derived/operators.parquet
    (several traces of a rank summed); None when the table cannot be read."""
    try:
        t = ctx.operators()
    except (OSError, pa.ArrowException):
        return None
    out: dict[int, dict[tuple[str, str], OpStat]] = {}
    for r, k, nm, c, s, i in zip(*(t.column(c).to_pylist() for c in (
            "rank", "kind", "name", "calls", "self_ns", "incl_ns"))):
        st = out.setdefault(r, {}).setdefault((k, nm), OpStat(k, nm))
        st.calls += c
        st.self_ns += s
        st.incl_ns += i
    return out


def _window(traced: pa.Table) -> tuple[int, int] | None:
    if traced.num_rows == 0:
        return None
    lo = pc.min(traced.column("host_start_ns")).as_py()
    hi = pc.max(traced.column("host_end_ns")).as_py()
    return (int(lo), int(hi)) if lo is not None and hi is not None and hi > lo else None

