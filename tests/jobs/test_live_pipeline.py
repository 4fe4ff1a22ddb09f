"""The live indications of a real pipeline-parallel job (`uberprof watch`, the live dashboard):
a 2-stage Gloo pipeline whose stage 1 holds three times stage 0's blocks (the session's
`pipeline_run`, tests/_parallel_runs.py, read on a copy without its saved analysis, as while
the job runs). Its stages do different work by design, so stage 1's longer CPU time is no
straggler; the layout each rank recorded says it is a pipeline. The rules on synthetic series:
tests/unit/test_live_pipeline_peers.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests._parallel_runs import STEPS, Report
from uberprof.analysis.diagnosis.step_signals import followed_signals
from uberprof.rundir.follow import RunFollower


def test_an_unbalanced_pipeline_gives_no_straggler_signal_and_records_pipelining(
        pipeline_run: Report, tmp_path: Path) -> None:
    # without derived/: no saved diagnosis to read, only the step timelines (what the live
    # views have while the job runs; the session's run was reported on)
    run = Path(shutil.copytree(pipeline_run[0], tmp_path / "pipe",
                               ignore=shutil.ignore_patterns("derived")))
    for r in (0, 1):
        meta = json.loads((run / "ranks" / str(r) / "rank.json").read_text())
        assert meta["parallel_apis"] == ["pipelining"]
        assert [g["ranks"] for g in meta["process_groups"]] == [[0, 1]]  # the world only
    follower = RunFollower(run)
    state = follower.poll()
    assert state.steps == int(STEPS[1]) and len(state.ranks) == 2
    found = followed_signals(follower)
    assert not [s for s in found if s.kind == "straggler"], [s.title for s in found]
    assert [(s.kind, s.confidence) for s in found] == [("pipeline_imbalance", "none")]
    assert found[0].title.startswith("pipeline of 2 stages: the stages do different work")
