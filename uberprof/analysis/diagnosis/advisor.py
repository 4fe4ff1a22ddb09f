"""The advisor: from a run's tables to ranked findings. `diagnose(path) -> Diagnosis` is the one
entry point that the terminal report, the HTML report, the dashboard and the trace export share.

Order of work (docs/DESIGN.md, §5): match collectives, align clocks (then drop pairings that
never overlap in time and align again), then per rank, in the map's workers (each reads one
event table; `rank_diagnosis.py`), idle gaps and the exposed part of each collective, then across
ranks lateness and the straggler,
bandwidth per instance and class, and finally the findings.

A finding's `time_at_stake_ms` is the wall-clock time of the analysed (traced) steps it accounts
for, an upper bound on what fixing it saves there: ranks run in parallel, so a per-rank amount
counts once (the worst rank's), and a straggler's is the delay it alone adds to each step.
Severity is its share of the analysed wall time: high >= 15%, medium >= 5%, else low.

Root-cause accounting: each lost millisecond is counted by one finding. Time a rank spends in a
collective before the last participant arrives is waiting for peers, the straggler's cost;
only the time after the last arrival is transfer, which bandwidth verdicts and their findings
use. A finding that is partly a consequence of another (exposed communication that is waiting
for a straggler, or the transfer of a latency- or bandwidth-bound class) keeps only its own
part as `time_at_stake_ms`, states the whole as `observed_ms`, its own share as `own_pct`, and
links the rest with `caused_by` (index and kind of the other finding, and the ms it accounts
for). `_account` holds the invariant: the findings' times at stake never add up to more than
the analysed wall time.

Every verdict states its evidence (`confidence`, `evidence["test"]`: `analysis/diagnosis/evidence.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof import __version__
from uberprof.analysis.tables.align import Alignment, align_clocks
from uberprof.analysis.diagnosis.arrivals import flight_basis
from uberprof.analysis.diagnosis.bandwidth import (
    SMALL_MESSAGE_BYTES,
    BandwidthClass,
    Peaks,
    bandwidth_classes,
    instance_bandwidth,
)
from uberprof.analysis.diagnosis.busy import BusyTimes, busy_times
from uberprof.analysis.diagnosis.causes import (
    EXPOSED_COMM_REMEDY,
    GAP_CAUSES,
    LINK_VERDICTS,
    STRAGGLER_CAUSES,
    THROTTLE_REMEDY,
    remedy_for,
)
from uberprof.analysis.tables.collectives import Matched, drop_inconsistent, match_collectives
from uberprof.analysis.tables.context import RunContext, load_context
from uberprof.analysis.diagnosis.evidence import MIN_INSTANCES, Test, count_test, trace_more_hint
from uberprof.analysis.diagnosis.gaps import CAUSES, DEFAULT_THRESHOLD_NS, GAP_SCHEMA
from uberprof.analysis.diagnosis.gpu_clocks import (
    SLOWDOWN_FRACTION,
    GpuClocks,
    gpu_clocks,
    throttled_vs_others,
)
from uberprof.analysis.diagnosis.host_cpu import host_cpu_findings
from uberprof.analysis.diagnosis.rank_diagnosis import TOP_GAPS, rank_passes
from uberprof.analysis.tables.steptime import step_time_doc
from uberprof.analysis.diagnosis.stragglers import (
    BASIS_FLIGHT_RECORDER,
    Straggler,
    StragglerTest,
    find_straggler,
    lateness,
    straggler_cause,
    straggler_test,
)
from uberprof.analysis.diagnosis.summaries import RankSummaries, sql_table, summarise
from uberprof.analysis.diagnosis.summaries import ns_to_ms as _ms
from uberprof.units import fmt_bytes

__all__ = [
    "FINDING_KINDS",
    "SCHEMA_VERSION",
    "Diagnosis",
    "Finding",
    "analysed_steps",
    "diagnose",
    "diagnose_context",
    "save_diagnosis",
    "severity_of",
]

SCHEMA_VERSION = 1
FINDING_KINDS = ("hang", "crash", "straggler", "data_stall", "launch_bound", "idle",
                 "exposed_comm", "bandwidth", "throttle", "host_cpu")
MIN_SHARE = 0.02  # a per-rank problem below this share of the analysed time is not a finding


@dataclass
class Finding:
    """One thing that holds the job back, in the user's terms."""

    kind: str
    severity: str  # high | medium | low
    title: str  # one line for people
    ranks: list[int]
    steps: list[int]
    cause: str | None
    time_at_stake_ms: float
    evidence: dict[str, Any]
    remedy: str
    confidence: str = "confirmed"  # confirmed | suspected (evidence["test"] says why)
    observed_ms: float | None = None  # the whole time it observed (own + caused_by)
    caused_by: list[dict[str, Any]] = field(default_factory=list)  # {index, kind, ms}

    def as_dict(self) -> dict[str, Any]:
        observed = self.observed_ms if self.observed_ms is not None else self.time_at_stake_ms
        return {"kind": self.kind, "severity": self.severity, "title": self.title,
                "ranks": self.ranks, "steps": self.steps, "cause": self.cause,
                "time_at_stake_ms": round(self.time_at_stake_ms, 3),
                "evidence": self.evidence, "remedy": self.remedy,
                "confidence": self.confidence, "observed_ms": round(observed, 3),
                "own_pct": round(100 * self.time_at_stake_ms / observed, 1) if observed else
                100.0,
                "caused_by": self.caused_by}


