"""The straggler finding's operators: what the slow rank spends more self time in per analysed
step than the others' median (diagnosis/op_excess.py), on small synthetic Gloo traces. On a real
job: tests/jobs/test_diagnosis_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import _traces as T
from tests.unit.test_p2p_pipeline import _gloo_trace
from uberprof.analysis.diagnosis.advisor import analysed_steps
from uberprof.analysis.diagnosis.op_excess import operator_excess
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
