"""Every query the dashboard makes, in one place, over one run's tables (cached per run).

The pages never read traces or Parquet files themselves: they ask a `RunData` for small,
already aggregated tables, so that a page of a 64-rank, 2000-step run is built from a few
thousand numbers. Where the numbers come from:

- `uberprof analyze` tables (steps, ranks, collectives, per-rank events) through
  `uberprof.analysis.context.load_context`, which also (re)runs the analysis when they are
  missing or stale;
- the diagnosis (`uberprof.analysis.saved.load_or_diagnose`): findings, clock alignment,
  lateness, idle gaps, bandwidth and the per-rank summaries; read back from the one
  `uberprof report` saved when it is fresh, else computed once (and saved);
- the run's counters (`uberprof.rundir.counters`), filtered while read and downsampled
  here with DuckDB;
- for runs without traces, the step timelines (`steps.jsonl`) alone.

Metric definitions are not repeated here: breakdowns come from the analysis tables (shares of
the window from `uberprof.analysis.summaries.time_shares`), per-rank lateness and idle time
from the diagnosis's summaries, and the interval sets of a step's timeline from
`uberprof.analysis.metrics.device_activity`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "BREAKDOWN_PARTS",
    "CounterSeries",
    "Heatmap",
    "RankTimeline",
    "RunData",
    "StepTimeline",
    "get_run",
]

Progress = Callable[[int, int, str], None]

# The stacked parts of a window (metrics.WINDOW_PARTS), in the order they are drawn, with their
# legend names: `breakdown_by_rank` has `<part>_pct` (share of the window) and `<part>_ns`.
BREAKDOWN_PARTS = (
    ("compute_only", "compute"),
    ("comm_under_compute", "comm under compute"),
    ("exposed_comm", "exposed comm"),
    ("memory", "memory"),
    ("idle", "idle"),
)

TIMELINE_STEP_COLUMNS = ("rank", "step", "host_start_ns", "host_end_ns", "step_time_ns",
                         "data_wait_ns", "traced")


def _sql(tables: dict[str, pa.Table], query: str, params: list[Any] | None = None) -> pa.Table:
    """Run one DuckDB query over Arrow tables (a fresh in-memory connection: thread-safe)."""
    con = duckdb.connect()
    try:
        for name, t in tables.items():
            con.register(name, t)
        return con.sql(query, params=params).to_arrow_table() if params else \
            con.sql(query).to_arrow_table()
    finally:
        con.close()


@dataclass
class Heatmap:
    """A rank x step matrix, binned so the browser draws at most a few hundred columns."""

    ranks: list[int]
    x: list[int]  # first step of each column
    z: np.ndarray  # [rows, columns], NaN where no data
    steps: np.ndarray  # [rows, columns] the step behind each cell (its maximum)
    bin_steps: int  # steps per column
    bin_ranks: int  # ranks per row


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
    run_id: str | None = None
    derived: Path | None = None
    ctx: Any = None  # uberprof.analysis.context.RunContext, None without traces
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    _steps: pa.Table | None = None
    _diagnosis: Any = None
    _diagnosis_error: str | None = None
    _diagnosed: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _memo: dict[str, Any] = field(default_factory=dict)
    _timelines: OrderedDict[int, StepTimeline] = field(default_factory=OrderedDict)

    # --- loading --------------------------------------------------------------------------------

    def load(self, progress: Progress | None = None) -> RunData:
        """Analyse the run when its tables are missing or stale (`progress` is told), and read
        its step timelines. Runs without traces load their step timelines only."""
        from uberprof.analysis.context import load_context
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
                    from uberprof.analysis.saved import load_or_diagnose

                    try:
                        self._diagnosis = load_or_diagnose(self.ctx)
                    except Exception as exc:  # noqa: BLE001 - show what we have
                        self._diagnosis_error = f"{type(exc).__name__}: {exc}"
                        self.problems.append(f"the diagnosis failed ({self._diagnosis_error}); "
                                             "findings, lateness and gaps are not shown")
            return self._diagnosis

    def warm(self) -> None:
        """Compute what the overview needs before the first request arrives."""
        self.diagnose()
        self.health()
        self.step_heatmap()
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
        schema = parts[0].schema if parts else None
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
            extra = pa.Table.from_pylist(rows)
            if schema is not None:
                cols = {n: (extra.column(n).cast(schema.field(n).type) if n in extra.schema.names
                            else pa.nulls(extra.num_rows, schema.field(n).type))
                        for n in schema.names}
                extra = pa.table(cols, schema=schema)
            parts.append(extra)
        if not parts:
            return pa.table({"rank": pa.array([], pa.int64()), "step": pa.array([], pa.int64()),
                             "host_start_ns": pa.array([], pa.int64()),
                             "host_end_ns": pa.array([], pa.int64()),
                             "step_time_ns": pa.array([], pa.int64()),
                             "data_wait_ns": pa.array([], pa.int64()),
                             "traced": pa.array([], pa.bool_())})
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def figure(self, key: str, build: Callable[[], Any]) -> Any:
        """A figure that depends on the run only (not on the selection), built once."""
        return self._once(f"figure:{key}", build)

    def _once(self, key: str, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._memo:
                self._memo[key] = fn()
            return self._memo[key]

    # --- what the run has -----------------------------------------------------------------------

    @property
    def steps(self) -> pa.Table:
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
        return bool(self._once("has_traces", find))

    def ranks(self) -> list[int]:
        return self._once("ranks", lambda: sorted(pc.unique(self.steps.column("rank"))
                                                  .to_pylist()) if self.steps.num_rows
                          else (self.ctx.rank_ids if self.ctx is not None else []))

    def traced_steps(self) -> list[int]:
        def find() -> list[int]:
            t = self.steps.filter(pc.equal(self.steps.column("traced"), True))
            return sorted(s for s in pc.unique(t.column("step")).to_pylist() if s is not None)
        return self._once("traced_steps", find)

    def all_steps(self) -> list[int]:
        return self._once("all_steps", lambda: sorted(
            s for s in pc.unique(self.steps.column("step")).to_pylist() if s is not None))

    def host_of(self, rank: int) -> str | None:
        hosts = self._once("hosts", self._hosts)
        return hosts.get(rank)

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
        return self._once("missing", find)

    # --- overview -------------------------------------------------------------------------------

    def rank_table(self) -> pa.Table | None:
        """RANK_SCHEMA rows (whole-trace breakdown per rank) of the ranks with traces, or
        None without traces."""
        if not self.has_traces:
            return None
        rt = self.ctx.breakdown()
        if "traces" in rt.schema.names:
            rt = rt.filter(pc.greater(pc.fill_null(rt.column("traces"), 0), 0))
        return rt

    def health(self) -> dict[str, Any]:
        """The numbers behind the overview's cards."""
        return self._once("health", self._health)

    def _health(self) -> dict[str, Any]:
        st = self.steps
        ranks = self.ranks()
        hosts = sorted({h for h in (self.host_of(r) for r in ranks) if h})
        q = _sql({"s": st}, """
            SELECT median(step_time_ns) / 1e6, quantile_cont(step_time_ns, 0.9) / 1e6,
                   count(DISTINCT step), max(step), min(step),
                   median(data_wait_ns) / 1e6
            FROM s WHERE step_time_ns IS NOT NULL AND step >= 0
        """).to_pylist()[0]
        vals = list(q.values())
        out: dict[str, Any] = {
            "run_id": self.run_id or self.root.name, "path": str(self.root),
            "ranks": len(ranks), "hosts": len(hosts), "host_names": hosts,
            "step_ms_median": vals[0], "step_ms_p90": vals[1], "steps": vals[2] or 0,
            "first_step": vals[4], "last_step": vals[3], "data_wait_ms_median": vals[5],
            "traced_steps": self.traced_steps(),
            "device": None, "backend": None, "breakdown": None,
            "findings": {"high": 0, "medium": 0, "low": 0},
            "straggler": None, "diagnosis_error": self._diagnosis_error,
        }
        rt = self.rank_table()
        if rt is not None and rt.num_rows:
            tot = {f: sum(x or 0 for x in rt.column(f"{f}_ns").to_pylist())
                   for f in ("window", "compute", "comm", "overlap", "exposed_comm", "memory",
                             "idle")}
            from uberprof.analysis import metrics as M

            out["breakdown"] = M.percentages(tot["window"], tot["compute"], tot["comm"],
                                             tot["overlap"], tot["exposed_comm"], tot["memory"],
                                             tot["idle"])
            modes = set(rt.column("mode").to_pylist())
            out["device"] = next((d for d, m in zip(rt.column("device_type").to_pylist(),
                                                    rt.column("mode").to_pylist())
                                  if m == "device"), None) or ("cpu" if modes else None)
        d = self.diagnose()
        if d is not None:
            out["backend"] = d.run.get("backend")
            for f in d.findings:
                out["findings"][f.severity] = out["findings"].get(f.severity, 0) + 1
            s = d.straggler
            if s is not None:
                out["straggler"] = {"rank": s.rank, "cause": s.cause, "last": s.last,
                                    "instances": s.instances,
                                    "lead_ms": s.median_lead_ns / 1e6,
                                    "delay_ms": s.delay_ns / 1e6, "host": self.host_of(s.rank)}
            out["analysed_wall_ms"] = d.run.get("analysed_wall_ms")
            out["residual_us"] = max((h.residual_ns or 0 for h in d.alignment.hosts),
                                     default=0) / 1e3
        return out

    def findings(self) -> list[Any]:
        d = self.diagnose()
        return list(d.findings) if d is not None else []

    def step_heatmap(self, column: str = "step_time_ns", max_cols: int = 250,
                     max_rows: int = 256) -> Heatmap | None:
        """Rank x step matrix of `column` in ms (the maximum over each bin, so that a slow step
        is never averaged away), with the step behind each cell for drill-down."""
        key = f"heatmap:{column}:{max_cols}:{max_rows}"
        return self._once(key, lambda: self._heatmap(self.steps, column, max_cols, max_rows))

    @staticmethod
    def _heatmap(t: pa.Table, column: str, max_cols: int, max_rows: int) -> Heatmap | None:
        if t.num_rows == 0 or column not in t.schema.names:
            return None
        lim = _sql({"s": t}, "SELECT min(step), max(step), min(rank), max(rank) FROM s "
                             "WHERE step >= 0").to_pylist()[0]
        s0, s1, r0, r1 = lim.values()
        if s0 is None:
            return None
        bs = max(1, -(-(s1 - s0 + 1) // max_cols))
        br = max(1, -(-(r1 - r0 + 1) // max_rows))
        q = _sql({"s": t}, f"""
            SELECT (rank - ?) // ? AS rb, (step - ?) // ? AS sb,
                   max({column}) / 1e6 AS v, arg_max(step, {column}) AS at
            FROM s WHERE step >= 0 AND {column} IS NOT NULL GROUP BY ALL
        """, [r0, br, s0, bs])
        n_r = (r1 - r0) // br + 1
        n_s = (s1 - s0) // bs + 1
        # float32 ms and int32 steps: half the bytes to the browser, and precise enough
        z = np.full((n_r, n_s), np.nan, dtype=np.float32)
        at = np.full((n_r, n_s), -1, dtype=np.int32)
        rb = q.column("rb").to_numpy()
        sb = q.column("sb").to_numpy()
        z[rb, sb] = q.column("v").to_numpy(zero_copy_only=False)
        at[rb, sb] = q.column("at").to_numpy(zero_copy_only=False)
        return Heatmap(ranks=[r0 + i * br for i in range(n_r)],
                       x=[s0 + j * bs for j in range(n_s)], z=z, steps=at, bin_steps=bs,
                       bin_ranks=br)

    def breakdown_by_rank(self) -> pa.Table | None:
        """Per rank: each BREAKDOWN_PARTS share of its traced time (`<part>_pct`) and its ns
        (`<part>_ns`), the overlap ratio (`overlap_pct`, of the communication), step times."""
        def build() -> pa.Table | None:
            from uberprof.analysis.summaries import time_shares

            rt = self.rank_table()
            if rt is None or rt.num_rows == 0:
                return None
            return _sql({"t": time_shares(rt), "r": rt}, """
                SELECT t.*, r.step_time_median_ms, r.step_time_p90_ms, r.mode, r.host
                FROM t JOIN r USING (rank) ORDER BY rank
            """)
        return self._once("breakdown_by_rank", build)

    # --- one step -------------------------------------------------------------------------------

    def step_ranks(self, step: int) -> pa.Table:
        """Every rank's host step time and data wait for one step (traced or not)."""
        t = self.steps.filter(pc.equal(self.steps.column("step"), step))
        return t.select([c for c in TIMELINE_STEP_COLUMNS if c in t.schema.names]) \
            .sort_by("rank")

    def aligned_instances(self) -> pa.Table | None:
        """Matched collective instances with start/end on the reference clock."""
        def build() -> pa.Table | None:
            d = self.diagnose()
            if d is None:
                return None
            return d.alignment.apply(d.matched.instances, ("start_ns", "end_ns"))
        return self._once("aligned_instances", build)

    def step_timeline(self, step: int, focus: int | None = None,
                      max_ranks: int = 48) -> StepTimeline | None:
        """Compute / communication / memory intervals of every rank in one traced step, on
        aligned clocks, merged to about a pixel (kept for the last few steps asked for)."""
        key = (step << 20) ^ (focus if focus is not None else 0xFFFFF)
        with self._lock:
            if key in self._timelines:
                self._timelines.move_to_end(key)
                return self._timelines[key]
        tl = self._step_timeline(step, focus, max_ranks)
        with self._lock:
            self._timelines[key] = tl  # type: ignore[assignment]
            while len(self._timelines) > 8:
                self._timelines.popitem(last=False)
        return tl

    def _step_timeline(self, step: int, focus: int | None, max_ranks: int
                       ) -> StepTimeline | None:
        from uberprof.analysis import intervals as iv
        from uberprof.analysis import metrics as M

        d = self.diagnose()
        if self.ctx is None:
            return None
        rows = self.steps.filter(pc.and_(pc.equal(self.steps.column("step"), step),
                                         pc.equal(self.steps.column("traced"), True)))
        rows = rows.filter(pc.is_valid(rows.column("device_start_ns"))).to_pylist()
        if not rows:
            return None
        rows.sort(key=lambda r: r["rank"])
        left_out = 0
        if len(rows) > max_ranks:
            keep = {r["rank"] for r in rows[:: -(-len(rows) // (max_ranks - 2))]}
            for extra in (focus, self.straggler_rank()):
                if extra is not None:
                    keep.add(extra)
            left_out = len(rows) - len(keep)
            rows = [r for r in rows if r["rank"] in keep]
        offset = (lambda r: d.alignment.offset_of(r)) if d is not None else (lambda r: 0)
        t0 = min(r["device_start_ns"] + offset(r["rank"]) for r in rows)
        t1 = max(r["device_end_ns"] + offset(r["rank"]) for r in rows)
        res = max((t1 - t0) / 1500.0, 1_000.0)  # about one pixel of a wide screen
        gaps = d.gaps.filter(pc.equal(d.gaps.column("step"), step)) if d is not None else None
        out = []
        for r in rows:
            rank, lo, hi = r["rank"], r["device_start_ns"], r["device_end_ns"]
            try:
                events = self.ctx.events(rank)
            except (KeyError, OSError):
                continue
            act = M.device_activity(events)
            off = offset(rank) - t0
            parts = {}
            for role, s in (("compute", act.compute), ("comm", act.comm),
                            ("memory", act.memory)):
                c = iv.clip(s, lo, hi)
                if len(c):
                    m = iv.union(c.starts, c.ends + int(res))  # merge what a pixel cannot split
                    parts[role] = ((m.starts + off) / 1e6, (m.ends - int(res) + off) / 1e6)
            g = []
            if gaps is not None and gaps.num_rows:
                for x in gaps.filter(pc.equal(gaps.column("rank"), rank)).to_pylist():
                    g.append({"start": (x["start_ns"] + off) / 1e6,
                              "end": (x["end_ns"] + off) / 1e6, "cause": x["cause"],
                              "before": x["before"], "after": x["after"],
                              "ms": x["dur_ns"] / 1e6})
            out.append(RankTimeline(rank=rank, host=self.host_of(rank), parts=parts,
                                    window=((lo + off) / 1e6, (hi + off) / 1e6), gaps=g))
        arrivals: list[dict[str, Any]] = []
        inst = self.aligned_instances()
        if inst is not None and inst.num_rows and d is not None:
            mine = inst.filter(pc.equal(inst.column("step"), step))
            lat = d.lateness.filter(pc.equal(d.lateness.column("step"), step))
            late = {(a, b): (c, e) for a, b, c, e in zip(
                *(lat.column(k).to_pylist() for k in ("instance", "rank", "lateness_ns",
                                                      "sole_last")))}
            shown = {r.rank for r in out}
            for i, name, rank, s, e in zip(*(mine.column(k).to_pylist() for k in
                                             ("instance", "name", "rank", "start_ns",
                                              "end_ns"))):
                if rank not in shown:
                    continue
                ln, last = late.get((i, rank), (0, False))
                arrivals.append({"instance": i, "name": name, "rank": rank,
                                 "start_ms": (s - t0) / 1e6, "end_ms": (e - t0) / 1e6,
                                 "lateness_ms": ln / 1e6, "last": bool(last)})
        return StepTimeline(step=step, ranks=out, arrivals=arrivals, resolution_ms=res / 1e6,
                            left_out=left_out)

    # --- stragglers -----------------------------------------------------------------------------

    def lateness_heatmap(self) -> Heatmap | None:
        """Rank x step of each rank's largest lateness (ms) over the step's collectives."""
        def build() -> Heatmap | None:
            d = self.diagnose()
            if d is None or d.lateness.num_rows == 0:
                return None
            per = _sql({"l": d.lateness}, """
                SELECT rank, step, max(lateness_ns) AS lateness_ns FROM l GROUP BY ALL
            """)
            return self._heatmap_dense(per, "lateness_ns")
        return self._once("lateness_heatmap", build)

    @staticmethod
    def _heatmap_dense(t: pa.Table, column: str) -> Heatmap | None:
        """Like `_heatmap`, but columns are the steps present (traced steps are sparse)."""
        if t.num_rows == 0:
            return None
        ranks = sorted(set(t.column("rank").to_pylist()))
        steps = sorted(set(t.column("step").to_pylist()))
        ri = {r: i for i, r in enumerate(ranks)}
        si = {s: j for j, s in enumerate(steps)}
        z = np.full((len(ranks), len(steps)), np.nan)
        at = np.full((len(ranks), len(steps)), -1, dtype=np.int64)
        for r, s, v in zip(t.column("rank").to_pylist(), t.column("step").to_pylist(),
                           t.column(column).to_pylist()):
            z[ri[r], si[s]] = (v or 0) / 1e6
            at[ri[r], si[s]] = s
        return Heatmap(ranks=ranks, x=steps, z=z, steps=at, bin_steps=1, bin_ranks=1)

    def lateness_ranking(self) -> list[dict[str, Any]]:
        """Ranks ordered by how late they arrive: median and p90 lateness, times alone last
        (the diagnosis's per-rank summaries)."""
        def build() -> list[dict[str, Any]]:
            d = self.diagnose()
            if d is None or d.summaries.lateness.num_rows == 0:
                return []
            t = _sql({"l": d.summaries.lateness}, """
                SELECT rank, instances, median_ns / 1e6 AS median_ms, p90_ns / 1e6 AS p90_ms,
                       last_in, delay_ns / 1e6 AS delay_ms
                FROM l ORDER BY median_ms DESC, rank
            """).to_pylist()
            for row in t:
                row["host"] = self.host_of(row["rank"])
            return t
        return self._once("lateness_ranking", build)

    def median_rank(self) -> int | None:
        """The rank of median lateness (the straggler's yardstick), never the straggler."""
        ranking = [r for r in self.lateness_ranking() if r["rank"] != self.straggler_rank()]
        if not ranking:
            others = [r for r in self.ranks() if r != self.straggler_rank()]
            return others[len(others) // 2] if others else None
        return ranking[len(ranking) // 2]["rank"]

    def straggler_factors(self) -> dict[str, Any]:
        """The straggler's per-step excess over the others, by factor (ms), and its counters."""
        s = self.straggler()
        if s is None:
            return {}
        return {"factors_ms": {k: v / 1e6 for k, v in s.factors.items()},
                "counters": dict(s.counters)}

    # --- gaps -----------------------------------------------------------------------------------

    def gaps_by_rank(self) -> pa.Table | None:
        """Idle time (ms) and gap count by rank and cause (the diagnosis's summaries)."""
        def build() -> pa.Table | None:
            d = self.diagnose()
            if d is None:
                return None
            return _sql({"g": d.summaries.idle}, """
                SELECT rank, cause, idle_ns / 1e6 AS ms, gaps FROM g ORDER BY rank, cause
            """)
        return self._once("gaps_by_rank", build)

    def gap_durations(self, rank: int | None = None, limit: int = 20_000) -> pa.Table | None:
        """Gap durations (µs) with cause, for a histogram (sampled beyond `limit`)."""
        d = self.diagnose()
        if d is None or d.gaps.num_rows == 0:
            return None
        g = d.gaps if rank is None else d.gaps.filter(pc.equal(d.gaps.column("rank"), rank))
        if g.num_rows > limit:
            idx = np.linspace(0, g.num_rows - 1, limit).astype(np.int64)
            g = g.take(pa.array(idx))
        return g.select(["rank", "step", "cause", "dur_ns"])

    def largest_gaps(self, rank: int | None = None, limit: int = 15) -> list[dict[str, Any]]:
        """The longest gaps with what the host was doing (of one rank, or of the whole run)."""
        d = self.diagnose()
        if d is None or d.gaps.num_rows == 0:
            return []
        if rank is None:
            return self._once("largest_gaps", lambda: sorted(
                d.top_gaps, key=lambda g: -g["dur_ns"])[:limit])

        def build() -> list[dict[str, Any]]:
            from uberprof.analysis.gaps import gap_context

            mine = d.gaps.filter(pc.equal(d.gaps.column("rank"), rank))
            if mine.num_rows == 0:
                return []
            try:
                events = self.ctx.events(rank)
            except (KeyError, OSError):
                return [{**g, "host": None} for g in mine.sort_by(
                    [("dur_ns", "descending")]).slice(0, limit).to_pylist()]
            return [{**g, "rank": rank} for g in gap_context(events, mine, limit)]
        return self._once(f"largest_gaps:{rank}:{limit}", build)

    # --- communication --------------------------------------------------------------------------

    def bandwidth_classes(self) -> list[dict[str, Any]]:
        d = self.diagnose()
        return [c.as_dict() for c in d.classes] if d is not None else []

    def bandwidth_instances(self, limit: int = 20_000) -> pa.Table | None:
        d = self.diagnose()
        if d is None or d.bandwidth.num_rows == 0:
            return None
        b = d.bandwidth
        if b.num_rows > limit:
            b = b.take(pa.array(np.linspace(0, b.num_rows - 1, limit).astype(np.int64)))
        return b

    def collectives_by_kind(self) -> pa.Table | None:
        """Per collective kind and message size: calls, total and median time (per rank)."""
        def build() -> pa.Table | None:
            if self.ctx is None:
                return None
            c = self.ctx.collectives()
            if c.num_rows == 0:
                return None
            return _sql({"c": c}, """
                SELECT coalesce(name, event) AS name, coalesce(in_bytes, out_bytes) AS bytes,
                       count(*) AS calls, count(DISTINCT rank) AS ranks,
                       sum(end_ns - start_ns) / 1e6 AS total_ms,
                       median(end_ns - start_ns) / 1e6 AS median_ms
                FROM c GROUP BY ALL ORDER BY total_ms DESC
            """)
        return self._once("collectives_by_kind", build)

    # --- counters -------------------------------------------------------------------------------

    def counter_catalog(self) -> dict[str, Any]:
        """Nodes with counters and, per node, the sources and metrics they hold (from each
        node's index, without reading the tables)."""
        return self._once("counter_catalog", self._counter_catalog)

    def _counter_catalog(self) -> dict[str, Any]:
        from uberprof.rundir import COUNTERS_DIR, RunDir
        from uberprof.rundir.counters import counter_meta, counter_nodes, series_index

        run = RunDir(self.root)
        nodes: dict[str, dict[str, Any]] = {}
        notes: list[str] = []
        gpu = False
        try:
            names = counter_nodes(run)
        except OSError:
            names = []
        for n in names:
            cdir = run.nodes_dir / n / COUNTERS_DIR
            index = series_index(cdir)
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
        return self._once("rank_gpus", build).get(rank)

    def time_origin_ns(self) -> int | None:
        """Epoch ns of the run's first step start: the zero of every time axis in seconds."""
        def build() -> int | None:
            t = self.steps
            if t.num_rows == 0:
                return None
            return pc.min(t.column("host_start_ns")).as_py()
        return self._once("t0", build)

    def counter_series(self, node: str, source: str, metric: str,
                       devices: list[str] | None = None, points: int = 600,
                       start_ns: int | None = None, end_ns: int | None = None
                       ) -> CounterSeries | None:
        """One metric over time per device, averaged into at most `points` time buckets."""
        key = f"series:{node}:{source}:{metric}:{devices}:{points}:{start_ns}:{end_ns}"
        return self._once(key, lambda: self._counter_series(node, source, metric, devices,
                                                            points, start_ns, end_ns))

    def _counter_series(self, node: str, source: str, metric: str, devices: list[str] | None,
                        points: int, start_ns: int | None, end_ns: int | None
                        ) -> CounterSeries | None:
        from uberprof.rundir.counters import counters_table

        try:
            t = counters_table(self.root, node, sources=[source], metrics=[metric],
                               start_ns=start_ns, end_ns=end_ns)
        except Exception:  # noqa: BLE001 - unreadable counters: nothing to draw
            return None
        if devices is not None:
            t = t.filter(pc.is_in(t.column("device"), pa.array(devices, pa.string())))
        if t.num_rows == 0:
            return None
        origin = self.time_origin_ns() or pc.min(t.column("ts_ns")).as_py()
        lo, hi = pc.min(t.column("ts_ns")).as_py(), pc.max(t.column("ts_ns")).as_py()
        width = max(int((hi - lo) / points) + 1, 1)
        q = _sql({"t": t}, """
            SELECT device, (ts_ns - ?) // ? AS b, avg(ts_ns) AS ts, avg(value) AS v
            FROM t GROUP BY ALL ORDER BY device, b
        """, [lo, width])
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        dev = np.array(q.column("device").to_pylist(), dtype=object)
        ts = q.column("ts").to_numpy(zero_copy_only=False)
        v = q.column("v").to_numpy(zero_copy_only=False)
        for d in sorted(set(dev.tolist()), key=lambda x: (len(x), x)):
            m = dev == d
            out[d] = ((ts[m] - origin) / 1e9, v[m])
        unit = t.column("unit")[0].as_py()
        return CounterSeries(metric=metric, unit=unit, devices=out, bucket_s=width / 1e9)

    def throttle_spans(self, node: str, devices: list[str] | None = None
                       ) -> list[tuple[str, float, float]]:
        """(device, start s, end s) of the runs of samples with a clock slowdown reason set."""
        def build() -> list[tuple[str, float, float]]:
            from uberprof.rundir.counters import counters_table

            try:
                t = counters_table(self.root, node, sources=["nvml"],
                                   metrics=["clocks_slowdown"])
            except Exception:  # noqa: BLE001
                return []
            if t.num_rows == 0:
                return []
            origin = self.time_origin_ns() or 0
            q = _sql({"t": t}, """
                WITH o AS (
                    SELECT device, ts_ns, value > 0 AS on_,
                           lead(ts_ns) OVER (PARTITION BY device ORDER BY ts_ns) AS nxt,
                           lag(value > 0) OVER (PARTITION BY device ORDER BY ts_ns) AS prev
                    FROM t
                ), g AS (
                    SELECT *, sum(CASE WHEN on_ AND coalesce(prev, false) = false THEN 1
                                       ELSE 0 END)
                              OVER (PARTITION BY device ORDER BY ts_ns) AS run
                    FROM o
                )
                SELECT device, min(ts_ns) AS s, max(coalesce(nxt, ts_ns)) AS e
                FROM g WHERE on_ GROUP BY device, run ORDER BY s
            """).to_pylist()
            return [(r["device"], (r["s"] - origin) / 1e9, (r["e"] - origin) / 1e9) for r in q]
        spans = self._once(f"throttle:{node}", build)
        return [s for s in spans if devices is None or s[0] in devices]

    def step_boundaries(self, rank: int, max_lines: int = 400) -> tuple[np.ndarray, int]:
        """Start times (s from the run's origin) of a rank's steps, every k-th when there are
        more than `max_lines`; returns the times and k."""
        t = self.steps.filter(pc.equal(self.steps.column("rank"), rank))
        starts = np.sort(t.column("host_start_ns").to_numpy(zero_copy_only=False)
                         .astype(np.float64))
        starts = starts[~np.isnan(starts)]
        k = max(1, -(-starts.size // max_lines))
        origin = self.time_origin_ns() or 0
        return (starts[::k] - origin) / 1e9, k

    def traced_spans(self, rank: int) -> list[tuple[float, float, int, int]]:
        """(start s, end s, first step, last step) of each traced window of a rank."""
        t = self.steps.filter(pc.and_(pc.equal(self.steps.column("rank"), rank),
                                      pc.equal(self.steps.column("traced"), True)))
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
