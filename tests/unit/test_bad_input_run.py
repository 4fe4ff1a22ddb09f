"""Bad run directories (issue 13, items 5, 6, 7 and 13): every command names what `info` knows,
never mixes two jobs' data, never shows a traceback, and never turns an impossible number into
a figure. Run in-process on small synthetic runs built like `uberprof run` writes them."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pandas  # noqa: F401 - loaded before the in-process CLI runs: see keep_pandas_out
import pytest
from click.testing import CliRunner
from rich.console import Console

from tests import _traces as T
from uberprof.cli import main
from uberprof.inventory import inventory
from uberprof.rundir import RunDir, claim_dir, read_step_timeline, step_row_problem

STEP_NS = 1_000_000  # the synthetic trace's steps: 1000 µs each, starting 1000 µs after base
WINDOW = "steps-000001-000002.pt.trace.json.gz"


def make_run(root: Path, world: int = 2, job: str = "job", shift_ns: int = 0,
             steps: int = 4, traced: bool = True, finished: bool = True) -> Path:
    """A run directory as `uberprof run` leaves it: run.json, and per rank rank.json, a step
    timeline of `steps` steps and (`traced`) a trace window of steps 1-2 (Gloo, on CPU).
    A second call on the same root adds a second job's folders (`0-2`, `1-2`, ...)."""
    run = RunDir(root)
    run.create(job)
    base = T.BASE_NS + shift_ns
    for r in range(world):
        rd = claim_dir(run.ranks_dir, str(r))
        meta = {"rank": r, "world_size": world, "local_rank": r, "host": "h", "node": "h",
                "pid": 100 + r, "backend": "gloo", "job_id": job, "start_ns": base,
                "trace": {"schedule": "steps 1-2", "disabled_reason": None,
                          "windows": [[1, 2]] if traced else []}}
        if finished:
            meta["end_ns"] = base + (steps + 2) * STEP_NS
        (rd / "rank.json").write_text(json.dumps(meta))
        rows = [{"kind": "step", "step": s, "host_start_ns": base + s * STEP_NS,
                 "host_end_ns": base + (s + 1) * STEP_NS, "data_wait_ns": 1000}
                for s in range(steps)]
        (rd / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        if traced:
            T.write(rd / "traces" / WINDOW, T.cpu_step_trace(rank=r, base_ns=base))
    return root


def cli(*args: str) -> tuple[int, str, str]:
    """A command in this process: (exit code, stdout, stderr); fails on a traceback or a
    warning (numpy's RuntimeWarnings included)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = CliRunner().invoke(main, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), \
        f"{args}: traceback\n{res.output}"
    assert "Traceback" not in res.stdout + res.stderr
    noisy = [w for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert not noisy, [str(w.message) for w in noisy]
    return res.exit_code, res.stdout, res.stderr


def analyze_json(path: Path) -> dict[str, Any]:
    code, out, err = cli("analyze", str(path), "--json", "--workers", "1")
    assert code == 0, err
    return json.loads(out)


def report_json(path: Path) -> tuple[int, dict[str, Any]]:
    code, out, _ = cli("report", str(path), "--json", "--workers", "1")
    return code, json.loads(out)


def export_notes(path: Path, out: Path) -> tuple[int, str]:
    code, _, err = cli("export", str(path), "-o", str(out), "--workers", "1")
    return code, err


def dashboard_problems(path: Path) -> list[str]:
    from dashboards.data import RunData

    return RunData(root=path, workers=1).load().problems


def one(problems: list[str], *words: str) -> str:
    hits = [p for p in problems if all(w in p for w in words)]
    assert len(hits) == 1, (words, problems)
    return hits[0]


# --- item 5: missing and duplicate ranks --------------------------------------------------------

def test_a_missing_rank_is_named_by_every_command(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    for p in (run / "ranks" / "1").rglob("*"):
        p.unlink() if p.is_file() else None
    for d in sorted((run / "ranks" / "1").rglob("*"), reverse=True):
        d.rmdir()
    (run / "ranks" / "1").rmdir()
    said = "missing ranks: 1 of a world of 2"
    one(analyze_json(run)["problems"], said)
    code, rep = report_json(run)
    assert code == 0 and rep["run"]["ranks"] == [0]
    assert rep["run"]["world_size"] == 2  # the job's, not the ranks that are left
    one(rep["run"]["problems"], said)
    code, err = export_notes(run, tmp_path / "out.json")
    assert code == 0 and said in err
    one(dashboard_problems(run), said)
    _, text, _ = cli("report", str(run), "--workers", "1")
    assert "1 of 2 rank(s)" in text


def test_two_jobs_under_one_run_id_are_never_mixed(tmp_path: Path) -> None:
    """Job B ran an hour after job A with the same --run-id: its folders are 0-2 and 1-2."""
    run = make_run(tmp_path / "run", job="same", steps=4)
    make_run(run, job="same", steps=6, shift_ns=3600 * 10**9)
    doc = analyze_json(run)
    assert [(r["rank"], r["steps"]) for r in doc["ranks"]] == [(0, 4), (1, 4)]  # job A only
    for r in (0, 1):
        said = one(doc["problems"], f"rank {r} appears 2 times")
        assert said.endswith(f"{run / 'ranks' / f'{r}-2'} left out")
    code, rep = report_json(run)
    assert code == 0 and [x["steps"] for x in rep["ranks"]] == [4, 4]
    assert rep["run"]["analysed_steps"] == [1, 2]
    assert rep["run"]["analysed_wall_ms"] < 10  # one job's two steps, not an hour apart
    one(rep["run"]["problems"], "rank 1 appears 2 times")
    code, err = export_notes(run, tmp_path / "out.json")
    assert code == 0 and "rank 0 appears 2 times" in err
    one(dashboard_problems(run), "rank 0 appears 2 times")


# --- item 6: tracebacks instead of a message ----------------------------------------------------

@pytest.mark.parametrize("raw,words", [
    ("[1, 2]", "not a JSON object"),
    ('"rank"', "not a JSON object"),
    (json.dumps({"rank": 10**30, "world_size": 2}), f"rank {10**30} is not a rank number"),
    (json.dumps({"rank": 1, "world_size": 10**30, "host": "\ud800", "clock": [1]}), None),
], ids=["list", "string", "huge-rank", "huge-world-and-surrogate-host"])
def test_rank_json_that_is_not_what_it_should_be(tmp_path: Path, raw: str,
                                                 words: str | None) -> None:
    run = make_run(tmp_path / "run")
    (run / "ranks" / "1" / "rank.json").write_text(raw)
    for doc in (analyze_json(run), report_json(run)[1]):
        ranks = [r["rank"] for r in doc["ranks"]]
        assert ranks == [0, 1]  # rank 1 from its folder's name
        problems = doc["problems"] if "problems" in doc else doc["run"]["problems"]
        if words:
            one(problems, str(run / "ranks" / "1" / "rank.json"), words)
    code, _, _ = cli("info", str(run))
    assert code == 0
    assert export_notes(run, tmp_path / "out.json")[0] == 0
    dashboard_problems(run)


def test_steps_jsonl_rows_that_are_not_objects(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=6)
    path = run / "ranks" / "1" / "steps.jsonl"
    with path.open("a") as f:
        f.write("[1, 2]\n\"step\"\n7\n")
    timeline_named(run, [6, 6], f"{path}: 3 row(s) left out (not a JSON object: 3)")


def timeline_named(run: Path, steps: list[int], said: str) -> None:
    """analyze keeps `steps` steps per rank, and it and info name the rows left out."""
    doc = analyze_json(run)
    assert [r["steps"] for r in doc["ranks"]] == steps
    one(doc["problems"], said)
    _, out, _ = cli("info", "--json", str(run))
    one(json.loads(out)["problems"], said)


def non_utf8(folder: Path, name: bytes, content: bytes = b"{}") -> Path:
    p = os.fsencode(folder) + b"/" + name
    with open(p, "wb") as f:
        f.write(content)
    return Path(os.fsdecode(p))


def test_a_file_name_that_is_not_utf8_beside_the_traces(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    T.write(folder / "rank-0.pt.trace.json.gz", T.cpu_step_trace(rank=0))
    T.write(folder / "rank-1.pt.trace.json.gz", T.cpu_step_trace(rank=1))
    non_utf8(folder, b"rank-2\xff.pt.trace.json",
             gzip.decompress(gzip.compress(json.dumps(T.cpu_step_trace(rank=2)).encode())))
    said = "rank-2\\xff.pt.trace.json: the file name is not valid UTF-8; left out"
    doc = analyze_json(folder)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    one(doc["problems"], said)
    code, rep = report_json(folder)
    assert code == 0 and rep["run"]["ranks"] == [0, 1]
    one(rep["run"]["problems"], said)
    code, err = export_notes(folder, tmp_path / "out.json")
    assert code == 0 and said in err
    one(dashboard_problems(folder), said)


def test_a_rank_folder_whose_name_is_not_utf8(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    os.rename(os.fsencode(run / "ranks" / "1"), os.fsencode(run / "ranks") + b"/1-\xff")
    doc = analyze_json(run)
    assert [r["rank"] for r in doc["ranks"]] == [0]
    one(doc["problems"], "1-\\xff: the folder name is not valid UTF-8")
    one(doc["problems"], "missing ranks: 1 of a world of 2")
    code, rep = report_json(run)
    assert code == 0 and rep["run"]["ranks"] == [0]
    assert export_notes(run, tmp_path / "out.json")[0] == 0
    code, out, _ = cli("info", str(run))
    assert code == 0 and "not valid UTF-8" in out


def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "sub" / "x"  # a file where a folder should be
    code, _, err = cli("export", str(run), "-o", f"{out}.json", "--workers", "1")
    assert err == f"uberprof export: cannot write {out}.json: {blocker} is not a folder\n"
    assert code == 1
    code, _, err = cli("report", str(run), "--html", f"{out}.html")
    assert code == 1 and f"cannot write {out}.html: no folder {out.parent}" in err
    assert not (run / "derived").exists()  # refused before any analysis
    code, _, err = cli("report", str(run), "--html", str(tmp_path / "nowhere" / "x.html"))
    assert code == 1 and "no folder" in err


def test_export_still_makes_the_folders_of_its_output(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    code, _, err = cli("export", str(run), "-o", str(tmp_path / "new" / "x.json"),
                       "--workers", "1")
    assert code == 0 and (tmp_path / "new" / "x.json.gz").is_file(), err


def test_an_output_that_fails_while_written_is_one_line(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A place that looks writable but is not (a read-only mount, /proc): caught at the write."""
    for name in ("uberprof.cli.export", "uberprof.cli.report"):  # the modules, not commands
        monkeypatch.setattr(sys.modules[name], "unwritable", lambda *_, **__: None)
    run = make_run(tmp_path / "run")
    (tmp_path / "nowhere").write_text("")
    out = tmp_path / "nowhere" / "x"
    code, _, err = cli("export", str(run), "-o", f"{out}.json", "--workers", "1")
    assert code == 1 and f"cannot write {out}.json: " in err
    code, text, err = cli("report", str(run), "--html", f"{out}.html", "--workers", "1")
    assert code == 1 and f"cannot write {out}.html: Not a directory" in err
    assert "uberprof report" in text  # the report itself is still printed


# --- item 7: huge numbers -----------------------------------------------------------------------

def mutate_trace(path: Path, **values: Any) -> None:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = next(e for e in doc["traceEvents"] if e.get("name") == "aten::mm")
    ev.update(values)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


@pytest.mark.parametrize("values", [{"ts": 1e19}, {"ts": 10**30}, {"ts": -1e19},
                                    {"dur": 1e19}, {"ts": 1e15}],
                         ids=["ts-float", "ts-int", "ts-negative", "dur", "ts-years-away"])
def test_event_times_out_of_range_are_left_out_and_named(tmp_path: Path,
                                                         values: dict[str, Any]) -> None:
    good = analyze_json(make_run(tmp_path / "good"))
    run = make_run(tmp_path / "run")
    trace = run / "ranks" / "1" / "traces" / WINDOW
    mutate_trace(trace, **values)
    doc = analyze_json(run)
    one(doc["problems"], str(trace), "1 event(s) with a time out of range left out")
    bad = {r["rank"]: r for r in doc["ranks"]}
    assert bad[0] == good["ranks"][0]
    assert bad[1]["step_time_ms"] == good["ranks"][1]["step_time_ms"]
    assert bad[1]["idle_pct"] < 100
    code, rep = report_json(run)
    assert code == 0 and all(x["step_time_ms"]["median"] > 0 for x in rep["ranks"])
    assert export_notes(run, tmp_path / "out.json")[0] == 0


def test_a_trace_whose_every_time_is_out_of_range_is_named(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    trace = run / "ranks" / "1" / "traces" / WINDOW
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    doc["baseTimeNanoseconds"] = 10**30
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    doc = analyze_json(run)
    one(doc["problems"], str(trace), "no usable timed events")
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]  # rank 1: its step timeline


def test_an_overflowing_step_row_costs_only_that_row(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=6)
    path = run / "ranks" / "1" / "steps.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[4]["host_end_ns"] = 10**30
    rows[5]["data_wait_ns"] = -5
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    timeline_named(run, [6, 4], f"{path}: 2 row(s) left out (host_end_ns out of range: 1; "
                                "data_wait_ns out of range: 1)")
    assert dashboard_problems(run)


@pytest.mark.parametrize("row,why", [
    ({"kind": "step", "step": 1, "host_start_ns": 5}, None),
    ({"kind": "step", "step": 1, "host_start_ns": 2**63}, "host_start_ns out of range"),
    ({"kind": "step", "step": 1, "host_start_ns": 9, "host_end_ns": 5},
     "host_end_ns before host_start_ns"),
    ({"kind": "step", "step": 2**60}, "step is not a step number"),
    ({"kind": "step", "step": 1, "x": float("inf")}, "x is not a finite number"),
    ({"kind": "gpu", "step": 1, "gpu_mem_bytes": -1}, "gpu_mem_bytes out of range"),
    ({"kind": "step"}, "no step number"),
    ([1], "not a JSON object"),
])
def test_step_row_rule(row: Any, why: str | None) -> None:
    assert step_row_problem(row) == why


def test_step_timeline_counts_what_it_left_out(tmp_path: Path) -> None:
    (tmp_path / "steps.jsonl").write_text('{"kind": "step", "step": 0}\n[1]\n[2]\n')
    t = read_step_timeline(tmp_path)
    assert t.steps == [{"step": 0}] and t.skipped == {"not a JSON object": 2}
    assert t.problem(tmp_path / "steps.jsonl") == \
        f"{tmp_path / 'steps.jsonl'}: 2 row(s) left out (not a JSON object: 2); the other " \
        "steps are kept"


# --- item 11 (report part) and 13: wording ------------------------------------------------------

def test_report_with_no_rank_analysed_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", world=1)
    (run / "ranks" / "0" / "steps.jsonl").unlink()
    (run / "ranks" / "0" / "traces" / WINDOW).write_bytes(b"garbage")
    code, text, _ = cli("report", str(run), "--html", str(tmp_path / "r.html"))
    assert code == 1
    assert "Nothing could be analysed" in text and "No findings" not in text
    html = (tmp_path / "r.html").read_text()
    assert "Nothing could be analysed" in html and "No findings" not in html


@pytest.mark.parametrize("finished,words", [
    (False, ("the job stopped abruptly (crashed or killed) after 4 step(s), before its trace "
             "window (steps 1-2); to get a trace, choose steps it reaches with --trace-steps, "
             "e.g. --trace-steps 1-3")),
    (True, "the job ended after 4 step(s), before its trace window (steps 1-2)"),
])
def test_a_run_that_never_reached_its_window_is_not_called_no_trace(
        tmp_path: Path, finished: bool, words: str) -> None:
    run = make_run(tmp_path / "run", traced=False, finished=finished)
    doc = analyze_json(run)
    said = one(doc["problems"], "no trace window in this run")
    assert words in said and "--no-trace?" not in said
    _, text, _ = cli("report", str(run))
    assert "--no-trace?" not in text


def test_a_job_still_running_before_its_window_is_not_called_crashed(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", traced=False, finished=False)
    node = run / "nodes" / "h"  # its node has started and not ended: the job runs
    node.mkdir(parents=True)
    (node / "node.json").write_text(json.dumps({"host": "h", "start_ns": T.BASE_NS}))
    said = one(analyze_json(run)["problems"], "no trace window in this run")
    assert "the job is still running (or its launcher was killed) after 4 step(s)" in said
    assert "crashed" not in said


def test_a_run_with_tracing_off_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", traced=False)
    for r in (0, 1):
        p = run / "ranks" / str(r) / "rank.json"
        meta = json.loads(p.read_text())
        meta["trace"] = {"schedule": "off", "disabled_reason": None}
        p.write_text(json.dumps(meta))
    one(analyze_json(run)["problems"], "tracing was off (--no-trace)")


def test_bandwidth_evidence_without_a_peak(tmp_path: Path) -> None:
    from uberprof.analysis.diagnosis.findings.bandwidth import evidence_sentence
    from uberprof.analysis.diagnosis.model import Finding

    f = Finding(kind="bandwidth", severity="low", title="t", ranks=[0], steps=[1],
                cause=None, time_at_stake_ms=1.0,
                evidence={"instances": 3, "busbw_gbit_s": 4.9, "peak_gbit_s": None,
                          "peak_source": None, "exposed_pct": 1.0, "transfer_ms": 2.0},
                remedy="r")
    line = evidence_sentence(f)
    assert "None" not in line and "no peak known" in line


def test_report_tables_are_never_cut_when_piped(tmp_path: Path) -> None:
    """A file or a pipe is no terminal: rich would assume 80 columns and cut the tables."""
    from uberprof.analysis.diagnosis.saved import load_or_diagnose
    from uberprof.analysis.tables.context import load_context
    from uberprof.present.report_terminal import render_report

    run = make_run(tmp_path / "run")
    d = load_or_diagnose(load_context(run, workers=1))
    d.top_gaps = [{"rank": 1, "step": 12345678, "dur_ns": 123456789012, "cause": "host",
                   "before": "aten::a_long_operator_name_1234", "after": "aten::another_op_x",
                   "host": "annotation: Optimizer.step#AdamW.step"}]
    buf = io.StringIO()
    render_report(d, Console(file=buf, width=80))
    text = buf.getvalue()
    assert "…" not in text
    row = next(line for line in text.splitlines() if "12345678" in line)
    assert "123456.79" in row and "aten::a_long_operator_name_1234" in row
    assert "annotation: Optimizer.step#AdamW.step" in row and len(row) > 80


def test_info_names_a_trace_window_that_was_still_being_written_when_a_rank_stopped(
        tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", finished=False, steps=6)
    meta_file = run / "ranks" / "1" / "rank.json"
    meta = json.loads(meta_file.read_text())
    meta["trace"]["exporting"] = [4, 5]  # the agent's record before the export of 4-5 began
    meta_file.write_text(json.dumps(meta))
    inv = inventory([run])
    [lost] = [p for p in inv["problems"] if "steps 4-5" in p]
    assert lost.startswith("rank 1: the trace of steps 4-5 was being written")
    assert {r["rank"]: r["trace_exporting"] for r in inv["ranks"]} == {0: None, 1: [4, 5]}
    # a window whose trace was written after all is no problem
    meta["trace"]["exporting"] = [1, 2]
    meta_file.write_text(json.dumps(meta))
    assert not [p for p in inventory([run])["problems"] if "being written" in p]
