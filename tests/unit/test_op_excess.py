"""The straggler finding's operators: what the slow rank spends more self time in per analysed
step than the others' median (diagnosis/op_excess.py), on small synthetic Gloo traces. On a real
job: tests/jobs/test_diagnosis_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import _traces as T
from tests.unit.test_p2p_pipeline import _gloo_trace
from uberprof.analysis.diagnosis.advisor import analysed_steps
from uberprof.analysis.diagnosis.op_excess import operator_excess, same_work
from uberprof.analysis.tables.context import load_context


def test_the_slow_rank_s_extra_operators_are_named_against_the_others_median(
        tmp_path: Path) -> None:
    for r in range(3):  # rank 2 runs aten::mm three more times per step, 100 µs each
        ev = [T.step(1, 1000, 1000), T.op(1010, 300, "aten::linear"),
              T.op(1020, 200, "aten::addmm")]
        ev += [T.op(1400 + 110 * k, 100, "aten::mm") for k in range(3 if r == 2 else 0)]
        T.write(tmp_path / "run" / f"rank{r}.json.gz", _gloo_trace(r, ev, world=3))
    ctx = load_context(tmp_path / "run", out=tmp_path / "derived")
    [top] = operator_excess(ctx, 2, analysed_steps(ctx))
    assert (top.name, top.calls, top.others_calls) == ("aten::mm", 3, 0)
    assert top.excess_ms == pytest.approx(0.3)  # self time: nothing else differs
    assert operator_excess(ctx, 0, analysed_steps(ctx)) == []  # the others run nothing extra


def _shaped(ts: float, dur: float, name: str, dims: list[list[int]] | None) -> dict:
    e = T.op(ts, dur, name)
    if dims is not None:
        e["args"]["Input Dims"] = dims
    return e


def _run(tmp_path: Path, rank2: list[dict], others: list[dict]) -> bool | None:
    for r in range(3):
        ev = [T.step(1, 1000, 1000), *(rank2 if r == 2 else others)]
        T.write(tmp_path / "run" / f"rank{r}.json.gz", _gloo_trace(r, ev, world=3))
    ctx = load_context(tmp_path / "run", out=tmp_path / "derived")
    return same_work(ctx, 2, analysed_steps(ctx))


def test_the_same_operators_on_the_same_shapes_each_slower_are_the_same_work(
        tmp_path: Path) -> None:
    dims = [[8, 64], [64, 64]]
    mine = [_shaped(1010 + 200 * k, 180, "aten::mm", dims) for k in range(3)]
    theirs = [_shaped(1010 + 200 * k, 100, "aten::mm", dims) for k in range(3)]
    assert _run(tmp_path, mine, theirs) is True


def test_extra_calls_or_larger_shapes_are_more_work_and_no_shapes_cannot_tell(
        tmp_path: Path) -> None:
    dims, big = [[8, 64], [64, 64]], [[32, 64], [64, 64]]
    theirs = [_shaped(1010 + 200 * k, 100, "aten::mm", dims) for k in range(3)]
    extra = theirs + [_shaped(1700, 100, "aten::mm", dims)]  # an injected straggler's product
    assert _run(tmp_path / "a", extra, theirs) is False
    larger = [_shaped(1010 + 200 * k, 180, "aten::mm", big) for k in range(3)]  # uneven inputs
    assert _run(tmp_path / "b", larger, theirs) is False
    bare = [_shaped(1010 + 200 * k, 100, "aten::mm", None) for k in range(3)]
    assert _run(tmp_path / "c", bare, bare) is None
