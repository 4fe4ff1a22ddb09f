"""The advisor: from a run's tables to ranked findings. `diagnose(path) -> Diagnosis` is the one
entry point that the terminal report, the HTML report, the dashboard and the trace export share.

Order of work (DESIGN.md): match collectives, align clocks (then drop pairings that never overlap
in time and align again), then per rank (one event table in memory at a time) idle gaps and the
exposed part of each collective, then across ranks lateness and the straggler, bandwidth per
instance and class, and finally the findings.

A finding's `time_at_stake_ms` is the wall-clock time of the analysed (traced) steps it accounts
for, an upper bound on what fixing it saves there: ranks run in parallel, so a per-rank amount
counts once (the worst rank's), and a straggler's is the delay it alone adds to each step.
Severity is its share of the analysed wall time: high >= 15%, medium >= 5%, else low.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof import __version__
from uberprof.analysis import metrics as M
from uberprof.analysis.align import Alignment, align_clocks
from uberprof.analysis.bandwidth import (
    BandwidthClass,
    Peaks,
    bandwidth_classes,
    exposed_ns,
    instance_bandwidth,
)
from uberprof.analysis.causes import (
    EXPOSED_COMM_REMEDY,
    GAP_CAUSES,
    LINK_VERDICTS,
    STRAGGLER_CAUSES,
    THROTTLE_REMEDY,
)
from uberprof.analysis.collectives import Matched, drop_inconsistent, match_collectives
from uberprof.analysis.context import RunContext, load_context
from uberprof.analysis.gaps import CAUSES, DEFAULT_THRESHOLD_NS, GAP_SCHEMA, gap_context, idle_gaps
from uberprof.analysis.gpu_clocks import (
    SLOWDOWN_FRACTION,
    GpuClocks,
    gpu_clocks,
    throttled_vs_others,
)
from uberprof.analysis.stragglers import Straggler, find_straggler, lateness, straggler_cause
from uberprof.analysis.summaries import RankSummaries, sql_table, summarise
from uberprof.analysis.summaries import ns_to_ms as _ms
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
                 "exposed_comm", "bandwidth", "throttle")
MIN_SHARE = 0.02  # a per-rank problem below this share of the analysed time is not a finding
TOP_GAPS = 5


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

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "title": self.title,
                "ranks": self.ranks, "steps": self.steps, "cause": self.cause,
                "time_at_stake_ms": round(self.time_at_stake_ms, 3),
                "evidence": self.evidence, "remedy": self.remedy}


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
             progress: Progress | None = None) -> Diagnosis:
    """Analyse `path` if needed (run directory, trace folder or file) and diagnose it."""
    ctx = load_context(path, out=out, workers=workers, progress=progress)
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
    per_rank = {r: _rank_pass(ctx, r, traced, matched.instances, threshold_ns)
                for r in ctx.rank_ids}
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
    straggler = find_straggler(lat, median_step)
    factors = _factors(traced, gaps, lat)
    clock_ev: dict[str, Any] = {}
    if straggler is not None:
        clock_ev = throttled_vs_others(straggler.rank, clocks)
        straggler.cause, straggler.factors = straggler_cause(straggler.rank, factors, clock_ev)
        straggler.counters = clock_ev

    peaks = Peaks(ctx, window)
    bw = instance_bandwidth(ctx, matched.instances, exposed, peaks)
    classes = bandwidth_classes(bw)

    summaries = summarise(lat, gaps)
    findings: list[Finding] = []
    if straggler is not None:
        findings.append(_straggler_finding(straggler, wall_ns, ctx, summaries))
    findings += _gap_findings(gaps, traced, wall_ns, straggler)
    findings += _exposed_comm_findings(traced, lat, wall_ns, classes)
    findings += _bandwidth_findings(classes, wall_ns)
    findings += _throttle_findings(clocks, traced, wall_ns, straggler)
    findings.sort(key=lambda f: (-f.time_at_stake_ms, f.kind))
    findings = _failure_findings(ctx) + findings

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
    ranks = _ranks_doc(ctx, traced, summaries)
    return Diagnosis(run=run, ranks=ranks, findings=findings, alignment=alignment,
                     matched=matched, lateness=lat, gaps=gaps, bandwidth=bw, classes=classes,
                     straggler=straggler, steps=traced, summaries=summaries,
                     top_gaps=top[:TOP_GAPS * 2], derived=Path(ctx.run.derived),
                     inputs=sorted(ctx.run.inputs))


def _failure_findings(ctx: RunContext) -> list[Finding]:
    """Hangs and crashes (analysis/failures.py), ranked first: a job that stops costs most."""
    if not ctx.is_run_dir:
        return []
    from uberprof.analysis.failures import failure_findings

    return failure_findings(ctx.root)


def save_diagnosis(d: Diagnosis) -> Path | None:
    """Write the diagnosis beside the derived tables (see `uberprof.analysis.saved.save`)."""
    from uberprof.analysis.saved import save

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


# --- the per-rank pass --------------------------------------------------------------------------

@dataclass
class _RankResult:
    gaps: pa.Table
    small_idle_ns: dict[int, int]
    exposed: dict[tuple[int, int], int]  # (instance, rank) -> exposed ns of its span
    top_gaps: list[dict[str, Any]]


def _rank_pass(ctx: RunContext, rank: int, traced: pa.Table, instances: pa.Table,
               threshold_ns: int) -> _RankResult:
    """Idle gaps and collective exposure of one rank: its event table is read, used, dropped."""
    mine = traced.filter(pc.equal(traced.column("rank"), rank))
    try:
        events = ctx.events(rank)
    except (KeyError, OSError):
        return _RankResult(GAP_SCHEMA.empty_table(), {}, {}, [])
    act = M.device_activity(events)
    rg = idle_gaps(rank, events, mine, threshold_ns, act)
    inst = instances.filter(pc.equal(instances.column("rank"), rank))
    exposed: dict[tuple[int, int], int] = {}
    if inst.num_rows:
        s = inst.column("start_ns").to_numpy()
        e = inst.column("end_ns").to_numpy()
        ex = exposed_ns(act.compute, s, e)
        exposed = {(int(i), rank): int(x) for i, x in
                   zip(inst.column("instance").to_numpy().tolist(), ex.tolist())}
    top = [{**g, "rank": rank} for g in gap_context(events, rg.gaps, TOP_GAPS)]
    return _RankResult(rg.gaps, rg.small_idle_ns, exposed, top)


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


def severity_of(share: float) -> str:
    return "high" if share >= 0.15 else "medium" if share >= 0.05 else "low"


def _ranks_str(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:8])) + \
        (f" (+{len(ranks) - 8})" if len(ranks) > 8 else "")


# --- findings -----------------------------------------------------------------------------------

def _straggler_finding(s: Straggler, wall_ns: int, ctx: RunContext,
                       summaries: RankSummaries) -> Finding:
    share = s.delay_ns / wall_ns if wall_ns else 0.0
    late = summaries.lateness_of(s.rank)  # the rank row's numbers, the same by construction
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
    }
    if s.counters.get("available"):
        ev["gpu"] = {k: v for k, v in s.counters.items() if k != "available"}
    cause = s.cause or "compute"
    title = (f"Rank {s.rank} is a straggler ({cause}): last at {ev['last_in']}/"
             f"{ev['instances']} collectives, {ev['median_lead_ms']} ms behind the others' "
             "median")
    return Finding("straggler", severity_of(share), title, [s.rank], s.steps, cause,
                   s.delay_ns / 1e6, ev, STRAGGLER_CAUSES[cause].remedy.format(r=s.rank))


def _gap_findings(gaps: pa.Table, traced: pa.Table, wall_ns: int,
                  straggler: Straggler | None) -> list[Finding]:
    if gaps.num_rows == 0 or not wall_ns:
        return []
    # per rank analysed wall time: the share is of each rank's own analysed time
    rank_time: dict[int, int] = {}
    for r, t in zip(traced.column("rank").to_pylist(), traced.column("step_time_ns").to_pylist()):
        rank_time[r] = rank_time.get(r, 0) + (t or 0)
    by: dict[str, dict[int, int]] = {c: {} for c in CAUSES}
    steps_of: dict[str, dict[int, set[int]]] = {c: {} for c in CAUSES}
    counts: dict[str, int] = {c: 0 for c in CAUSES}
    largest: dict[str, dict[str, Any]] = {}
    for c, r, total, n, steps in _sql(
            "SELECT cause, rank, sum(dur_ns), count(*), list(DISTINCT step) FROM g "
            "GROUP BY cause, rank", g=gaps):
        by[c][r] = int(total)
        steps_of[c][r] = set(steps)
        counts[c] += int(n)
    fields = ["cause", "rank", "step", "dur_ns", "before", "after"]
    for row in _sql("SELECT cause, arg_max(rank, dur_ns), arg_max(step, dur_ns), max(dur_ns), "
                    "arg_max(before, dur_ns), arg_max(after, dur_ns) FROM g GROUP BY cause",
                    g=gaps):
        largest[row[0]] = dict(zip(fields, row))
    out = []
    for cause in CAUSES:
        ranks = sorted(r for r, v in by[cause].items()
                       if rank_time.get(r) and v / rank_time[r] >= MIN_SHARE)
        if straggler is not None and straggler.cause == "data" and cause == "data":
            ranks = [r for r in ranks if r != straggler.rank]  # the straggler finding says it
        if not ranks:
            continue
        worst = max(ranks, key=lambda r: by[cause][r])
        stake = by[cause][worst]
        share = stake / wall_ns
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
        }
        c = GAP_CAUSES[cause]
        title = (f"Device idle {_ms(stake)} ms on {_ranks_str([worst])} ({c.phrase}); "
                 f"{len(ranks)} rank(s) affected")
        steps = sorted(set().union(*(steps_of[cause][r] for r in ranks)))
        out.append(Finding(c.kind, severity_of(share), title, ranks, steps, cause, stake / 1e6,
                           ev, c.remedy))
    return out


def _exposed_comm_findings(traced: pa.Table, lat: pa.Table, wall_ns: int,
                           classes: list[BandwidthClass]) -> list[Finding]:
    """Communication not hidden under compute that every rank pays (per step, the least
    exposed rank's), so that waiting for a straggler is not counted twice."""
    if traced.num_rows == 0 or not wall_ns:
        return []
    per_step: dict[int, list[tuple[int, int, int]]] = {}
    for r, s, x, c in zip(*(traced.column(k).to_pylist()
                            for k in ("rank", "step", "exposed_comm_ns", "comm_ns"))):
        per_step.setdefault(s, []).append((r, x or 0, c or 0))
    stake = 0
    comm_total = 0
    steps = []
    for s, rows in per_step.items():
        least = min(x for _, x, _ in rows)
        stake += least
        comm_total += min(c for _, _, c in rows)
        if least > 0:
            steps.append(s)
    share = stake / wall_ns
    if share < MIN_SHARE * 2:
        return []
    ranks = sorted({r for rows in per_step.values() for r, _, _ in rows})
    bound = [c.as_dict() for c in classes if c.verdict in ("bandwidth-bound", "latency-bound")]
    ev = {"exposed_ms_all_ranks_pay": _ms(stake),
          "comm_ms_least_rank": _ms(comm_total),
          "exposed_of_comm_pct": round(100 * stake / comm_total, 1) if comm_total else None,
          "share_pct": round(100 * share, 1),
          "limited_collectives": bound[:3]}
    title = (f"Communication not hidden under compute: {_ms(stake)} ms "
             f"({ev['share_pct']}% of the analysed time) on every rank")
    return [Finding("exposed_comm", severity_of(share), title, ranks, sorted(steps), None,
                    stake / 1e6, ev, EXPOSED_COMM_REMEDY)]


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
        out.append(Finding(v.kind, severity_of(share), title, [], c.steps, c.verdict,
                           stake / 1e6, {**d, "share_pct": round(100 * share, 1)}, v.remedy))
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
    run_id = None
    if ctx.is_run_dir:
        try:
            from uberprof.rundir import RunDir, read_json

            run_id = read_json(RunDir(ctx.root).run_file).get("run_id")
        except (OSError, ValueError):
            run_id = None
    un = matched.unmatched
    return {
        "schema_version": SCHEMA_VERSION,
        "uberprof_version": __version__,
        "path": str(ctx.root),
        "run_id": run_id,
        "kind": "run" if ctx.is_run_dir else "traces",
        "world_size": len(ctx.rank_ids),
        "ranks": ctx.rank_ids,
        "hosts": hosts,
        "backend": next((i.backend for i in ctx.ranks.values() if i.backend), None),
        "device_type": next((i.device_type for i in ctx.ranks.values() if i.mode == "device"),
                            "cpu"),
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
