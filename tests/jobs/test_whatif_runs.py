"""`uberprof whatif` and the report's replay and critical path on a real 4-rank CPU (Gloo) run
whose rank 2 runs its forward pass four times (tests/_diag_runs.py): the step graph replays the
measured steps within 5%, its critical path runs mostly on the straggler, and removing the
straggler's extra work projects a shorter step with its interval. By hand: tests/unit/
test_whatif_graph.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from tests._diag_runs import slow_compute_run  # noqa: F401
from uberprof.cli import main

STRAGGLER = 2


def _copy(src: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("derived"))
    return run


def test_the_replay_reproduces_the_steps_and_the_path_runs_on_the_straggler(
        slow_compute_run: Path, tmp_path: Path) -> None:  # noqa: F811
    run = _copy(slow_compute_run, tmp_path)
    res = CliRunner().invoke(main, ["report", str(run), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["run"]
    rp, cp = doc["replay"], doc["critical_path"]
    assert len(rp["steps"]) == 10 and rp["graph"]["ranks"] == 4
    assert rp["graph"]["comm_nodes"] >= 4 * 10 and rp["graph"]["complete_edges"] > 0
    assert rp["median_error_pct"] <= 5.0 and rp["fit_for_projection"], rp
    assert all(s["error_pct"] <= 5.0 for s in rp["steps"]), rp["steps"]
    assert cp["rank"] == STRAGGLER, cp
    assert sum(cp["by_kind_ms"].values()) > 0 and cp["top_operators"]
    res = CliRunner().invoke(main, ["report", str(run)], terminal_width=120)
    assert "critical path" in res.stdout and "replay: median error" in res.stdout


def test_removing_the_straggler_projects_a_shorter_step_with_its_interval(
        slow_compute_run: Path, tmp_path: Path) -> None:  # noqa: F811
    run = _copy(slow_compute_run, tmp_path)
    res = CliRunner().invoke(main, ["whatif", str(run), "--remove", "straggler", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["straggler"] == STRAGGLER
    assert doc["fit_for_projection"] and doc["replay_error_pct"] <= 5.0
    assert abs(doc["replayed_step_ms"] - doc["baseline_step_ms"]) <= \
        0.05 * doc["baseline_step_ms"]
    assert doc["projected_step_ms"] < doc["baseline_step_ms"], doc
    lo, hi = doc["interval_ms"]
    assert lo <= doc["projected_step_ms"] <= hi and "interval" in doc["interval"]
    assert doc["changes"][0]["rank"] == STRAGGLER and doc["changes"][0]["removed_ms"] > 0

    res = CliRunner().invoke(main, ["whatif", str(run), "--remove", "straggler", "--remove",
                                    "data", "--link-scale", "2", "--op", "aten::addmm=2"],
                             terminal_width=120)
    assert res.exit_code == 0, res.output
    assert "projected" in res.stdout and "shorter" in res.stdout
    assert "replay error" in res.stdout
