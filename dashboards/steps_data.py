"""The run's steps as the pages read them (part of `RunData`, `dashboards/data.py`): one table
of every rank's steps (the analysis's, plus the step timelines of ranks without an analysable
trace, or of every rank when the run has none), the steps read since while the job runs, and
the run's time axis (its first step's start is the zero of every axis in seconds)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.read import series_of, sql_table

__all__ = ["DASHBOARD_STEP_COLUMNS", "STEP_SCHEMA", "StepTables", "append_new_steps",
           "load_steps"]

STEP_SCHEMA = pa.schema([("rank", pa.int64()), ("step", pa.int64()),
                         ("host_start_ns", pa.int64()), ("host_end_ns", pa.int64()),
                         ("step_time_ns", pa.int64()), ("data_wait_ns", pa.int64()),
                         ("traced", pa.bool_())])
# The analysis's step table columns the pages read from `steps` (a traced step's device window
# on /steps); its breakdown columns are read from the diagnosis, so they are not loaded.
DASHBOARD_STEP_COLUMNS = (*STEP_SCHEMA.names, "device_start_ns", "device_end_ns")


class StepTables:
    """`RunData`'s step tables: `steps` (built on first use while the job runs), per-rank
    series, the steps present and traced, and the run's time axis."""

    _steps: pa.Table | None
    _steps_of: Callable[[], pa.Table] | None
    follower: Any
    ctx: Any
    once: Callable[..., Any]
    saved_overview: Callable[[], Any]  # the analysis' summary of the steps, when it holds
    _lock: Any

    @property
    def steps(self) -> pa.Table:
        with self._lock:
            if self._steps is None and self._steps_of is not None:
                self._steps = self._steps_of()
        assert self._steps is not None, "RunData.load() first"
        return self._steps

    def rank_steps(self, rank: int) -> pa.Table:
        """One rank's rows of `steps`."""
        return self.steps.filter(pc.equal(self.steps.column("rank"), rank))

    def ranks(self) -> list[int]:
        saved = self.saved_overview()
        if saved is not None and saved.ranks:
            return list(saved.ranks)
        return self.once("ranks", lambda: sorted(pc.unique(self.steps.column("rank"))
                                                 .to_pylist()) if self.steps.num_rows
                         else (self.ctx.rank_ids if self.ctx is not None else []))

    def traced_steps(self) -> list[int]:
        def find() -> list[int]:
            saved = self.saved_overview()
            if saved is not None:
                return list(saved.traced_steps)
            t = self.steps.filter(pc.equal(self.steps.column("traced"), True))
            return sorted(s for s in pc.unique(t.column("step")).to_pylist() if s is not None)
        return self.once("traced_steps", find)

    def all_steps(self) -> list[int]:
        def find() -> list[int]:
            saved = self.saved_overview()
            if saved is not None:
                return list(saved.all_steps)
            return sorted(s for s in pc.unique(self.steps.column("step")).to_pylist()
                          if s is not None)
        return self.once("all_steps", find)

    def step_series(self, column: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per rank (rank, steps, `column`: step_time_ns or data_wait_ns), in step order: from
        the follower's arrays while the job runs (no table to build), else from `steps`."""
        if self.follower is not None:
            return self.follower.series({"step_time_ns": "duration_ns"}.get(column, column))
        return series_of(self.steps.select(["rank", "step", column]), column)

    def time_origin_ns(self) -> int | None:
        """Epoch ns of the run's first step start: the zero of every time axis in seconds."""
        def build() -> int | None:
            t = self.steps
            if t.num_rows == 0:
                return None
            return pc.min(t.column("host_start_ns")).as_py()
        return self.once("t0", build)

    def traced_spans(self, rank: int) -> list[tuple[float, float, int, int]]:
        """(start s, end s, first step, last step) of each traced window of a rank."""
        t = self.rank_steps(rank)
        t = t.filter(pc.equal(t.column("traced"), True))
        if t.num_rows == 0:
            return []
        origin = self.time_origin_ns() or 0
        rows = sorted(zip(t.column("step").to_pylist(), t.column("host_start_ns").to_pylist(),
                          t.column("host_end_ns").to_pylist()))
        out: list[tuple[float, float, int, int]] = []
        for s, a, b in rows:
            if a is None or b is None:
                continue
            if out and out[-1][3] == s - 1:
                out[-1] = (out[-1][0], (b - origin) / 1e9, out[-1][2], s)
            else:
                out.append(((a - origin) / 1e9, (b - origin) / 1e9, s, s))
        return out


def load_steps(root: Path, ctx: Any, problems: list[str]) -> pa.Table:
    """Steps of every rank: the analysis table (`ctx`, None without traces), plus the step
    timelines of ranks that have no analysable trace (or of every rank when the run has no
    traces at all). A cut-off step timeline is told to `problems`."""
    from uberprof.rundir import STEPS_FILE, ranks_by_id, read_steps

    parts = []
    have: set[int] = set()
    if ctx is not None:
        t = ctx.steps(DASHBOARD_STEP_COLUMNS)
        parts.append(t)
        have = set(pc.unique(t.column("rank")).to_pylist()) if t.num_rows else set()
    schema = parts[0].schema if parts else STEP_SCHEMA
    rows = []
    for rank, meta in ranks_by_id(root).items():
        if rank in have:
            continue
        steps, truncated = read_steps(meta.folder)
        if truncated:
            problems.append(f"{meta.folder / STEPS_FILE}: ends with a cut-off line")
        for r in steps:
            s, e = r.get("host_start_ns"), r.get("host_end_ns")
            if not isinstance(r.get("step"), int):
                continue
            rows.append({"rank": rank, "step": r["step"], "host_start_ns": s,
                         "host_end_ns": e, "data_wait_ns": r.get("data_wait_ns"),
                         "traced": False,
                         "step_time_ns": e - s if isinstance(s, int) and isinstance(e, int)
                         else None})
    if rows:
        parts.append(_conform(pa.Table.from_pylist(rows), schema))
    if not parts:
        return STEP_SCHEMA.empty_table()
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """`t` with `schema`'s columns: cast where it has them, nulls where it has not."""
    return pa.table({n: (t.column(n).cast(schema.field(n).type) if n in t.schema.names
                         else pa.nulls(t.num_rows, schema.field(n).type))
                     for n in schema.names}, schema=schema)


def append_new_steps(base: pa.Table, live: pa.Table) -> pa.Table:
    """`base` (the steps as loaded) and the rows of `live` (the step timelines read since)
    past each rank's last step in `base`: the steps of a run whose job still runs."""
    if live.num_rows == 0:
        return base
    seen = sql_table("SELECT rank, max(step) AS last FROM b GROUP BY rank", b=base)
    last = dict(zip(seen.column("rank").to_pylist(), seen.column("last").to_pylist()))
    rank = live.column("rank").to_numpy()
    ranks = np.unique(rank)
    floor = np.array([last.get(int(r), -(2 ** 62)) if last.get(int(r)) is not None
                      else -(2 ** 62) for r in ranks], dtype=np.int64)
    new = live.column("step").to_numpy() > floor[np.searchsorted(ranks, rank)]
    if not new.any():
        return base
    extra = live.filter(pa.array(new)).append_column(
        "traced", pa.array(np.zeros(int(new.sum()), bool)))
    return pa.concat_tables([base, _conform(extra, base.schema)])