@dataclass
class Diagnosis:
    """Everything the diagnosis found: findings plus the tables behind them (for plots)."""

    run: dict[str, Any]
    ranks: list[dict[str, Any]]
    findings: list[Finding]
    alignment: Alignment
    matched: Matched
    lateness: pa.Table  # LATENESS_SCHEMA (aligned clocks)
    gaps: pa.Table  # GAP_SCHEMA (each rank's own clock)
    bandwidth: pa.Table  # BANDWIDTH_SCHEMA
    classes: list[BandwidthClass]
    straggler: Straggler | None
    steps: pa.Table  # the analysed (traced) steps, RUN_STEP_SCHEMA
    summaries: RankSummaries  # per-rank lateness and idle by cause: every view reads these
    top_gaps: list[dict[str, Any]] = field(default_factory=list)
    derived: Path | None = None  # the run's derived-tables folder
    inputs: list[str] = field(default_factory=list)  # the traces diagnosed (relative paths)

    def to_json(self) -> dict[str, Any]:
        """The `uberprof report --json` document (see README, "uberprof report")."""
        return {"run": self.run, "ranks": self.ranks,
                "findings": [f.as_dict() for f in self.findings]}


Progress = Callable[[int, int, str], None]


def diagnose(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
             threshold_ns: int = DEFAULT_THRESHOLD_NS, workers: int | None = None,
             progress: Progress | None = None, executor: Executor | None = None) -> Diagnosis:
    """Analyse `path` if needed (run directory, trace folder or file) and diagnose it; the
    per-rank work on `workers` processes, or on `executor` (Dask's)."""
    ctx = load_context(path, out=out, workers=workers, progress=progress, executor=executor)
    return diagnose_context(ctx, threshold_ns=threshold_ns)


def diagnose_context(ctx: RunContext, threshold_ns: int = DEFAULT_THRESHOLD_NS) -> Diagnosis:
    problems = list(ctx.problems)
    matched = match_collectives(ctx)
    alignment = align_clocks(ctx, matched)
    matched, dropped = drop_inconsistent(matched, alignment.offsets())
    if dropped:
        alignment = align_clocks(ctx, matched)
    aligned = alignment.apply(matched.instances, ("start_ns", "end_ns"))

    traced = analysed_steps(ctx)
    per_rank = {p.rank: p for p in rank_passes(ctx, traced, matched.instances, threshold_ns)}
    problems += [p.problem for p in per_rank.values() if p.problem]
    gaps = pa.concat_tables([p.gaps for p in per_rank.values()]) if per_rank else \
        GAP_SCHEMA.empty_table()
    exposed = {k: v for p in per_rank.values() for k, v in p.exposed.items()}

    lat = lateness(aligned)
    step_ns = traced.column("step_time_ns").to_numpy(zero_copy_only=False)
    step_ns = step_ns[~np.isnan(step_ns.astype(np.float64))] if step_ns.size else step_ns
    median_step = float(np.median(step_ns)) if step_ns.size else None
    wall_ns = _analysed_wall_ns(traced)

    window = _window(traced, alignment)
    clocks = gpu_clocks(ctx, window)
    busy = busy_times(ctx)
    traced_test = straggler_test(lat, median_step, wall_ns, busy=busy)
    s_test, straggler, basis_doc = _straggler_on_best_basis(ctx, alignment, lat, traced_test,
                                                           median_step, wall_ns, busy)
    factors = _factors(traced, gaps, lat)
    clock_ev: dict[str, Any] = {}
    if straggler is not None:
        clock_ev = throttled_vs_others(straggler.rank, clocks)
        work = s_test.busy if s_test is not None else None
        work_ns = work.excess_ns if work is not None and work.confirmed \
            and work.rank == straggler.rank else None
        straggler.cause, straggler.factors = straggler_cause(straggler.rank, factors, clock_ev,
                                                             work_ns)
        straggler.counters = clock_ev
        if basis_doc is not None:
            _note_traced_view(straggler, traced_test, work_ns)

    peaks = Peaks(ctx, window)
    bw = instance_bandwidth(ctx, aligned, exposed, peaks, alignment.error_bounds())
    classes = bandwidth_classes(bw)

    summaries = summarise(lat, gaps)
    device_type = _device_type(ctx)
    findings: list[Finding] = []
    s_finding = None
    if straggler is not None:
        s_finding = _straggler_finding(straggler, wall_ns, ctx, summaries, device_type)
        findings.append(s_finding)
    findings += _gap_findings(gaps, traced, wall_ns, s_finding, device_type)
    bandwidth = _bandwidth_findings(classes, wall_ns)
    findings += _exposed_comm_findings(traced, lat, wall_ns, classes, s_finding, bandwidth)
    findings += bandwidth
    findings += _throttle_findings(clocks, traced, wall_ns, straggler)
    findings += host_cpu_findings(ctx, window)
    findings = _account(_failure_findings(ctx) + findings, wall_ns)

    unmatched = matched.unmatched
    if unmatched.num_rows:
        problems.append(f"{unmatched.num_rows} collective call(s) could not be matched across "
                        "ranks (not on every rank of the group, or never overlapping in time); "
                        "left out of lateness and bandwidth")
    top = []
    for p in per_rank.values():
        top += p.top_gaps
    top.sort(key=lambda g: -g["dur_ns"])
    run = _run_doc(ctx, traced, wall_ns, median_step, alignment, matched, threshold_ns,
                   problems, classes)
    run["straggler_test"] = s_test.as_dict() if s_test is not None else None
    if run["straggler_test"] is not None and basis_doc is not None:
        run["straggler_test"]["flight_recorder"] = basis_doc
        run["straggler_test"]["traced"] = traced_test.as_dict() if traced_test else None
    run["step_time"] = step_time_doc(ctx.steps(), median_step)
    run["accounting"] = {
        "analysed_wall_ms": _ms(wall_ns),
        "at_stake_ms": round(sum(f.time_at_stake_ms for f in findings), 3),
        "rule": "each lost millisecond is counted by one finding; waiting for peers inside a "
                "collective is the late rank's, transfer after the last arrival is the link's"}
    ranks = _ranks_doc(ctx, traced, summaries)
    return Diagnosis(run=run, ranks=ranks, findings=findings, alignment=alignment,
                     matched=matched, lateness=lat, gaps=gaps, bandwidth=bw, classes=classes,
                     straggler=straggler, steps=traced, summaries=summaries,
                     top_gaps=top[:TOP_GAPS * 2], derived=Path(ctx.run.derived),
                     inputs=sorted(ctx.run.inputs))


