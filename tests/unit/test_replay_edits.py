"""A what-if edit replayed on the recorded graph itself (its dropped and moved edges given to
`replay`, its structure reused) against the same edit replayed on a copy of the graph with
those edges (`edited_graph`, its own structure): the same times, own work, tails and
dependencies, on random graphs and on a synthetic 8-GPU run, and the same projection
document from `project` either way. The in-place replay is what keeps a projection from
holding a second graph and structure at 512 ranks (benchmarks/README.md)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_replay_levels import random_graph
from uberprof.analysis.diagnosis import whatif
from uberprof.analysis.diagnosis.busy import busy_times
from uberprof.analysis.diagnosis.whatif import parse_changes, project, run_graph
from uberprof.analysis.diagnosis.whatif_changes import Edit, apply_changes, edited_graph
from uberprof.analysis.tables.graph import StepGraph
from uberprof.analysis.tables.lanes import BARRIER, COMPLETE
from uberprof.analysis.tables.replay import keeps_levels, replay


def _assert_same_edit(g: StepGraph, e: Edit, how: str) -> None:
    """`g` replayed with `e`'s edges against its copy with them; deciding edges compared
    through the copy's edge order (kept edges first, in `g`'s order)."""
    moved = e.src if (e.src != g.src).any() else None
    assert keeps_levels(g, moved)
    a = replay(g, e.own, None, e.tail, how=how, drop=e.drop, src=moved)
    b = replay(edited_graph(g, e), e.own, None, e.tail, how=how)
    for f in ("start", "end", "own", "tail"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.broken == b.broken == 0
    kept = np.flatnonzero(~e.drop)
    for f in ("start_by", "end_by"):
        x, y = getattr(a, f), getattr(b, f)
        y = np.where(y >= 0, kept[np.clip(y, 0, kept.size - 1)], y)
        np.testing.assert_array_equal(x, y, err_msg=f)


def _random_edit(g: StepGraph, rng: np.random.Generator) -> Edit:
    """Random work and tails, a third of the edges dropped, and each collective's `complete`
    edges into a wait moved to its barrier (as hiding communication does)."""
    e = Edit(rng.choice([0.0, 0.5, 1.0, 1.6], g.n), g.tail * rng.choice([0.5, 1.0, 2.0], g.n),
             g, [], rng.random(g.src.size) < 0.3, g.src.copy(), [])
    bar = np.full(g.n, -1, np.int64)
    arrive = np.flatnonzero(g.kind[g.dst] == BARRIER)
    bar[g.src[arrive]] = g.dst[arrive]
    moved = (g.etype == COMPLETE) & (bar[g.src] >= 0) & (g.kind[g.dst] != BARRIER) & \
        (rng.random(g.src.size) < 0.7)
    e.src[moved] = bar[g.src[moved]]
    return e


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("how", ["levels", "loop"])
def test_an_edit_replayed_in_place_equals_its_copy_on_random_graphs(seed: int, how: str) -> None:
    g = random_graph(seed)
    rng = np.random.default_rng(seed)
    if replay(g).broken:
        assert not keeps_levels(g)  # a cycle was broken: a copy replays it
        return
    _assert_same_edit(g, _random_edit(g, rng), how)


def test_a_cycle_or_an_added_edge_goes_to_the_copy() -> None:
    """Where the structure dropped a dependency, or an edit adds edges (hidden communication's
    `need` edges), `project` replays a copy of the graph as before: in place it could differ."""
    broken = [s for s in range(30) if replay(random_graph(s, cycles=True)).broken]
    assert broken and not keeps_levels(random_graph(broken[0], cycles=True))
    g = random_graph(3)
    e = apply_changes(g, parse_changes(["exposed-comm"], None, []), None, copy=False)
    assert e.extra and e.graph is g


@pytest.fixture(scope="module")
def synth_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[StepGraph, object]:
    from tests.unit.test_dashboard import write_synth
    from uberprof.analysis.read import open_run

    tmp = tmp_path_factory.mktemp("edits")
    run = write_synth(tmp / "synth", steps=30, counters=False)
    opened = open_run(run, out=tmp / "derived", workers=1)
    d = opened.diagnosis
    assert opened.ctx is not None and d is not None
    g = run_graph(opened.ctx, d.steps, d.matched.instances, d.alignment.offsets(), d.p2p,
                  busy_times(opened.ctx))
    return g, d


@pytest.mark.parametrize("remove", [["straggler"], ["sync"], ["launch"],
                                    ["straggler", "sync", "launch"]])
def test_an_edit_replayed_in_place_equals_its_copy_on_a_synthetic_run(
        synth_graph: tuple[StepGraph, object], remove: list[str]) -> None:
    from tests.unit.test_dashboard import SYNTH_STRAGGLER

    g, _ = synth_graph
    e = apply_changes(g, parse_changes(remove, 2.0, []), SYNTH_STRAGGLER, copy=False)
    assert e.drop.any() or remove == ["launch"]
    for how in ("levels", "loop"):
        _assert_same_edit(g, e, how)


@pytest.mark.parametrize("remove", [["straggler"], ["sync"], ["straggler", "data", "sync"]])
def test_a_projection_is_the_same_in_place_and_on_a_copy(
        synth_graph: tuple[StepGraph, object], remove: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.test_dashboard import SYNTH_STRAGGLER

    g, d = synth_graph
    changes = parse_changes(remove, 2.0, [])
    base = replay(g)
    used: list[bool] = []
    real = whatif.keeps_levels

    def spy(*a: object) -> bool:
        used.append(real(*a))  # type: ignore[arg-type]
        return used[-1]

    monkeypatch.setattr(whatif, "keeps_levels", spy)
    inplace = project(g, d.steps, changes, SYNTH_STRAGGLER, base=base)  # type: ignore[attr-defined]
    monkeypatch.setattr(whatif, "keeps_levels", lambda *a: False)
    copied = project(g, d.steps, changes, SYNTH_STRAGGLER, base=base)  # type: ignore[attr-defined]
    assert used == [True]
    assert inplace == copied
    assert inplace["gain_ms"] is not None and inplace["gain_ms"] > 0
