"""The read side of the analysis: the one way a view opens a run.

Views (`uberprof/present/`, `dashboards/`) compute nothing. The CLI calls `open_run` and hands
the result to a presenter: the run's tables (the analysis, brought up to date when stale) and
its diagnosis (the saved one when fresh, else made once and saved). Everything a view shows is
read from an `OpenedRun`; a number it lacks is added to the analysis or the diagnosis, never
worked out in the view. While a job runs, `live_signals` is the one function that turns its step
timelines into indications (for `uberprof watch` and the live dashboard), and `saved_findings`
reads what the last saved diagnosis said.

Views select and group the saved tables with `sql_table` (DuckDB over Arrow); that is reading,
not computing: a metric, a threshold or a verdict never comes from a view.
`tests/unit/test_architecture.py` holds views to this module, the diagnosis's model and its
causes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.evidence import MIN_INSTANCES
from uberprof.analysis.diagnosis.gaps import DEFAULT_THRESHOLD_NS
from uberprof.analysis.diagnosis.model import Diagnosis, Progress
from uberprof.analysis.diagnosis.saved import SavedFindings
from uberprof.analysis.diagnosis.summaries import sql_table
from uberprof.analysis.tables.overview import (
    HEATMAP_COLS,
    HEATMAP_ROWS,
    Heatmap,
    OverviewSummary,
    RankSeries,
    heatmap_of_series,
    read_overview,
    series_of,
    step_quantiles,
)

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.step_signals import Signal
    from uberprof.analysis.diff.compare import Comparison
    from uberprof.analysis.tables.context import RunContext
    from uberprof.rundir.follow import RunFollower

__all__ = [
    "DEFAULT_THRESHOLD_NS",
    "HEATMAP_COLS",
    "HEATMAP_ROWS",
    "MIN_INSTANCES",
    "Heatmap",
    "OpenedRun",
    "OverviewSummary",
    "RankSeries",
    "SavedFindings",
    "compare_runs",
    "diagnose_opened",
    "empty_report",
    "heatmap_of_series",
    "keep_pandas_out",
    "live_signals",
    "open_run",
    "open_tables",
    "ranks_table_file",
    "saved_findings",
    "scaling_of",
    "series_of",
    "sql_table",
    "step_quantiles",
]


_ANALYSED_TOTALS = ("window", "compute", "comm", "overlap", "exposed_comm", "memory", "idle")


def _analysed_totals(rank: dict[str, Any]) -> dict[str, Any]:
    """A report document's rank item as the totals `tables.shares.time_shares` reads
    (`<part>_ns`): its analysed steps' times (`ranks[].analysed`)."""
    a = rank["analysed"]
    out = {f"{k}_ns": round((a.get(f"{k}_ms") or 0.0) * 1e6) for k in _ANALYSED_TOTALS}
    # idle is the rest, so that the parts tile the window exactly whatever the rounding
    out["idle_ns"] = max(out["window_ns"] - out["compute_ns"] - out["exposed_comm_ns"]
                         - out["memory_ns"], 0)
    return {"rank": rank["rank"], **out}


