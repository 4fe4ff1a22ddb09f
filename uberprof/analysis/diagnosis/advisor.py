"""The advisor: from a run's tables to ranked findings. `diagnose(path) -> Diagnosis` is the one
entry point; views open a run through `analysis/read.py`, which calls it when no fresh diagnosis
is saved.

Order of work (docs/DESIGN.md, §5): match collectives, align clocks (then drop pairings that
never overlap in time and align again), then per rank, in the map's workers (each reads one
event table; `rank_diagnosis.py`), idle gaps and the exposed part of each collective, then across
ranks lateness and the straggler,
bandwidth per instance and class, and finally the findings: every producer registered in
`findings/` (`findings.PRODUCERS`), in order, on the facts gathered here (`facts.Facts`).

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
for). `account` holds the invariant: the findings' times at stake never add up to more than
the analysed wall time.

Every verdict states its evidence (`confidence`, `evidence["test"]`: `evidence.py`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.bandwidth import Peaks, bandwidth_classes, instance_bandwidth
from uberprof.analysis.diagnosis.busy import busy_times
from uberprof.analysis.diagnosis.document import ranks_doc, run_doc_of
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings import produce
from uberprof.analysis.diagnosis.gains import attach_gains, run_projector, top_two, unfit_why
from uberprof.analysis.diagnosis.gaps import AROUND_SCHEMA, DEFAULT_THRESHOLD_NS, GAP_SCHEMA
from uberprof.analysis.diagnosis.gpu_clocks import gpu_clocks
from uberprof.analysis.diagnosis.group_comm import GroupComm, group_comm
from uberprof.analysis.diagnosis.job_traits import job_traits
from uberprof.analysis.diagnosis.lateness import lateness
from uberprof.analysis.diagnosis.memory import run_memory
from uberprof.analysis.diagnosis.memory_timeline import run_memory_timeline
from uberprof.analysis.diagnosis.model import Diagnosis, Finding, Progress
from uberprof.analysis.diagnosis.pipeline_stages import PipelineStages, pipeline_stages
from uberprof.analysis.diagnosis.rank_accounts import rank_accounting
from uberprof.analysis.diagnosis.rank_comm import rank_comm
from uberprof.analysis.diagnosis.rank_diagnosis import RankResult, rank_passes
from uberprof.analysis.diagnosis.report_doc import RunDoc, as_json
from uberprof.analysis.diagnosis.stragglers import StragglerTests, name_straggler
from uberprof.analysis.diagnosis.summaries import summarise
from uberprof.analysis.diagnosis.timeline_changes import timeline_changes
from uberprof.analysis.diagnosis.top_modules import run_modules
from uberprof.analysis.diagnosis.top_ops import run_operators
from uberprof.analysis.diagnosis.warmup import EVIDENCE_SCHEMA, Warmup, warmup_of
from uberprof.analysis.diagnosis.window_compare import compare_windows
from uberprof.analysis.tables.align import Alignment, align_clocks
from uberprof.analysis.tables.collectives import Matched, drop_inconsistent, match_collectives
from uberprof.analysis.tables.context import RunContext, load_context
from uberprof.analysis.tables.metrics import analysed_ns
from uberprof.analysis.tables.p2p import NO_PEER, P2P, match_p2p, p2p_doc
from uberprof.analysis.tables.parallelism import Parallelism, read_parallelism
from uberprof.analysis.tables.steptime import step_time_doc
from uberprof.units import ns_to_ms as _ms

__all__ = ["account", "analysed_steps", "diagnose", "diagnose_context", "finding_order"]


def diagnose(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
             threshold_ns: int = DEFAULT_THRESHOLD_NS, workers: int | None = None,
             progress: Progress | None = None, executor: Executor | None = None) -> Diagnosis:
    """Analyse `path` if needed (run directory, trace folder or file) and diagnose it; the
    per-rank work on `workers` processes, or on `executor` (Dask's)."""
    ctx = load_context(path, out=out, workers=workers, progress=progress, executor=executor)
    return diagnose_context(ctx, threshold_ns=threshold_ns)


def diagnose_context(ctx: RunContext, threshold_ns: int = DEFAULT_THRESHOLD_NS) -> Diagnosis:
    """Diagnose a run whose tables are loaded (module docstring: the order of work). Several
    tests read each node's small counter streams: they are read once (`shared_reads`)."""
    from uberprof.rundir.counters import shared_reads

    with shared_reads():
        return _diagnose_context(ctx, threshold_ns)


def _diagnose_context(ctx: RunContext, threshold_ns: int, story: bool = True) -> Diagnosis:
    """The diagnosis; with `story`, the changes of the step time's level and the comparison
    of the windows either side (whose own diagnoses are made without)."""
    d = _diagnose_once(ctx, threshold_ns, story)
    if story:  # the windows either side of a change, each diagnosed on its own
        compare_windows(ctx, d, lambda w: _diagnose_context(w, threshold_ns, story=False))
    return d


def _diagnose_once(ctx: RunContext, threshold_ns: int, story: bool) -> Diagnosis:
    """One diagnosis of `ctx`'s analysed steps (with `story`, also the level changes over its
    whole step timeline)."""
    problems = list(ctx.problems)
    matched, alignment, aligned = _aligned_collectives(ctx)

    per_rank, traced, gaps, warm = _per_rank(ctx, matched, threshold_ns)
    problems += [p.problem for p in per_rank.values() if p.problem]
    exposed = {k: v for p in per_rank.values() for k, v in p.exposed.items()}

    lat = lateness(warm.steady_rows(aligned))
    median_step, wall_ns = _median_step(traced), _analysed_wall_ns(traced)

    window = _window(traced, alignment)
    clocks = gpu_clocks(ctx, window)
    busy = busy_times(ctx)
    tests = name_straggler(ctx, alignment, traced, gaps, lat, clocks, median_step, wall_ns,
                           busy)
    bw = instance_bandwidth(ctx, aligned, exposed, Peaks(ctx, window), alignment.error_bounds())
    classes = bandwidth_classes(bw)

    summaries = summarise(lat, gaps)
    device_type = _device_type(ctx)
    parallelism, p2p, pipeline, groups = _parallel_facts(ctx, alignment, traced, matched,
                                                         exposed, wall_ns)
    traits = job_traits(ctx, traced, device_type)
    facts = Facts(ctx=ctx, traced=traced, wall_ns=wall_ns, lateness=lat, gaps=gaps,
                  classes=classes, clocks=clocks, straggler=tests.straggler,
                  summaries=summaries, device_type=device_type, window=window, p2p=p2p,
                  parallelism=parallelism, pipeline=pipeline,
                  groups=groups,
                  exposed_around=warm.steady_rows(_exposed_around(per_rank.values()), ""),
                  traits=traits, instances=warm.steady_rows(aligned),
                  rank_comm=rank_comm(traced, lat, _group_of(aligned), p2p.per_rank_step()))
    proj, cp_doc, rp_doc = run_projector(ctx, traced, matched.instances, alignment.offsets(),
                                         p2p.pairs, parallelism.stage_of or {}, busy)
    produced = produce(facts)
    attach_gains(produced, proj, unfit_why(rp_doc))  # before the order, which uses them
    findings = account(produced, wall_ns)

    problems += _unmatched_problems(matched, p2p)
    top = sorted((g for p in per_rank.values() for g in p.top_gaps if warm.keeps(g)),
                 key=lambda g: -g["dur_ns"])
    run = run_doc_of(ctx, traced, wall_ns, median_step, alignment, matched, threshold_ns,
                     problems, classes, device_type, parallelism)
    _add_tables(run, ctx, traced, p2p, pipeline, groups, traits, warm.traced)
    run.host_wall_ms = _ms(_analysed_wall_ns(traced, host_only=True)) if traced.num_rows else None
    run.critical_path, run.replay = cp_doc, rp_doc  # the graph built once, above
    run.warmup = warm.doc()
    run.fix_top_two = top_two(findings, proj)
    run.timeline_changes = timeline_changes(ctx, busy, alignment.offsets()) if story else []
    _add_verdict_docs(run, ctx, tests, median_step, wall_ns, findings, warm)
    ranks = rank_accounting(ranks_doc(ctx, traced, summaries, facts.rank_comm), findings)
    return Diagnosis(run=as_json(run), ranks=ranks, findings=findings,
                     alignment=alignment, matched=matched, lateness=lat, gaps=gaps, bandwidth=bw,
                     classes=classes, straggler=tests.straggler, steps=traced,
                     summaries=summaries, top_gaps=top, derived=Path(ctx.run.derived),
                     inputs=sorted(ctx.run.inputs), p2p=p2p.pairs)


def _group_of(instances: pa.Table) -> dict[int, str]:
    """Matched instance id -> its process group key."""
    return dict(zip(instances.column("instance").to_pylist(),
                    instances.column("grp").to_pylist()))


def _per_rank(ctx: RunContext, matched: Matched, threshold_ns: int
              ) -> tuple[dict[int, RankResult], pa.Table, pa.Table, Warmup]:
    """The per-rank passes over the analysed steps, then the run's warm-up (warmup.py): the
    steps and gaps the steady-state verdicts read are those left after it."""
    traced = analysed_steps(ctx)
    per_rank = {p.rank: p for p in rank_passes(ctx, traced, matched.instances, threshold_ns)}
    gaps = pa.concat_tables([GAP_SCHEMA.empty_table(), *(p.gaps for p in per_rank.values())])
    evidence = pa.concat_tables([EVIDENCE_SCHEMA.empty_table(),
                                 *(p.warmup for p in per_rank.values())])
    warm = warmup_of(traced, evidence,
                     {r: p.cut for r, p in per_rank.items() if p.cut is not None})
    return per_rank, warm.steady(traced), warm.steady_rows(gaps), warm


def _median_step(traced: pa.Table) -> float | None:
    """The median step time of the analysed steps (ns), None without any."""
    step_ns = traced.column("step_time_ns").to_numpy(zero_copy_only=False)
    step_ns = step_ns[~np.isnan(step_ns.astype(np.float64))] if step_ns.size else step_ns
    return float(np.median(step_ns)) if step_ns.size else None


def _unmatched_problems(matched: Matched, p2p: P2P) -> list[str]:
    """The problems of collectives and send/recv calls that could not be matched."""
    out = []
    if matched.unmatched.num_rows:
        out.append(f"{matched.unmatched.num_rows} collective call(s) could not be matched "
                   "across ranks (not on every rank of the group, or never overlapping in "
                   "time); left out of lateness and bandwidth")
    if p2p.unmatched.num_rows:
        reasons = set(p2p.unmatched.column("reason").to_pylist())
        why = (f": {NO_PEER}, so pipeline stages' waits and transfers are not measured"
               if reasons == {NO_PEER} else " (see run.p2p.unmatched_examples)")
        out.append(f"{p2p.unmatched.num_rows} send/recv call(s) could not be paired with "
                   f"the peer's receive/send{why}")
    return out


def _add_tables(run: RunDoc, ctx: RunContext, traced: pa.Table, p2p: P2P,
                pipeline: PipelineStages | None, groups: list[GroupComm],
                traits: dict[str, Any] | None, every_step: pa.Table) -> None:
    """The report document's tables that are no verdict (RunDoc's fields: none added here).
    The operator and module tables were summed by the map over every traced step, warm-up
    included: their per-step figures are of `every_step`, so that they agree with their sums."""
    run.p2p = p2p_doc(p2p)
    run.pipeline = pipeline.as_dict() if pipeline is not None else None
    run.comm_by_group = [g.as_dict() for g in groups]
    run.job_traits = traits
    run.operators = run_operators(ctx, every_step)
    run.memory = run_memory(ctx)
    run.modules = run_modules(ctx, every_step)
    run.memory_timeline = run_memory_timeline(ctx, traced)


def _exposed_around(results: Iterable[RankResult]) -> pa.Table:
    """Every rank's exposed communication by the compute around it (gaps.AROUND_SCHEMA)."""
    return pa.concat_tables([AROUND_SCHEMA.empty_table(),
                             *(p.exposed_around for p in results)])


def _parallel_facts(ctx: RunContext, alignment: Alignment, traced: pa.Table, matched: Matched,
                    exposed: dict[tuple[int, int], int], wall_ns: int
                    ) -> tuple[Parallelism, P2P, PipelineStages | None, list[GroupComm]]:
    """The run's parallelism, its send/recv pairs, its pipeline's stages (where the reading
    places them, else where the transfers do) and its communication per process group. The
    pipeline's schedule and micro-batches join the reading, so every view says one thing."""
    parallelism = read_parallelism(ctx)
    p2p = match_p2p(ctx, alignment.offsets(), _max_error_ns(alignment))
    pipeline = pipeline_stages(traced, p2p.pairs, parallelism.stage_of or None)
    if pipeline is not None:
        parallelism = dataclasses.replace(parallelism, pipeline=pipeline.as_dict(),
                                          stage_of=parallelism.stage_of or pipeline.stage_of)
    return parallelism, p2p, pipeline, group_comm(ctx, matched.instances, exposed, wall_ns)


def _max_error_ns(alignment: Alignment) -> int:
    """A bound on the clock error between two ranks: two hosts' errors add (0 when every rank
    shares one clock)."""
    bounds = [b for b in alignment.error_bounds().values() if b]
    return 2 * int(max(bounds)) if bounds else 0


def _aligned_collectives(ctx: RunContext) -> tuple[Matched, Alignment, pa.Table]:
    """Match the collectives, align the clocks on them, drop the pairings that never overlap in
    time and align again; the matched instances on aligned clocks."""
    matched = match_collectives(ctx)
    alignment = align_clocks(ctx, matched)
    matched, dropped = drop_inconsistent(matched, alignment.offsets())
    if dropped:
        alignment = align_clocks(ctx, matched)
    return matched, alignment, alignment.apply(matched.instances, ("start_ns", "end_ns"))


def _add_verdict_docs(run: RunDoc, ctx: RunContext, tests: StragglerTests,
                      median_step: float | None, wall_ns: int, findings: list[Finding],
                      warm: Warmup) -> None:
    """The report document's straggler test, step time and accounting (docs/json.md)."""
    run.straggler_test = tests.as_dict()
    run.step_time = step_time_doc(warm.steady_rows(ctx.steps(), ""), median_step)
    run.accounting = {
        "analysed_wall_ms": _ms(wall_ns),
        "at_stake_ms": round(sum(f.time_at_stake_ms for f in findings), 3),
        "rule": "each lost millisecond is counted by one finding; waiting for peers inside a "
                "collective is the late rank's, transfer after the last arrival is the link's"}


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

def _analysed_wall_ns(traced: pa.Table, host_only: bool = False) -> int:
    """Wall time of the analysed steps: per step the longest rank's analysed time (the longer
    of its host and device windows, `metrics.analysed_ns`; `host_only`: its host window),
    summed over steps."""
    if traced.num_rows == 0:
        return 0
    times = traced.column("step_time_ns").fill_null(0).to_pylist() if host_only else \
        analysed_ns(traced).tolist()
    per: dict[int, int] = {}
    for s, t in zip(traced.column("step").to_pylist(), times):
        per[s] = max(per.get(s, 0), int(t))
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


def _device_type(ctx: RunContext) -> str:
    """The run's accelerator type, "cpu" when no rank has one."""
    return next((i.device_type for i in ctx.ranks.values() if i.mode == "device" and
                 i.device_type), "cpu")


_SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}


def finding_order(f: Finding) -> tuple[Any, ...]:
    """The report's one ranking (docs/findings.md, `RANKING_RULE`): a hang or crash first (a job
    that stops costs most); then by severity, so that severity and order always agree; within
    a severity by one scale, milliseconds of step time: the projected gain where a what-if
    change models the finding (`projected_gain.gain_ms`, 0 where the replay finds none), its
    own time at stake where none does (the kind declares no change, or the replay is unfit).
    A 2% finding with a model never leads a 28% one without."""
    g = f.projected_gain
    scale = float((g or {}).get("gain_ms") or 0.0) if g is not None else f.time_at_stake_ms
    return (f.role != "failure", _SEVERITY_RANK.get(f.severity, 3), -scale,
            -f.time_at_stake_ms, f.kind)


def account(findings: list[Finding], wall_ns: int) -> list[Finding]:
    """Rank the findings (`finding_order`), resolve `caused_by` links to indices, and hold
    the invariant: their times at stake add up to at most the analysed wall time (a finding
    that would cross it keeps only what is left, and says so in `evidence["capped_ms"]`)."""
    findings = sorted(findings, key=finding_order)
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
