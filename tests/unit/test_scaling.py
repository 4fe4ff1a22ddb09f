"""`uberprof scaling` without jobs, on real runs: the GPU samples (samples/gpu, recorded on an H100:
`nccl1` one NCCL rank, `gloo2` two Gloo ranks, `straggler` gloo2 with rank 1 computing twice)
are one job at world sizes 1 and 2 (their scripts differ in `--backend`, so they need
--force), and their saved diagnoses are what the table must be read from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests._gpu_samples import sample_fixtures
from uberprof.analysis.diff.scaling import ScalingError, scaling, scaling_point_of
from uberprof.cli import main

RUNS = ("nccl1", "gloo2", "straggler")

runs, reports = sample_fixtures(RUNS, "scaling-samples")


def _argv(run: Path) -> list[str]:
    """Rank 0's command line as rank.json recorded it."""
    return json.loads((run / "ranks" / "0" / "rank.json").read_text())["argv"]


def _scaling(*args: str) -> Any:
    return CliRunner().invoke(main, ["scaling", *args])


def _step_ms(report: dict[str, Any]) -> float:
    r = report["run"]
    return r["host_wall_ms"] / len(r["analysed_steps"])


def test_runs_with_other_script_arguments_are_refused_naming_what_differs(
        runs: dict[str, Path], reports: dict[str, dict[str, Any]]) -> None:
    res = _scaling(str(runs["nccl1"]), str(runs["gloo2"]))
    assert res.exit_code == 1
    assert "not of one job" in res.output and "--backend" in res.output
    assert "--force" in res.output


