"""The live indications of a real pipeline-parallel job (`uberprof watch`, the live dashboard):
a 2-stage Gloo pipeline whose stage 1 holds three times stage 0's blocks. Its stages do
different work by design, so stage 1's longer CPU time is no straggler; the layout each rank
recorded says it is a pipeline. The rules on synthetic series: tests/unit/test_live_pipeline_peers.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests._jobs import SAMPLES, torchrun, uberprof_run
from uberprof.analysis.diagnosis.step_signals import followed_signals
from uberprof.rundir.follow import RunFollower


def test_an_unbalanced_pipeline_gives_no_straggler_signal_and_records_pipelining(
        tmp_path: Path) -> None:
    uberprof_run(tmp_path, "pipe",
                 torchrun(2, SAMPLES / "train_pipeline.py", "--schedule", "1f1b",
                          "--microbatches", "8", "--heavy-stage", "1", "--heavy-factor", "3",
                          "--steps", "12"),
                 "--trace-steps", "3-6", "--counters", "none")
    run = tmp_path / "pipe"
    for r in (0, 1):
        meta = json.loads((run / "ranks" / str(r) / "rank.json").read_text())
        assert meta["parallel_apis"] == ["pipelining"]
        assert [g["ranks"] for g in meta["process_groups"]] == [[0, 1]]  # the world only
    follower = RunFollower(run)
    state = follower.poll()
    assert state.steps == 12 and len(state.ranks) == 2
    found = followed_signals(follower)
    assert not [s for s in found if s.kind == "straggler"], [s.title for s in found]
    assert [(s.kind, s.confidence) for s in found] == [("pipeline_imbalance", "none")]
    assert found[0].title.startswith("pipeline of 2 stages: the stages do different work")
