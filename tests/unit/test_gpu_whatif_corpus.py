"""What-if on the real GPU traces of the corpus (issue 48; tests/unit/test_gpu_corpus.py lists
them): the step graph of each, replayed as recorded and changed, must keep the bounds
docs/whatif.md states for GPU ranks:

- the baseline replay reproduces each trace's steps within FIT_PCT, or says it is unfit and why;
- removing launch overhead or exposed communication never makes any rank end a step later;
- taking time off a node on a step's critical path makes that step end earlier;
- `--op` finds a host operator of a GPU trace through the kernels it launched.

The graphs are built from each trace's analysis (under tmp: nothing is written beside the
traces), once per module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.unit.test_gpu_corpus import CORPUS
from uberprof.analysis.diagnosis.busy import busy_times
from uberprof.analysis.diagnosis.whatif import (
    FIT_PCT,
    project,
    replay_doc,
    run_graph,
)
from uberprof.analysis.diagnosis.whatif_changes import Change, apply_changes
from uberprof.analysis.read import open_run
from uberprof.analysis.tables.graph import StepGraph
from uberprof.analysis.tables.lanes import COMPUTE
from uberprof.analysis.tables.replay import Replay, critical_path, replay, step_spans

TOLERANCE_NS = 1_000  # rounding of scaled offsets: a step may end this much later and be equal
STEPS_CHECKED = 3  # steps of each trace whose critical path is shortened


@dataclass
class Case:
    """One GPU trace's graph, its replay as recorded, its steps and its fitness."""

    graph: StepGraph
    base: Replay
    traced: pa.Table
    fit: dict


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """The graph of every corpus trace with a GPU rank."""
    out = tmp_path_factory.mktemp("gpu_whatif")
    got: dict[str, Case] = {}
    for name, path in CORPUS.items():
        if not Path(path).exists():
            continue
        opened = open_run(path, out=out / name.replace("/", "_"), workers=1)
        d, ctx = opened.diagnosis, opened.ctx
        if d is None or ctx is None or not d.ranks:
            continue
        g = run_graph(ctx, d.steps, d.matched.instances, d.alignment.offsets(), d.p2p,
                      busy_times(ctx))
        if not g.device_lanes:
            continue
        base = replay(g)
        got[name] = Case(g, base, d.steps, replay_doc(g, d.steps, base))
    return got


def test_the_corpus_gives_graphs_of_gpu_ranks(cases: dict[str, Case]) -> None:
    """Most of the corpus's GPU traces have device lanes in their graph."""
    if len(CORPUS) < 30:
        pytest.skip("../shared/traces is not there")
    assert len(cases) >= 25, sorted(cases)


def test_the_baseline_replay_reproduces_each_trace_or_says_why_not(
        cases: dict[str, Case]) -> None:
    """Within FIT_PCT (median over the steps) or unfit, with a reason that names one."""
    bad = []
    for name, c in cases.items():
        f = c.fit
        if f["fit_for_projection"]:
            if not f["median_error_pct"] <= FIT_PCT:
                bad.append(f"{name}: fit at {f['median_error_pct']}%")
        elif not f["why"] or "differ" not in f["why"] and "no traced step" not in f["why"]:
            bad.append(f"{name}: unfit without a reason: {f['why']!r}")
    assert bad == []
    assert sum(c.fit["fit_for_projection"] for c in cases.values()) >= 0.8 * len(cases)


def _ends(g: StepGraph, r: Replay) -> dict[tuple[int, int], int]:
    return {(s, k): v[1] for s, per in step_spans(g, r).items() for k, v in per.items()}


@pytest.mark.parametrize("kind", ["launch", "exposed-comm"])
def test_removing_launch_or_exposed_comm_never_makes_a_rank_end_a_step_later(
        cases: dict[str, Case], kind: str) -> None:
    bad = []
    for name, c in cases.items():
        if not c.fit["fit_for_projection"]:
            continue
        e = apply_changes(c.graph, [Change(kind)], None)
        new = replay(e.graph, e.own, None, e.tail)
        before, after = _ends(c.graph, c.base), _ends(e.graph, new)
        late = [(k, (after[k] - v) / 1e6) for k, v in before.items()
                if k in after and after[k] > v + TOLERANCE_NS]
        if late:
            bad.append(f"{name}: (step, rank) ending later, ms: {late[:3]}")
    assert bad == []


def test_time_taken_off_a_steps_critical_path_shortens_that_step(
        cases: dict[str, Case]) -> None:
    """The largest compute piece of each step's critical path (from its end back to its start)
    made twice as fast: the step (its last rank's end) ends earlier."""
    bad, checked = [], 0
    for name, c in cases.items():
        if not c.fit["fit_for_projection"]:
            continue
        g, base = c.graph, c.base
        for s, per in sorted(step_spans(g, base).items())[:STEPS_CHECKED]:
            rank, (a, b, _, last) = max(per.items(), key=lambda kv: kv[1][1])
            p = critical_path(g, base, last, a)
            on = (p.kind == 0) & (g.kind[p.node] == COMPUTE) & (base.own[p.node] > 0)
            if not on.any():
                continue
            u = int(p.node[on][np.argmax(p.ns[on])])
            own = np.ones(g.n)
            own[u] = 0.5
            end = max(v[1] for v in step_spans(g, replay(g, own)).get(s, {}).values())
            checked += 1
            if not end < b:
                bad.append(f"{name} step {s}: node {u} ({base.own[u] / 1e6:.3f} ms on rank "
                           f"{rank}'s path) halved, the step ends {(end - b) / 1e6:+.3f} ms")
    assert bad == []
    assert checked >= 20


def test_op_finds_a_host_operators_kernels_on_a_gpu_trace(cases: dict[str, Case]) -> None:
    """`--op aten::mm=2` on HTA's trace_filter (its report lists aten::mm): the kernels the
    operator launched are found and made faster, and the step is not longer."""
    c = cases.get("hta/trace_filter")
    if c is None:
        pytest.skip("../shared/traces is not there")
    doc = project(c.graph, c.traced, [Change("op", 2.0, "aten::mm")], None, base=c.base)
    ch = doc["changes"][0]
    assert ch["matched"] == ["aten::mm"] and ch["kernel_ms"] > 10.0, ch
    assert 0.0 <= doc["gain_ms"] <= ch["kernel_ms"] / 2


def test_removing_launch_shortens_a_launch_bound_single_gpu_trace(
        cases: dict[str, Case]) -> None:
    """HTA's nccl_parser_config (one A100 rank, its device idle a third of the step waiting for
    launches): without launch overhead the step is shorter, by less than the device's idle."""
    c = cases.get("hta/nccl_parser_config")
    if c is None:
        pytest.skip("../shared/traces is not there")
    doc = project(c.graph, c.traced, [Change("launch")], None, base=c.base)
    ch = doc["changes"][0]
    steps = len(doc["steps"])
    assert doc["gain_ms"] > 0.05 * doc["baseline_step_ms"], doc
    assert doc["gain_ms"] <= ch["device_idle_ms"] / steps + ch["launch_overhead_ms"] / steps
