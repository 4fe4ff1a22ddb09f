"""The guard of tests/unit/ (tests/_no_jobs.py, on through tests/unit/conftest.py): a unit test
that starts a training job, a browser, a terminal or a network namespace fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._no_jobs import MESSAGE, JobInUnitTest, NoJobs, guarded, refusal

PY = sys.executable
PLAYWRIGHT = "/venv/lib/python3.11/site-packages/playwright/driver"


def test_a_unit_test_may_not_start_torchrun(no_jobs: NoJobs) -> None:
    with pytest.raises(JobInUnitTest, match="move this test to tests/jobs/"):
        subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", "train.py"],
                       check=False)
    assert no_jobs.refused and "torchrun" in no_jobs.refused[0]
    no_jobs.refused.clear()  # refused as it should be: this test passes


def test_a_caught_refusal_fails_the_test_all_the_same() -> None:
    """Code under test that catches the error (a `doctor` probing what it can run, say) does
    not hide it: the guarded block fails when it ends."""
    with (pytest.raises(pytest.fail.Exception, match="move this test to tests/jobs/"),
          guarded(NoJobs())):
        try:
            subprocess.check_output([PY, "-m", "uberprof", "run", "--", PY, "-c", "pass"])
        except JobInUnitTest:
            pass


def test_what_is_allowed_still_runs() -> None:
    out = subprocess.run([PY, "-m", "uberprof", "run", "--help"], capture_output=True,
                         text=True, check=True, timeout=120)
    assert "--trace-steps" in out.stdout
    assert subprocess.check_output([PY, "-c", "print('torchrun')"], text=True) == "torchrun\n"


@pytest.mark.parametrize("args", [
    ["torchrun", "--nproc_per_node=2", "train.py"],
    ["/work/.venv/bin/torchrun", "--standalone", "train.py"],
    ["env", "OMP_NUM_THREADS=1", "torchrun", "train.py"],
    [PY, "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"],
    [PY, "-m", "uberprof", "run", "--out", "runs", "--", PY, "train.py"],
    [PY, "-m", "uberprof", "--quiet", "run", "--", PY, "-c", "pass"],
    ["/venv/bin/uberprof", "run", "--", PY, "train.py"],
    [PY, "-m", "uberprof", "calibrate", "runs/r", "--yes"],
    ["/usr/bin/chromium", "--headless", "about:blank"],
    [f"{PLAYWRIGHT}/node", f"{PLAYWRIGHT}/package/cli.js", "run-driver"],
    ["tmux", "new-session", "-d", "-s", "x", "uberprof watch r"],
    ["ip", "netns", "add", "node-a"],
    ["ip", "-n", "node-a", "netns", "exec", "node-a", "true"],
    ["unshare", "--net", "true"],
    ["nsenter", "--net=/run/netns/a", "true"],
    ["sh", "-c", "cd /tmp && torchrun --standalone train.py"],
    ["bash", "-c", "exec uberprof run -- python train.py"],
    "torchrun",  # a string: the program alone
])
def test_what_starts_a_job_is_refused(args: list[str] | str) -> None:
    assert refusal(args) is not None, args


@pytest.mark.parametrize("line", ["cd /tmp && tmux new -d", "ip netns add a",
                                  "uberprof run -- python train.py", "/usr/bin/chromium x"])
def test_shell_lines_that_start_a_job_are_refused(line: str) -> None:
    assert refusal(line, shell=True) is not None, line


@pytest.mark.parametrize("args", [
    [PY, "-c", "import torch; print('torchrun')"],
    [PY, "-m", "uberprof", "run", "--help"],
    [PY, "-m", "uberprof", "--version"],
    [PY, "-m", "uberprof", "doctor", "--out", "runs"],
    [PY, "-m", "uberprof", "info", "runs/r"],
    [PY, "-m", "uberprof", "report", "--json", "runs/r"],
    [PY, "-m", "uberprof", "dashboard", "runs/r", "--port", "0"],
    [PY, "-m", "uberprof", "watch", "--once", "runs/run"],
    [PY, "benchmarks/synth_run.py", "out", "--ranks", "4"],
    [PY, "train.py", "--launcher", "torchrun"],
    [PY, "-m", "pip", "wheel", "--no-deps", "."],
    ["sh", "-c", "echo uberprof report r"],
])
def test_other_commands_are_allowed(args: list[str]) -> None:
    assert refusal(args) is None, args


def test_the_message_says_where_the_test_belongs() -> None:
    assert MESSAGE == "unit tests start no jobs: move this test to tests/jobs/"