def _straggler_on_best_basis(ctx: RunContext, alignment: Alignment, lat: pa.Table,
                             traced_test: StragglerTest | None, median_step: float | None,
                             wall_ns: int, busy: BusyTimes | None = None
                             ) -> tuple[StragglerTest | None, Straggler | None,
                                        dict[str, Any] | None]:
    """The straggler test on one basis (stragglers.py): the Flight Recorder's arrivals over
    every untraced step when they are at least as many instances as the traced window's,
    else the traced collectives. Returns the test, the straggler (its cost from the traced steps) and
    the Flight Recorder basis described (None when it was not used)."""
    fr = flight_basis(ctx, alignment.offsets())
    if fr is None or fr.instances < (traced_test.instances if traced_test else 0):
        return traced_test, find_straggler(lat, median_step, wall_ns, test=traced_test), None
    test = straggler_test(fr.lateness, fr.median_step_ns, fr.wall_ns, BASIS_FLIGHT_RECORDER,
                          busy)
    return test, find_straggler(lat, median_step, wall_ns, test=test,
                                basis=fr.lateness), fr.as_dict()


def _note_traced_view(s: Straggler, traced: StragglerTest | None,
                      work_ns: int | None = None) -> None:
    """Say where the traced steps, which the cause is read from, disagree with the Flight
    Recorder's verdict: another rank last there, or the rank not slower by its cause."""
    notes = []
    if traced is None or traced.rank != s.rank:
        notes.append(f"the traced steps alone do not show rank {s.rank} most often last")
    excess = s.factors.get(s.cause or "compute", 0) if s.factors else 0
    traced_says = max(s.factors, key=lambda f: s.factors[f]) if s.factors else None
    by_busy = s.cause == "compute" and work_ns is not None and traced_says != "compute"
    if excess <= 0 and not by_busy:
        notes.append(f"its per-step breakdown in the traced steps shows no excess "
                     f"{s.cause or 'compute'} over the others: the cause is uncertain")
    sentence = ("; cause read from its busy time over every step (the traced steps' "
                "breakdown weighs less)" if by_busy else
                "; cause read from the traced steps' breakdown")
    if notes:
        sentence += " (" + "; ".join(notes) + ")"
    s.test["sentence"] += sentence
    s.test["cause_basis"] = "busy time" if by_busy else "traced steps"
    if notes:
        s.test["cause_note"] = "; ".join(notes)


def _failure_findings(ctx: RunContext) -> list[Finding]:
    """Hangs and crashes (analysis/diagnosis/failures.py), ranked first: a job that stops costs most."""
    if not ctx.is_run_dir:
        return []
    from uberprof.analysis.diagnosis.failures import failure_findings

    return failure_findings(ctx.root, ctx.run.step_tail)  # what the map read of each timeline


