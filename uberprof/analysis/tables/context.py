"""What the diagnosis reads: the tables of `uberprof analyze`, each rank's metadata (host, clock,
process groups) and the run directory's counters, gathered once behind one object.

The diagnosis never reads trace files itself: it works from the derived tables, so it runs in
seconds on runs whose traces took minutes to ingest, and it reruns `analyze` only for traces
that changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.progress import Progress
from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables.pipeline import Analysis, analyze
from uberprof.rundir import RankMeta, RunDir, ranks_by_id
from uberprof.rundir.flight_log import FlightLog, read_flight_log

__all__ = ["RankInfo", "RunContext", "load_context", "rows_or_none"]


def rows_or_none(read: Callable[[], pa.Table]) -> pa.Table | None:
    """`read()`'s table (an optional derived table: `RunContext.modules`, `memory_timeline`)
    when it can be read and has rows, else None."""
    try:
        t = read()
    except (OSError, pa.ArrowException):
        return None
    return t if t.num_rows else None


@dataclass(frozen=True)
class RankInfo:
    """One rank's identity as far as the run says: where it ran and what its clock was."""

    rank: int
    host: str | None  # None when neither rank.json nor the trace names it
    world_size: int | None
    local_rank: int | None
    backend: str | None
    mode: str  # "device" or "cpu"
    device_type: str
    clock: dict[str, Any]  # rank.json "clock" (online offset estimate), {} for plain traces
    process_groups: list[dict[str, Any]]  # from the trace's distributedInfo.pg_config
    window: tuple[int, int] | None = None  # whole-trace window (first to last activity), ns
    cpu_cores: int | None = None  # rank.json: the cores its process could run on
    torch_threads: int | None = None  # rank.json: torch's intra-op threads


@dataclass
class RunContext:
    """A run's analysis tables plus the metadata the cross-rank diagnosis needs. The tables are
    read (once) from the derived folder through `uberprof.analysis.tables.derived`."""

    run: Analysis  # the analysis the tables come from (its source, derived folder, inputs)
    root: Path
    is_run_dir: bool
    ranks: dict[int, RankInfo]
    problems: list[str] = field(default_factory=list)
    workers: int | None = None  # the map's processes (None: by the amount of work)
    executor: Executor | None = None  # the map's executor instead (Dask's), when one is given
    _cache: dict[str, pa.Table] = field(default_factory=dict, repr=False)
    _flight_logs: dict[int, FlightLog] | None = field(default=None, repr=False)

    def flight_logs(self) -> dict[int, FlightLog]:
        """Each analysed rank's Flight Recorder arrivals (a run directory's; {} otherwise), read
        once: the group of a Gloo collective (`groups.py`) and the straggler test over the
        untraced steps (`diagnosis/arrivals.py`) both use them."""
        if self._flight_logs is None:
            self._flight_logs = {}
            if self.is_run_dir:
                for r, meta in ranks_by_id(RunDir(self.root)).items():
                    log = read_flight_log(meta.folder) if r in self.ranks else None
                    if log is not None and log.unreadable is None:  # named as a problem
                        self._flight_logs[r] = log
        return self._flight_logs

    @property
    def derived(self) -> Path:
        """The derived folder of the analysis."""
        return Path(self.run.derived)

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    @property
    def world_size(self) -> int:
        """The job's world size as its ranks report it: more than the ranks analysed when some
        are missing (named among the problems)."""
        return max([len(self.ranks), *(i.world_size or 0 for i in self.ranks.values())])

    def steps(self, columns: Sequence[str] | None = None) -> pa.Table:
        """RUN_STEP_SCHEMA rows (one per rank and step), Arrow; with `columns`, only those,
        read from the file unless the whole table was (not kept: the dashboard reads its few
        columns once). At 512 ranks x 10,000 steps a third of the columns are nearly all of
        the bytes, and reading the rest (null but on traced steps, in hundreds of row groups)
        cost twice the time of those."""
        if columns is not None and "steps" not in self._cache:
            return D.read_run_steps(self.derived, columns=columns)
        if "steps" not in self._cache:
            self._cache["steps"] = D.read_run_steps(self.derived)
        t = self._cache["steps"]
        return t.select(list(columns)) if columns is not None else t

    def collectives(self) -> pa.Table:
        """One row per collective instance on each rank, Arrow."""
        if "collectives" not in self._cache:
            self._cache["collectives"] = D.read_collectives(self.derived)
        return self._cache["collectives"]

    def breakdown(self) -> pa.Table:
        """RANK_SCHEMA rows (whole-trace breakdown per rank), Arrow."""
        if "ranks" not in self._cache:
            self._cache["ranks"] = D.read_ranks(self.derived)
        return self._cache["ranks"]

    def operators(self) -> pa.Table:
        """RUN_OPERATOR_SCHEMA rows (per rank, kind and name: calls, self and inclusive time
        over the analysed steps), Arrow: what the operator views and `diff` read instead of
        every rank's events."""
        if "operators" not in self._cache:
            self._cache["operators"] = D.read_operators(self.derived)
        return self._cache["operators"]

    def modules(self) -> pa.Table:
        """RUN_MODULE_SCHEMA rows (per rank and module path: calls, total and self time over
        the analysed steps); empty without module spans in the traces."""
        if "modules" not in self._cache:
            self._cache["modules"] = D.read_modules(self.derived)
        return self._cache["modules"]

    def memory_timeline(self) -> pa.Table:
        """RUN_MEMORY_TIMELINE_SCHEMA rows (every rank's [memory] events, with step and
        operator); empty without profile_memory. Not cached: read once per diagnosis."""
        return D.read_memory_timeline(self.derived)

    def events(self, rank: int) -> pa.Table:
        """Every event of one rank (not cached: a rank's table at a time bounds memory)."""
        return D.read_rank_events(self.derived, self.run.inputs, rank)

    def activity(self, rank: int) -> pa.Table | None:
        """One rank's device activity as the analysis counted it (ACTIVITY_SCHEMA), None when
        it has none."""
        try:
            return D.read_rank_activity(self.derived, self.run.inputs, rank)
        except (KeyError, OSError):
            return None

    def host_of(self, rank: int) -> str | None:
        info = self.ranks.get(rank)
        return info.host if info else None

    def window(self, first: int, last: int, span: tuple[int, int] | None = None
               ) -> RunContext:
        """The same run with only steps `first`..`last` traced, and only the steps in `span`
        (all when None) in its step table: the other traced steps marked untraced, only the
        window's collectives. A diagnosis of it is the window's own, with the Flight
        Recorder's arrivals of the `span` steps only (the report compares two:
        diagnosis/window_compare.py); the tables read so far are shared, none read again."""
        def inside(t: pa.Table, lo: int, hi: int) -> pa.ChunkedArray:
            s = t.column("step")
            return pc.and_(pc.greater_equal(s, lo), pc.less_equal(s, hi))

        steps = self.steps()
        if span is not None:
            steps = steps.filter(pc.or_(inside(steps, *span), pc.less(steps.column("step"), 0)))
        traced = pc.and_(pc.fill_null(steps.column("traced"), False),
                         inside(steps, first, last))
        steps = steps.set_column(steps.schema.get_field_index("traced"), "traced", traced)
        coll = self.collectives()
        return replace(self, _cache={**self._cache, "steps": steps,
                                     "collectives": coll.filter(inside(coll, first, last))})


