"""The tests' time limits (tests/_jobs.py): derived from the job and the machine's load."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests import _jobs as jobs
from tests._jobs import PY, SAMPLES, job_limit, stop, time_limit, torchrun


def test_limits_grow_with_load_and_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(jobs.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    idle = time_limit(40)
    assert idle == 40 * jobs.SAFETY  # an idle machine: the work's bound times the margin
    assert time_limit(1) == jobs.FLOOR_S
    monkeypatch.setattr(jobs.os, "getloadavg", lambda: (6.0, 6.0, 6.0))  # 3 per CPU
    assert time_limit(40) == 3 * idle
    assert time_limit(10_000) == jobs.CEILING_S  # a stuck job still ends


def test_job_limit_reads_steps_and_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(jobs.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    one = job_limit([PY, str(SAMPLES / "train_ddp.py"), "--steps", "100"])
    assert one == (jobs.START_S + 100 * jobs.STEP_S) * jobs.SAFETY
    four = job_limit(torchrun(4, SAMPLES / "train_ddp.py", "--steps", "100"))
    assert four == 2 * one  # four ranks on two CPUs
    assert job_limit([PY, "x.py"]) == job_limit([PY, "x.py", "--steps", "30"])


def test_stop_ends_a_process_that_ignores_nothing() -> None:
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"], text=True)
    t0 = time.monotonic()
    stop([p], grace_s=5)
    assert p.returncode is not None and time.monotonic() - t0 < 5