def save_diagnosis(d: Diagnosis) -> Path | None:
    """Write the diagnosis beside the derived tables (see `uberprof.analysis.diagnosis.saved.save`)."""
    from uberprof.analysis.diagnosis.saved import save

    return save(d)


def analysed_steps(ctx: RunContext) -> pa.Table:
    """The traced steps of every rank (RUN_STEP_SCHEMA). A rank whose trace has no step
    annotations gets one pseudo-step -1 spanning its whole trace, so it is still diagnosed."""
    steps = ctx.steps()
    traced = steps.filter(pc.and_(pc.equal(steps.column("traced"), True),
                                  pc.is_valid(steps.column("device_start_ns"))))
    have = set(traced.column("rank").to_pylist())
    breakdown = {r["rank"]: r for r in ctx.breakdown().to_pylist()}
    extra = []
    for r in ctx.rank_ids:
        w = ctx.ranks[r].window
        if r in have or w is None or r not in breakdown:
            continue
        b = breakdown[r]
        row: dict[str, Any] = {f: None for f in traced.schema.names}
        row.update(rank=r, step=-1, host_start_ns=w[0], host_end_ns=w[1], device_start_ns=w[0],
                   device_end_ns=w[1], data_wait_ns=0, optimizer_ns=0, comm_bytes=0,
                   collectives=0, device_incomplete=False, traced=True, step_time_ns=w[1] - w[0])
        for f in ("window_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns",
                  "memory_ns", "idle_ns"):
            row[f] = b.get(f)
        extra.append(row)
    if not extra:
        return traced
    return pa.concat_tables([traced, pa.Table.from_pylist(extra, schema=traced.schema)])


# --- cross-rank facts ---------------------------------------------------------------------------

def _analysed_wall_ns(traced: pa.Table) -> int:
    """Wall time of the analysed steps: per step the longest rank's, summed over steps."""
    if traced.num_rows == 0:
        return 0
    per: dict[int, int] = {}
    for s, t in zip(traced.column("step").to_pylist(), traced.column("step_time_ns").to_pylist()):
        if t is not None:
            per[s] = max(per.get(s, 0), t)
    return sum(per.values())


def _window(traced: pa.Table, alignment: Alignment) -> tuple[int, int] | None:
    if traced.num_rows == 0:
        return None
    lo = pc.min(traced.column("host_start_ns")).as_py()
    hi = pc.max(traced.column("host_end_ns")).as_py()
    if lo is None or hi is None:
        return None
    pad = max(abs(h.offset_ns) for h in alignment.hosts) if alignment.hosts else 0
    return int(lo) - pad - 1_000_000_000, int(hi) + pad + 1_000_000_000


def _factors(traced: pa.Table, gaps: pa.Table, lat: pa.Table
             ) -> dict[int, dict[int, dict[str, float]]]:
    """Per step and rank: compute, data wait, host/launch idle and time in collectives after
    the last arrival (ns), the numbers a straggler's cause is read from."""
    out: dict[int, dict[int, dict[str, float]]] = {}
    for row in traced.select(["rank", "step", "compute_ns", "data_wait_ns"]).to_pylist():
        out.setdefault(row["step"], {})[row["rank"]] = {
            "compute": float(row["compute_ns"] or 0), "data": float(row["data_wait_ns"] or 0),
            "host_launch": 0.0, "network": 0.0}
    if gaps.num_rows:
        for r, s, data, host in _sql(
                "SELECT rank, step, sum(dur_ns) FILTER (WHERE cause = 'data'), "
                "sum(dur_ns) FILTER (WHERE cause IN ('launch', 'host', 'sync')) "
                "FROM g GROUP BY rank, step", g=gaps):
            f = out.get(s, {}).get(r)
            if f is not None:
                f["data"] = max(f["data"], float(data or 0))
                f["host_launch"] += float(host or 0)
    if lat.num_rows:
        for r, s, t in _sql("SELECT rank, step, sum(transfer_ns) FROM l GROUP BY rank, step",
                            l=lat):
            f = out.get(s, {}).get(r)
            if f is not None:
                f["network"] += float(t or 0)
    return out


def _sql(query: str, **tables: pa.Table) -> list[tuple[Any, ...]]:
    """Rows of a DuckDB query over Arrow tables (aggregations over per-event tables)."""
    t = sql_table(query, **tables)
    return list(zip(*(c.to_pylist() for c in t.columns)))


def _device_type(ctx: RunContext) -> str:
    """The run's accelerator type, "cpu" when no rank has one."""
    return next((i.device_type for i in ctx.ranks.values() if i.mode == "device" and
                 i.device_type), "cpu")


