"""Bad input: a clear message naming the file and the problem, the other ranks still analysed,
and a non-zero exit only when nothing could be analysed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas  # noqa: F401 - loaded before the in-process CLI runs: see keep_pandas_out
import pytest
from click.testing import CliRunner

from tests import _traces as T
from uberprof.cli import main


def analyze_json(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    res = CliRunner().invoke(main, ["analyze", str(path), "--json", "--workers", "1",
                                    "--out", str(path.parent / (path.name + "-derived")), *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, json.loads(res.stdout)


def folder_with_good_rank(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    T.write(d / "rank-0.pt.trace.json.gz", T.gpu_step_trace(rank=0))
    return d


def assert_one_problem(doc: dict[str, Any], bad: Path, *words: str) -> None:
    hits = [p for p in doc["problems"] if str(bad) in p]
    assert len(hits) == 1, doc["problems"]
    for w in words:
        assert w in hits[0], hits[0]


def test_truncated_gzip(tmp_path: Path) -> None:
    d = folder_with_good_rank(tmp_path)
    data = gzip.compress(json.dumps(T.gpu_step_trace(rank=1)).encode())
    bad = d / "rank-1.pt.trace.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    code, doc = analyze_json(d)
    assert code == 0 and [r["rank"] for r in doc["ranks"]] == [0]
    assert_one_problem(doc, bad, "truncated gzip")


def test_invalid_json(tmp_path: Path) -> None:
    d = folder_with_good_rank(tmp_path)
    bad = T.write(d / "rank-1.json", '{"traceEvents": [{"ph": "X", "ts": 1,,}]}')
    code, doc = analyze_json(d)
    assert code == 0 and [r["rank"] for r in doc["ranks"]] == [0]
    assert_one_problem(doc, bad, "invalid JSON")


@pytest.mark.parametrize("content,words", [
    (b"", ("empty file",)),
    (b"   \n", ("empty file",)),
    ({"traceEvents": []}, ("no trace events",)),
    ({"schemaVersion": 1, "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "i", "name": "Iteration Start", "pid": 1, "tid": 0, "ts": 5}]},
     ("only metadata",)),
], ids=["empty", "blank", "no-events", "metadata-only"])
def test_empty_and_metadata_only(tmp_path: Path, content: Any, words: tuple[str, ...]) -> None:
    d = folder_with_good_rank(tmp_path)
    bad = T.write(d / "rank-1.json", content)
    code, doc = analyze_json(d)
    assert code == 0 and [r["rank"] for r in doc["ranks"]] == [0]
    assert_one_problem(doc, bad, *words)


def test_missing_rank(tmp_path: Path) -> None:
    d = folder_with_good_rank(tmp_path)
    bad = T.write(d / "host_1234.1700000000.pt.trace.json", T.gpu_step_trace(rank=None))
    code, doc = analyze_json(d)
    assert code == 0 and [r["rank"] for r in doc["ranks"]] == [0]
    assert_one_problem(doc, bad, "cannot tell which rank")


def test_missing_rank_everywhere_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    a = T.write(d / "a.json", T.gpu_step_trace(rank=None))
    b = T.write(d / "b.json", T.gpu_step_trace(rank=None))
    code, doc = analyze_json(d)
    assert code == 1 and doc["ranks"] == []
    assert_one_problem(doc, a, "cannot tell which rank")
    assert_one_problem(doc, b, "cannot tell which rank")


def test_duplicate_ranks(tmp_path: Path) -> None:
    d = folder_with_good_rank(tmp_path)
    T.write(d / "rank-1.json", T.gpu_step_trace(rank=1))
    dup = T.write(d / "rank-1-copy.json", T.gpu_step_trace(rank=1))
    code, doc = analyze_json(d)
    assert code == 0 and [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert_one_problem(doc, dup, "duplicate rank 1")


def test_one_rank_in_several_windows_is_not_a_duplicate(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    T.write(d / "worker0.1.pt.trace.json", T.gpu_step_trace(rank=0))
    T.write(d / "worker0.2.pt.trace.json", T.gpu_step_trace(rank=0, t0=50_000))
    code, doc = analyze_json(d)
    assert code == 0 and doc["problems"] == []
    assert doc["ranks"][0]["steps"] == 2  # steps 1 and 2 of the first window; the second
    # window repeats the numbers 1 and 2, which are kept once


def test_negative_durations(tmp_path: Path) -> None:
    d = folder_with_good_rank(tmp_path)
    doc1 = T.gpu_step_trace(rank=1)
    doc1["traceEvents"].append(T.kernel(1500, -40, 99))
    doc1["traceEvents"].append(T.op(1200, -3))
    bad = T.write(d / "rank-1.json", doc1)
    code, doc = analyze_json(d)
    assert code == 0 and [r["rank"] for r in doc["ranks"]] == [0, 1]  # rank 1 still analysed
    assert_one_problem(doc, bad, "2 events with a negative duration dropped")


def test_unknown_accelerator(tmp_path: Path) -> None:
    d = folder_with_good_rank(tmp_path)
    ev = [T.step(1, 0, 100), T.step(2, 100, 100),
          {"ph": "X", "cat": "npu_kernel", "name": "matmul_npu", "pid": 0, "tid": 3,
           "ts": 10, "dur": 50, "args": {"device": 0, "stream": 3}},
          {"ph": "X", "cat": "npu_kernel", "name": "add_npu", "pid": 0, "tid": 3,
           "ts": 110, "dur": 20, "args": {"device": 0, "stream": 3}}]
    bad = T.write(d / "rank-1.json", T.trace(ev, rank=1))
    code, doc = analyze_json(d)
    assert code == 0 and [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert_one_problem(doc, bad, "'npu_kernel' (2)", "unknown accelerator")
    r1 = doc["ranks"][1]
    assert r1["compute_pct"] == 100.0  # counted as compute, as the message says


def test_not_a_trace_json(tmp_path: Path) -> None:
    d = folder_with_good_rank(tmp_path)
    bad = T.write(d / "rank-1.json", [1, 2, 3])
    code, doc = analyze_json(d)
    assert code == 0
    assert_one_problem(doc, bad, "no trace events")


def test_nothing_analysable_exits_non_zero(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    a = T.write(d / "rank-0.json", b"")
    b = d / "rank-1.json.gz"
    b.write_bytes(b"\x1f\x8b\x08\x00garbage")  # a gzip header, then nothing valid
    code, doc = analyze_json(d)
    assert code == 1 and doc["ranks"] == []
    assert_one_problem(doc, a, "empty file")
    assert_one_problem(doc, b, "gzip")


def test_no_traces_at_all(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, doc = analyze_json(tmp_path / "empty")
    assert code == 1 and "no Kineto traces" in doc["problems"][0]


def test_bad_input_in_a_run_directory_via_the_pool(tmp_path: Path) -> None:
    """The same messages come back from worker processes (the default parallel path)."""
    run = tmp_path / "run"
    (run / "run.json").parent.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r"}))
    for rank in range(3):
        (run / "ranks" / str(rank)).mkdir(parents=True)
        (run / "ranks" / str(rank) / "rank.json").write_text(json.dumps({"rank": rank}))
        T.write(run / "ranks" / str(rank) / "traces" / "steps-000001-000002.pt.trace.json.gz",
                T.cpu_step_trace(rank=None))
    bad = run / "ranks" / "2" / "traces" / "steps-000001-000002.pt.trace.json.gz"
    bad.write_bytes(bad.read_bytes()[:40])
    res = CliRunner().invoke(main, ["analyze", str(run), "--json", "--workers", "2"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert_one_problem(doc, bad, "truncated gzip")


def test_a_worker_that_dies_costs_only_its_input(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace whose analysis kills its process (out of memory, a crash) is reported; the other
    ranks are analysed (each input runs in its own forked process)."""
    import os
    import signal

    from uberprof.analysis.tables import pool

    d = folder_with_good_rank(tmp_path)
    T.write(d / "rank-1.pt.trace.json.gz", T.gpu_step_trace(rank=1))
    bad = T.write(d / "rank-2.pt.trace.json.gz", T.gpu_step_trace(rank=2))
    real = pool.analyze_input

    def dies_on_rank_2(path: str, out: str) -> dict[str, Any]:
        if path == str(bad):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, out)

    monkeypatch.setattr(pool, "analyze_input", dies_on_rank_2)
    res = CliRunner().invoke(main, ["analyze", str(d), "--json", "--workers", "2"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert_one_problem(doc, bad, "died (signal 9)")
