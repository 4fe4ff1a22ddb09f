"""One rank's part of the cross-rank reduce (`reduce.py`): its step rows, its traces' collectives,
operators, modules and memory rows with their rank and trace, and its row of the rank table.

A rank's part reads only that rank's small per-input tables and step timelines, so the parts
of a big run are made on the analysis workers (`pool.map_calls`: forked processes or Dask's)
while the reduce writes the run-level tables in rank order; at 512 ranks they were 7 of the
reduce's 9 s on one core. `rank_part` is a plain function of plain values for that reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.derived import (
    COLLECTIVES_FILE,
    INPUT_COLLECTIVES_FILE,
    INPUT_OPERATORS_FILE,
    INPUT_STEPS_FILE,
    MEMORY_FILE,
    MODULES_FILE,
    OPERATORS_FILE,
    PART_STEPS_FILE,
    read_input_table,
    read_timeline,
)
from uberprof.analysis.tables.schemas import (
    BREAKDOWN_FIELDS,
    RUN_COLLECTIVE_SCHEMA,
    RUN_MEMORY_TIMELINE_SCHEMA,
    RUN_MODULE_SCHEMA,
    RUN_OPERATOR_SCHEMA,
    RUN_STEP_SCHEMA,
)
from uberprof.ingest.discover import TraceInput
from uberprof.rundir import STEPS_FILE as STEPS_JSONL

__all__ = ["PER_TRACE", "Item", "RankPart", "rank_part", "spill", "unspill"]

Item = tuple[TraceInput, dict[str, Any], dict[str, Any]]  # input, manifest entry, summary

# The per-input tables a rank's part gathers: (the run-level table, its schema, the input's
# table, whether an input may lack it: the map writes those only with rows)
PER_TRACE: tuple[tuple[str, pa.Schema, str, bool], ...] = (
    (COLLECTIVES_FILE, RUN_COLLECTIVE_SCHEMA, INPUT_COLLECTIVES_FILE, False),
    (OPERATORS_FILE, RUN_OPERATOR_SCHEMA, INPUT_OPERATORS_FILE, False),
    (MODULES_FILE, RUN_MODULE_SCHEMA, MODULES_FILE, True),
    (MEMORY_FILE, RUN_MEMORY_TIMELINE_SCHEMA, MEMORY_FILE, True),
)


@dataclass
class RankPart:
    """What one rank adds to the run-level tables. `steps` is None when the rank has neither a
    trace nor a step timeline (it adds nothing); `notes`: its cut-off or unreadable step
    timelines, by folder (the reduce says them in the run's folder order)."""

    rank: int
    steps: pa.Table | None
    per_trace: dict[str, list[pa.Table]] = field(default_factory=dict)
    row: dict[str, Any] | None = None
    notes: dict[Path, str] = field(default_factory=dict)
    traced: bool = False
    steps_file: str | None = None  # where `spill` moved `steps` (`unspill` reads it back)


def spill(part: RankPart, folder: Path) -> RankPart:
    """`part` with its step rows moved to an Arrow file in `folder`, for a worker to hand the
    reduce a file name instead of the rows: 1.5 MB a rank at 10,000 steps, which pickled,
    sent through the worker's pipe and unpickled cost ~5 ms of CPU a rank (2.5 s at 512
    ranks, a third of it the reduce's own serial time); written here and mapped there, well
    under a millisecond."""
    if part.steps is not None:
        path = folder / PART_STEPS_FILE.format(rank=part.rank)
        with pa.OSFile(str(path), "wb") as sink, \
                pa.ipc.new_file(sink, part.steps.schema) as writer:
            writer.write_table(part.steps)
        part.steps, part.steps_file = None, str(path)
    return part


def unspill(part: RankPart) -> RankPart:
    """The part as `spill` had it: its step rows mapped from the file (no copy; the mapping
    lives as long as the rows), the file removed."""
    if part.steps_file is not None:
        part.steps = pa.ipc.open_file(pa.memory_map(part.steps_file)).read_all()
        os.unlink(part.steps_file)
        part.steps_file = None
    return part


def rank_part(derived: Path, rank: int, items: list[Item],
              timelines: list[tuple[Path, dict[str, Any] | None]]) -> RankPart:
    """Rank `rank`'s part: `items` are its traces (in the reduce's order), `timelines` its
    rank folders with their manifest entries (None: the folder has no steps.jsonl)."""
    part = RankPart(rank, None, traced=bool(items))
    timeline = _timeline(derived, timelines, part.notes)
    if not items and timeline is None:
        return part
    part.steps = _steps(derived, rank, items, timeline)
    part.per_trace = {name: _per_trace(derived, rank, items, source, schema, optional)
                      for name, schema, source, optional in PER_TRACE}
    part.row = _rank_row(rank, items, part.steps)
    return part


def _timeline(derived: Path, timelines: list[tuple[Path, dict[str, Any] | None]],
              notes: dict[Path, str]) -> pa.Table | None:
    """One rank's step timeline (the tables `timeline_table` made of the steps.jsonl of its
    folders; a step in two folders: the first folder's), one row per step; None when it has
    none. Cut-off or unreadable timelines go to `notes`."""
    parts = []
    for rd, e in timelines:
        if e is None:  # no steps.jsonl
            continue
        if e.get("status") != "ok":
            notes[rd] = e.get("message") or f"{rd / STEPS_JSONL}: could not be read"
            continue
        if e.get("truncated"):
            notes[rd] = (f"{rd / STEPS_JSONL}: ends with a cut-off line; "
                         f"{e.get('rows')} whole steps kept")
        if e.get("skipped"):
            notes[rd] = "; ".join(filter(None, (notes.get(rd), e["skipped"])))
        if e.get("rows"):
            parts.append(read_timeline(derived, e["key"]))
    return _first_per_step(pa.concat_tables(parts)) if parts else None


def _first_per_step(t: pa.Table) -> pa.Table:
    """The first row of each step, in order of first appearance."""
    _, first = np.unique(t.column("step").to_numpy(), return_index=True)
    return t.take(np.sort(first)) if len(first) < t.num_rows else t


def _steps(derived: Path, rank: int, items: list[Item], timeline: pa.Table | None) -> pa.Table:
    """RUN_STEP_SCHEMA rows of one rank, by step: its traces' steps (a step in two traces: the
    first's), with the host window of its step timeline where that has both ends; and the
    timeline's other steps (untraced: host window and data wait only)."""
    parts = []
    for inp, e, _ in items:
        t = read_input_table(derived, e["key"], INPUT_STEPS_FILE)
        parts.append(_conform(t.append_column("trace", pa.array([inp.rel] * t.num_rows,
                                                                pa.string())), rank, True))
    steps = _first_per_step(pa.concat_tables(parts)) if parts else \
        RUN_STEP_SCHEMA.empty_table()
    if timeline is not None and timeline.num_rows:
        window = timeline.take(pc.index_in(steps.column("step"), value_set=timeline["step"]))
        both = pc.and_(window.column("host_start_ns").is_valid(),
                       window.column("host_end_ns").is_valid())
        for col in ("host_start_ns", "host_end_ns"):  # the timeline's window replaces the trace's
            steps = steps.set_column(steps.schema.get_field_index(col), col, pc.if_else(
                both, window.column(col), steps.column(col)))
        rest = timeline.filter(pc.invert(pc.is_in(timeline["step"], value_set=steps["step"])))
        steps = pa.concat_tables([steps, _conform(
            rest.select(["step", "host_start_ns", "host_end_ns", "data_wait_ns"]), rank, False)])
    steps = steps.sort_by("step")
    return steps.set_column(RUN_STEP_SCHEMA.get_field_index("step_time_ns"), "step_time_ns",
                            pc.subtract(steps.column("host_end_ns"),
                                        steps.column("host_start_ns")))


def _conform(t: pa.Table, rank: int, traced: bool) -> pa.Table:
    """`t` as RUN_STEP_SCHEMA rows of `rank` (columns it lacks: null)."""
    n = t.num_rows
    given = {"rank": pa.array(np.full(n, rank), pa.int64()),
             "traced": pa.array(np.full(n, traced), pa.bool_())}
    return pa.table([given[f.name] if f.name in given else
                     t.column(f.name).cast(f.type) if f.name in t.column_names else
                     pa.nulls(n, f.type) for f in RUN_STEP_SCHEMA], schema=RUN_STEP_SCHEMA)


def _per_trace(derived: Path, rank: int, items: list[Item], name: str,
               schema: pa.Schema, optional: bool = False) -> list[pa.Table]:
    """One rank's rows of the per-input table `name` (collectives, operators, modules, memory),
    one table per trace, with its rank and trace columns: the run-level table's rows
    (`schema`). An `optional` table an input lacks gives no rows."""
    parts = []
    for inp, e, _ in items:
        try:
            t = read_input_table(derived, e["key"], name)
        except FileNotFoundError:
            if not optional:
                raise
            continue
        t = t.add_column(0, "rank", pa.array(np.full(t.num_rows, rank), pa.int64()))
        t = t.append_column("trace", pa.array([inp.rel] * t.num_rows, pa.string()))
        parts.append(t.cast(schema))
    return parts


def _rank_row(rank: int, items: list[Item], steps: pa.Table) -> dict[str, Any]:
    """One rank's RANK_SCHEMA row: its traces' breakdown summed, with its shares (none for a
    rank known from its step timeline only), and the median and p90 of its step times."""
    totals: dict[str, int | None] = {f: sum(int(s[f]) for _, _, s in items)
                                      for f in BREAKDOWN_FIELDS}
    pct = M.percentages(*(totals[f] for f in BREAKDOWN_FIELDS))  # type: ignore[arg-type]
    if not items:  # known from the step timeline only
        totals = dict.fromkeys(totals)
        pct = dict.fromkeys(pct)
    times = steps.column("step_time_ns").drop_null().to_numpy().astype(np.float64)
    modes = {s["mode"] for _, _, s in items}
    return {
        "rank": rank,
        "mode": ("device" if "device" in modes else "cpu") if items else None,
        "device_type": next((s["device_type"] for _, _, s in items
                             if s["mode"] == "device"), "cpu" if items else None),
        "host": next((s["host"] for _, _, s in items if s.get("host")), None),
        "traces": len(items),
        "steps": steps.num_rows,
        **totals,
        **pct,
        "step_time_median_ms": round(float(np.median(times)) / 1e6, 3) if times.size else None,
        "step_time_p90_ms": round(float(np.percentile(times, 90)) / 1e6, 3) if times.size
        else None,
    }
