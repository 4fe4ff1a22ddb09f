"""The replay a level at a time (numpy) against the replay an event at a time (the reference
loop): the same start, end, deciding edges, own work, tails and dropped dependencies on random
graphs (collectives, send/recv, device lanes, what-if `need` edges, clock errors that close a
cycle) and on graphs built from real traces, as recorded and edited by what-if changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from uberprof.analysis.diagnosis.busy import busy_times
from uberprof.analysis.diagnosis.whatif import parse_changes, run_graph
from uberprof.analysis.diagnosis.whatif_changes import apply_changes
from uberprof.analysis.tables.graph import StepGraph, build_graph
from uberprof.analysis.tables.lanes import BETWEEN, COMPUTE, DATA, HOST, NEED, WAIT, RankLane
from uberprof.analysis.tables.replay import Replay, _structure, replay, step_spans

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
FIELDS = ("start", "end", "start_by", "end_by", "own", "tail")


def _assert_same(a: Replay, b: Replay) -> None:
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.broken == b.broken


def _both(g: StepGraph, rng: np.random.Generator | None = None) -> tuple[Replay, Replay]:
    """Both replays of `g`, with random changes of work and tails where `rng` is given."""
    kw = {}
    if rng is not None:
        kw = {"scale": rng.choice([0.0, 0.5, 1.0, 1.7], g.n),
              "tail_scale": rng.choice([0.25, 1.0, 3.0], g.n),
              "tail_ns": rng.integers(0, 20, g.n) * 1000 if rng.random() < 0.5 else None}
    return replay(g, how="levels", **kw), replay(g, how="loop", **kw)


def _segments(rng: np.random.Generator, t0: int, steps: int) -> RankLane:
    """A lane of `steps` steps of random segments (µs apart), a gap between two steps."""
    start, end, kind, step, t = [], [], [], [], t0
    for s in range(steps):
        if s:
            start.append(t), end.append(t + 3000), kind.append(HOST), step.append(BETWEEN)
            t += 3000
        for _ in range(int(rng.integers(3, 12))):
            d = int(rng.integers(0, 40)) * 1000  # zero-length segments too
            start.append(t), end.append(t + d), step.append(s)
            kind.append(int(rng.choice([COMPUTE, COMPUTE, WAIT, HOST, DATA])))
            t += d
    return RankLane(0, np.array(start, np.int64), np.array(end, np.int64),
                    np.array(kind, np.int8), np.array(step, np.int64))


def random_graph(seed: int, cycles: bool = False) -> StepGraph:
    """Ranks with random lanes (some with a device lane joined by `reach` edges), random
    collectives and send/recv inside them, clocks a little off, and (`cycles`) `need` edges in
    any direction, which close cycles the replay must break."""
    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(2, 6))
    steps = int(rng.integers(1, 4))
    lanes: dict[int, RankLane] = {}
    for r in range(ranks):
        lane = _segments(rng, int(rng.integers(0, 5)) * 1000, steps)
        lane.rank = r
        if rng.random() < 0.4:
            dev = _segments(rng, int(lane.start[0]) + 2000, steps)
            dev.rank = r
            links = []  # (src lane, src segment, dst lane, dst segment, offset)
            for a in rng.integers(0, 2, int(rng.integers(1, 6))).tolist():
                links.append((a, int(rng.integers(0, (lane, dev)[a].start.size)), 1 - a,
                              int(rng.integers(0, (lane, dev)[1 - a].start.size)),
                              int(rng.integers(0, 5)) * 1000))
            lane.device, lane.links = dev, np.array(links, np.int64).reshape(-1, 5)
        lanes[r] = lane
    span = [(int(x.start[0]), int(x.end[-1])) for x in lanes.values()]
    lo, hi = max(a for a, _ in span), min(b for _, b in span)
    rows = []
    for i in range(int(rng.integers(1, 8))):
        who = rng.choice(ranks, int(rng.integers(2, ranks + 1)), replace=False)
        for r in who.tolist():
            s = int(rng.integers(lo, max(hi - 1000, lo + 1)))
            rows.append({"instance": i, "rank": r, "start_ns": s,
                         "end_ns": s + int(rng.integers(0, 30)) * 1000})
    instances = pa.Table.from_pylist(rows)
    pairs = []
    for p in range(int(rng.integers(0, 3))):
        a, b = rng.choice(ranks, 2, replace=False).tolist()
        s1, s2 = (int(x) for x in rng.integers(lo, max(hi - 1000, lo + 1), 2))
        pairs.append({"pair": p, "src": a, "dst": b, "step": 0, "bytes": 4,
                      "send_start_ns": s1, "send_end_ns": s1 + 2000,
                      "recv_start_ns": s2, "recv_end_ns": max(s2, s1) + 4000})
    offsets = {r: int(rng.integers(-2, 3)) * 1000 for r in range(ranks)}
    g = build_graph(lanes, offsets, instances, pa.Table.from_pylist(pairs) if pairs else None)
    if cycles:
        k = int(rng.integers(2, 12))
        src, dst = rng.integers(0, g.n, k), rng.integers(0, g.n, k)
        g = dataclasses.replace(g, src=np.r_[g.src, src], dst=np.r_[g.dst, dst],
                                etype=np.r_[g.etype, np.full(k, NEED, np.int8)],
                                offset=np.r_[g.offset, np.zeros(k, np.int64)], cache={})
    return g


@pytest.mark.parametrize("seed", range(30))
def test_the_level_replay_equals_the_loop_on_random_graphs(seed: int) -> None:
    g = random_graph(seed)
    _assert_same(*_both(g))
    _assert_same(*_both(g, np.random.default_rng(seed)))


@pytest.mark.parametrize("seed", range(30))
def test_the_level_replay_equals_the_loop_where_cycles_are_broken(seed: int) -> None:
    g = random_graph(seed, cycles=True)
    a, b = _both(g, np.random.default_rng(seed))
    _assert_same(a, b)


def test_random_graphs_exercise_broken_cycles_and_levels_of_several_edges() -> None:
    """The random graphs above reach what the level replay does differently: events with
    several incoming edges in one level (a reduction) and dependencies dropped to break a
    cycle (else the equality tests would not test them)."""
    broken = [replay(random_graph(s, cycles=True)).broken for s in range(30)]
    assert sum(b > 0 for b in broken) >= 5
    multi = [not _structure(random_graph(s)).single.all() for s in range(30)]
    assert all(multi)


@pytest.mark.parametrize("seed", range(10))
def test_levels_order_every_kept_dependency(seed: int) -> None:
    """Every kept edge goes from an earlier level to a later one, and a node's start comes a
    level before its end: what lets a level's events be replayed at once."""
    g = random_graph(seed, cycles=seed % 2 == 1)
    st = _structure(g)
    level = np.empty(2 * g.n, np.int64)
    level[st.ev] = np.repeat(np.arange(st.levels), np.diff(st.lptr))
    to = np.repeat(np.arange(2 * g.n), np.diff(st.ptr))
    assert (level[st.from_ev[st.order_e]] < level[to]).all()
    assert (level[0::2] < level[1::2]).all()


