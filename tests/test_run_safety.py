"""What `uberprof run` must never do to the user: run a typo, widen imports, hang a terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import PY, ROOT, job_env

BASE_PY = getattr(sys, "_base_executable", "") or ""


def _uberprof(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = job_env(PYTHONPATH=str(ROOT))
    return subprocess.run([PY, "-m", "uberprof", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


@pytest.mark.parametrize("typo, suggestion", [("--hang-timout", None),
                                              ("--trace-step", "--trace-steps")])
def test_unknown_option_is_an_error_not_the_command(tmp_path: Path, typo: str,
                                                    suggestion: str | None) -> None:
    out = tmp_path / "runs"
    proc = _uberprof(tmp_path, "run", "--out", str(out), typo, "15", "--", PY, "-c", "pass")
    assert proc.returncode == 2, proc.stderr
    assert f"No such option '{typo}'" in proc.stderr
    assert suggestion is None or suggestion in proc.stderr
    assert "was not found" not in proc.stderr
    assert not out.exists(), "a mistyped option created a run directory"


def test_command_without_double_dash_still_runs(tmp_path: Path) -> None:
    proc = _uberprof(tmp_path, "run", "--out", str(tmp_path / "runs"), PY, "-c",
                     "import sys; print('ran', sys.argv[1:])", "--flag", "x")
    assert proc.returncode == 0, proc.stderr
    assert "ran ['--flag', 'x']" in proc.stdout


def _bare_env() -> dict[str, str]:
    env = job_env()
    env.pop("PYTHONPATH", None)
    return env


def _no_uberprof_in(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import uberprof"], capture_output=True,
                           env=_bare_env(), cwd="/")
    return probe.returncode != 0


@pytest.mark.skipif(not BASE_PY or not _no_uberprof_in(BASE_PY),
                    reason="needs an interpreter without uberprof installed")
@pytest.mark.parametrize("neighbour", ["tests", "samples"])
def test_bootstrap_makes_only_uberprof_importable(tmp_path: Path, neighbour: str) -> None:
    # Another interpreter than uberprof's own: the bootstrap loads uberprof from UBERPROF_HOME,
    # and must not make the folders beside it importable.
    code = (f"import sys\ntry:\n    import {neighbour}\nexcept ImportError:\n    print('no')\n"
            "else:\n    print('yes')\nprint('uberprof' in sys.modules)\n")
    plain = subprocess.run([BASE_PY, "-c", code], capture_output=True, text=True,
                           cwd=tmp_path, env=_bare_env(), timeout=60)
    assert plain.stdout.splitlines() == ["no", "False"]
    # The job keeps only the bootstrap folder that uberprof put first on PYTHONPATH, so that
    # the checkout under test (on this test's PYTHONPATH) is reachable through UBERPROF_HOME only.
    job = ["sh", "-c", 'PYTHONPATH="${PYTHONPATH%%:*}" exec "$0" -c "$1"', BASE_PY, code]
    proc = subprocess.run([PY, "-m", "uberprof", "run", "--out", str(tmp_path / "runs"),
                           "--counters", "none", "--", *job], capture_output=True, text=True,
                          cwd=tmp_path, env=job_env(PYTHONPATH=str(ROOT)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["no", "True"], proc.stderr
    assert "bootstrap failed" not in proc.stderr
