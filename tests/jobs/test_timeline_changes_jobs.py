"""The story in time on a real job (docs/report.md, "The story in time"): a 2-rank Gloo job
under `uberprof run` with its default trace window (steps 10-19) and the slowdown trigger,
healthy for 100 steps, then rank 1 computes three times as long. The slowdown's window lands
on the slow stretch on every rank at the same steps, and `report` names rank 1 and the step
the slowdown began at, with window 1 as the healthy before and what changed between the two."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._failures import report_json
from tests._jobs import SAMPLES, info_json, torchrun, uberprof_run

# the slowdown trigger reads the step times' level against their spread: a neighbouring
# test's jobs on the same two cores would widen it (as for test_trace_on_slowdown_jobs.py)
pytestmark = pytest.mark.solo

# three times as long (the trigger's own test uses twice): the default window's traced steps
# widen the spread the trigger holds the rise to, and a load on the machine narrows the rise
SLOW_FROM, STEPS, SLOW_RANK, FACTOR = 100, 400, 1, 3
NEAR = 5  # steps between the injected onset and the one the report names


def test_report_names_the_slow_rank_and_the_step_the_slowdown_began(tmp_path: Path) -> None:
    uberprof_run(tmp_path, "story", torchrun(
        2, SAMPLES / "train_ddp.py", "--steps", str(STEPS), "--slow-rank", str(SLOW_RANK),
        "--slow-factor", str(FACTOR), "--fault-steps", f"{SLOW_FROM}-{STEPS - 1}"))
    # default options: the slowdown trigger is on by default
    run = tmp_path / "story"
    changes = report_json(run)["run"]["timeline_changes"]
    (lead,) = [c for c in changes if c["lead"]]
    assert lead["direction"] == "slower" and lead["ranks"] == [SLOW_RANK], lead["summary"]
    onsets = (lead["onset_step"], lead["rank_changes"][0]["onset_step"])
    assert all(abs(s - SLOW_FROM) <= NEAR for s in onsets), lead["summary"]
    assert [w["window"] for w in lead["windows_before"]] == [1], lead["summary"]

    windows = [[(tuple(w["steps"]), w["trigger"]) for w in r["trace_windows"]]
               for r in info_json(run)["ranks"]]
    assert windows[0] == windows[1] and windows[0][0] == ((10, 19), "schedule"), windows
    slow = [w for w, trigger in windows[0] if trigger == "slowdown"]
    (node,) = run.glob("nodes/*/node.json")
    assert len(slow) == 1, ("the slowdown trigger opened no window", node.read_text())
    assert SLOW_FROM < slow[0][0] and slow[0][1] < STEPS
    assert [(tuple(w["steps"]), w["trigger"]) for w in lead["windows_after"]] == \
        [(slow[0], "slowdown")]
    compared = lead["windows_compared"]
    assert compared is not None and compared["step_time_ms"]["verdict"] == "slower"
    assert compared["before_window"] == 1 and compared["moved"], compared
    assert isinstance(compared["findings"], list)  # each window diagnosed on its own