def _account(findings: list[Finding], wall_ns: int) -> list[Finding]:
    """Rank the findings (a hang or crash first: a job that stops costs most; then by their own
    time), resolve `caused_by` links to indices, and hold
    the invariant: their times at stake add up to at most the analysed wall time (a finding
    that would cross it keeps only what is left, and says so in `evidence["capped_ms"]`)."""
    findings = sorted(findings, key=lambda f: (f.kind not in ("hang", "crash"),
                                               -f.time_at_stake_ms, f.kind))
    index = {id(f): i for i, f in enumerate(findings)}
    left = wall_ns / 1e6
    for f in findings:
        for c in f.caused_by:
            ref = c.pop("_ref", None)
            if ref is not None:
                c["index"] = index.get(id(ref))
        if f.time_at_stake_ms > left:
            f.evidence["capped_ms"] = round(f.time_at_stake_ms - left, 3)
            if f.observed_ms is None:
                f.observed_ms = f.time_at_stake_ms
            f.time_at_stake_ms = max(left, 0.0)
        left -= f.time_at_stake_ms
    return findings


def severity_of(share: float) -> str:
    return "high" if share >= 0.15 else "medium" if share >= 0.05 else "low"


def _ranks_str(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:8])) + \
        (f" (+{len(ranks) - 8})" if len(ranks) > 8 else "")


# --- findings -----------------------------------------------------------------------------------

def _straggler_finding(s: Straggler, wall_ns: int, ctx: RunContext,
                       summaries: RankSummaries, device_type: str) -> Finding:
    share = s.delay_ns / wall_ns if wall_ns else 0.0
    late = summaries.lateness_of(s.rank)  # the rank row's (traced window); `basis`: the test's
    ev = {
        "last_in": late["last_in"], "instances": late["instances"],
        "last_pct": round(100 * s.last_fraction, 1),
        "median_lateness_ms": _ms(s.median_lateness_ns),
        "median_lead_ms": _ms(s.median_lead_ns),
        "others_spread_ms": _ms(s.noise_ns),
        "delay_ms": _ms(s.delay_ns), "others_wait_ms": _ms(s.others_wait_ns),
        "steps_analysed": s.steps_analysed,
        "excess_per_step_ms": {k: _ms(v) for k, v in s.factors.items()},
        "host": ctx.host_of(s.rank),
        "share_pct": round(100 * share, 1),
        "test": s.test,
        "basis": {"source": s.basis, "last_in": s.last, "instances": s.instances,
                  "steps": s.steps_analysed},
    }
    if s.counters.get("available"):
        ev["gpu"] = {k: v for k, v in s.counters.items() if k != "available"}
    cause = s.cause or "compute"
    verb = "is a straggler" if s.confidence == "confirmed" else "may be a straggler (suspected)"
    where = " (Flight Recorder, untraced steps)" if s.basis == BASIS_FLIGHT_RECORDER else ""
    title = (f"Rank {s.rank} {verb} ({cause}): last at {s.last}/{s.instances} "
             f"collectives{where}, {ev['median_lead_ms']} ms behind the others' median")
    remedy = remedy_for(STRAGGLER_CAUSES[cause], device_type).format(r=s.rank)
    return Finding("straggler", severity_of(share), title, [s.rank], s.steps, cause,
                   s.delay_ns / 1e6, ev, remedy, confidence=s.confidence)


