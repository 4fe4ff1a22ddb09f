"""`uberprof calibrate RUN` never runs the command a run directory names without the user's say."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from uberprof.cli import main

calibrate_cli = importlib.import_module("uberprof.cli.calibrate")  # the module, not the command


def _planted_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run directory whose recorded command would create `marker` if it were ever run."""
    run = tmp_path / "received-run"
    node = run / "nodes" / "n0"
    node.mkdir(parents=True)
    (run / "ranks").mkdir()
    (run / "run.json").write_text("{}")
    marker = tmp_path / "PWNED"
    command = ["sh", "-c", f"touch {marker}", "train.py"]
    (node / "node.json").write_text(json.dumps({"command": command}))
    return run, marker


def test_without_a_terminal_the_recorded_launcher_is_refused(tmp_path: Path) -> None:
    run, marker = _planted_run(tmp_path)
    res = CliRunner().invoke(main, ["calibrate", str(run)])
    assert res.exit_code == 2
    assert f"touch {marker}" in res.output and "--yes" in res.output
    assert not marker.exists()


@pytest.mark.parametrize("answer, runs", [("\n", False), ("n\n", False), ("y\n", True)])
def test_the_recorded_launcher_runs_only_when_confirmed(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        answer: str, runs: bool) -> None:
    run, marker = _planted_run(tmp_path)
    monkeypatch.setattr(calibrate_cli, "stdin_is_terminal", lambda: True)
    res = CliRunner().invoke(main, ["calibrate", str(run)], input=answer)
    assert f"touch {marker}" in res.output  # shown before asking
    assert marker.exists() == runs
    if not runs:
        assert res.exit_code == 1 and "nothing run" in res.output


def test_yes_runs_the_recorded_launcher(tmp_path: Path) -> None:
    run, marker = _planted_run(tmp_path)
    CliRunner().invoke(main, ["calibrate", "--yes", str(run)])
    assert marker.exists()


def test_an_explicit_launcher_needs_no_confirmation(tmp_path: Path) -> None:
    run, marker = _planted_run(tmp_path)
    mine = tmp_path / "mine"
    res = CliRunner().invoke(main, ["calibrate", str(run), "--", "sh", "-c", f"touch {mine}"])
    assert mine.exists() and not marker.exists(), res.output