def test_a_what_if_edit_keeps_the_node_cache_and_computes_the_structure_again() -> None:
    g = random_graph(3)
    step_spans(g, replay(g))
    e = apply_changes(g, parse_changes(["exposed-comm"], None, []), None)
    assert e.graph is not g and "windows" in e.graph.cache
    assert "structure" not in e.graph.cache
    _assert_same(*_both(e.graph))


CHANGES = [[], ["exposed-comm"], ["launch"], ["sync"], ["launch", "sync", "exposed-comm"]]


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is not there")
@pytest.mark.parametrize("folder", ["hta/trace_filter", "hta/nccl_parser_config"])
def test_the_level_replay_equals_the_loop_on_real_traces(folder: str, tmp_path: Path) -> None:
    """GPU traces (two lanes a rank, collectives): the recorded graph and the graphs the
    what-if changes edit (edges dropped, moved, added), with their changed work."""
    from uberprof.analysis.read import open_run

    opened = open_run(TRACES / folder, out=tmp_path, workers=1)
    d = opened.diagnosis
    assert opened.ctx is not None and d is not None
    g = run_graph(opened.ctx, d.steps, d.matched.instances, d.alignment.offsets(), d.p2p,
                  busy_times(opened.ctx))
    assert g.n > 100
    for remove in CHANGES:
        e = apply_changes(g, parse_changes(remove, None, []), None)
        a = replay(e.graph, e.own, None, e.tail, how="levels")
        b = replay(e.graph, e.own, None, e.tail, how="loop")
        _assert_same(a, b)


def test_the_level_replay_equals_the_loop_on_a_synthetic_run(tmp_path: Path) -> None:
    """A synthetic 8-GPU run (benchmarks/synth_run.py, as the dashboard's tests write it),
    as recorded and with the straggler removed and the link twice as fast."""
    from tests.unit.test_dashboard import SYNTH_STRAGGLER, write_synth
    from uberprof.analysis.read import open_run

    run = write_synth(tmp_path / "synth", steps=30, counters=False)
    opened = open_run(run, out=tmp_path / "derived", workers=1)
    d = opened.diagnosis
    assert opened.ctx is not None and d is not None
    g = run_graph(opened.ctx, d.steps, d.matched.instances, d.alignment.offsets(), d.p2p,
                  busy_times(opened.ctx))
    assert len(g.lanes) == 8
    for changes in ([], parse_changes(["straggler", "exposed-comm"], 2.0, [])):
        e = apply_changes(g, changes, SYNTH_STRAGGLER)
        a = replay(e.graph, e.own, None, e.tail, how="levels")
        b = replay(e.graph, e.own, None, e.tail, how="loop")
        _assert_same(a, b)


@pytest.mark.parametrize("seed", range(12))
def test_event_and_frontier_kahn_give_the_same_levels_and_dropped_dependencies(seed: int) -> None:
    """Narrow graphs are levelled an event at a time in Python, wide ones a frontier at a time
    in numpy (replay.MAX_LANES_EVENT_KAHN): both give every event the same level, the same
    number of levels and drop the same dependencies, cycles included."""
    from uberprof.analysis.tables.replay import _event_edges, _levels_by_event, _levels_by_frontier

    g = random_graph(seed, cycles=seed % 2 == 1)
    n2 = 2 * g.n
    from_ev, to_ev = _event_edges(g)
    own = np.arange(0, n2, 2, dtype=np.int64)
    a_from, a_to = np.r_[from_ev, own], np.r_[to_ev, own + 1]
    out = np.argsort(a_from, kind="stable")
    optr = np.searchsorted(a_from[out], np.arange(n2 + 1))
    indeg = np.bincount(a_to, minlength=n2).astype(np.int64)
    lv_e, n_e, broken_e = _levels_by_event(g, a_to[out], optr, indeg.copy())
    lv_f, n_f, broken_f = _levels_by_frontier(g, a_to[out], optr, indeg.copy())
    np.testing.assert_array_equal(lv_e, lv_f)
    assert (n_e, broken_e) == (n_f, broken_f)
    assert (lv_e >= 0).all()