def _gap_findings(gaps: pa.Table, traced: pa.Table, wall_ns: int,
                  s_finding: Finding | None, device_type: str) -> list[Finding]:
    """Idle gaps by cause: the worst rank's time (ranks run in parallel). Idle on the
    straggler is inside the delay its finding counts: only the worst other rank's is this
    finding's own, the rest links to the straggler."""
    if gaps.num_rows == 0 or not wall_ns:
        return []
    # per rank analysed wall time: the share is of each rank's own analysed time
    rank_time: dict[int, int] = {}
    for r, t in zip(traced.column("rank").to_pylist(), traced.column("step_time_ns").to_pylist()):
        rank_time[r] = rank_time.get(r, 0) + (t or 0)
    by: dict[str, dict[int, int]] = {c: {} for c in CAUSES}
    steps_of: dict[str, dict[int, set[int]]] = {c: {} for c in CAUSES}
    counts: dict[str, int] = {c: 0 for c in CAUSES}
    n_of: dict[tuple[str, int], int] = {}
    largest: dict[str, dict[str, Any]] = {}
    for c, r, total, n, steps in _sql(
            "SELECT cause, rank, sum(dur_ns), count(*), list(DISTINCT step) FROM g "
            "GROUP BY cause, rank", g=gaps):
        by[c][r] = int(total)
        steps_of[c][r] = set(steps)
        counts[c] += int(n)
        n_of[(c, r)] = int(n)
    s_rank = s_finding.ranks[0] if s_finding is not None else None
    fields = ["cause", "rank", "step", "dur_ns", "before", "after"]
    for row in _sql("SELECT cause, arg_max(rank, dur_ns), arg_max(step, dur_ns), max(dur_ns), "
                    "arg_max(before, dur_ns), arg_max(after, dur_ns) FROM g GROUP BY cause",
                    g=gaps):
        largest[row[0]] = dict(zip(fields, row))
    out = []
    for cause in CAUSES:
        ranks = sorted(r for r, v in by[cause].items()
                       if rank_time.get(r) and v / rank_time[r] >= MIN_SHARE)
        if s_finding is not None and s_finding.cause == "data" and cause == "data":
            ranks = [r for r in ranks if r != s_rank]  # the straggler finding says it
        if not ranks:
            continue
        worst = max(ranks, key=lambda r: by[cause][r])
        stake = by[cause][worst]
        own = max((by[cause][r] for r in ranks if r != s_rank), default=0)
        caused: list[dict[str, Any]] = []
        if s_finding is not None and stake > own:
            caused.append({"_ref": s_finding, "kind": "straggler", "ms": _ms(stake - own),
                           "part": f"idle on the straggler, rank {s_rank}: inside the delay "
                                   "its finding counts"})
        share = own / wall_ns
        g = largest[cause]
        per_rank = {str(r): _ms(by[cause][r]) for r in ranks}
        ev = {
            "idle_ms_per_rank": per_rank,
            "share_of_rank_time_pct": {str(r): round(100 * by[cause][r] / rank_time[r], 1)
                                       for r in ranks},
            "gaps": counts[cause],
            "largest_gap": {"rank": g["rank"], "step": g["step"], "ms": _ms(g["dur_ns"]),
                            "before": g["before"], "after": g["after"]},
            "share_pct": round(100 * share, 1),
            "observed_share_pct": round(100 * stake / wall_ns, 1),
        }
        c = GAP_CAUSES[cause]
        title = (f"Device idle {_ms(stake)} ms on {_ranks_str([worst])} ({c.phrase}); "
                 f"{len(ranks)} rank(s) affected")
        steps = sorted(set().union(*(steps_of[cause][r] for r in ranks)))
        worst_steps = len(steps_of[cause][worst])
        confidence, test = count_test(
            f"idle gaps ({c.label}) on rank {worst}, {_ms(stake)} ms = "
            f"{ev['share_of_rank_time_pct'][str(worst)]}% of its analysed time (threshold "
            f"{100 * MIN_SHARE:.0f}%)", n_of[(cause, worst)], worst_steps)
        if confidence == "suspected":
            test.sentence += "; to confirm, " + trace_more_hint(steps)
        ev["test"] = test.as_dict()
        out.append(Finding(c.kind, severity_of(share), title, ranks, steps, cause, own / 1e6,
                           ev, remedy_for(c, device_type), confidence=confidence,
                           observed_ms=stake / 1e6, caused_by=caused))
    return out


def _exposed_comm_findings(traced: pa.Table, lat: pa.Table, wall_ns: int,
                           classes: list[BandwidthClass], straggler_finding: Finding | None,
                           bandwidth: list[Finding]) -> list[Finding]:
    """Communication not hidden under compute that every rank pays (per step, the least
    exposed rank's), so that waiting for a straggler is not counted twice. Split into waiting
    for peers and transfer in the proportion of that rank's collective time before and after
    the last arrival; the wait is a straggler's when there is one, the transfer a
    latency- or bandwidth-bound class's when there is one (`caused_by`)."""
    if traced.num_rows == 0 or not wall_ns:
        return []
    per_step: dict[int, list[tuple[int, int, int]]] = {}
    for r, s, x, c in zip(*(traced.column(k).to_pylist()
                            for k in ("rank", "step", "exposed_comm_ns", "comm_ns"))):
        per_step.setdefault(s, []).append((r, x or 0, c or 0))
    split: dict[tuple[int, int], tuple[float, float]] = {}
    if lat.num_rows:
        for r, st, w, t in _sql("SELECT rank, step, sum(wait_ns), sum(transfer_ns) FROM l "
                                "GROUP BY rank, step", l=lat):
            split[(r, st)] = (float(w or 0), float(t or 0))
    stake = wait = 0.0
    comm_total = 0
    steps = []
    for s, rows in per_step.items():
        r_least, least, _ = min(rows, key=lambda x: x[1])
        stake += least
        w, t = split.get((r_least, s), (0.0, 0.0))
        wait += least * w / (w + t) if w + t > 0 else 0.0
        comm_total += min(c for _, _, c in rows)
        if least > 0:
            steps.append(s)
    share = stake / wall_ns
    if share < MIN_SHARE * 2:
        return []
    transfer = stake - wait
    ranks = sorted({r for rows in per_step.values() for r, _, _ in rows})
    bound = [c.as_dict() for c in classes if c.verdict in ("bandwidth-bound", "latency-bound")]
    caused: list[dict[str, Any]] = []
    if straggler_finding is not None and wait > 0:
        caused.append({"_ref": straggler_finding, "kind": "straggler", "ms": _ms(wait),
                       "part": "waiting for the straggler"})
    left = transfer
    for b in bandwidth:
        take = min(left, b.time_at_stake_ms * 1e6)
        if take > 0:
            caused.append({"_ref": b, "kind": b.kind, "ms": _ms(take),
                           "part": f"transfer of a {b.cause} class"})
            left -= take
    own = stake - sum(c["ms"] * 1e6 for c in caused)
    n_steps = len(per_step)
    ev = {"exposed_ms_all_ranks_pay": _ms(stake),
          "wait_ms": _ms(wait), "transfer_ms": _ms(transfer),
          "comm_ms_least_rank": _ms(comm_total),
          "exposed_of_comm_pct": round(100 * stake / comm_total, 1) if comm_total else None,
          "share_pct": round(100 * share, 1),
          "limited_collectives": bound[:3]}
    confidence, test = count_test(
        f"communication not hidden under compute on every rank: {_ms(stake)} ms "
        f"({ev['share_pct']}% of the analysed time; threshold {200 * MIN_SHARE:.0f}%), of which "
        f"{_ms(wait)} ms waiting for peers and {_ms(transfer)} ms transfer",
        len(steps), n_steps)
    ev["test"] = test.as_dict()
    title = (f"Communication not hidden under compute: {_ms(stake)} ms "
             f"({ev['share_pct']}% of the analysed time) on every rank "
             f"({_ms(wait)} ms waiting for peers, {_ms(transfer)} ms transfer)")
    return [Finding("exposed_comm", severity_of(share), title, ranks, sorted(steps), None,
                    max(own, 0.0) / 1e6, ev, EXPOSED_COMM_REMEDY, confidence=confidence,
                    observed_ms=stake / 1e6, caused_by=caused)]