def load_context(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 workers: int | None = None, progress: Progress | None = None,
                 force: bool = False, executor: Executor | None = None) -> RunContext:
    """Analyse `path` (reusing up-to-date tables) and gather rank metadata for the diagnosis.
    `workers`/`executor` run both the analysis's map and the diagnosis's per-rank part."""
    analysis = analyze(path, out=out, workers=workers, progress=progress, force=force,
                       executor=executor)
    root = Path(analysis.source)
    run_dir = RunDir(root)
    is_run = run_dir.is_run()
    meta = ranks_by_id(run_dir) if is_run else {}  # rank.json's fields, type-checked
    summaries = analysis.first_input_summaries()
    ranks: dict[int, RankInfo] = {}
    for row in analysis.ranks:
        r = int(row["rank"])
        m = meta.get(r) or RankMeta(rank=r, folder=root)
        s = summaries.get(r, {})
        ranks[r] = RankInfo(
            rank=r,
            host=m.host or _str(row.get("host")) or _str(s.get("host")),
            world_size=m.world_size or _int(s.get("world_size")),
            local_rank=m.local_rank,
            backend=m.backend or _str(s.get("backend")),
            mode=str(row.get("mode") or "cpu"),
            device_type=str(row.get("device_type") or "cpu"),
            clock=m.clock,
            process_groups=list(s.get("process_groups") or []),
            window=_window(s),
            cpu_cores=m.cpu_cores,
            torch_threads=m.torch_threads,
        )
    return RunContext(run=analysis, root=root, is_run_dir=is_run, ranks=ranks,
                      problems=list(analysis.summary.get("problems") or []), workers=workers,
                      executor=executor)


def _window(summary: dict[str, Any]) -> tuple[int, int] | None:
    lo, hi = _int(summary.get("window_start_ns")), _int(summary.get("window_end_ns"))
    return (lo, hi) if lo is not None and hi is not None and hi > lo else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
