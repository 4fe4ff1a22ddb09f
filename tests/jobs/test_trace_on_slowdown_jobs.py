"""`uberprof run --trace-on-slowdown` on a real 2-rank Gloo job that runs healthy for 80 steps
and then has rank 1 compute twice as long: the node agent sees the step time rise and every
rank records one window, marked "slowdown", inside the slow stretch at the same steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._jobs import SAMPLES, info_json, torchrun, uberprof_run

# the detector reads the step times' level against their own spread: a neighbouring test's
# jobs on the same two cores widen that spread (in a full `make test` the rise went unseen)
pytestmark = pytest.mark.solo

# the window opens a margin of steps after the node agent reads the rise (it reads every few
# seconds, and the margin covers the ranks' poll in steps): on a quiet machine's short steps
# that is 100 steps or more past the detection, so the slow stretch runs 320 steps
SLOW_FROM, STEPS = 80, 400


def test_a_slowdown_opens_one_window_on_every_rank_inside_the_slow_stretch(
        tmp_path: Path) -> None:
    proc = uberprof_run(tmp_path, "slow", torchrun(
        2, SAMPLES / "train_ddp.py", "--steps", str(STEPS), "--slow-rank", "1",
        "--slow-factor", "2", "--fault-steps", f"{SLOW_FROM}-{STEPS - 1}"),
        "--no-trace", "--trace-on-slowdown")
    run = tmp_path / "slow"
    (node,) = run.glob("nodes/*/node.json")
    slowdowns = json.loads(node.read_text())["slowdowns"]
    assert len(slowdowns["detected"]) == 1, (slowdowns, proc.stderr[-2000:])
    (found,) = slowdowns["detected"]
    assert SLOW_FROM <= found["onset"] <= SLOW_FROM + 5 and found["requested"]
    assert "step time rose from" in proc.stderr
    info = info_json(run)
    assert info["problems"] == []
    windows = [[(w["steps"], w["trigger"]) for w in r["trace_windows"]] for r in info["ranks"]]
    assert windows[0] == windows[1] == [(found["window"], "slowdown")], windows
    assert SLOW_FROM < found["window"][0] and found["window"][1] < STEPS
