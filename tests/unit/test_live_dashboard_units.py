"""The live dashboard leaves ended runs alone: an ended run is not followed (no timer, no
status line), one whose node has not ended is. Following a real running job in headless
Chromium: tests/jobs/test_live_dashboard.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests._jobs import PY, ROOT


def test_an_ended_run_is_not_followed(tmp_path: Path) -> None:
    """Old runs behave as before: no timer, no status line."""
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.live import live_for

    run = tmp_path / "synth"
    subprocess.run([PY, str(ROOT / "benchmarks" / "synth_run.py"),
                    str(run), "--ranks", "2", "--steps", "20", "--trace-steps", "5-6"],
                   check=True, capture_output=True, timeout=300)
    assert live_for(RunData(root=run).load()) is None
    node = next((run / "nodes").iterdir()) / "node.json"
    node.write_text(re.sub(r'"end_ns": \d+', '"end_ns": null', node.read_text()))
    live = live_for(RunData(root=run).load())
    assert live is not None and live.state.running
