"""`uberprof report` and `uberprof calibrate` from the command line: the terminal report, the
stable JSON document, on synthetic traces. On a real run (analysis on demand, the HTML file,
the calibration): tests/jobs/test_report_cli_jobs.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tests import _traces as T
from uberprof.cli import main

FINDING_KEYS = {"kind", "severity", "title", "ranks", "steps", "cause", "time_at_stake_ms",
                "evidence", "remedy", "confidence", "observed_ms", "own_pct", "caused_by",
                "projected_gain", "projected_gain_why", "role", "page", "evidence_sentence",
                "details", "accounts_for"}
RANK_KEYS = {"rank", "host", "mode", "device_type", "steps", "step_time_ms", "breakdown_pct",
             "analysed", "idle_gaps", "lateness_ms", "exposed_comm", "accounted"}
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
        assert set(r["idle_gaps"]["ms_by_cause"]) == {"data", "sync", "launch", "host", "other",
                                                      "warmup"}
    assert doc["run"]["collectives"]["matched_instances"] == 2
    for f in doc["findings"]:
        assert set(f) == FINDING_KEYS
        assert f["severity"] in ("high", "medium", "low")
    # one ranking: by severity, then the projected gain (or the time at stake where no change
    # models the finding) on one scale
    sev = {"high": 0, "medium": 1, "low": 2}
    keys = [(sev[f["severity"]], -((f["projected_gain"] or {}).get("gain_ms") or 0.0)
             if f["projected_gain"] is not None else -f["time_at_stake_ms"])
            for f in doc["findings"]]
    assert keys == sorted(keys)
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


def test_calibrate_needs_a_launcher(tmp_path: Path) -> None:
    run = tmp_path / "r"
    (run / "ranks").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    res = CliRunner().invoke(main, ["calibrate", str(run)])
    assert res.exit_code == 2 and "launcher" in res.output


def test_every_report_document_has_the_same_run_fields_problems_under_run(tmp_path: Path
                                                                          ) -> None:
    """One builder (analysis/diagnosis/document.py): a path with nothing to diagnose and a run
    directory that crashed before its trace window give the same `run` fields as a full report,
    with `run_id`, `clock_alignment` and the problems under `run` (docs/json.md)."""
    from tests.unit.test_hangs_units import _crashed_before_its_traces

    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(main, ["report", str(empty), "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert set(doc) == {"run", "ranks", "findings"}
    assert RUN_KEYS <= set(doc["run"]) and doc["findings"] == [] and doc["ranks"] == []
    assert doc["run"]["problems"] and str(empty) in doc["run"]["path"]

    run = _crashed_before_its_traces(tmp_path)
    res = CliRunner().invoke(main, ["report", str(run.root), "--json"])
    doc = json.loads(res.stdout)
    assert RUN_KEYS <= set(doc["run"]) and set(doc) == {"run", "ranks", "findings"}
    assert doc["run"]["run_id"] == "r" and doc["run"]["kind"] == "run"
    assert doc["run"]["clock_alignment"] is not None and doc["run"]["problems"]
    assert doc["findings"][0]["kind"] == "crash"
