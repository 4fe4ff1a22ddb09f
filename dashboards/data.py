"""The dashboard's shared core: one opened run, loaded once and shared by every page and request.
Each page asks its own query module (`uberprof.dashboards.queries.<page>`) for small, already
aggregated tables; those modules read the run through this core, so that a page of a 64-rank,
2000-step run is built from a few thousand numbers. The dashboard computes nothing: it reads
what the analysis saved, through `uberprof.analysis.read`:

- `RunData` holds the `OpenedRun` its caller made (`read.open_tables`: the `uberprof analyze`
  tables, brought up to date when missing or stale) and its diagnosis (`read.diagnose_opened`:
  the one `uberprof report` saved when fresh, else made once and saved; for a run directory
  without traces, its hang and crash findings);
- the steps of every rank, with the step timelines of ranks without traces
  (`dashboards/steps_data.py`);
- the run's counters (`uberprof.rundir.counters`, `dashboards/counters_data.py`);
- for `--compare A`, the comparison the caller made (`dashboards/queries/compare.py`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.model import Diagnosis, Finding
from uberprof.analysis.read import (
    OpenedRun,
    OverviewSummary,
    diagnose_opened,
    open_tables,
)
from uberprof.dashboards.counters_data import Counters, CounterSeries
from uberprof.dashboards.steps_data import StepTables, append_new_steps, load_steps

__all__ = ["BREAKDOWN_PARTS", "CounterSeries", "RunData", "get_run"]

Progress = Callable[[int, int, str], None]
T = TypeVar("T")

# The stacked parts of a window (metrics.WINDOW_PARTS), in the order they are drawn, with their
# legend names: `breakdown_by_rank` has `<part>_pct` (share of the window) and `<part>_ns`.
BREAKDOWN_PARTS = (
    ("compute_only", "compute"),
    ("comm_under_compute", "comm under compute"),
    ("exposed_comm", "exposed comm"),
    ("memory", "memory"),
    ("idle", "idle"),
)


@dataclass
class RunData(StepTables, Counters):
    """One run's tables and diagnosis, loaded once and shared by every page and request."""

    root: Path
    out: Path | None = None
    workers: int | None = None
    baseline: Path | None = None  # run A of `uberprof dashboard B --compare A`
    opened: OpenedRun | None = None  # `open` (or `load`) sets it
    comparison: Any = None  # queries.compare.Compared with run A, when the caller made it
    run_id: str | None = None
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    follower: Any = None  # a RunFollower while the run's job runs (`followed`)
    _steps: pa.Table | None = None
    _steps_of: Callable[[], pa.Table] | None = None  # builds `_steps` on first use
    _diagnosis_error: str | None = None
    _diagnosed: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _diagnosis_lock: threading.Lock = field(default_factory=threading.Lock)
    _background: threading.Thread | None = None  # the diagnosis made while pages are served
    _memo: dict[str, Any] = field(default_factory=dict)
    _recent: OrderedDict[Any, Any] = field(default_factory=OrderedDict)

    # --- opening ---------------------------------------------------------------------------------

    @classmethod
    def of(cls, opened: OpenedRun, **options: Any) -> RunData:
        """The dashboard's view of a run its caller opened (`read.open_tables`, or
        `read.open_run` with its diagnosis); `options`: out, workers, baseline, comparison."""
        return cls(root=Path(opened.root).resolve(), **options).open(opened)

    def load(self, progress: Progress | None = None) -> RunData:
        """Open the run (`read.open_tables`: analysed first when its tables are missing or
        stale, `progress` is told) and read its step timelines. Runs without traces load
        their step timelines only; the diagnosis is read or made on first use."""
        t0 = time.perf_counter()
        self.open(open_tables(self.root, out=self.out, workers=self.workers, progress=progress))
        self.load_seconds = time.perf_counter() - t0
        return self

    def open(self, opened: OpenedRun) -> RunData:
        """Take `opened` (its tables, and its diagnosis when it has one) and read the steps."""
        from uberprof.rundir import RunDir

        self.opened = opened
        self.run_id = RunDir(self.root).run_id()
        if opened.ctx is not None:
            self.problems = list(opened.problems)
        if opened.no_traces is not None:
            self.notices.append(f"no traces: {opened.no_traces}")
        self._diagnosed = opened.diagnosis is not None
        if self.saved_overview() is None:
            self._steps = load_steps(self.root, opened.ctx, self.problems)
        else:  # the overview draws from its saved summary: the 5 M rows wait for a page
            root, ctx, problems = self.root, opened.ctx, self.problems
            self._steps_of = lambda: load_steps(root, ctx, problems)
        return self

    def saved_overview(self) -> OverviewSummary | None:
        """The step table's summary the analysis saved for the overview (`read.OpenedRun.
        overview`: ranks, steps, step-time quantiles, the binned heat map) when it covers what
        the pages show: no job followed, and every rank folder among its ranks. Else None, and
        the step table is read."""
        def find() -> OverviewSummary | None:
            if self.follower is not None or self.opened is None:
                return None
            saved = self.opened.overview()
            if saved is None:
                return None
            from uberprof.rundir import ranks_by_id

            return saved if set(ranks_by_id(self.root)) <= set(saved.ranks) else None
        return self.once("overview", find)

    @property
    def ctx(self) -> Any:
        """The analysis tables (`read.OpenedRun.ctx`), None without traces."""
        return self.opened.ctx if self.opened is not None else None

    @property
    def derived(self) -> Path | None:
        return self.opened.derived if self.opened is not None else None

    def diagnose(self) -> Diagnosis | None:
        """The diagnosis the run was opened with, else on first use the saved one when fresh
        or a new one (`read.diagnose_opened`), then kept; without traces, the hang and crash
        findings. None when there is none (no traces, no hang or crash), or on error
        (`diagnosis_error`, and said among the problems). Its own lock, not the caches':
        the overview is built while a diagnosis runs (`diagnose_in_background`)."""
        with self._diagnosis_lock:
            if not self._diagnosed:
                self._diagnosed = True
                if self.opened is not None:
                    try:
                        diagnose_opened(self.opened)
                    except Exception as exc:  # noqa: BLE001 - show what we have
                        self._failed(exc)
            d = self.opened.diagnosis if self.opened is not None else None
            # without traces (step timelines only), nothing but a hang or a crash to show
            return d if d is None or d.findings or self.has_traces else None

    def _failed(self, exc: Exception) -> None:
        self._diagnosis_error = f"{type(exc).__name__}: {exc}"
        if not self.has_traces:
            self.problems.append(f"reading the hang/crash records failed: {exc}")
        else:
            self.problems.append(f"the diagnosis failed ({self._diagnosis_error}); "
                                 "findings, lateness and gaps are not shown")

    def read_saved_diagnosis(self) -> bool:
        """Take the diagnosis saved under `derived/` when it is fresh (reading it is cheap);
        whether there was one. `diagnose()` then does no diagnosis work."""
        with self._diagnosis_lock:
            if self.opened is None:
                return False
            if not self._diagnosed and self.has_traces:
                try:
                    diagnose_opened(self.opened, make=False)
                except Exception:  # noqa: BLE001 - unreadable: diagnose() makes it again
                    self.opened.diagnosis = None
                self._diagnosed = self.opened.diagnosis is not None
            return self._diagnosed and self.opened.diagnosis is not None

    def followed(self, follower: Any) -> RunData:
        """This run as its job has grown since it was loaded: the same analysis and diagnosis,
        with the steps `follower` (a `uberprof.rundir.follow.RunFollower`) read since. Made at
        every refresh that found new steps, so it is cheap: caches start empty but for what
        does not depend on the steps, and the step table is merged only when a page asks."""
        self.diagnose()  # once, shared by every refresh
        self.traced_steps()  # the steps read since were not analysed: none of them is traced
        keep = ("has_traces", "hosts", "rank_gpus", "breakdown_by_rank", "aligned_instances",
                "failures", "traced_steps")
        new = replace(self, follower=follower, _steps=None, _lock=threading.RLock(),
                      _memo={k: v for k, v in self._memo.items() if k in keep},
                      _recent=OrderedDict(), problems=list(self.problems),
                      notices=list(self.notices))
        base = self.steps

        def merged() -> pa.Table:
            from uberprof.rundir.follow import steps_table

            return append_new_steps(base, steps_table(follower))
        new._steps_of = merged
        return new

    def warm(self) -> None:
        """The diagnosis (unless it is being made in the background) and the counters'
        catalog, before the first request arrives (the app builds the overview itself when it
        starts)."""
        if not self.diagnosis_pending():
            self.diagnose()
        self.counter_catalog()

    def diagnose_in_background(self, done: Callable[[], None] | None = None) -> None:
        """Start `diagnose()` on a thread, so that the pages that need no diagnosis are served
        meanwhile (the overview says the findings are being diagnosed and fills them in);
        `done()` is called after it, failed or not."""
        def run() -> None:
            try:
                self.diagnose()
            finally:
                if done is not None:
                    done()
        with self._lock:
            if self._background is None and not self._diagnosed:
                self._background = threading.Thread(target=run, name="uberprof-diagnosis",
                                                    daemon=True)
                self._background.start()

    def diagnosis_pending(self) -> bool:
        """Whether the diagnosis is being made in the background now (pages that would wait
        for it say so instead)."""
        b = self._background
        return b is not None and b.is_alive()

    # --- caches ---------------------------------------------------------------------------------

    def once(self, key: str, build: Callable[[], T]) -> T:
        """`build()`, computed on first use and kept for the life of the app (the run does not
        change while it is served)."""
        with self._lock:
            if key not in self._memo:
                self._memo[key] = build()
            return self._memo[key]

    def recent(self, key: Any, build: Callable[[], T], keep: int = 8) -> T:
        """`build()`, kept for the `keep` keys asked for last (large per-selection results)."""
        with self._lock:
            if key in self._recent:
                self._recent.move_to_end(key)
                return self._recent[key]
        value = build()
        with self._lock:
            self._recent[key] = value
            while len(self._recent) > keep:
                self._recent.popitem(last=False)
        return value

    def figure(self, key: str, build: Callable[[], Any]) -> Any:
        """A figure that depends on the run only (not on the selection), built once."""
        return self.once(f"figure:{key}", build)

    # --- what the run has -----------------------------------------------------------------------

    @property
    def label(self) -> str:
        """The run's name in titles: its run id, else its folder's name."""
        return self.run_id or self.root.name

    @property
    def diagnosis_error(self) -> str | None:
        """Why the diagnosis failed (None when it did not, or was not tried)."""
        return self._diagnosis_error

    @property
    def is_run_dir(self) -> bool:
        """A uberprof run directory (else a folder of Kineto traces or one trace file)."""
        from uberprof.rundir import RunDir

        return RunDir(self.root).is_run()

    @property
    def has_traces(self) -> bool:
        """Whether any rank has an analysed trace (a run may have step timelines only)."""
        return bool(self.once("has_traces", lambda: self.rank_table() is not None))

    def host_of(self, rank: int) -> str | None:
        return self.once("hosts", self._hosts).get(rank)

    def _hosts(self) -> dict[int, str | None]:
        from uberprof.rundir import ranks_by_id

        out: dict[int, str | None] = {}
        if self.ctx is not None:
            out = {r: self.ctx.host_of(r) for r in self.ctx.rank_ids}
        for rank, m in ranks_by_id(self.root).items():
            if not out.get(rank):
                out[rank] = m.host
        return out

    def straggler(self) -> Any:
        d = self.diagnose()
        return d.straggler if d is not None else None

    def straggler_rank(self) -> int | None:
        s = self.straggler()
        return s.rank if s is not None else None

    def findings(self) -> list[Finding]:
        d = self.diagnose()
        return list(d.findings) if d is not None else []

    def timeline_changes(self) -> list[dict[str, Any]]:
        """Where the step time changed level, as the diagnosis saved it
        (`run.timeline_changes`); [] without a diagnosis. A run without traces has one too
        (its step timelines tell the story, as `report` prints it), which `diagnose` keeps
        from the other pages."""
        self.diagnose()
        d = self.opened.diagnosis if self.opened is not None else None
        return list(d.run["timeline_changes"]) if d is not None else []

    def failures(self) -> list[Finding]:
        """The hang and crash findings of the diagnosis (for a run directory without traces,
        read from the run directory alone: a job that hung or crashed before its trace
        window)."""
        return self.once("failures", lambda: [f for f in self.findings()
                                              if f.role == "failure"])

    def missing(self) -> list[str]:
        """What the run lacks, in the user's words (shown on every page that would use it)."""
        def find() -> list[str]:
            out = []
            if not self.has_traces:
                out.append("No traces: this run has step timelines only, so there is no "
                           "compute/communication breakdown, no findings, gaps, lateness or "
                           "bandwidth. Record some with `uberprof run --trace-steps A-B` (or "
                           "`--trace-every N`).")
            cat = self.counter_catalog()
            if not cat["nodes"] and not self.is_run_dir:
                out.append("No counters: this is a folder of traces; GPU and host counters come "
                           "with runs recorded by `uberprof run`.")
            elif not cat["nodes"]:
                out.append("No counters: the run was recorded with `--counters none`, or the "
                           "node agents could not sample.")
            elif not cat["gpu"]:
                notes = [n for n in cat["notes"] if "GPU" in n or "NVML" in n]
                out.append("No GPU counters (clocks, temperature, power, utilisation)"
                           + (f": {notes[0].rstrip('.')}." if notes else ": host counters "
                              "only."))
            if self.ctx is None and not self.steps.num_rows:
                out.append("No step timelines either: is this a uberprof run directory?")
            return out
        return self.once("missing", find)

    # --- per-rank breakdown (overview, gaps, communication) ------------------------------------

    def rank_table(self) -> pa.Table | None:
        """RANK_SCHEMA rows (whole-trace breakdown per rank) of the ranks with traces, or
        None when no rank has one."""
        return self.opened.traced_breakdown() if self.opened is not None else None

    def breakdown_by_rank(self) -> pa.Table | None:
        """Per rank: each BREAKDOWN_PARTS share of its analysed time (`<part>_pct`) and its ns
        (`<part>_ns`), the overlap ratio (`overlap_pct`, of the communication), step times
        (`read.OpenedRun.time_shares` beside the whole-trace breakdown)."""
        def build() -> pa.Table | None:
            rt = self.rank_table()
            shares = self.opened.time_shares() if self.opened is not None else None
            if rt is None or shares is None:
                return None
            return _with_rank_columns(shares, rt, ("step_time_median_ms", "step_time_p90_ms",
                                                   "mode", "host"))
        # of the analysed steps once diagnosed (the report's), of the whole traces before
        ready = self.opened is not None and self.opened.diagnosis is not None
        return self.once("breakdown_by_rank" if ready else "breakdown_by_rank_traces", build)


def _with_rank_columns(left: pa.Table, right: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """`left`'s rows whose rank `right` has, with `right`'s `columns` of that rank added, by
    rank (an inner join on the one-row-per-rank key). Arrow, not DuckDB: the overview's
    breakdown is drawn at every start, and DuckDB's import alone is 45-90 ms of it."""
    at = pc.index_in(left.column("rank"), value_set=right.column("rank"))
    keep = pc.is_valid(at)
    out = left.filter(keep)
    taken = right.select(list(columns)).take(at.filter(keep))
    for name in columns:
        out = out.append_column(taken.schema.field(name), taken.column(name))
    return out.sort_by("rank")


_RUNS: dict[Path, RunData] = {}
_RUNS_LOCK = threading.Lock()


def get_run(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
            workers: int | None = None, progress: Progress | None = None) -> RunData:
    """The loaded `RunData` of a run, shared by every request (loaded on first use)."""
    root = Path(path).resolve()
    with _RUNS_LOCK:
        data = _RUNS.get(root)
        if data is None:
            data = RunData(root=root, out=Path(out) if out is not None else None,
                           workers=workers).load(progress)
            _RUNS[root] = data
        return data
