"""The what-if validation benchmark's arithmetic and printing (benchmarks/whatif.py) on made-up
pair results: the signed error, which option a checkout offers, the median and maximum against
the targets, and the lines it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._jobs import ROOT, load_script

W = load_script(ROOT / "benchmarks" / "whatif.py", "_whatif_bench")


def _result(pair: str, projected: float | None, measured: float | None,
            replay: tuple[float, float] = (0.0, 0.0), skipped: str | None = None) -> object:
    r = W.PairResult(pair, 0, ["--remove", pair], skipped=skipped)
    if skipped is None:
        r.projected_ms, r.projected_interval_ms, r.baseline_ms = projected, [90.0, 110.0], 150.0
        r.problem = W.RunFigures(150.0, [140.0, 160.0], replay[0], 8)
        r.measured = W.RunFigures(measured, [95.0, 105.0], replay[1], 8)
    return r


def test_projection_error_is_signed_percent_of_measured() -> None:
    assert W.projection_error_pct(110.0, 100.0) == pytest.approx(10.0)
    assert W.projection_error_pct(90.0, 100.0) == pytest.approx(-10.0)
    assert W.projection_error_pct(None, 100.0) is None
    assert W.projection_error_pct(100.0, 0.0) is None


def test_pick_option_takes_the_first_option_the_help_lists() -> None:
    opts = (("--link-gbps", "4"), ("--link-scale", "4"))
    assert W.pick_option(opts, "  --link-gbps X  ...\n  --link-scale F") == ["--link-gbps", "4"]
    assert W.pick_option(opts, "  --link-scale F  transfer time / F") == ["--link-scale", "4"]
    assert W.pick_option((("--balance-stages",),), "  --link-scale F") is None


def test_summary_takes_median_and_max_of_absolute_errors_against_targets() -> None:
    rs = [_result("straggler", 104.0, 100.0), _result("data", 88.0, 100.0),
          _result("link", 101.0, 100.0, replay=(1.0, 6.0)),
          _result("pipeline", None, None, skipped="option not available")]
    s = W.summarise(rs)
    assert s["projection"]["median_pct"] == pytest.approx(4.0)
    assert s["projection"]["max_pct"] == pytest.approx(12.0)
    assert s["projection"]["pairs"] == 3
    assert not s["projection"]["met"] and s["missed_pairs"] == ["data"]
    assert s["replay"]["max_pct"] == pytest.approx(6.0) and not s["replay"]["met"]
    assert s["skipped"] == ["pipeline: option not available"]


def test_fixed_runs_of_one_configuration_are_pooled_with_their_spread() -> None:
    rs = [_result("straggler", 104.0, 100.0), _result("data", 88.0, 120.0),
          _result("pipeline", 50.0, 60.0)]  # straggler and data share their fixed runs
    (g,) = W.fixed_reference(rs)["groups"]  # the pipeline's single run is left out
    assert g["pairs"] == ["data", "straggler"] and g["runs"] == 2
    assert g["median_ms"] == pytest.approx(110.0) and g["spread_pct"] == pytest.approx(20 / 1.1)
    assert g["errors_pct"]["straggler#0"] == pytest.approx(-600 / 110)
    assert g["errors_pct"]["data#0"] == pytest.approx(-2200 / 110)
    line = W.summary_lines({**W.summarise(rs), "fixed_reference": W.fixed_reference(rs)})[-1]
    assert "2 runs, median 110.0 ms, run-to-run spread 18.2%" in line
    line = W.summary_lines({**W.summarise(rs), "fixed_reference": W.fixed_reference(rs),
                            "mode": "in-job"})[-1]
    assert "fixed steps of data/straggler over 2 jobs, median 110.0 ms, job-to-job spread" \
        in line


def test_a_pair_repeated_is_pooled_as_median_projection_against_median_fixed_run() -> None:
    rs = [_result("straggler", p, m) for p, m in ((104.0, 100.0), (90.0, 120.0), (99.0, 80.0))]
    rs += [_result("data", 88.0, 120.0)]  # once: not pooled
    rs += [_result("pipeline", None, None, skipped="option not available")] * 2
    pooled = W.pooled_pairs(rs)
    assert list(pooled) == ["straggler"]
    g = pooled["straggler"]
    assert g["repeats"] == 3 and g["projected_median_ms"] == pytest.approx(99.0)
    assert g["measured_median_ms"] == pytest.approx(100.0)
    assert g["error_pct"] == pytest.approx(-1.0)
    lines = W.summary_lines({**W.summarise(rs), "pooled": pooled})
    assert "straggler over 3 repeats: median projection 99.0 ms against the fixed runs' " \
        "median 100.0 ms: -1.0%" in lines


def test_summary_meets_targets_only_with_figures_within_them() -> None:
    ok = W.summarise([_result("straggler", 105.0, 100.0, replay=(0.5, 4.9))])
    assert ok["projection"]["met"] and ok["replay"]["met"]
    none = W.summarise([_result("pipeline", None, None, skipped="option not available")])
    assert not none["projection"]["met"] and not none["replay"]["met"]


def test_lines_show_each_pair_figures_or_why_it_was_skipped() -> None:
    rs = [_result("straggler", 104.0, 100.0, replay=(0.3, 1.2)),
          _result("pipeline", None, None, skipped="option not available")]
    lines = W.result_lines(rs)
    row = next(x for x in lines if x.startswith("straggler"))
    for text in ("104.0", "100.0", "+4.0", "90.0-110.0", "95.0-105.0", "0.3 / 1.2"):
        assert text in row
    assert any(x.startswith("pipeline") and "skipped: option not available" in x
               for x in lines)
    summary = "\n".join(W.summary_lines(W.summarise(rs)))
    assert "median 4.0%, max 4.0%" in summary and "skipped pipeline" in summary


def test_contention_is_the_median_step_of_the_ranks_mean_core_wait_and_cpu(tmp_path: Path) -> None:
    rows = {0: [(1, 10e6, 20e6), (2, 30e6, 20e6), (3, 50e6, 40e6), (9, 999e6, 999e6)],
            1: [(1, 30e6, 40e6), (2, 50e6, 40e6), (3, 70e6, 60e6)]}
    for rank, steps in rows.items():
        d = tmp_path / "ranks" / str(rank)
        d.mkdir(parents=True)
        lines = [json.dumps({"kind": "step", "step": s, "run_wait_ns": w, "cpu_ns": c})
                 for s, w, c in steps]
        (d / "steps.jsonl").write_text("\n".join([*lines, "{torn"]) + "\n")
    # per step, the ranks' means: wait 20/40/60 ms, cpu 30/30/50 ms; step 9 is not traced
    assert W.contention(tmp_path, [1, 2, 3]) == (40.0, 30.0)
    assert W.contention(tmp_path, [7]) == (None, None)
    row = W.result_lines([_with_contention()])[1]
    assert "40/30; 12/8" in row


def _with_contention() -> object:
    r = _result("straggler", 104.0, 100.0)
    r.problem.core_wait_ms, r.problem.cpu_ms = 40.0, 30.0
    r.measured.core_wait_ms, r.measured.cpu_ms = 12.0, 8.0
    return r


def test_an_in_job_pair_faults_every_other_step_and_traces_both_kinds() -> None:
    fault, trace, bad, good = W.in_job_plan(9, 3, 1)
    # 18 steps; the odd ones faulty; traced 3..15, two steps left after the window as a pair's
    # run leaves them
    assert fault == "1,3,5,7,9,11,13,15,17" and trace == "3-15"
    assert bad == [3, 5, 7, 9, 11, 13, 15] and good == [4, 6, 8, 10, 12, 14]
    fault, _, bad, good = W.in_job_plan(9, 3, 2)
    assert fault.startswith("0,2,4") and bad[0] == 4 and good[0] == 3


def test_step_figures_take_the_median_of_the_chosen_steps_only() -> None:
    doc = {"steps": [{"step": s, "measured_ms": float(m), "projected_ms": float(p)}
                     for s, m, p in [(3, 100, 60), (4, 50, 50), (5, 110, 70), (6, 60, 60),
                                     (7, 120, 80)]]}
    med, iv = W.step_figures(doc, [3, 5, 7], "projected_ms")
    assert med == 70.0 and iv == [60.0, 80.0]  # fewer than six steps: their range
    assert W.step_figures(doc, [4, 6])[0] == 55.0
    assert W.step_figures(doc, [99]) is None
    f = W.figures({**doc, "baseline_step_ms": 100.0, "replay_error_pct": 0.5}, None, [4, 6])
    assert (f.step_ms, f.steps, f.replay_error_pct) == (55.0, 2, 0.5)


def test_in_job_steps_are_measured_as_the_period_of_their_last_rank_end(tmp_path: Path) -> None:
    # rank 0 ends each step last; rank 1's ends swing (a pipeline's split alternating): its
    # windows are 80/120 ms, the periods of the last end 100 ms each
    ends = {0: [0, 100, 200, 300], 1: [-10, 70, 190, 270]}
    for rank, es in ends.items():
        d = tmp_path / "ranks" / str(rank)
        d.mkdir(parents=True)
        (d / "steps.jsonl").write_text("".join(
            json.dumps({"kind": "step", "step": s, "host_end_ns": int(e * 1e6)}) + "\n"
            for s, e in enumerate(es)) + "{torn\n")
    doc = {"steps": [{"step": s, "measured_ms": 120.0, "projected_ms": 90.0, "gain_ms": g}
                     for s, g in [(0, 5.0), (2, 30.0), (3, -4.0)]], "baseline_step_ms": 120.0}
    rows = W.as_periods(doc, tmp_path)["steps"]
    assert [(r["step"], r["measured_ms"], r["projected_ms"]) for r in rows] == \
        [(2, 100.0, 70.0), (3, 100.0, 104.0)]  # step 0 has no step before it: dropped


def test_an_in_job_error_sets_each_problem_step_against_the_fixed_steps_around_it() -> None:
    # the job's level doubles halfway: by the medians the projection looks 25% off, step by
    # step it is 10% short throughout
    measured = {3: 100, 5: 100, 7: 100, 9: 200, 11: 200, 13: 200}
    doc = {"steps": [{"step": s, "measured_ms": float(m), "projected_ms": 0.0}
                     for s, m in measured.items()]
           + [{"step": s, "measured_ms": 999.0, "projected_ms": 0.9 * (measured[s - 1]
                                                                         + measured[s + 1]) / 2}
              for s in (4, 6, 8, 10, 12)]}
    assert W.neighbour_error_pct(doc, [4, 6, 8, 10, 12]) == pytest.approx(-10.0)
    assert W.neighbour_error_pct(doc, [2, 14]) is None  # no fixed step on both sides
    r = _result("link", 120.0, 150.0)
    r.step_error_pct = -10.0
    assert r.error_pct == -10.0 and W.pooled_pairs([r, r])["link"]["error_pct"] == -10.0
