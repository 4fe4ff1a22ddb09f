"""A trace window stops early once its rank's memory grew past `--window-memory-mb`, on a real
2-rank pipeline job (CPU, Gloo, shapes recorded: the profiler holds each traced operator's
tensors until the window ends, tens of MB a step here), and the run stays readable."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tests._jobs import SAMPLES, info_json, torchrun, uberprof_run
from uberprof.cli import main
from uberprof.rundir import parse_trace_file_name

STEPS = 14
WINDOW = (2, 11)


def test_a_window_that_outgrows_its_memory_budget_stops_early_and_says_so(
        tmp_path: Path) -> None:
    proc = uberprof_run(tmp_path, "cut", torchrun(2, SAMPLES / "train_pipeline.py", "--steps",
                                                  str(STEPS), "--dim", "256", "--batch", "16"),
                        "--trace-steps", f"{WINDOW[0]}-{WINDOW[1]}", "--window-memory-mb", "40",
                        "--counters", "none")
    run = tmp_path / "cut"
    cuts = {r: json.loads((run / "ranks" / str(r) / "rank.json").read_text())["trace"]
            ["cut_short"] for r in (0, 1)}
    assert any(cuts.values()), cuts
    for rank, rank_cuts in cuts.items():
        for cut in rank_cuts:
            assert cut["window"] == list(WINDOW) and cut["budget_mb"] == 40
            assert WINDOW[0] <= cut["last"] < WINDOW[1] and cut["grown_mb"] > 40
            # the trace holds the steps recorded before the cut, under their own range
            traces = [parse_trace_file_name(p.name)
                      for p in (run / "ranks" / str(rank) / "traces").iterdir()]
            assert traces == [(WINDOW[0], cut["last"])], traces
    assert "stopped after step" in proc.stderr and "--window-memory-mb" in proc.stderr
    problems = info_json(run)["problems"]
    assert any("stopped after step" in p and "over the budget of 40 MB" in p
               for p in problems), problems
    res = CliRunner().invoke(main, ["report", str(run), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["run"]["step_time"]["traced"]["steps"] >= 1, doc["run"]["step_time"]
