"""`uberprof watch` in a real terminal (tmux): following a real job, and quitting on q. Its
readers and the one-shot view: tests/unit/test_watch.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests._jobs import PY, ROOT, info_json, start_followed_job, stop, time_limit
from tests.unit.test_watch import _step


def _tmux_watch(session: str, *args: str) -> None:
    """`uberprof watch ARGS` in a detached tmux session (150 x 40), which then says
    WATCH-EXITED=<exit code> and stays open for capture-pane."""
    command = (f"cd {ROOT} && env PYTHONPATH={ROOT} OMP_NUM_THREADS=1 {PY} -m uberprof watch "
               + " ".join(args) + "; echo WATCH-EXITED=$?; sleep 600")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "40",
                    command], check=True)


def _pane(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                          text=True, check=True).stdout


def _wait_for(session: str, pattern: str, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, _pane(session))
        if m:
            return m
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not on the screen in {timeout} s:\n{_pane(session)}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_watch_follows_a_real_job_under_tmux(tmp_path: Path) -> None:
    """A 2-rank job under `uberprof run` while `uberprof watch` runs in tmux: the running
    state with steps growing, then the ended state with the job's own step count, then watch
    exits by itself. The job runs until the test has seen it grow (tests/_jobs.followed_job),
    so no step count has to outlast the look."""
    run = tmp_path / "live"
    job = start_followed_job(tmp_path, "live", tmp_path / "stop")
    session = f"uberprof-watch-{os.getpid()}"
    try:
        deadline = time.monotonic() + time_limit(40)
        while not (run / "ranks").is_dir() and time.monotonic() < deadline:
            assert job.poll() is None, f"the job ended (exit {job.returncode}) at its start"
            time.sleep(0.5)
        _tmux_watch(session, "--interval", "0.5", str(run))
        first = int(_wait_for(session, r"running · (\d+) steps", time_limit(60)).group(1))
        later = _wait_for(session, rf"running · (?!{first} )(\d+) steps", time_limit(40))
        assert int(later.group(1)) > first
        screen = _pane(session)
        for rank in (0, 1):
            assert re.search(rf"^\s+{rank}\s+\d+\s", screen, re.MULTILINE), screen
        (tmp_path / "stop").touch()
        assert job.wait(timeout=time_limit(30)) == 0
        ranks = info_json(run)["ranks"]
        final = ranks[0]["steps"]  # what the run holds, every rank the same
        assert {r["steps"] for r in ranks} == {final} and final >= int(later.group(1)), ranks
        _wait_for(session, rf"ended \(exit 0\) · {final} steps", 30)
        _wait_for(session, r"WATCH-EXITED=0", 30)
    finally:
        stop([job])
        subprocess.run(["tmux", "kill-session", "-t", session], check=False,
                       capture_output=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_watch_quits_on_q_under_tmux(tmp_path: Path) -> None:
    """A job that never ends (node.json without end_ns): q stops watching, and the terminal
    is given back."""
    rank = tmp_path / "ranks" / "0"
    rank.mkdir(parents=True)
    (rank / "steps.jsonl").write_bytes(_step(0, 0, 100))
    (tmp_path / "nodes" / "n0").mkdir(parents=True)
    (tmp_path / "nodes" / "n0" / "node.json").write_text('{"end_ns": null}')
    session = f"uberprof-watch-q-{os.getpid()}"
    try:
        _tmux_watch(session, str(tmp_path))
        _wait_for(session, r"running · 1 steps", 60)
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        _wait_for(session, r"WATCH-EXITED=0", 20)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False,
                       capture_output=True)
