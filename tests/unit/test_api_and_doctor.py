"""The in-script API and `uberprof doctor`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests._jobs import PY, job_env


def test_step_is_a_no_op_without_uberprof() -> None:
    proc = subprocess.run([PY, "-c", ("import uberprof, sys; uberprof.step(); "
                                      "print('torch' in sys.modules)")], capture_output=True,
                          text=True,
                          env=job_env(), timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "False"  # import stays cheap


def test_doctor_reports_this_machine(tmp_path: Path) -> None:
    proc = subprocess.run([PY, "-m", "uberprof", "doctor", "--out", str(tmp_path / "runs")],
                          capture_output=True, text=True, env=job_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for name in ("torch", "gloo", "nvml", "output"):
        assert name in out
    assert "writable" in out
    assert "will collect" in out


def test_version_and_help() -> None:
    from uberprof import __version__

    v = subprocess.run([PY, "-m", "uberprof", "--version"], capture_output=True, text=True,
                       check=False)
    assert __version__ in v.stdout
    h = subprocess.run([PY, "-m", "uberprof", "run", "--help"], capture_output=True, text=True,
                       check=False)
    assert "--trace-steps" in h.stdout and "Examples" in h.stdout
