"""What would fixing it gain: the step graph (`tables/graph.py`) replayed with the recorded
durations (does it reproduce the measured steps?), its critical path (which rank and which
kind of work set each step's length), and replayed with changes (`uberprof whatif`).

Three documents, each a plain dict (docs/json.md, docs/whatif.md):

- `replay_doc`: per traced step the measured length (the longest rank's host window, as the
  report's step time, or on a GPU rank up to the end of the step's device work where that is
  later: `measured_steps`) against the replayed one, and the median and largest error. A run whose
  median error is above `FIT_PCT` is *unfit for projection*: the graph misses what set its
  steps, and the document says why.
- `critical_path_doc`: per step the pieces of the path that set its length, by kind (compute,
  transfer, waiting, data, host) and by rank, with the operators on it; summed over the steps.
- `project`: the replay with `Change`s (`--remove straggler|data|launch|sync|exposed-comm`,
  `--link-scale F`, `--link-gbps X`, `--balance-stages`, `--op NAME=F`; several compose; each
  is a graph edit of `whatif_changes.py`) against the replay without them.

A projection is the graph's answer, no more: it keeps every dependency and every recorded
duration it was not told to change, so it cannot know contention that a change would add or
remove, caches warming differently, or a schedule the framework would pick instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.diagnosis.bandwidth import bus_factor, message_bytes
from uberprof.analysis.diagnosis.busy import BusyTimes, busy_times
from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.analysis.diagnosis.shared_cores import core_sharing
from uberprof.analysis.diagnosis.whatif_changes import (
    Change,
    Edit,
    apply_changes,
    edited_graph,
    edits_edges,
    parse_changes,
)
from uberprof.analysis.tables.contention import (
    SHARING_DAMPING,
    SHARING_ROUNDS,
    CoreSharing,
    mean_rates,
)
from uberprof.analysis.tables.context import RankInfo, RunContext
from uberprof.analysis.tables.graph import StepGraph, build_graph
from uberprof.analysis.tables.lanes import (
    COMPUTE,
    lane_passes,
)
from uberprof.analysis.tables.p2p import P2P_NAMES
from uberprof.analysis.tables.replay import (
    PATH_KINDS,
    Replay,
    critical_path,
    keeps_levels,
    recorded_device_spans,
    replay,
    step_spans,
)
from uberprof.analysis.tables.steptime import median_interval
from uberprof.rundir import rank_ranges

__all__ = ["FIT_PCT", "Change", "caveats", "core_contention", "critical_path_doc", "other_load",
           "outnumbered_cores", "parse_changes", "project", "project_run", "replay_doc",
           "run_graph", "run_graph_docs", "stages_of", "step_ends", "straggler_of", "with_bytes"]

FIT_PCT = 5.0  # a replay whose median error per step is above this is unfit for projection
TOP_OPS = 5


def run_graph(ctx: RunContext, traced: pa.Table, instances: pa.Table,
              offsets: dict[int, int], pairs: pa.Table | None,
              busy: BusyTimes | None) -> StepGraph:
    """The run's step graph: each rank's lane (read where the analysis's map runs), joined by
    the matched `instances` (own clocks) and send/recv `pairs` on the aligned clock, with the
    cores its CPU ranks share (`shared_cores.core_sharing`, from the run's `busy` times)."""
    g = build_graph(lane_passes(ctx, traced), offsets,
                    with_bytes(with_solo(instances, ctx)), pairs, consume=True)
    g.sharing = core_sharing(ctx, g, busy)
    return g


def with_solo(instances: pa.Table, ctx: RunContext) -> pa.Table:
    """`instances` and, as instances of one participant, the collectives of the ranks that have
    no matched instance because their peers are not in the traces (one rank's trace of a
    larger job): their kernels are comm nodes too, so that hiding communication can act on
    them; with no peer to wait for, the whole of each counts as its transfer (an upper bound:
    `whatif_changes` says so). Ranks with a matched instance add nothing (their unmatched
    collectives stay out, as the matching left them)."""
    have = set(instances.column("rank").to_pylist()) if instances.num_rows else set()
    if not set(ctx.rank_ids) - have:
        return instances
    coll = ctx.collectives()
    if coll.num_rows == 0:
        return instances
    rank = coll.column("rank").to_numpy()
    keep = ~np.isin(rank, list(have)) & ~np.asarray(pc.is_in(
        pc.fill_null(coll.column("name"), ""), pa.array(P2P_NAMES)).to_numpy(zero_copy_only=False))
    solo = coll.filter(pa.array(keep))
    if solo.num_rows == 0:
        return instances
    base = int(pc.max(instances.column("instance")).as_py()) + 1 if instances.num_rows else 0
    ones = pa.array(np.ones(solo.num_rows, np.int64))
    cols = {"instance": pa.array(np.arange(base, base + solo.num_rows, dtype=np.int64)),
            "grp": pc.fill_null(solo.column("pg_name").cast(pa.string()), "solo"),
            "name": solo.column("name"), "participants": ones,
            "group_size": solo.column("group_size").cast(pa.int64())}
    rows = pa.table({f.name: cols[f.name] if f.name in cols else solo.column(f.name)
                     for f in instances.schema}).cast(instances.schema)
    return pa.concat_tables([instances, rows])


def with_bytes(instances: pa.Table) -> pa.Table:
    """`instances` with each row's transfer size S and bus factor as `bandwidth.py` defines
    them (`bytes`, `bus_factor`: what `--link-gbps` re-times), null where unknown."""
    if instances.num_rows == 0 or "bytes" in instances.schema.names:
        return instances
    cols = instances.select(["name", "in_bytes", "out_bytes", "group_size",
                             "participants"]).to_pydict()
    size, bus = [], []
    for name, i, o, gs, n in zip(cols["name"], cols["in_bytes"], cols["out_bytes"],
                                 cols["group_size"], cols["participants"]):
        k = int(gs or n or 1)
        size.append(message_bytes(name or "", i, o, k))
        bus.append(bus_factor(name or "", k))
    return instances.append_column("bytes", pa.array(size, pa.int64())) \
        .append_column("bus_factor", pa.array(bus, pa.float64()))


def run_graph_docs(ctx: RunContext, traced: pa.Table, instances: pa.Table,
                   offsets: dict[int, int], pairs: pa.Table | None, busy: BusyTimes | None
                   ) -> tuple[StepGraph | None, Replay | None, dict[str, Any] | None,
                              dict[str, Any] | None]:
    """The graph, its replay, and the report's `run.critical_path` and `run.replay` (all None
    without a traced step on any rank's lane). A graph that cannot be built costs the report
    these two fields only: the reason goes to `run.replay.why`."""
    try:
        g = run_graph(ctx, traced, instances, offsets, pairs, busy)
        if not g.lanes:
            return None, None, None, None
        r = replay(g)
        rp = replay_doc(g, traced, r)
        rp["caveats"] = caveats(ctx, g)
        rp["core_sharing"] = g.sharing.as_dict() if g.sharing is not None else None
        return g, r, critical_path_doc(g, r), rp
    except Exception as exc:  # noqa: BLE001 - a projection aid never stops the report
        return None, None, None, {
            "steps": [], "median_error_pct": None, "max_error_pct": None,
            "fit_for_projection": False, "threshold_pct": FIT_PCT,
            "why": f"the step graph could not be built ({type(exc).__name__}: {exc})",
            "graph": None}


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)


def measured_steps(traced: pa.Table, g: StepGraph | None = None) -> dict[int, int]:
    """Per traced step, its measured length: the longest rank's host window (the report's step
    time), or, with the graph `g`, from the host window's start to the later of its end and the
    recorded end of the step's device work, as the replay measures a step (`step_spans`): where
    the device runs behind its host, the step ends on the device."""
    dev = recorded_device_spans(g) if g is not None and g.device_lanes else {}
    out: dict[int, int] = {}
    for s, r, t in zip(*(traced.column(c).to_pylist() for c in ("step", "rank", "step_time_ns"))):
        if s is not None and t is not None:
            out[s] = max(out.get(s, 0), int(t), dev.get((s, r), 0))
    return out


def replayed_steps(g: StepGraph, r: Replay) -> dict[int, tuple[int, int]]:
    """Per step, the replayed length (the longest rank's window) and that rank."""
    out: dict[int, tuple[int, int]] = {}
    for s, per in step_spans(g, r).items():
        rank, (a, b, _, _) = max(per.items(), key=lambda kv: (kv[1][1] - kv[1][0], -kv[0]))
        out[s] = (b - a, rank)
    return out


def replay_doc(g: StepGraph, traced: pa.Table, r: Replay | None = None) -> dict[str, Any]:
    """`run.replay` (module docstring)."""
    r = r if r is not None else replay(g)
    meas, rep = measured_steps(traced, g), replayed_steps(g, r)
    rows = []
    for s in sorted(set(meas) & set(rep)):
        m, x = meas[s], rep[s][0]
        rows.append({"step": s, "measured_ms": _ms(m), "replayed_ms": _ms(x),
                     "error_pct": round(100 * abs(x - m) / m, 2) if m else None})
    errs = np.array([x["error_pct"] for x in rows if x["error_pct"] is not None])
    med = round(float(np.median(errs)), 2) if errs.size else None
    fit = med is not None and med <= FIT_PCT
    return {"steps": rows, "median_error_pct": med,
            "max_error_pct": round(float(errs.max()), 2) if errs.size else None,
            "fit_for_projection": fit, "threshold_pct": FIT_PCT,
            "why": _why(fit, med, rows, r, g), "graph": {"ranks": len(g.lanes), **g.counts(),
                                                         "dropped_dependencies": r.broken}}


def _why(fit: bool, med: float | None, rows: list[dict[str, Any]], r: Replay,
         g: StepGraph) -> str:
    if med is None:
        return ("no traced step could be replayed: no rank has a step with a host window in "
                "its events" if not rows else "the measured steps have no length")
    if fit:
        return (f"the graph replays the measured steps to a median {med}% (at most "
                f"{FIT_PCT:g}%): projections keep the recorded dependencies")
    reasons = []
    if r.broken:
        reasons.append(f"{r.broken} dependencies contradicted the aligned clocks (a clock "
                       "error larger than the alignment's bound) and were dropped")
    if not g.counts()["comm_nodes"]:
        reasons.append("no collective or send/recv could be placed in the ranks' lanes, so the "
                       "ranks' waits on each other are fixed lengths")
    reasons.append("the steps' length is set by something the trace does not show as a "
                   "dependency (host threads outside the training thread, work before the "
                   "trace window's first step, an unmatched collective)")
    return (f"replayed steps differ from the measured by a median {med}% (above "
            f"{FIT_PCT:g}%): " + "; ".join(reasons))


def critical_path_doc(g: StepGraph, r: Replay | None = None) -> dict[str, Any]:
    """`run.critical_path` (module docstring): per step and summed over the steps."""
    r = r if r is not None else replay(g)
    steps, kinds, ranks, ops = [], dict.fromkeys(PATH_KINDS, 0), {}, {}
    for s, per in sorted(step_spans(g, r).items()):
        rank, (a, b, _, last) = max(per.items(), key=lambda kv: (kv[1][1] - kv[1][0], -kv[0]))
        p = critical_path(g, r, last, a)
        bk, br = p.by_kind(), p.by_rank()
        step_ops = _path_ops(g, r, p)
        for k, v in bk.items():
            kinds[k] += v
        for k, v in br.items():
            ranks[k] = ranks.get(k, 0) + v
        for k, v in step_ops.items():
            ops[k] = ops.get(k, 0) + v
        steps.append({"step": s, "length_ms": _ms(b - a), "rank": rank,
                      "by_kind_ms": {k: _ms(v) for k, v in bk.items()},
                      "by_rank_ms": {str(k): _ms(v) for k, v in sorted(br.items())},
                      "top_operators": _top(step_ops)})
    total = sum(kinds.values())
    sets = max(ranks, key=lambda k: ranks[k]) if ranks else None
    kind = max(kinds, key=lambda k: kinds[k]) if total else None
    return {"steps": steps, "by_kind_ms": {k: _ms(v) for k, v in kinds.items()},
            "by_kind_pct": {k: round(100 * v / total, 1) if total else 0.0
                            for k, v in kinds.items()},
            "by_rank_ms": {str(k): _ms(v) for k, v in sorted(ranks.items())},
            "rank": sets, "kind": kind, "top_operators": _top(ops),
            "summary": _path_sentence(sets, kind, kinds, ranks, total, len(steps))}


def _path_ops(g: StepGraph, r: Replay, p: Any) -> dict[str, float]:
    """Operator time on the path: each compute piece takes its node's operators in proportion
    to the share of the node's work it covers."""
    share: dict[int, float] = {}
    for node, kind, ns in zip(p.node.tolist(), p.kind.tolist(), p.ns.tolist()):
        if kind == 0 and g.kind[node] == COMPUTE and r.own[node] > 0:
            share[node] = share.get(node, 0.0) + ns / float(r.own[node])
    if not share or g.op_node.size == 0:
        return {}
    nodes = np.fromiter(share, np.int64)
    m = np.isin(g.op_node, nodes)
    out: dict[str, float] = {}
    scale = g.dur[g.op_node[m]].astype(np.float64)
    own = r.own[g.op_node[m]] / np.where(scale > 0, scale, 1)
    for node, code, ns, f in zip(g.op_node[m].tolist(), g.op_name[m].tolist(),
                                 g.op_ns[m].tolist(), own.tolist()):
        name = g.names[code]
        out[name] = out.get(name, 0.0) + ns * f * min(share[node], 1.0)
    return out


def _top(ops: dict[str, float]) -> list[dict[str, Any]]:
    return [{"name": k, "ms": _ms(v)} for k, v in
            sorted(ops.items(), key=lambda kv: -kv[1])[:TOP_OPS] if v > 0]


def _path_sentence(rank: int | None, kind: str | None, kinds: dict[str, int],
                   ranks: dict[int, int], total: int, n: int) -> str:
    if not total or rank is None or kind is None:
        return "no step could be replayed"
    return (f"over {n} step(s), {round(100 * ranks[rank] / total)}% of the critical path is on "
            f"rank {rank}; by kind, {kind} sets most of it ({round(100 * kinds[kind] / total)}%)")


# --- projections -------------------------------------------------------------------------------

def step_ends(g: StepGraph, r: Replay) -> dict[int, int]:
    """Per step, when its last rank finishes it (the replayed end of its window)."""
    return {s: max(b for _, b, _, _ in per.values()) for s, per in step_spans(g, r).items()}


def project(g: StepGraph, traced: pa.Table, changes: list[Change],
            straggler: int | None, straggler_basis: str = "", base: Replay | None = None,
            stages: dict[int, int] | None = None,
            fit: dict[str, Any] | None = None,
            only: tuple[int, int] | None = None) -> dict[str, Any]:
    """Replay `g` as recorded (`base`, when the caller has it) and with `changes`
    (`whatif_changes.apply_changes`; `stages`: each rank's pipeline stage). A step's gain is
    how much earlier its last rank finishes it, less the gain of the step before (so the
    gains add up to the whole window's, and a rank that merely starts a step earlier gains
    nothing); the projected step is the measured one less its gain. The projected step time is
    the measured median less the mean gain a step (the window's saving spread over its steps),
    with the measured median's 95% interval moved by it (module docstring; docs/whatif.md).

    `only` (steps A-B, inclusive) keeps those steps' figures: the whole graph is still
    replayed, so a step's gain is the same as without it (its predecessors' gains are taken
    off whichever steps are kept), and the replay error is that of the kept steps."""
    base = base if base is not None else replay(g)
    edit = apply_changes(g, changes, straggler, stages, copy=False)
    new = _replay_edit(g, edit, base)
    meas, rep = measured_steps(traced, g), replayed_steps(g, base)
    e0, e1 = step_ends(g, base), step_ends(g, new)
    steps = sorted(set(meas) & set(rep) & set(e0) & set(e1))
    saved = np.array([e0[s] - e1[s] for s in steps], np.float64)
    gain = np.diff(np.r_[0.0, saved])
    if only is not None:
        traced_steps = steps
        keep = np.array([only[0] <= s <= only[1] for s in steps], bool)
        steps, gain = [s for s, k in zip(steps, keep) if k], gain[keep]
        traced = traced.filter(pc.is_in(traced.column("step"), pa.array(steps, pa.int64())))
    m = np.array([meas[s] for s in steps], np.float64)
    rp = np.array([rep[s][0] for s in steps], np.float64)
    p = m - gain
    rows = [{"step": s, "measured_ms": _ms(a), "replayed_ms": _ms(b), "gain_ms": _ms(c),
             "projected_ms": _ms(d)} for s, a, b, c, d in zip(steps, m, rp, gain, p)]
    fit = fit if fit is not None else replay_doc(g, traced, base)
    doc: dict[str, Any] = {
        "changes": edit.notes, "straggler": straggler, "straggler_basis": straggler_basis,
        "steps": rows, "baseline_step_ms": None, "replayed_step_ms": None,
        "projected_step_ms": None, "interval_ms": None, "interval": None, "gain_ms": None,
        "gain_pct": None, "fit_for_projection": fit["fit_for_projection"],
        "replay_error_pct": fit["median_error_pct"], "why": fit["why"],
        "dropped_dependencies": new.broken,
        "core_sharing": g.sharing.as_dict() if g.sharing is not None else None,
        "step_range": list(only) if only is not None else None}
    if not steps:
        if only is not None:
            doc["why"] = (f"no traced step in {only[0]}-{only[1]}; the traced steps are "
                          f"{rank_ranges(traced_steps) if traced_steps else 'none'}")
        return doc
    doc.update(_projected_step(m, rp, gain))
    return doc


def _projected_step(m: np.ndarray, rp: np.ndarray, gain: np.ndarray) -> dict[str, Any]:
    """`project`'s step-time figures from the kept steps' measured (`m`) and replayed (`rp`)
    times and gains: the measured median, its interval and both moved by the mean gain."""
    # the window's saving a step, not the median of the steps' projections: a change moves
    # step boundaries, so one step's gain can be negative while the window gains (a median
    # over such steps came out 1% longer than measured with the window 111 ms shorter)
    saving = float(gain.mean())
    iv = median_interval(m)
    kind = "95% interval of the median over the steps"
    if iv is None:
        iv, kind = (float(m.min()), float(m.max())), \
            "range over the steps (too few for a 95% interval)"
    base_ms = float(np.median(m))
    return {"baseline_step_ms": _ms(base_ms), "replayed_step_ms": _ms(np.median(rp)),
            "projected_step_ms": _ms(base_ms - saving),
            "interval_ms": [_ms(iv[0] - saving), _ms(iv[1] - saving)],
            "interval": kind, "gain_ms": _ms(saving),
            "gain_pct": round(100 * saving / base_ms, 1) if base_ms else None}


def _replay_edit(g: StepGraph, edit: Edit, base: Replay) -> Replay:
    """The replay of `g` as `edit` changed it: `base` where nothing changed; `g` itself with
    the edit's dropped and moved edges where its levels still order them (`keeps_levels`: no
    copy of the graph's edges and no structure of its own, together ~370 MB at 512 ranks);
    else a copy of `g` with the edited edges (`edited_graph`: an edit that adds edges, or a
    graph whose structure broke a cycle), as before. The three give the same times."""
    if not edits_edges(g, edit):
        unchanged = bool((edit.own == 1).all()) and bool((edit.tail == g.tail).all())
        return base if unchanged else _replay_shared(g, edit.own, edit.tail, base)
    moved = edit.src if (edit.src != g.src).any() else None
    if not edit.extra and keeps_levels(g, moved):
        drop = edit.drop if edit.drop.any() else None
        return _replay_shared(g, edit.own, edit.tail, base, drop, moved)
    return _replay_shared(edited_graph(g, edit), edit.own, edit.tail, base)


def _replay_shared(g: StepGraph, own: np.ndarray, tail: np.ndarray, base: Replay,
                   drop: np.ndarray | None = None, src: np.ndarray | None = None) -> Replay:
    """Replay `g` with each node's work scaled by `own` (and the edges `drop` and `src` edit,
    `replay`), then, where its CPU ranks share a host's cores (`g.sharing`), each running
    segment's work also by its recorded rate over its rate in the new replay, damped, for a
    few rounds (tables/contention.py)."""
    new = replay(g, own, None, tail, drop=drop, src=src)
    sh = g.sharing
    if sh is None:
        return new
    run = sh.running()
    recorded = mean_rates(sh, base.start, base.end)
    factor = np.ones(g.n)
    for _ in range(SHARING_ROUNDS):
        now = mean_rates(sh, new.start, new.end)
        target = np.where(run, recorded / np.maximum(now, 1e-6), 1.0)
        factor = (1 - SHARING_DAMPING) * factor + SHARING_DAMPING * target
        new = replay(g, own * factor, None, tail, drop=drop, src=src)
    return new


def stages_of(d: Diagnosis) -> dict[int, int]:
    """Each rank's pipeline stage as the diagnosis read it (`run.pipeline`), else none."""
    pipe = d.run.get("pipeline")
    out: dict[int, int] = {}
    if isinstance(pipe, dict):
        for st in pipe.get("per_stage") or []:
            for r in st.get("ranks") or []:
                out[int(r)] = int(st["stage"])
    return out


def straggler_of(d: Diagnosis) -> tuple[int | None, str]:
    """The rank `--remove straggler` acts on, and why that one: the diagnosis's straggler, else
    the straggler test's candidate (the rank most often last), else (no collective to test:
    a pipeline) the rank most of the critical path runs on, else none."""
    if d.straggler is not None:
        return d.straggler.rank, f"the diagnosis's straggler ({d.straggler.confidence})"
    test = d.run.get("straggler_test")
    if isinstance(test, dict) and isinstance(test.get("rank"), int):
        named = test.get("decision") not in (None, "none")
        return test["rank"], (("" if named else "no straggler was named; acting on ") +
                              f"the straggler test's candidate, most often last (decision: "
                              f"{test.get('decision')})")
    cp = d.run.get("critical_path")
    if isinstance(cp, dict) and isinstance(cp.get("rank"), int):
        return cp["rank"], ("no straggler test (no matched collective): the rank most of the "
                            "critical path runs on")
    return None, "no straggler: the straggler test has no candidate"


def project_run(ctx: RunContext, d: Diagnosis, changes: list[Change],
                only: tuple[int, int] | None = None) -> dict[str, Any]:
    """`uberprof whatif`: the run's graph (from its tables and its diagnosis's matched
    collectives, send/recv pairs and clock alignment) replayed with `changes`; `only`: the
    figures of steps A-B alone (`project`)."""
    g = run_graph(ctx, d.steps, d.matched.instances, d.alignment.offsets(), d.p2p,
                  busy_times(ctx))
    rank, basis = straggler_of(d)
    doc = project(g, d.steps, changes, rank, basis, stages=stages_of(d), only=only)
    doc["caveats"] = caveats(ctx, g)
    return doc


def caveats(ctx: RunContext, g: StepGraph | None = None) -> list[str]:
    """What makes the run's projections less sure than their intervals say (`caveats` of a
    projection and of `run.replay`): CPU ranks that fill their cores, and hosts that other work
    kept busy."""
    sharing = g.sharing if g is not None else None
    return [c for c in (core_contention(ctx.ranks.values(), sharing is not None),
                        outnumbered_cores(ctx.ranks.values()), other_load(sharing)) if c]


def outnumbered_cores(ranks: Iterable[RankInfo]) -> str | None:
    """The uncertainty a projection cannot remove where a host's CPU ranks outnumber its cores
    (rank.json's `cpu`): there the ranks take turns on the cores, and work removed from one
    rank (a straggler's, a data wait's) also frees cores for the others, by an amount the
    replay's processor sharing, fitted to one recording, gets only in part, either way (issue
    54: 4 ranks on 2 cores, `--remove straggler` projected 49.1 ms a step against 39.3 ms
    measured without the straggler, +25%; `--remove data` within 5%). None where every host has
    a core per CPU rank or the cores are unknown."""
    by_host: dict[str, list[int]] = {}
    for info in ranks:
        if info.mode == "cpu" and info.cpu_cores:
            by_host.setdefault(info.host or "?", []).append(int(info.cpu_cores))
    over = [(h, len(c), max(c)) for h, c in sorted(by_host.items()) if len(c) > max(c)]
    if not over:
        return None
    host, n, cores = max(over, key=lambda o: o[1] / o[2])
    more = f" and {len(over) - 1} other host(s)" if len(over) > 1 else ""
    return (f"ranks outnumber cores ({n} CPU ranks on {cores} core(s) of {host}{more}): they "
            "take turns on the cores, and work removed from one rank also frees cores for the "
            "others by an amount the projection cannot pin down from one recording; it may be "
            "off either way by a quarter of the step (4 ranks on 2 cores, --remove straggler "
            "against a run without the straggler: +25%, and -16% beside other jobs; "
            "docs/whatif.md); measure the change, or project on a host with a core per rank")


def other_load(sharing: CoreSharing | None) -> str | None:
    """Why a projection is unsure where other work kept a host busy through the recording
    (`CoreSharing.busy_hosts`: its fitted background at least `BUSY_PER_CORE` of its cores);
    None where no host was."""
    busy = sharing.busy_hosts() if sharing is not None else []
    if not busy:
        return None
    host, cores, background = max(busy, key=lambda b: b[2] / max(b[1], 1))
    more = f" (and {len(busy) - 1} other host(s))" if len(busy) > 1 else ""
    return (f"{host}{more} was busy with other work: {background:.1f} other runnable thread(s) "
            f"on average beside the ranks on {cores} core(s), fitted to their run-queue wait. "
            "With the cores full the ranks' work shares them whatever its split, so a change "
            "that moves or removes work frees less than projected (balancing pipeline stages "
            "beside other jobs: 10-19% optimistic, docs/whatif.md); measure on a quiet host")


def core_contention(ranks: Iterable[RankInfo], modelled: bool = False) -> str | None:
    """Why a projection may be optimistic on CPU ranks that fill their host's cores (torch's
    threads of its ranks at least its cores, as rank.json records them): a change that lets
    ranks compute or transfer at the same time, where the recording had one of them idle
    (a straggler or a data wait removed), adds contention for the cores that the replay, which
    keeps the recorded durations, cannot see, or sees only as far as `modelled` (the graph's
    `sharing`: contention.py) goes. None where no host is full or it is unknown."""
    by_host: dict[str, list[tuple[int, int]]] = {}
    for info in ranks:
        if info.mode == "cpu" and info.cpu_cores:
            by_host.setdefault(info.host or "?", []).append((info.torch_threads or 1,
                                                             info.cpu_cores))
    full = []  # (host, ranks, their threads, its cores) where the threads fill the cores
    for host, rs in sorted(by_host.items()):
        threads, cores = sum(t for t, _ in rs), max(c for _, c in rs)
        if threads >= cores:
            full.append((host, len(rs), threads, cores))
    if not full:
        return None
    host, n, threads, cores = full[0]
    more = f" and {len(full) - 1} other host(s)" if len(full) > 1 else ""
    head = (f"CPU ranks fill their cores ({n} rank(s), {threads} torch thread(s) on {cores} "
            f"core(s) of {host}{more}): a change that lets ranks compute or communicate at the "
            "same time adds contention for the cores, ")
    if modelled:
        return head + ("which the projection models as processor sharing fitted to the "
                       "run-queue wait the run recorded, but not the cache or memory bandwidth "
                       "the ranks also share, so it may still be optimistic (docs/whatif.md)")
    return head + ("which the replay does not model (the run recorded no run-queue wait), so "
                   "its projection is optimistic (as measured with 2 ranks on 2 cores: "
                   "docs/whatif.md)")