def _bandwidth_findings(classes: list[BandwidthClass], wall_ns: int) -> list[Finding]:
    out = []
    for c in classes:
        if c.verdict not in ("bandwidth-bound", "latency-bound") or not wall_ns:
            continue
        if c.t_total_ns / wall_ns < MIN_SHARE / 4:
            continue
        stake = c.exposed_ns
        share = stake / wall_ns
        d = c.as_dict()
        size = fmt_bytes(c.bytes)
        if c.verdict == "bandwidth-bound":
            title = (f"{c.name} of {size} is bandwidth-bound on the {c.link} link "
                     f"({c.link_kind or 'unknown'}): busbw {d['busbw_gbit_s']} Gbit/s = "
                     f"{d['busbw_of_peak_pct']}% of its {d['peak_gbit_s']} Gbit/s peak")
        else:
            peak = f" = {d['busbw_of_peak_pct']}% of the peak" if d["busbw_of_peak_pct"] else ""
            title = (f"{c.name} of {size} is latency-bound on the {c.link} link: busbw "
                     f"{d['busbw_gbit_s']} Gbit/s{peak} over {c.instances} small messages")
        v = LINK_VERDICTS[c.verdict]
        sentence = (f"upper-quartile busbw of {c.instances} instance(s) over {len(c.steps)} "
                    f"step(s), from their transfer time (first exit - last arrival; waiting for "
                    f"peers excluded): {d['busbw_gbit_s']} Gbit/s"
                    + (f" = {d['busbw_of_peak_pct']}% of the {d['peak_gbit_s']} Gbit/s peak "
                       f"({c.peak_source})" if d["busbw_of_peak_pct"] is not None else
                       f", no peak known; {size} messages are latency-bound on any link"))
        if c.confidence == "suspected":
            sentence += (f"; a verdict from {c.instances} instance(s), fewer than "
                         f"{MIN_INSTANCES}: suspected; to confirm, " + trace_more_hint(c.steps))
        test = Test(name="busbw against the link's peak", statistic=f"{d['busbw_gbit_s']} Gbit/s",
                    instances=c.instances,
                    threshold=(f">= 80% of peak bandwidth-bound; < 50% with messages below "
                               f"{fmt_bytes(SMALL_MESSAGE_BYTES)} (or the calibrated half-peak size) "
                               "latency-bound"), sentence=sentence)
        out.append(Finding(v.kind, severity_of(share), title, [], c.steps, c.verdict,
                           stake / 1e6, {**d, "share_pct": round(100 * share, 1),
                                         "test": test.as_dict()}, v.remedy,
                           confidence=c.confidence))
    return out


