"""The dashboard's shared core: one run, its diagnosis, and the tables every page reads, loaded
once and shared by every page and request. Each page asks its own query module
(`uberprof.dashboards.queries.<page>`) for small, already aggregated tables; those modules
read the run through this core, so that a page of a 64-rank, 2000-step run is built from a few
thousand numbers. Where the numbers come from:

- `uberprof analyze` tables (steps, ranks, collectives, per-rank events) through
  `uberprof.analysis.tables.context.load_context`, which also (re)runs the analysis when they are
  missing or stale;
- the diagnosis (`uberprof.analysis.diagnosis.saved.load_or_diagnose`): findings, clock alignment,
  lateness, idle gaps, bandwidth and the per-rank summaries; read back from the one
  `uberprof report` saved when it is fresh, else computed once (and saved);
- the run's counters (`uberprof.rundir.counters`), filtered while read and averaged into
  time buckets here;
- for runs without traces, the step timelines (`steps.jsonl`) alone.

Metric definitions are not repeated here: per-rank shares of the window come from
`uberprof.analysis.diagnosis.summaries.time_shares`, everything else from the diagnosis.
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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.summaries import sql_table

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

_STEP_SCHEMA = pa.schema([("rank", pa.int64()), ("step", pa.int64()),
                          ("host_start_ns", pa.int64()), ("host_end_ns", pa.int64()),
                          ("step_time_ns", pa.int64()), ("data_wait_ns", pa.int64()),
                          ("traced", pa.bool_())])


@dataclass
class CounterSeries:
    """One metric of one source over time, per device, downsampled to at most `points`."""

    metric: str
    unit: str | None
    devices: dict[str, tuple[np.ndarray, np.ndarray]]  # device -> (t seconds, value)
    bucket_s: float


@dataclass
class RunData:
    """One run's tables and diagnosis, loaded once and shared by every page and request."""

    root: Path
    out: Path | None = None
    workers: int | None = None
    baseline: Path | None = None  # run A of `uberprof dashboard B --compare A`
    run_id: str | None = None
    derived: Path | None = None
    ctx: Any = None  # uberprof.analysis.tables.context.RunContext, None without traces
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    follower: Any = None  # a RunFollower while the run's job runs (`followed`)
    _steps: pa.Table | None = None
    _steps_of: Callable[[], pa.Table] | None = None  # builds `_steps` on first use
    _diagnosis: Any = None
    _diagnosis_error: str | None = None
    _diagnosed: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _memo: dict[str, Any] = field(default_factory=dict)
    _recent: OrderedDict[Any, Any] = field(default_factory=OrderedDict)

    # --- loading --------------------------------------------------------------------------------

    def load(self, progress: Progress | None = None) -> RunData:
        """Analyse the run when its tables are missing or stale (`progress` is told), and read
        its step timelines. Runs without traces load their step timelines only."""
        from uberprof.analysis.tables.context import load_context
        from uberprof.ingest.discover import NoTraces
        from uberprof.rundir import RunDir

        t0 = time.perf_counter()
        self.run_id = RunDir(self.root).run_id()
        try:
            self.ctx = load_context(self.root, out=self.out, workers=self.workers,
                                    progress=progress)
            self.derived = self.ctx.run.derived
            self.problems = list(self.ctx.problems)
        except NoTraces as exc:
            self.ctx = None
            self.notices.append(f"no traces: {exc}")
        self._steps = self._load_steps()
        self.load_seconds = time.perf_counter() - t0
        return self

    def diagnose(self) -> Any:
        """The diagnosis (the saved one when fresh, else computed on first use), then kept;
        None without traces or on error."""
        with self._lock:
            if not self._diagnosed:
                self._diagnosed = True
                if self.has_traces:
                    from uberprof.analysis.diagnosis.saved import load_or_diagnose

                    try:
                        self._diagnosis = load_or_diagnose(self.ctx)
                    except Exception as exc:  # noqa: BLE001 - show what we have
                        self._diagnosis_error = f"{type(exc).__name__}: {exc}"
                        self.problems.append(f"the diagnosis failed ({self._diagnosis_error}); "
                                             "findings, lateness and gaps are not shown")
            return self._diagnosis

    def read_saved_diagnosis(self) -> bool:
        """Take the diagnosis saved under `derived/` when it is fresh (reading it is cheap);
        whether there was one. `diagnose()` then does no diagnosis work."""
        with self._lock:
            if self._diagnosed or not self.has_traces:
                return self._diagnosis is not None
            from uberprof.analysis.diagnosis.saved import load

            try:
                d = load(self.ctx)
            except Exception:  # noqa: BLE001 - unreadable: diagnose() makes it again
                d = None
            if d is not None:
                self._diagnosis, self._diagnosed = d, True
            return d is not None

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

            return _append_new_steps(base, steps_table(follower))
        new._steps_of = merged
        return new

    def step_series(self, column: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Per rank (rank, steps, `column`: step_time_ns or data_wait_ns), in step order: from
        the follower's arrays while the job runs (no table to build), else from `steps`."""
        if self.follower is not None:
            return self.follower.series({"step_time_ns": "duration_ns"}.get(column, column))
        t = self.steps.select(["rank", "step", column]).sort_by([("rank", "ascending"),
                                                                  ("step", "ascending")])
        rank = t.column("rank").to_numpy(zero_copy_only=False)
        ranks, first = np.unique(rank, return_index=True)
        cut = first[1:]
        return list(zip(ranks.tolist(),
                        np.split(t.column("step").to_numpy(zero_copy_only=False), cut),
                        np.split(t.column(column).to_numpy(zero_copy_only=False), cut)))

    def warm(self) -> None:
        """The diagnosis and the counters' catalog, before the first request arrives (the app
        builds the overview itself when it starts)."""
        self.diagnose()
        self.counter_catalog()

    def _load_steps(self) -> pa.Table:
        """Steps of every rank: the analysis table, plus the step timelines of ranks that have
        no analysable trace (or of every rank when the run has no traces at all)."""
        from uberprof.rundir import STEPS_FILE, ranks_by_id, read_steps

        parts = []
        have: set[int] = set()
        if self.ctx is not None:
            t = self.ctx.steps()
            parts.append(t)
            have = set(pc.unique(t.column("rank")).to_pylist()) if t.num_rows else set()
        schema = parts[0].schema if parts else _STEP_SCHEMA
        rows = []
        for rank, meta in ranks_by_id(self.root).items():
            if rank in have:
                continue
            steps, truncated = read_steps(meta.folder)
            if truncated:
                self.problems.append(f"{meta.folder / STEPS_FILE}: ends with a cut-off line")
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
            return _STEP_SCHEMA.empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

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
    def steps(self) -> pa.Table:
        with self._lock:
            if self._steps is None and self._steps_of is not None:
                self._steps = self._steps_of()
        assert self._steps is not None, "RunData.load() first"
        return self._steps

    @property
    def is_run_dir(self) -> bool:
        """A uberprof run directory (else a folder of Kineto traces or one trace file)."""
        from uberprof.rundir import RunDir

        return RunDir(self.root).is_run()

    @property
    def has_traces(self) -> bool:
        """Whether any rank has an analysed trace (a run may have step timelines only)."""
        def find() -> bool:
            if self.ctx is None:
                return False
            rt = self.ctx.breakdown()
            if rt.num_rows == 0:
                return False
            if "traces" not in rt.schema.names:
                return True
            return any((t or 0) > 0 for t in rt.column("traces").to_pylist())
        return bool(self.once("has_traces", find))

    def ranks(self) -> list[int]:
        return self.once("ranks", lambda: sorted(pc.unique(self.steps.column("rank"))
                                                 .to_pylist()) if self.steps.num_rows
                         else (self.ctx.rank_ids if self.ctx is not None else []))

    def traced_steps(self) -> list[int]:
        def find() -> list[int]:
            t = self.steps.filter(pc.equal(self.steps.column("traced"), True))
            return sorted(s for s in pc.unique(t.column("step")).to_pylist() if s is not None)
        return self.once("traced_steps", find)

    def all_steps(self) -> list[int]:
        return self.once("all_steps", lambda: sorted(
            s for s in pc.unique(self.steps.column("step")).to_pylist() if s is not None))

    def rank_steps(self, rank: int) -> pa.Table:
        """One rank's rows of `steps`."""
        return self.steps.filter(pc.equal(self.steps.column("rank"), rank))

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

    def findings(self) -> list[Any]:
        d = self.diagnose()
        return list(d.findings) if d is not None else []

    def failures(self) -> list[Any]:
        """The hang and crash findings: the diagnosis' when the run has traces, else read from
        the run directory alone (a job that hung or crashed before its trace window)."""
        def find() -> list[Any]:
            if self.has_traces:
                return [f for f in self.findings() if f.kind in ("hang", "crash")]
            from uberprof.rundir import RunDir

            if not RunDir(self.root).is_run():
                return []
            from uberprof.analysis.diagnosis.findings.failures import failure_findings

            try:
                return failure_findings(self.root)
            except Exception as exc:  # noqa: BLE001 - the other pages still work
                self.problems.append(f"reading the hang/crash records failed: {exc}")
                return []
        return self.once("failures", find)

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
        None without traces."""
        if not self.has_traces:
            return None
        rt = self.ctx.breakdown()
        if "traces" in rt.schema.names:
            rt = rt.filter(pc.greater(pc.fill_null(rt.column("traces"), 0), 0))
        return rt

    def breakdown_by_rank(self) -> pa.Table | None:
        """Per rank: each BREAKDOWN_PARTS share of its traced time (`<part>_pct`) and its ns
        (`<part>_ns`), the overlap ratio (`overlap_pct`, of the communication), step times."""
        def build() -> pa.Table | None:
            from uberprof.analysis.diagnosis.summaries import time_shares

            rt = self.rank_table()
            if rt is None or rt.num_rows == 0:
                return None
            return sql_table("""
                SELECT t.*, r.step_time_median_ms, r.step_time_p90_ms, r.mode, r.host
                FROM t JOIN r USING (rank) ORDER BY rank
            """, t=time_shares(rt), r=rt)
        return self.once("breakdown_by_rank", build)

    # --- the run's time axis (counters, stragglers) --------------------------------------------

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

    # --- counters (read through uberprof.rundir.counters) --------------------------------------

    def counter_catalog(self) -> dict[str, Any]:
        """Nodes with counters and, per node, the sources and metrics they hold (from each
        node's index, without reading the tables)."""
        return self.once("counter_catalog", self._counter_catalog)

    def _counter_catalog(self) -> dict[str, Any]:
        from uberprof.rundir import RunDir
        from uberprof.rundir.counters import counter_meta, counter_nodes, counter_series

        run = RunDir(self.root)
        nodes: dict[str, dict[str, Any]] = {}
        notes: list[str] = []
        gpu = False
        try:
            names = counter_nodes(run)
        except OSError:
            names = []
        for n in names:
            index = counter_series(run, n)
            meta = counter_meta(run, n)
            notes += [x for x in meta.get("notes") or [] if isinstance(x, str)]
            series: dict[str, dict[str, str]] = {}
            for s in index:
                series.setdefault(s["source"], {})[s["metric"]] = s.get("unit") or ""
            gpu = gpu or "nvml" in series or "dcgm" in series
            nodes[n] = {"host": meta.get("host") or n, "series": series,
                        "gpus": sorted((meta.get("gpus") or {}).keys(),
                                       key=lambda g: (len(g), g))}
        return {"nodes": nodes, "gpu": gpu, "notes": sorted(set(notes))}

    def node_of_rank(self, rank: int | None) -> str | None:
        """The counters node that sampled a rank's host."""
        cat = self.counter_catalog()
        if rank is None or not cat["nodes"]:
            return next(iter(cat["nodes"]), None)
        host = self.host_of(rank)
        for n, info in cat["nodes"].items():
            if info["host"] == host:
                return n
        return next(iter(cat["nodes"]), None)

    def rank_gpu(self, rank: int) -> tuple[str, str] | None:
        """(node, GPU label) of a rank, from GPU UUIDs."""
        def build() -> dict[int, tuple[str, str]]:
            from uberprof.rundir.counters import rank_gpus

            try:
                return rank_gpus(self.root)
            except Exception:  # noqa: BLE001 - counters are optional
                return {}
        return self.once("rank_gpus", build).get(rank)

    def counters(self, node: str, sources: list[str], metrics: list[str],
                 start_ns: int | None = None, end_ns: int | None = None) -> pa.Table | None:
        """Rows of a node's counters (`uberprof.rundir.counters.counters_table`), None when
        they cannot be read (counters are optional: nothing to draw)."""
        from uberprof.rundir.counters import counters_table

        try:
            return counters_table(self.root, node, sources=sources, metrics=metrics,
                                  start_ns=start_ns, end_ns=end_ns)
        except Exception:  # noqa: BLE001
            return None

    def counter_series(self, node: str, source: str, metric: str,
                       devices: list[str] | None = None, points: int = 600,
                       start_ns: int | None = None, end_ns: int | None = None
                       ) -> CounterSeries | None:
        """One metric over time per device, averaged into at most `points` time buckets."""
        key = f"series:{node}:{source}:{metric}:{devices}:{points}:{start_ns}:{end_ns}"
        return self.once(key, lambda: self._counter_series(node, source, metric, devices,
                                                           points, start_ns, end_ns))

    def _counter_series(self, node: str, source: str, metric: str, devices: list[str] | None,
                        points: int, start_ns: int | None, end_ns: int | None
                        ) -> CounterSeries | None:
        t = self.counters(node, [source], [metric], start_ns, end_ns)
        if t is not None and devices is not None:
            t = t.filter(pc.is_in(t.column("device"), pa.array(devices, pa.string())))
        if t is None or t.num_rows == 0:
            return None
        origin = self.time_origin_ns() or pc.min(t.column("ts_ns")).as_py()
        lo, hi = pc.min(t.column("ts_ns")).as_py(), pc.max(t.column("ts_ns")).as_py()
        width = max(int((hi - lo) / points) + 1, 1)
        q = sql_table(f"""
            SELECT device, (ts_ns - {int(lo)}) // {int(width)} AS b, avg(ts_ns) AS ts,
                   avg(value) AS v
            FROM t GROUP BY ALL ORDER BY device, b
        """, t=t)
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        dev = np.array(q.column("device").to_pylist(), dtype=object)
        ts = q.column("ts").to_numpy(zero_copy_only=False)
        v = q.column("v").to_numpy(zero_copy_only=False)
        for d in sorted(set(dev.tolist()), key=lambda x: (len(x), x)):
            m = dev == d
            out[d] = ((ts[m] - origin) / 1e9, v[m])
        unit = t.column("unit")[0].as_py()
        return CounterSeries(metric=metric, unit=unit, devices=out, bucket_s=width / 1e9)


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """`t` with `schema`'s columns: cast where it has them, nulls where it has not."""
    return pa.table({n: (t.column(n).cast(schema.field(n).type) if n in t.schema.names
                         else pa.nulls(t.num_rows, schema.field(n).type))
                     for n in schema.names}, schema=schema)


def _append_new_steps(base: pa.Table, live: pa.Table) -> pa.Table:
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