@dataclass
class OpenedRun:
    """A run as every view reads it: its tables, its diagnosis and what went wrong reading it.

    `ctx` is None for a path without traces (a job that hung or crashed before its trace
    window); its `diagnosis` then holds the hang and crash findings read from the run directory
    alone, or is None when there are none."""

    root: Path
    ctx: RunContext | None
    diagnosis: Diagnosis | None = None
    problems: list[str] = field(default_factory=list)  # one line each, the file named
    no_traces: str | None = None  # why there is nothing to analyse, when there is not

    @property
    def has_traces(self) -> bool:
        return self.ctx is not None

    @property
    def derived(self) -> Path | None:
        return self.ctx.derived if self.ctx is not None else None

    def activity(self, rank: int, lo: int | None = None, hi: int | None = None
                 ) -> pa.Table | None:
        """Rank `rank`'s device activity as the analysis counted it (ACTIVITY_SCHEMA: role,
        start_ns, end_ns on its own clock, intervals disjoint per role), clipped to [lo, hi)
        when given; None when it has none."""
        t = self.ctx.activity(rank) if self.ctx is not None else None
        if t is None or (lo is None and hi is None):
            return t
        lo = lo if lo is not None else -(2**63)
        hi = hi if hi is not None else 2**63 - 1
        t = t.filter(pc.and_(pc.less(t.column("start_ns"), hi),
                             pc.greater(t.column("end_ns"), lo)))
        return t.set_column(1, "start_ns", pc.max_element_wise(t.column("start_ns"), lo)) \
                .set_column(2, "end_ns", pc.min_element_wise(t.column("end_ns"), hi))

    def time_shares(self) -> pa.Table | None:
        """Per rank with an analysed trace, the parts that tile its analysed time
        (`tables.shares.time_shares`: `<part>_ns`, `<part>_pct`, `overlap_pct`), by rank: of
        the analysed steps the diagnosis saved (`ranks[].analysed`, the time the report's rank
        table and the findings' shares are of) once there is one, else of the whole traces as
        the analysis saved them; None without traces."""
        from uberprof.analysis.tables.shares import read_time_shares, time_shares

        if self.ctx is None:
            return None
        d = self.diagnosis
        if d is None or not d.ranks:
            return read_time_shares(self.ctx.derived)
        rows = [_analysed_totals(r) for r in d.ranks if (r["analysed"].get("window_ms") or 0) > 0]
        return time_shares(rows) if rows else None

    def run_breakdown(self) -> dict[str, Any] | None:
        """The whole run's breakdown: `metrics.percentages` of its traced ranks' totals
        together (compute_pct, exposed_comm_pct, idle_pct, ...), of their analysed steps once
        the diagnosis saved them (as `time_shares`), else of the whole traces as the analysis
        saved it (`tables.shares.run_breakdown`); None without traces."""
        from uberprof.analysis.tables.shares import read_run_breakdown, run_breakdown

        if self.ctx is None:
            return None
        d = self.diagnosis
        rows = [_analysed_totals(r) for r in (d.ranks if d is not None else [])
                if (r["analysed"].get("window_ms") or 0) > 0]
        return run_breakdown(rows) if rows else read_run_breakdown(self.ctx.derived)

    def collective_kinds(self) -> pa.Table | None:
        """Per collective name and message size: calls, ranks, total and median time (ms), by
        total time, as the analysis saved them (`tables.shares.write_collective_kinds`); None
        without traces or collectives."""
        from uberprof.analysis.tables.derived import read_collective_kinds

        t = read_collective_kinds(self.ctx.derived) if self.ctx is not None else None
        return t if t is not None and t.num_rows else None

    def step_timelines(self, columns: list[str]) -> pa.Table | None:
        """Every rank's step timeline as the analysis saved it (TIMELINE_SCHEMA): `rank`,
        `step` and `columns`, in rank and step order; None without traces or a run directory.
        A rank whose table was not saved (no steps.jsonl, unreadable) has no rows."""
        if self.ctx is None or not self.ctx.is_run_dir or self.ctx.run is None:
            return None
        from uberprof.analysis.tables.schemas import TIMELINE_SCHEMA
        from uberprof.rundir import RunDir, ranks_by_id

        cols = ["step", *(c for c in columns if c != "step")]
        schema = pa.schema([("rank", pa.int64()), *(TIMELINE_SCHEMA.field(c) for c in cols)])
        parts = []
        for rank, meta in sorted(ranks_by_id(RunDir(self.ctx.root)).items()):
            t = self.ctx.run.timeline(meta.folder)
            if t is None or not t.num_rows:
                continue
            parts.append(t.select(cols).add_column(
                0, "rank", pa.repeat(pa.scalar(rank, pa.int64()), t.num_rows)))
        return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()

    def overview(self) -> OverviewSummary | None:
        """What the dashboard's overview draws from the step table (ranks, steps, step-time
        quantiles, the binned heat map), as the reduce saved it; None without traces or when
        it is missing or older than the step table (`tables/overview.py`)."""
        return read_overview(self.ctx.derived) if self.ctx is not None else None

    def traced_breakdown(self) -> pa.Table | None:
        """The whole-trace breakdown (RANK_SCHEMA) of the ranks with an analysed trace, None
        when there is none."""
        if self.ctx is None:
            return None
        rt = self.ctx.breakdown()
        if "traces" in rt.schema.names:
            rt = rt.filter(pc.greater(pc.fill_null(rt.column("traces"), 0), 0))
        return rt if rt.num_rows else None


def open_tables(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                workers: int | None = None, progress: Progress | None = None,
                executor: Executor | None = None) -> OpenedRun:
    """The run's tables, analysed first where missing or stale; no diagnosis yet (a view that
    shows progress in stages calls `diagnose_opened` next)."""
    from uberprof.analysis.tables.context import load_context
    from uberprof.ingest.discover import NoTraces

    try:
        ctx = load_context(path, out=out, workers=workers, progress=progress, executor=executor)
    except NoTraces as exc:
        return OpenedRun(Path(path), None, problems=[str(exc)], no_traces=str(exc))
    return OpenedRun(Path(path), ctx, problems=list(ctx.problems))


