"""Two trace windows of one run, each diagnosed on its own and compared as `uberprof diff`
compares runs (`analysis/diagnosis/window_compare.py`, `RunContext.window`). On the real GPU
straggler run (`samples/gpu/straggler`: rank 1 runs its forward pass twice; steps 10-12
traced), whose steps 10 and 12 stand in for a window before and one after a change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from uberprof.analysis.diagnosis import advisor
from uberprof.analysis.diagnosis.window_compare import compare_windows
from uberprof.analysis.tables.context import RunContext, load_context

RUN = Path(__file__).resolve().parents[2] / "samples" / "gpu" / "straggler"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> RunContext:
    dest = tmp_path_factory.mktemp("windows") / "straggler"
    shutil.copytree(RUN, dest)
    return load_context(dest, workers=1)


def test_a_window_of_a_run_is_diagnosed_on_its_own_steps(ctx: RunContext) -> None:
    whole = advisor.diagnose_context(ctx)
    assert whole.run["analysed_steps"] == [10, 11, 12]
    one = advisor.diagnose_context(ctx.window(12, 12))
    assert one.run["analysed_steps"] == [12]
    assert set(one.matched.instances.column("step").to_pylist()) <= {12}
    assert one.run["analysed_wall_ms"] < whole.run["analysed_wall_ms"]
    # the run's own tables are untouched: the window is a view of them
    assert set(ctx.steps().filter(ctx.steps().column("traced")).column("step").to_pylist()) \
        == {10, 11, 12}


def test_the_lead_change_gets_the_comparison_of_its_two_windows(ctx: RunContext) -> None:
    d = advisor.diagnose_context(ctx)
    windows = {n: {"window": n, "steps": [s, s], "trigger": t, "ranks": [0, 1]}
               for n, s, t in ((1, 10, "schedule"), (2, 12, "slowdown"))}
    lead = {"lead": True, "ranks": [1], "windows_before": [windows[1]],
            "before": {"first_step": 1, "last_step": 11},
            "after": {"first_step": 12, "last_step": 39},
            "windows_after": [windows[2]], "windows_compared": None}
    other = {**lead, "lead": False, "windows_after": []}
    d.run["timeline_changes"] = [other, lead]
    made: list[list[int]] = []
    spans: list[tuple[int, int]] = []
    diagnosed: list[advisor.Diagnosis] = []

    def diagnose(w: RunContext) -> advisor.Diagnosis:
        out = advisor.diagnose_context(w)
        made.append(out.run["analysed_steps"])
        steps = w.steps().column("step").to_pylist()
        spans.append((min(steps), max(steps)))
        diagnosed.append(out)
        return out

    compare_windows(ctx, d, diagnose)
    assert made == [[10], [12]] and other["windows_compared"] is None
    # each window's diagnosis read the steps of its own stretch only
    assert spans == [(1, 11), (12, 39)]
    assert [sorted(set(d.steps.column("step").to_pylist())) for d in diagnosed] == [[10], [12]]
    c = lead["windows_compared"]
    assert (c["before_window"], c["after_window"]) == (1, 2) and c["ranks"] == [0, 1]
    assert c["step_time_ms"]["before"] and c["step_time_ms"]["after"]
    assert all({"change", "kind", "before_ms", "after_ms", "delta_ms"} <= set(f)
               for f in c["findings"])
    assert c["sentence"].startswith("window 2 against window 1: median step")
