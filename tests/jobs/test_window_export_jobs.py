"""A trace window's export leaves the training thread (issue 29 item 5): real 2-rank CPU/Gloo
jobs under `uberprof run --trace-steps 2-3` (tests/scripts/window_end_exit.py). The script
wraps the profiler's export so that it records the thread it ran on and sleeps first
(`--export-delay`), which makes every race below certain rather than likely: the export is
still running when the ranks go on, or end."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests._jobs import SCRIPTS, info_json, torchrun, uberprof_run

WINDOW = (2, 3)
DELAY_S = 3.0  # the export's added wait: far beyond what stopping a 16x16 model's window takes


def _run(out: Path, run_id: str, end: str, steps: int = 8) -> tuple[Path, Path, int]:
    record = out / f"{run_id}-export"
    proc = uberprof_run(out, run_id, torchrun(2, SCRIPTS / "window_end_exit.py",
                                              "--steps", str(steps),
                                              "--window-last", str(WINDOW[1]), "--end", end,
                                              "--record", str(record),
                                              "--export-delay", str(DELAY_S)),
                        "--trace-steps", f"{WINDOW[0]}-{WINDOW[1]}", check=False)
    return out / run_id, record, proc.returncode


def _trace(run: Path, rank: int) -> dict:
    """The rank's one trace file, which must be whole: gzip and JSON both complete."""
    files = sorted((run / "ranks" / str(rank) / "traces").iterdir())
    assert [f.name for f in files] == ["steps-000002-000003.pt.trace.json.gz"], files
    return json.loads(gzip.decompress(files[0].read_bytes()))


def _steps(run: Path, rank: int) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run / "ranks" / str(rank) / "steps.jsonl").open()]
    return {r["step"]: r for r in rows if r["kind"] == "step"}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    return _run(tmp_path_factory.mktemp("winexport"), "healthy", "none")


def test_the_export_runs_off_the_training_thread(healthy: tuple[Path, Path, int]) -> None:
    _, record, code = healthy
    assert code == 0
    for rank in (0, 1):
        doc = json.loads(Path(f"{record}.{rank}").read_text())
        assert doc["main_thread"] is False and doc["thread"] == "uberprof-trace-export", doc


def test_the_step_after_the_window_does_not_pay_for_the_export(
        healthy: tuple[Path, Path, int]) -> None:
    """uberprof's own time on the training thread in the step after the window (profiler
    stop, Flight Recorder dump) stays below the export's added sleep alone."""
    run, _, _ = healthy
    for rank in (0, 1):
        after = _steps(run, rank)[WINDOW[1] + 1]
        assert after["uberprof_ns"] < DELAY_S * 1e9, after


def test_the_windows_traces_are_complete_and_listed(healthy: tuple[Path, Path, int]) -> None:
    run, _, _ = healthy
    for rank in (0, 1):
        names = {e.get("name") for e in _trace(run, rank)["traceEvents"]}
        assert {"ProfilerStep#2", "ProfilerStep#3"} <= names
        meta = json.loads((run / "ranks" / str(rank) / "rank.json").read_text())
        assert meta["trace"]["windows"] == [list(WINDOW)]
        assert meta["trace"]["exporting"] is None
    info = info_json(run)
    assert [[w["steps"] for w in r["trace_windows"]] for r in info["ranks"]] == \
        [[list(WINDOW)], [list(WINDOW)]]


@pytest.mark.parametrize("end", ["os_exit", "raise"])
def test_an_exit_right_after_the_window_still_leaves_its_whole_trace(
        tmp_path: Path, end: str) -> None:
    run, record, code = _run(tmp_path, end, end)
    assert code != 0
    for rank in (0, 1):
        assert Path(f"{record}.{rank}").exists()  # the export ran to its end
        names = {e.get("name") for e in _trace(run, rank)["traceEvents"]}
        assert {"ProfilerStep#2", "ProfilerStep#3"} <= names
        assert not list((run / "ranks" / str(rank) / "traces").glob("*.tmp"))


def test_a_rank_killed_while_writing_its_trace_names_the_window_it_lost(
        tmp_path: Path) -> None:
    """SIGKILL right after the window's last step: rank.json already names the window whose
    trace was being written (recorded before the training thread went on)."""
    run, record, code = _run(tmp_path, "kill", "kill")
    assert code != 0
    for rank in (0, 1):
        assert not Path(f"{record}.{rank}").exists()  # the export did not finish
        meta = json.loads((run / "ranks" / str(rank) / "rank.json").read_text())
        assert meta["trace"]["exporting"] == list(WINDOW)
        tdir = run / "ranks" / str(rank) / "traces"
        assert not any(p.name.endswith((".json", ".json.gz")) for p in tdir.iterdir())
