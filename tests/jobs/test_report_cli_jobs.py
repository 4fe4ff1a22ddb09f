"""`uberprof report` and `uberprof calibrate` on a real run: analysis on demand, the terminal
report, the self-contained HTML file, and the calibration recorded in the run (which starts a job
under the run's own launcher). On synthetic traces: tests/unit/test_report_cli.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

from tests._jobs import PY, job_env
from uberprof.cli import main


def test_report_on_a_run_analyses_first_and_names_the_straggler(
        slow_compute_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(slow_compute_run, run, ignore=shutil.ignore_patterns("derived"))
    res = CliRunner().invoke(main, ["report", str(run)], terminal_width=120)
    assert res.exit_code == 0, res.output
    assert (run / "derived" / "steps.parquet").exists()  # analysed on demand
    out = res.stdout
    assert "uberprof report  slowcompute" in out
    assert re.search(r"1\. (HIGH|MEDIUM)\s+straggler \(compute\)", out), out
    assert "Rank 2 is a straggler" in out and "→" in out

    html = tmp_path / "report.html"
    res = CliRunner().invoke(main, ["report", str(run), "--html", str(html), "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["findings"][0]["kind"] == "straggler" and doc["findings"][0]["ranks"] == [2]
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>") and "Rank 2 is a straggler" in text
    # the replay's caution, where the ranks fill this machine's cores, beside the gains
    assert ("<b>Caution</b> (projected gains): CPU ranks fill" in text) == \
        bool(doc["run"]["replay"]["caveats"])
    # self-contained: plotly's code inlined once, nothing fetched from elsewhere
    assert "plotly.js v" in text or "Plotly" in text
    assert not re.search(r"<script[^>]+src=", text)
    assert text.count("Plotly.newPlot") >= 4

    # the job ended and its diagnosis is saved: `watch` says the report's verdict, not an
    # indication of its own (the live dashboard reads the same `live_signals`)
    res = CliRunner().invoke(main, ["watch", "--once", str(run)])
    assert res.exit_code == 0, res.output
    said = " ".join(res.stdout.split())
    title = " ".join(doc["findings"][0]["title"].split())
    assert f"• {title} (saved diagnosis of every step)" in said, said
    assert "(live, from the step timelines)" not in said.replace("waits for data", "")


def test_calibrate_records_the_peak_in_the_run(slow_compute_run: Path,
                                               tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(slow_compute_run, run, ignore=shutil.ignore_patterns("derived"))
    proc = subprocess.run([PY, "-m", "uberprof", "calibrate", str(run), "--yes",  # noqa: PLW1510
                           "--max-mb", "4", "--iters", "3"], capture_output=True, text=True,
                          timeout=300, env=job_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.distributed.run" in proc.stderr  # the run's own launcher, reused
    cal = json.loads((run / "calibration.json").read_text())
    assert cal["format"] == "uberprof-calibration" and cal["world_size"] == 4
    [world] = cal["groups"]
    assert world["link"] == "loopback" and world["peak_busbw_Bps"] > 0
    assert [p["bytes"] for p in world["points"]][:2] == [64 << 10, 128 << 10]
    res = CliRunner().invoke(main, ["report", str(run), "--json"])
    doc = json.loads(res.stdout)
    assert all(c["peak_source"] == "calibration" for c in doc["run"]["bandwidth"])
