"""Arrivals at collectives on every untraced step, from the Flight Recorder
(rundir/flight_log.py): with the traced window, the straggler test's basis (stragglers/bases.py).

The traced window holds a few steps; the Flight Recorder's `time_created_ns` (when a rank
called the collective, epoch ns on its host's clock) is there for every step at no tracing
cost. Per (process group, sequence number), the ranks' arrivals form one instance, as the
traces' matched collectives do, and `stragglers.lateness` reads both alike (an arrival has
no end: its transfer and wait are null).

- Steps: an arrival belongs to the step whose host window (the step table: steps.jsonl, the
  same epoch clock) holds it on that rank; an instance to the step most of its ranks put it in.
  Arrivals outside every step (process-group set-up, the final barrier) are left out, and so
  are the first step (start-up), the steps right after a trace window (uberprof's own
  teardown, which lands on the ranks unevenly): `steptime.own_cost_steps`, and the traced
  steps themselves. The profiler slows ranks unevenly: over the traced steps of healthy
  4-rank runs on 2 cores one rank was alone last in 14-15 of 20 all-reduces (chance < 0.1%)
  and in 14-15 of 38 over the untraced ones (chance). The straggler test pools both, each
  instance once (`stragglers.combined_straggler_test`): the untraced steps outweigh a skewed
  window by their number, and a clear traced straggler is not cleared by a few of them.
- Clocks: each rank's arrivals move onto the reference clock by its host's offset
  (`align.Alignment`), as the traced collectives do.
- Completeness: an instance counts only when every rank seen in its group called it (a rank
  whose ring dropped it would make the others look late or early).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.lateness import ARRIVAL_FIELDS, lateness
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.steptime import own_cost_steps, step_walls
from uberprof.ingest.classify import canonical_collective
from uberprof.rundir.flight_log import Arrival

__all__ = ["ARRIVAL_INSTANCE_SCHEMA", "FlightBasis", "arrival_instances", "flight_basis",
           "step_of"]

ARRIVAL_INSTANCE_SCHEMA = pa.schema([
    *ARRIVAL_FIELDS,
    ("start_ns", pa.int64()),  # the arrival, on the reference clock
    ("end_ns", pa.int64()),  # null: the Flight Recorder has no end under Gloo
])


@dataclass
class FlightBasis:
    """The straggler test's basis from the Flight Recorder, with what it left out."""

    lateness: pa.Table  # stragglers.LATENESS_SCHEMA
    instances: int
    steps: list[int]
    wall_ns: int  # the steps' wall time (longest rank's window, summed)
    median_step_ns: float | None
    lost: int = 0  # entries a ring dropped before they were read
    left_out: dict[str, int] = field(default_factory=dict)  # instances, by reason

    def as_dict(self) -> dict[str, Any]:
        return {"source": "flight_recorder", "instances": self.instances,
                "steps": len(self.steps),
                "first_step": self.steps[0] if self.steps else None,
                "last_step": self.steps[-1] if self.steps else None,
                "lost_entries": self.lost, "left_out": self.left_out}


def step_of(starts: list[int], ends: list[int], steps: list[int], t: int) -> int | None:
    """The step whose host window [start, end) holds `t` (windows sorted by start)."""
    i = bisect.bisect_right(starts, t) - 1
    return steps[i] if i >= 0 and t < ends[i] else None


def arrival_instances(arrivals: Mapping[int, list[Arrival]],
                      windows: Mapping[int, list[tuple[int, int, int]]],
                      offsets: Mapping[int, int] | None = None,
                      exclude: set[int] | None = None) -> tuple[pa.Table, dict[str, int]]:
    """Instances of every rank's arrivals (ARRIVAL_INSTANCE_SCHEMA), and the count left out
    by reason (module docstring). `windows[rank]`: (step, host_start_ns, host_end_ns)."""
    offsets = offsets or {}
    exclude = exclude or set()
    members: dict[str, set[int]] = {}
    by_key: dict[tuple[str, int], list[tuple[int, int, int | None, str]]] = {}
    for r, arr in arrivals.items():
        w = sorted(windows.get(r, []), key=lambda x: x[1])
        starts, ends, steps = [x[1] for x in w], [x[2] for x in w], [x[0] for x in w]
        for a in arr:
            members.setdefault(a.group, set()).add(r)
            by_key.setdefault((a.group, a.seq), []).append(
                (r, a.time_ns + int(offsets.get(r, 0)), step_of(starts, ends, steps, a.time_ns),
                 a.op))
    left: Counter[str] = Counter()
    kept: list[tuple[int, list[tuple[int, int, int | None, str]], int, str]] = []
    for (group, _), calls in by_key.items():
        if len(members[group]) < 2:
            continue
        if len({c[0] for c in calls}) < len(members[group]):
            left["not on every rank of its group"] += 1
            continue
        step = Counter(c[2] for c in calls).most_common(1)[0][0]
        if step is None:
            left["outside every step"] += 1
            continue
        if step in exclude:
            left["start-up, traced or after a trace window"] += 1
            continue
        kept.append((min(c[1] for c in calls), calls, step, canonical_collective(calls[0][3])))
    kept.sort(key=lambda k: k[0])
    cols = list(zip(*[(i, r, step, name, len(calls), t)
                      for i, (_, calls, step, name) in enumerate(kept) for r, t, _, _ in calls]))
    if not cols:
        return ARRIVAL_INSTANCE_SCHEMA.empty_table(), dict(left)
    table = pa.table({
        "instance": pa.array(cols[0], pa.int64()), "rank": pa.array(cols[1], pa.int64()),
        "step": pa.array(cols[2], pa.int64()), "name": pa.array(cols[3], pa.string()),
        "participants": pa.array(cols[4], pa.int64()),
        "start_ns": pa.array(cols[5], pa.int64()),
        "end_ns": pa.nulls(len(cols[0]), pa.int64())}, schema=ARRIVAL_INSTANCE_SCHEMA)
    return table, dict(left)


def flight_basis(ctx: RunContext, offsets: Mapping[int, int]) -> FlightBasis | None:
    """The Flight Recorder's lateness over the untraced steps of a run directory, or None when
    no two ranks have a flight log (an older run, the recorder off, plain traces)."""
    if not ctx.is_run_dir:
        return None
    arrivals: dict[int, list[Arrival]] = {}
    lost = 0
    for r, log in ctx.flight_logs().items():
        if log.arrivals:
            arrivals[r] = log.arrivals
            lost += log.lost
    if len(arrivals) < 2:
        return None
    steps = ctx.steps()
    windows: dict[int, list[tuple[int, int, int]]] = {}
    for r, s, a, b in zip(*(steps.column(c).to_pylist()
                            for c in ("rank", "step", "host_start_ns", "host_end_ns"))):
        if None not in (r, s, a, b) and s >= 0:
            windows.setdefault(r, []).append((s, a, b))
    walls = step_walls(steps)
    first, after = own_cost_steps(walls)
    exclude = set(after) | {s for s, (_, traced) in walls.items() if traced}
    exclude |= {first} if first is not None else set()
    inst, left = arrival_instances(arrivals, windows, offsets, exclude)
    if inst.num_rows == 0:
        return None
    used = sorted(set(inst.column("step").to_pylist()))
    w = [walls[s][0] for s in used if s in walls]
    return FlightBasis(lateness=lateness(inst), instances=len(set(inst.column("instance")
                                                                 .to_pylist())),
                       steps=used, wall_ns=int(sum(w)),
                       median_step_ns=float(np.median(w)) if w else None, lost=lost,
                       left_out=left)
