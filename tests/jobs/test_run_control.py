"""Exit codes, signals, broken output folders and killed ranks: uberprof never harms the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests._jobs import PY, ROOT, SAMPLES, info_json, job_env, torchrun, uberprof_run


def _start(out: Path, run_id: str, command: list[str], *options: str) -> subprocess.Popen[str]:
    cmd = [PY, "-m", "uberprof", "run", "--out", str(out), "--run-id", run_id, *options, "--",
           *command]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=job_env(), start_new_session=True)


def _wait_for_steps(steps_file: Path, n: int, proc: subprocess.Popen[str], timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if steps_file.exists():
            rows = [ln for ln in steps_file.read_text().splitlines() if '"kind":"step"' in ln]
            if len(rows) >= n:
                return
        if proc.poll() is not None:
            raise AssertionError(f"job ended early: {proc.communicate()}")
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps in {steps_file} after {timeout} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("code", [0, 3, 42])
def test_exit_code_passes_through(tmp_path: Path, code: int) -> None:
    proc = uberprof_run(tmp_path, "exit", [PY, "-c", f"import sys; sys.exit({code})"],
                        check=False)
    assert proc.returncode == code
    node = json.loads(next((tmp_path / "exit" / "nodes").glob("*/node.json")).read_text())
    assert node["exit_code"] == code and node["end_ns"] >= node["start_ns"]


def test_child_killed_by_signal_exits_like_a_shell(tmp_path: Path) -> None:
    proc = uberprof_run(tmp_path, "sig", [PY, "-c", ("import os,signal; os.kill(os.getpid(), "
                                                     "signal.SIGTERM)")], check=False)
    assert proc.returncode == 128 + signal.SIGTERM


def test_missing_command(tmp_path: Path) -> None:
    proc = uberprof_run(tmp_path, "missing", ["no-such-command-xyz"], check=False)
    assert proc.returncode == 127
    assert "no-such-command-xyz" in proc.stderr and "not found" in proc.stderr


def test_sigterm_reaches_the_job(tmp_path: Path) -> None:
    script = ("import signal, sys, time\n"
              "def bye(*a):\n    print('got TERM', flush=True); sys.exit(7)\n"
              "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    proc = _start(tmp_path, "term", [PY, "-c", script])
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert "got TERM" in out
    assert proc.returncode == 7


def test_ctrl_c_stops_a_torchrun_job_cleanly(tmp_path: Path) -> None:
    proc = _start(tmp_path, "ctrlc", torchrun(2, SAMPLES / "train_ddp.py", "--steps", "100000"),
                  "--no-trace")
    run = tmp_path / "ctrlc"
    for r in (0, 1):  # every rank has written 3 steps (one may lag the other by a write)
        _wait_for_steps(run / "ranks" / str(r) / "steps.jsonl", 3, proc)
    pids = [json.loads((d / "rank.json").read_text())["pid"] for d in (run / "ranks").iterdir()]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)  # what the terminal sends to the foreground `uberprof run`
    proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 60
    assert proc.returncode != 0
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "ranks outlived Ctrl-C"
    info = info_json(run)
    assert all(r["steps"] >= 3 for r in info["ranks"])
    assert info["nodes"][0]["exit_code"] == proc.returncode


def test_unwritable_out_leaves_the_job_unchanged(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    command = [PY, "-c", "print('job output line'); import sys; sys.exit(5)"]
    plain = subprocess.run(command, capture_output=True, text=True, env=job_env(), check=False)
    proc = uberprof_run(blocker / "runs", "x", command, check=False)
    assert proc.returncode == plain.returncode == 5
    assert proc.stdout == plain.stdout
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("uberprof:")]
    assert len(notes) == 1 and "cannot write the run directory" in notes[0]


def test_agent_failure_inside_a_rank_does_not_harm_it(tmp_path: Path) -> None:
    # The rank agent cannot create its folder (the run directory is a file): the job runs on.
    bad_run = tmp_path / "run-is-a-file"
    bad_run.write_text("")
    env = job_env(UBERPROF_RUN_DIR=str(bad_run),
                  PYTHONPATH=str(ROOT / "uberprof" / "collect" / "bootstrap"))
    proc = subprocess.run([PY, str(SAMPLES / "train_ddp.py"), "--steps", "3"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0
    assert "trained 3 steps" in proc.stdout
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("uberprof:")]
    assert len(notes) == 1 and "not be profiled" in notes[0] and "not affected" in notes[0]


def test_existing_sitecustomize_is_chained(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('user sitecustomize ran', flush=True)\n")
    env = job_env(PYTHONPATH=str(site))
    proc = subprocess.run([PY, "-m", "uberprof", "run", "--out", str(tmp_path), "--run-id", "c",
                           "--", PY, "-c", ("import sys; print('job ran', [p for p in "
                                            "sys.path if p.endswith('site')])")],
                          capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "user sitecustomize ran"
    assert "job ran" in proc.stdout and str(site) in proc.stdout


def test_kill_9_of_a_rank_keeps_its_finished_steps(tmp_path: Path) -> None:
    proc = _start(tmp_path, "kill9", torchrun(2, SAMPLES / "train_ddp.py", "--steps", "100000"),
                  "--no-trace")
    run = tmp_path / "kill9"
    _wait_for_steps(run / "ranks" / "1" / "steps.jsonl", 5, proc)
    victim = json.loads((run / "ranks" / "1" / "rank.json").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    rows = [ln for ln in (run / "ranks/1/steps.jsonl").read_text().splitlines()
            if '"kind":"step"' in ln]
    info = info_json(run)
    rank1 = next(r for r in info["ranks"] if r["rank"] == 1)
    assert rank1["steps"] == len(rows) >= 5
    assert not rank1["finished"]
    assert any(p.startswith("rank 1 stopped abruptly") and f"its {len(rows)} finished steps" in p
               for p in info["problems"]), info["problems"]
