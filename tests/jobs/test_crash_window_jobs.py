"""A rank that dies inside its trace window (issue 29): real 2-rank CPU/Gloo jobs under
`uberprof run --trace-steps 3-6` where rank 1 raises torch.OutOfMemoryError
(`samples/train_ddp.py --oom-rank 1 --oom-step S`). Findings that claim "every rank" rest only
on the steps every rank completed, and a death inside the window is said to be inside it."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests._jobs import SAMPLES, info_json, torchrun, uberprof_run
from uberprof.cli import main


def _oom_run(out: Path, run_id: str, step: int) -> Path:
    proc = uberprof_run(out, run_id, torchrun(2, SAMPLES / "train_ddp.py", "--steps", "10",
                                              "--oom-rank", "1", "--oom-step", str(step)),
                        "--trace-steps", "3-6", check=False)
    assert proc.returncode != 0, proc.stderr[-2000:]
    return out / run_id


@pytest.fixture(scope="module")
def oom_at_5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _oom_run(tmp_path_factory.mktemp("crashwin"), "oom5", 5)


def _report(run: Path) -> tuple[int, dict]:
    res = CliRunner().invoke(main, ["report", str(run), "--json", "--workers", "1"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, json.loads(res.stdout)


def _finished_by_all(run: Path) -> set[int]:
    """The steps every rank finished, from their step timelines."""
    sets = []
    for rd in sorted((run / "ranks").iterdir()):
        lines = (rd / "steps.jsonl").read_text().splitlines()
        rows = [json.loads(x) for x in lines if x.strip()]
        sets.append({r["step"] for r in rows if r.get("kind") == "step"})
    return set.intersection(*sets)


def _cut_trace_at(path: Path, step: int) -> None:
    """Drop the trace's events from ProfilerStep#`step` on: what a rank leaves when it dies
    before the profiler records its last step."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    at = next(e["ts"] for e in doc["traceEvents"] if e.get("name") == f"ProfilerStep#{step}")
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not isinstance(e.get("ts"), int | float) or e["ts"] < at]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_every_rank_findings_use_only_steps_every_rank_completed(oom_at_5: Path) -> None:
    code, doc = _report(oom_at_5)
    assert code == 3  # the report found the crash: it exits by that verdict
    crash = next(f for f in doc["findings"] if f["kind"] == "crash")
    assert crash["ranks"] == [1] and crash["steps"] == [5]
    complete = _finished_by_all(oom_at_5)
    assert 5 not in complete
    for f in doc["findings"]:
        if "every rank" in f["title"]:
            assert set(f["steps"]) <= complete, f


def test_a_survivors_partial_step_is_not_exposed_comm_on_every_rank(
        oom_at_5: Path, tmp_path: Path) -> None:
    """Rank 1's trace without its partial step 5, as when it dies before the profiler records
    the step: rank 0's step 5 (waiting for its dead peer) alone must not make a finding about
    every rank."""
    run = tmp_path / "run"
    shutil.copytree(oom_at_5, run, ignore=shutil.ignore_patterns("derived"))
    (trace,) = (run / "ranks" / "1" / "traces").iterdir()
    _cut_trace_at(trace, 5)
    code, doc = _report(run)
    assert code == 3  # the crash's verdict
    exposed = [f for f in doc["findings"] if f["kind"] == "exposed_comm"]
    for f in exposed:
        assert 5 not in f["steps"], f["title"]
        assert f["evidence"]["steps_left_out"]["5"]
    assert not any("every rank" in f["title"] and 5 in f["steps"] for f in doc["findings"])


def test_a_rank_that_died_inside_its_window_is_said_to_have_died_inside_it(
        tmp_path: Path) -> None:
    run = _oom_run(tmp_path, "oom3", 3)  # dies in step 3, the window's first: no trace at all
    code, doc = _report(run)
    assert code == 3  # nothing could be analysed, but the crash is the verdict
    said = next(p for p in doc["run"]["problems"] if "no trace window in this run" in p)
    assert "inside its trace window (steps 3-6): it stopped in step 3" in said, said
    assert "before its trace window" not in said
    info = info_json(run)
    assert any("the job stopped in step 3, inside the window" in p for p in info["problems"])
    assert not any("before the window" in p for p in info["problems"])