def diagnose_opened(opened: OpenedRun, threshold_ns: int = DEFAULT_THRESHOLD_NS,
                    on_save_error: Callable[[OSError], None] | None = None,
                    make: bool = True) -> OpenedRun:
    """`opened` with its diagnosis: the saved one when fresh, else a new one (saved; a folder
    that cannot be written is told to `on_save_error`). `make=False` only reads a fresh saved
    one (cheap), leaving `diagnosis` None when there is none: a view that shows progress says
    "diagnosing" only when it must. Without traces, the hang and crash findings of a run
    directory."""
    from uberprof.analysis.diagnosis.saved import load, load_or_diagnose

    if opened.ctx is not None and not make:
        opened.diagnosis = load(opened.ctx, threshold_ns=threshold_ns)
    elif opened.ctx is not None:
        opened.diagnosis = load_or_diagnose(opened.ctx, threshold_ns=threshold_ns,
                                            on_save_error=on_save_error)
    else:
        from uberprof.analysis.diagnosis.document import failures_only_diagnosis
        from uberprof.rundir import RunDir

        if RunDir(opened.root).is_run():
            d = failures_only_diagnosis(opened.root, list(opened.problems))
            opened.diagnosis = d if d.findings else None
    return opened


def open_run(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
             threshold_ns: int = DEFAULT_THRESHOLD_NS, workers: int | None = None,
             progress: Progress | None = None, executor: Executor | None = None,
             on_save_error: Callable[[OSError], None] | None = None) -> OpenedRun:
    """Open `path` (a run directory, a folder of Kineto traces or one trace) for a view: its
    tables and its diagnosis (`open_tables`, then `diagnose_opened`)."""
    opened = open_tables(path, out=out, workers=workers, progress=progress, executor=executor)
    return diagnose_opened(opened, threshold_ns=threshold_ns, on_save_error=on_save_error)


def ranks_table_file(derived: str | os.PathLike[str]) -> Path:
    """Where the analysis saved its per-rank table (`derived/ranks.parquet`), to name it."""
    from uberprof.analysis.tables.derived import RANKS_FILE

    return Path(derived) / RANKS_FILE


def keep_pandas_out() -> None:
    """Keep pandas out of this process (`tables.pool.keep_pandas_out`): a view that opens a run
    calls it before reading, as the analysis's workers do."""
    from uberprof.analysis.tables.pool import keep_pandas_out as keep_out

    keep_out()


def empty_report(path: str | os.PathLike[str], problems: list[str]) -> dict[str, Any]:
    """The report document of a path with nothing to diagnose (docs/json.md): the same fields
    as any report, empty, with the problems under `run`."""
    from uberprof.analysis.diagnosis.document import empty_diagnosis

    return empty_diagnosis(Path(path), problems).to_json()


def live_signals(follower: RunFollower) -> list[Signal]:
    """What the step timelines of a running job already show, under the diagnosis's own tests
    (`analysis/diagnosis/step_signals.py`): the one computation behind `uberprof watch` and the
    live dashboard."""
    from uberprof.analysis.diagnosis.step_signals import followed_signals

    return followed_signals(follower)


def saved_findings(run: Any) -> SavedFindings | None:
    """The findings and per-rank lateness of the diagnosis last saved for `run` (a run
    directory), None when there is none."""
    from uberprof.analysis.diagnosis.saved import read_saved_findings

    return read_saved_findings(run)


def compare_runs(a: str | os.PathLike[str], b: str | os.PathLike[str],
                 out: str | os.PathLike[str] | None = None, **kwargs: Any) -> Comparison:
    """Run B against run A (`uberprof diff A B`, the dashboard's /compare page). `out`: where
    B's tables are (`uberprof dashboard B --out`; A's are in their default place); `kwargs`
    go to both (`profile_run`: workers, ranks, steps, threshold_ns)."""
    from uberprof.analysis.diff import compare, profile_run

    return compare(profile_run(a, **kwargs), profile_run(b, out=out, **kwargs))


def scaling_of(paths: list[str | os.PathLike[str]],
               outs: list[str | os.PathLike[str] | None] | None = None, force: bool = False,
               batches: list[int] | None = None, **kwargs: Any) -> dict[str, Any]:
    """The `uberprof scaling --json` document of `paths` (docs/scaling.md; the dashboard's
    /compare scaling section): each run read as `report` reads it. `outs`: where each run's
    tables are (None: the default place); `kwargs` go to every run (workers, threshold_ns).
    Raises ValueError (`ScalingError`) with a one-line reason naming the run."""
    from uberprof.analysis.diff.scaling import read_scaling_point, scaling

    places = list(outs) if outs is not None else [None] * len(paths)
    points = [read_scaling_point(p, out=o, **kwargs) for p, o in zip(paths, places)]
    return scaling(points, force=force, batches=batches).to_json()
