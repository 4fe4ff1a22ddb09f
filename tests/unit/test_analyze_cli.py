"""`uberprof analyze` and `uberprof.load`: output format, incremental re-analysis, read-only
inputs, the Python API."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas  # noqa: F401 - loaded before the in-process CLI runs: see keep_pandas_out
import pyarrow as pa
import pytest
from click.testing import CliRunner

import uberprof
from tests import _traces as T
from uberprof.cli import main

RANK_KEYS = {"rank", "steps", "idle_pct", "compute_pct", "non_compute_pct", "overlap_pct",
             "exposed_comm_pct", "step_time_ms"}


def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    res = CliRunner(env=env).invoke(main, ["analyze", *args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout, res.stderr


def make_folder(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    T.write(d / "rank-0.pt.trace.json.gz", T.gpu_step_trace(rank=0))
    T.write(d / "rank-1.pt.trace.json.gz", T.gpu_step_trace(rank=1))
    T.write(d / "rank-2.pt.trace.json", T.cpu_step_trace(rank=2))
    return d


def test_json_document_is_exactly_the_documented_shape(tmp_path: Path) -> None:
    d = make_folder(tmp_path)
    code, out, _ = run_cli(str(d), "--json", "--workers", "1")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"ranks", "problems"} and doc["problems"] == []
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2]
    for r in doc["ranks"]:
        assert set(r) == RANK_KEYS and set(r["step_time_ms"]) == {"median", "p90"}
        assert r["steps"] == 2
    assert doc["ranks"][0]["overlap_pct"] == 25.0 and doc["ranks"][0]["idle_pct"] == 13.33
    assert doc["ranks"][0]["step_time_ms"] == {"median": 1.0, "p90": 1.0}


def test_no_communication_means_null_overlap(tmp_path: Path) -> None:
    d = tmp_path / "t"
    T.write(d / "rank-0.json", T.trace([T.step(1, 0, 100), T.step(2, 100, 100),
                                        T.launch(1, 1), T.kernel(10, 50, 1),
                                        T.launch(101, 2), T.kernel(110, 50, 2)]))
    code, out, _ = run_cli(str(d), "--json", "--workers", "1")
    r = json.loads(out)["ranks"][0]
    assert code == 0 and r["overlap_pct"] is None and r["exposed_comm_pct"] == 0.0


def test_table_output_and_tables_on_disk(tmp_path: Path) -> None:
    d = make_folder(tmp_path)
    code, out, _ = run_cli(str(d), "--workers", "1")
    assert code == 0
    assert "rank" in out and "idle" in out and "cuda" in out and "cpu" in out
    assert max(len(line) for line in out.splitlines()[:6]) <= 80  # the table fits a terminal
    assert str(d / "derived") in out.replace("\n", "")
    for name in ("manifest.json", "summary.json", "steps.parquet", "ranks.parquet",
                 "collectives.parquet"):
        assert (d / "derived" / name).is_file(), name


def test_inputs_already_analysed_are_skipped(tmp_path: Path) -> None:
    d = make_folder(tmp_path)
    assert run_cli(str(d), "--workers", "1")[0] == 0
    manifest = d / "derived" / "manifest.json"
    before = json.loads(manifest.read_text())
    code, out, _ = run_cli(str(d), "--workers", "1")
    assert code == 0 and "0 read now" in out and "3 unchanged" in out
    # a rewritten trace (new size/mtime) is read again, alone
    T.write(d / "rank-1.pt.trace.json.gz", T.gpu_step_trace(rank=1, t0=5000))
    code, out, _ = run_cli(str(d), "--workers", "1", "--json")
    assert code == 0
    after = json.loads(manifest.read_text())
    changed = {k for k in after["inputs"] if after["inputs"][k] != before["inputs"][k]}
    assert changed == {"rank-1.pt.trace.json.gz"}
    code, out, _ = run_cli(str(d), "--workers", "1", "--force")
    assert "3 read now" in out


def test_out_option_and_read_only_input(tmp_path: Path) -> None:
    d = make_folder(tmp_path)
    code, out, _ = run_cli(str(d), "--workers", "1", "--json", "--out", str(tmp_path / "o"))
    assert code == 0 and (tmp_path / "o" / "summary.json").is_file()
    assert not (d / "derived").exists()
    ro = tmp_path / "ro"
    make_folder(ro)
    for p in [ro / "traces", *(ro / "traces").iterdir()]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        before = sorted(p.name for p in (ro / "traces").iterdir())
        code, out, err = run_cli(str(ro / "traces"), "--workers", "1", "--json",
                                 env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
        assert code == 0 and len(json.loads(out)["ranks"]) == 3
        assert "read-only" in err
        assert sorted(p.name for p in (ro / "traces").iterdir()) == before  # nothing written
        assert list((tmp_path / "cache" / "uberprof" / "derived").iterdir())
    finally:
        for p in [ro / "traces", *(ro / "traces").iterdir()]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_single_file_path(tmp_path: Path) -> None:
    f = T.write(tmp_path / "x" / "rank-5.pt.trace.json", T.gpu_step_trace(rank=None))
    code, out, _ = run_cli(str(f), "--json", "--workers", "1")
    assert code == 0 and [r["rank"] for r in json.loads(out)["ranks"]] == [5]


def test_parallel_and_serial_agree(tmp_path: Path) -> None:
    d = make_folder(tmp_path)
    _, a, _ = run_cli(str(d), "--json", "--workers", "1", "--out", str(tmp_path / "a"))
    _, b, _ = run_cli(str(d), "--json", "--workers", "3", "--out", str(tmp_path / "b"))
    assert json.loads(a) == json.loads(b)


def test_python_api(tmp_path: Path) -> None:
    d = make_folder(tmp_path)
    run = uberprof.load(d, workers=1)
    assert run.ranks == [0, 1, 2] and run.problems == []
    steps = run.steps()
    assert list(steps["step"][steps["rank"] == 0]) == [1, 2]
    assert (steps["window_ns"] == steps["compute_ns"] + steps["exposed_comm_ns"]
            + steps["memory_ns"] + steps["idle_ns"]).all()
    assert isinstance(run.steps(rank=2, format="arrow"), pa.Table)
    b = run.breakdown()
    assert list(b["mode"]) == ["device", "device", "cpu"]
    ev = run.events(2)
    gl = ev[ev["kind"] == "host_comm"]
    assert list(gl["in_bytes"]) == [4000, 8000] and set(gl["step"]) == {1, 2}
    assert run.events(0, format="arrow").schema.field("ts").type == pa.int64()
    coll = run.collectives(rank=0)
    assert list(coll["name"]) == ["allreduce"] and list(coll["in_bytes"]) == [4000]
    assert run.summary()["ranks"][0]["rank"] == 0
    with pytest.raises(KeyError):
        run.events(7)


def test_import_uberprof_stays_cheap() -> None:
    code = ("import sys, uberprof; heavy = [m for m in ('pyarrow', 'numpy', 'pandas', 'msgspec',"
            " 'duckdb', 'uberprof.loader', 'uberprof.analysis') if m in sys.modules];"
            " print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": ""}).stdout
    assert out.strip() == "[]"




def test_run_without_traces_gives_step_times(tmp_path: Path) -> None:
    """A run recorded with --no-trace: step times from the step timeline, no breakdown."""
    run = tmp_path / "run"
    (run / "ranks" / "0").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r"}))
    (run / "ranks" / "0" / "rank.json").write_text(json.dumps({"rank": 0}))
    rows = [{"kind": "step", "step": i, "host_start_ns": 10**18 + i * 10**8,
             "host_end_ns": 10**18 + (i + 1) * 10**8, "data_wait_ns": 5} for i in range(5)]
    (run / "ranks" / "0" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = run_cli(str(run), "--json", "--workers", "1")
    doc = json.loads(out)
    assert code == 0
    assert doc["ranks"] == [{"rank": 0, "steps": 5, "idle_pct": None, "compute_pct": None,
                             "non_compute_pct": None, "overlap_pct": None,
                             "exposed_comm_pct": None,
                             "step_time_ms": {"median": 100.0, "p90": 100.0}}]
    assert "--no-trace" in doc["problems"][0]
