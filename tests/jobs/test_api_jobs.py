"""The in-script API around a real training loop (tests/scripts/api_profile.py, in its own
process). `uberprof doctor` and the API's units: tests/unit/test_api_and_doctor.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests._jobs import PY, SCRIPTS, info_json, job_env


def test_profile_context_manager(tmp_path: Path) -> None:
    proc = subprocess.run([PY, str(SCRIPTS / "api_profile.py"), str(tmp_path)],
                          capture_output=True, text=True, env=job_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    [rank] = info_json(tmp_path / "api")["ranks"]
    assert rank["steps"] == 6 and rank["finished"]
    assert [w["steps"] for w in rank["trace_windows"]] == [[2, 3]]
