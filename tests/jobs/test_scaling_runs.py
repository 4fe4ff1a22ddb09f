"""`uberprof scaling` on one CPU (Gloo) job recorded at 2 and 4 ranks (tests/_runs.py's
`ddp_runs`: samples/train_ddp.py, 10 steps, traced on steps 4-6).

The table's step time, throughput and efficiency are checked against the runs' own step
timelines (each rank's steps.jsonl, read here with nothing but json), and the breakdown against
the change in step time it explains. No timing is assumed: whatever the machine made of the
runs, the numbers must agree with what the runs measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from uberprof.cli import main


def _report(run: Path) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["report", str(run), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _measured_step_ms(run: Path, steps: list[int]) -> float:
    """The run's own step time over `steps`: per step the longest rank's host window in its
    steps.jsonl, averaged."""
    longest: dict[int, float] = {}
    for timeline in run.glob("ranks/*/steps.jsonl"):
        for line in timeline.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "step" and row["step"] in steps:
                ms = (row["host_end_ns"] - row["host_start_ns"]) / 1e6
                longest[row["step"]] = max(longest.get(row["step"], 0.0), ms)
    assert sorted(longest) == sorted(steps)
    return sum(longest.values()) / len(longest)


@pytest.fixture(scope="module")
def scaled(ddp_runs: dict[int, Path]) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["scaling", str(ddp_runs[4]), str(ddp_runs[2]), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_the_table_has_one_row_per_world_size_smallest_first(
        scaled: dict[str, Any], ddp_runs: dict[int, Path]) -> None:
    assert [r["world_size"] for r in scaled["runs"]] == [2, 4]
    assert [r["ranks"] for r in scaled["runs"]] == [2, 4]
    assert all(r["nodes"] == 1 for r in scaled["runs"])
    assert scaled["baseline"] == str(ddp_runs[2]) and scaled["differences"] == []


def test_efficiency_comes_from_the_runs_own_measured_throughput(
        scaled: dict[str, Any], ddp_runs: dict[int, Path]) -> None:
    """No --batch and none in the script's arguments: steps/s per rank, measured."""
    assert scaled["throughput_unit"] == "steps/s"
    measured = {}
    for r in scaled["runs"]:
        run = ddp_runs[r["world_size"]]
        steps = _report(run)["run"]["analysed_steps"]
        measured[r["world_size"]] = _measured_step_ms(run, steps)
        assert r["step_ms"] == pytest.approx(measured[r["world_size"]], abs=0.01)
        assert r["throughput_per_rank"] == pytest.approx(1000 / measured[r["world_size"]],
                                                         rel=1e-3)
        assert r["throughput_total"] == pytest.approx(r["world_size"] * 1000
                                                      / measured[r["world_size"]], rel=1e-3)
    assert scaled["runs"][0]["efficiency"] == 1.0
    assert scaled["runs"][1]["efficiency"] == pytest.approx(measured[2] / measured[4], rel=1e-3)


def test_the_breakdown_adds_up_to_the_change_in_step_time(scaled: dict[str, Any]) -> None:
    base, big = scaled["runs"]
    for r in (base, big):
        assert sum(r["parts_ms"].values()) == pytest.approx(r["step_ms"], abs=0.01)
        assert abs(r["parts_ms"].get("other", 0.0)) < 0.01 * r["step_ms"]  # the path covers it
    assert sum(big["delta_parts_ms"].values()) == pytest.approx(
        big["step_ms"] - base["step_ms"], abs=0.01)
    # DDP's all-reduce on the default group: the 4-rank run's exposed communication is there
    assert {p["key"] for p in scaled["parts"]} >= {"comm:world", "compute"}


def test_the_terminal_table_and_the_html_plot(ddp_runs: dict[int, Path],
                                              tmp_path: Path) -> None:
    page = tmp_path / "scaling.html"
    res = CliRunner().invoke(main, ["scaling", str(ddp_runs[2]), str(ddp_runs[4]),
                                    "--html", str(page)], terminal_width=140)
    assert res.exit_code == 0, res.output
    assert "exposed comm: world" in res.output and "step time" in res.output
    assert "ddp2" in res.output and "ddp4" in res.output
    html = page.read_text()
    assert "Scaling efficiency" in html and "exposed comm: world" in html