def test_the_table_is_read_from_each_runs_saved_diagnosis(
        runs: dict[str, Path], reports: dict[str, dict[str, Any]]) -> None:
    res = _scaling(str(runs["gloo2"]), str(runs["nccl1"]), "--force", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    one, two = doc["runs"]  # smallest first, whatever the order given
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["ranks"] == 1 and two["ranks"] == 2 and one["nodes"] == two["nodes"] == 1
    assert doc["baseline"] == str(runs["nccl1"])
    assert any("--backend" in d for d in doc["differences"])
    # batch 16 from the script's own --batch: samples/s
    assert doc["throughput_unit"] == "samples/s" and one["batch_per_rank"] == 16
    for r, name in ((one, "nccl1"), (two, "gloo2")):
        assert r["step_ms"] == pytest.approx(_step_ms(reports[name]), abs=1e-3)
        assert r["throughput_per_rank"] == pytest.approx(16 * 1000 / r["step_ms"], rel=1e-3)
        assert r["throughput_total"] == pytest.approx(r["throughput_per_rank"]
                                                      * r["world_size"], rel=1e-3)
        assert sum(r["parts_ms"].values()) == pytest.approx(r["step_ms"], abs=0.01)
    assert two["efficiency"] == pytest.approx(one["step_ms"] / two["step_ms"], rel=1e-3)
    assert two["lost_ms_per_step"] == pytest.approx(two["step_ms"] - one["step_ms"], abs=1e-2)
    assert sum(two["delta_parts_ms"].values()) == pytest.approx(two["delta_step_ms"], abs=0.01)


def test_exposed_communication_is_the_critical_paths_transfers_by_group(
        reports: dict[str, dict[str, Any]], runs: dict[str, Path]) -> None:
    doc = reports["gloo2"]
    p = scaling_point_of(doc, _argv(runs["gloo2"]))
    n = len(doc["run"]["analysed_steps"])
    cp = doc["run"]["critical_path"]["by_kind_ms"]
    comm = {k: v for k, v in p.parts_ms.items() if k.startswith("comm:")}
    assert sum(comm.values()) == pytest.approx(cp.get("transfer", 0.0) / n, abs=1e-6)
    groups = {str(g["dim"] or g["group"]) for g in doc["run"]["comm_by_group"]
              if g["exposed_ms"] > 0}
    assert {k.removeprefix("comm:") for k in comm} == (groups or {"?"})
    assert p.parts_ms.get("waiting", 0.0) == pytest.approx(cp.get("waiting", 0.0) / n)


def test_a_named_stragglers_time_at_stake_is_its_own_part(
        reports: dict[str, dict[str, Any]], runs: dict[str, Path]) -> None:
    doc = reports["straggler"]
    stake = sum(f["time_at_stake_ms"] for f in doc["findings"] if f["kind"] == "straggler")
    assert stake > 0, "the straggler sample names its straggler"
    p = scaling_point_of(doc, _argv(runs["straggler"]))
    n = len(doc["run"]["analysed_steps"])
    cp = doc["run"]["critical_path"]["by_kind_ms"]
    assert p.parts_ms["stragglers"] == pytest.approx(min(stake / n, cp["compute"] / n))
    assert p.parts_ms["stragglers"] + p.parts_ms["compute"] == pytest.approx(cp["compute"] / n)
    assert sum(p.parts_ms.values()) == pytest.approx(p.step_ms)


def test_same_script_with_a_fault_knob_is_another_job(
        reports: dict[str, dict[str, Any]], runs: dict[str, Path]) -> None:
    a = scaling_point_of(reports["gloo2"], _argv(runs["gloo2"]))
    b = scaling_point_of(reports["straggler"], _argv(runs["straggler"]))
    with pytest.raises(ScalingError, match="--slow-compute"):
        scaling([a, b])
    assert scaling([a, b], force=True).differences


def test_another_script_is_another_job(reports: dict[str, dict[str, Any]],
                                       runs: dict[str, Path]) -> None:
    argv = _argv(runs["gloo2"])
    a = scaling_point_of(reports["gloo2"], argv)
    other = [x.replace("train_ddp.py", "train_fsdp.py") for x in argv]
    b = scaling_point_of(reports["gloo2"], other)
    with pytest.raises(ScalingError, match="train_fsdp.py"):
        scaling([a, b])


def test_batch_option_sets_samples_per_rank_once_or_per_run(
        reports: dict[str, dict[str, Any]], runs: dict[str, Path]) -> None:
    pts = [scaling_point_of(reports[n], _argv(runs[n])) for n in ("nccl1", "gloo2")]
    s = scaling(pts, force=True, batches=[8, 32])
    one, two = s.to_json()["runs"]
    assert (one["batch_per_rank"], two["batch_per_rank"]) == (8, 32)
    # four times the batch per rank: the ideal step is four times the baseline's
    assert two["ideal_step_ms"] == pytest.approx(4 * one["step_ms"], rel=1e-3)
    assert two["efficiency"] == pytest.approx(4 * one["step_ms"] / two["step_ms"], rel=1e-3)
    with pytest.raises(ScalingError, match="--batch"):
        scaling(pts, force=True, batches=[1, 2, 3])


def test_without_a_batch_throughput_is_in_steps_per_second(
        reports: dict[str, dict[str, Any]]) -> None:
    pts = [scaling_point_of(reports[n], None) for n in ("nccl1", "gloo2")]
    doc = scaling(pts).to_json()  # no command line: not judged as another job
    assert doc["throughput_unit"] == "steps/s" and "unknown" in doc["basis"]["throughput"]
    assert doc["runs"][1]["throughput_per_rank"] == pytest.approx(
        1000 / doc["runs"][1]["step_ms"], rel=1e-3)


def test_fewer_than_two_runs_is_an_error(runs: dict[str, Path]) -> None:
    res = _scaling(str(runs["gloo2"]))
    assert res.exit_code == 1 and "at least 2 runs" in res.output


def test_a_run_that_cannot_be_analysed_is_named(tmp_path: Path, runs: dict[str, Path]) -> None:
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    res = _scaling(str(runs["gloo2"]), str(empty))
    assert res.exit_code == 1 and "nothing-here" in res.output and "cannot be analysed" in \
        res.output


def test_terminal_table_and_html_plots(runs: dict[str, Path], tmp_path: Path) -> None:
    res = _scaling(str(runs["nccl1"]), str(runs["gloo2"]), "--force")
    assert res.exit_code == 0, res.output
    assert "Where the step time went" in res.output and "efficiency" in res.output
    page = tmp_path / "s.html"
    res = _scaling(str(runs["nccl1"]), str(runs["gloo2"]), "--force", "--html", str(page))
    assert res.exit_code == 0, res.output
    text = page.read_text()
    assert "Scaling efficiency" in text and "Where the step time went" in text
    assert text.count("plotly.js") >= 1 and "nccl1" in text and "gloo2" in text


def test_html_figures_draw_the_document(reports: dict[str, dict[str, Any]],
                                        runs: dict[str, Path]) -> None:
    from uberprof.present.scaling_html import efficiency_figure, lost_time_figure

    pts = [scaling_point_of(reports[n], _argv(runs[n])) for n in ("nccl1", "gloo2")]
    doc = scaling(pts, force=True).to_json()
    eff = efficiency_figure(doc)
    assert list(eff.data[1].y) == pytest.approx([r["efficiency"] * 100 for r in doc["runs"]])
    lost = lost_time_figure(doc)
    bars = [t for t in lost.data if t.type == "bar"]
    assert sum(t.y[0] for t in bars) == pytest.approx(doc["runs"][1]["delta_step_ms"], abs=0.02)


# --- the dashboard's /compare page --------------------------------------------------------------

def test_compare_page_has_a_scaling_section_for_runs_of_other_sizes(
        runs: dict[str, Path], reports: dict[str, dict[str, Any]]) -> None:
    from tests.unit.test_dashboard import _ids
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.pages import compare as page
    from uberprof.dashboards.queries.compare import compare_with
    from uberprof.dashboards.ui import Selection

    c = compare_with(runs["nccl1"], runs["gloo2"], workers=1, others=(runs["straggler"],))
    assert c.scaling is not None and c.scaling_error is None
    assert [r["world_size"] for r in c.scaling["runs"]] == [1, 2, 2]
    assert c.scaling["differences"]  # shown, not refused
    data = RunData(root=runs["gloo2"], workers=1, baseline=runs["nccl1"], comparison=c).load()
    layout = page.layout(data, Selection())
    ids = _ids(layout)
    assert {"compare-scaling", "compare-scaling-table", "compare-scaling-efficiency",
            "compare-scaling-lost", "compare-headline"} <= ids
    # two runs of one size: no scaling section
    same = compare_with(runs["gloo2"], runs["straggler"], workers=1)
    assert same.scaling is None and same.scaling_error is None
