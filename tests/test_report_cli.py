"""`uberprof report` and `uberprof calibrate` from the command line: the terminal report, the
stable JSON document, the self-contained HTML file, and analysis on demand."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests import _traces as T
from tests._diag_runs import slow_compute_run  # noqa: F401
from tests.jobs import PY, job_env
from uberprof.cli import main

FINDING_KEYS = {"kind", "severity", "title", "ranks", "steps", "cause", "time_at_stake_ms",
                "evidence", "remedy", "confidence", "observed_ms", "own_pct", "caused_by"}
RANK_KEYS = {"rank", "host", "mode", "device_type", "steps", "step_time_ms", "breakdown_pct",
             "analysed", "idle_gaps", "lateness_ms"}
RUN_KEYS = {"schema_version", "uberprof_version", "path", "run_id", "kind", "world_size", "ranks",
            "hosts", "backend", "device_type", "analysed_steps", "analysed_wall_ms",
            "step_time_ms", "gap_threshold_us", "clock_alignment", "collectives", "bandwidth",
            "problems", "straggler_test", "step_time", "accounting"}


def _two_rank_traces(tmp_path: Path) -> Path:
    """Two Gloo ranks where rank 1 arrives late at both all-reduces."""
    folder = tmp_path / "traces"
    T.write(folder / "rank-0.json", T.cpu_step_trace(rank=0))
    late = T.cpu_step_trace(rank=1)
    for e in late["traceEvents"]:
        if e.get("name") == "gloo:all_reduce":
            e["ts"] += 100
            e["dur"] -= 100
    T.write(folder / "rank-1.json", late)
    return folder


def test_json_document_is_stable(tmp_path: Path) -> None:
    folder = _two_rank_traces(tmp_path)
    res = CliRunner().invoke(main, ["report", str(folder), "--json", "--out",
                                    str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc) == {"run", "ranks", "findings"}
    assert RUN_KEYS <= set(doc["run"])
    assert doc["run"]["schema_version"] == 1 and doc["run"]["kind"] == "traces"
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert RANK_KEYS <= set(r)
        assert set(r["idle_gaps"]["ms_by_cause"]) == {"data", "sync", "launch", "host", "other"}
    assert doc["run"]["collectives"]["matched_instances"] == 2
    for f in doc["findings"]:
        assert set(f) == FINDING_KEYS
        assert f["severity"] in ("high", "medium", "low")
    stakes = [f["time_at_stake_ms"] for f in doc["findings"]]
    assert stakes == sorted(stakes, reverse=True)
    # saved beside the derived tables for the dashboard
    saved = json.loads((tmp_path / "d" / "diagnosis.json").read_text())
    assert saved["findings"] == doc["findings"]
    for name in ("instances", "lateness", "gaps", "bandwidth", "unmatched"):
        assert (tmp_path / "d" / "diagnosis" / f"{name}.parquet").exists()


def test_no_traces_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["report", str(tmp_path / "empty")])
    assert res.exit_code == 1
    assert "no Kineto traces" in res.output


@pytest.mark.slow
def test_report_on_a_run_analyses_first_and_names_the_straggler(
        slow_compute_run: Path, tmp_path: Path) -> None:  # noqa: F811
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
    # self-contained: plotly's code inlined once, nothing fetched from elsewhere
    assert "plotly.js v" in text or "Plotly" in text
    assert not re.search(r"<script[^>]+src=", text)
    assert text.count("Plotly.newPlot") >= 4


@pytest.mark.slow
def test_calibrate_records_the_peak_in_the_run(slow_compute_run: Path,  # noqa: F811
                                               tmp_path: Path) -> None:
    import subprocess

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


def test_calibrate_needs_a_launcher(tmp_path: Path) -> None:
    run = tmp_path / "r"
    (run / "ranks").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    res = CliRunner().invoke(main, ["calibrate", str(run)])
    assert res.exit_code == 2 and "launcher" in res.output