def _throttle_findings(clocks: dict[int, GpuClocks], traced: pa.Table, wall_ns: int,
                       straggler: Straggler | None) -> list[Finding]:
    out = []
    hit = {r: c for r, c in clocks.items() if c.slowdown_fraction >= SLOWDOWN_FRACTION}
    if straggler is not None and straggler.cause == "clock_throttle":
        hit.pop(straggler.rank, None)
    if not hit or not wall_ns:
        return out
    compute: dict[int, int] = {}
    for r, c in zip(traced.column("rank").to_pylist(), traced.column("compute_ns").to_pylist()):
        compute[r] = compute.get(r, 0) + (c or 0)
    stakes = {}
    for r, c in hit.items():
        slow = 1.0 - (c.sm_clock_mhz / c.sm_clock_max_mhz) if c.sm_clock_mhz and \
            c.sm_clock_max_mhz else 0.0
        stakes[r] = compute.get(r, 0) * max(slow, 0.0) * c.slowdown_fraction
    worst = max(stakes, key=lambda r: stakes[r])
    share = stakes[worst] / wall_ns
    reasons = sorted({k for c in hit.values() for k, v in c.reasons.items() if v > 0})
    ev = {"gpus": {str(r): c.as_dict() for r, c in hit.items()},
          "share_pct": round(100 * share, 1)}
    title = (f"GPU clocks slowed down on {_ranks_str(sorted(hit))}"
             + (f" ({', '.join(reasons)})" if reasons else ""))
    out.append(Finding("throttle", severity_of(share), title, sorted(hit), [],
                       ", ".join(reasons) or None, stakes[worst] / 1e6, ev, THROTTLE_REMEDY))
    return out


# --- documents ----------------------------------------------------------------------------------

def _run_doc(ctx: RunContext, traced: pa.Table, wall_ns: int, median_step: float | None,
             alignment: Alignment, matched: Matched, threshold_ns: int, problems: list[str],
             classes: list[BandwidthClass]) -> dict[str, Any]:
    steps = sorted(set(traced.column("step").to_pylist())) if traced.num_rows else []
    hosts: dict[str, list[int]] = {}
    for r in ctx.rank_ids:
        hosts.setdefault(ctx.host_of(r) or "unknown", []).append(r)
    from uberprof.rundir import RunDir

    run_id = RunDir(ctx.root).run_id() if ctx.is_run_dir else None
    un = matched.unmatched
    return {
        "schema_version": SCHEMA_VERSION,
        "uberprof_version": __version__,
        "path": str(ctx.root),
        "run_id": run_id,
        "kind": "run" if ctx.is_run_dir else "traces",
        "world_size": ctx.world_size,
        "ranks": ctx.rank_ids,
        "hosts": hosts,
        "backend": next((i.backend for i in ctx.ranks.values() if i.backend), None),
        "device_type": _device_type(ctx),
        "analysed_steps": steps,
        "analysed_wall_ms": _ms(wall_ns),
        "step_time_ms": _ms(median_step),
        "gap_threshold_us": threshold_ns / 1e3,
        "clock_alignment": alignment.as_dict(),
        "collectives": {
            "matched_instances": matched.n_instances,
            "unmatched_calls": un.num_rows,
            "unmatched_examples": [
                {"rank": r["rank"], "collective": r["name"], "step": r["step"],
                 "bytes": r["in_bytes"], "reason": r.get("reason")}
                for r in un.slice(0, 5).to_pylist()],
            "groups": {g: {"ranks": v, "matched_by": matched.method.get(g)}
                       for g, v in matched.groups.items()},
        },
        "bandwidth": [c.as_dict() for c in classes],
        "problems": problems,
    }


def _ranks_doc(ctx: RunContext, traced: pa.Table, summaries: RankSummaries
               ) -> list[dict[str, Any]]:
    bd = {r["rank"]: r for r in ctx.breakdown().to_pylist()}
    per_step: dict[int, dict[str, int]] = {}
    for row in traced.select(["rank", "compute_ns", "exposed_comm_ns", "idle_ns", "window_ns",
                              "data_wait_ns"]).to_pylist():
        acc = per_step.setdefault(row["rank"], {})
        for k, v in row.items():
            if k != "rank":
                acc[k] = acc.get(k, 0) + (v or 0)
    out = []
    for r in ctx.rank_ids:
        b = bd.get(r, {})
        info = ctx.ranks[r]
        late = summaries.lateness_of(r)
        idle_ns, gaps = summaries.idle_of(r)
        st = per_step.get(r, {})
        out.append({
            "rank": r,
            "host": info.host,
            "mode": info.mode,
            "device_type": info.device_type,
            "steps": b.get("steps"),
            "step_time_ms": {"median": b.get("step_time_median_ms"),
                             "p90": b.get("step_time_p90_ms")},
            "breakdown_pct": {k: b.get(f"{k}_pct") for k in
                              ("compute", "non_compute", "exposed_comm", "memory", "idle",
                               "overlap")},
            "analysed": {"compute_ms": _ms(st.get("compute_ns")),
                         "exposed_comm_ms": _ms(st.get("exposed_comm_ns")),
                         "idle_ms": _ms(st.get("idle_ns")),
                         "data_wait_ms": _ms(st.get("data_wait_ns")),
                         "window_ms": _ms(st.get("window_ns"))},
            "idle_gaps": {"count": gaps,
                          "ms_by_cause": {c: _ms(v) for c, v in idle_ns.items()}},
            "lateness_ms": {"median": _ms(late["median_ns"]), "p90": _ms(late["p90_ns"]),
                            "last_in": late["last_in"], "instances": late["instances"]},
        })
    return out
