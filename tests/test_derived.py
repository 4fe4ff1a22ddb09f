"""The derived folder (issue 13 items 0 and 4): what it stores reads the same from any working
directory, commands work from anywhere and fail loudly when they lose all their data, and
analyses of one run at once all succeed."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import uberprof
from tests._diag_runs import healthy_run  # noqa: F401
from tests.jobs import PY, job_env
from uberprof.analysis.tables import derived as D
from uberprof.cli import main

RANKS = [0, 1, 2, 3]


def _copy(run: Path, dst: Path) -> Path:
    """A private copy of a session run, without its tables."""
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("derived"))
    return dst


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`uberprof ARGS` in its own process, run from `cwd` (which is not the repository)."""
    env = job_env(PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([PY, "-m", "uberprof", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=env, check=False)


def _ranks_in_export(path: Path) -> set[int]:
    """Ranks with trace events (complete events of the rank's own process) in an export."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return {e["pid"] for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") != "uberprof" and e.get("pid") in RANKS}


def _manifest(run: Path) -> dict[str, Any]:
    return orjson.loads((run / "derived" / D.MANIFEST_FILE).read_bytes())


@pytest.fixture
def places(healthy_run: Path, tmp_path: Path) -> tuple[Path, Path, Path]:  # noqa: F811
    """(a working directory, a run under it as runs/r, an unrelated working directory)."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _copy(healthy_run, work / "runs" / "r")
    return work, run, elsewhere


def test_every_command_works_from_any_directory(places: tuple[Path, Path, Path]) -> None:
    """The first analysis runs with a path relative to one directory; then every command runs
    from another, with a relative and with an absolute path, and its output holds every rank."""
    work, run, elsewhere = places
    first = _cli(work, "analyze", "runs/r", "--json")
    assert first.returncode == 0, first.stderr
    assert [r["rank"] for r in json.loads(first.stdout)["ranks"]] == RANKS

    m = _manifest(run)
    for section in ("inputs", "timelines"):
        assert m[section]
        for rel, e in m[section].items():
            assert e["path"] == rel and (run / rel).exists(), e  # relative to the run

    for path in (str(run), os.path.relpath(run, elsewhere)):
        res = _cli(elsewhere, "analyze", path, "--json")
        assert res.returncode == 0, res.stderr
        assert [r["rank"] for r in json.loads(res.stdout)["ranks"]] == RANKS

        res = _cli(elsewhere, "report", path, "--json")
        assert res.returncode == 0, res.stderr
        assert [r["rank"] for r in json.loads(res.stdout)["ranks"]] == RANKS

        out = elsewhere / f"export-{len(path)}.json"
        res = _cli(elsewhere, "export", path, "-o", str(out.name))
        assert res.returncode == 0, res.stderr
        assert "cannot read" not in res.stderr and "left out" not in res.stderr
        assert _ranks_in_export(elsewhere / (out.name + ".gz")) == set(RANKS)

        res = _cli(elsewhere, "info", path, "--json")
        assert res.returncode == 0, res.stderr
        assert sorted(r["rank"] for r in json.loads(res.stdout)["ranks"]) == RANKS


def test_a_manifest_with_working_directory_paths_still_works(
        places: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Manifests written before stored the paths as named from the first analysis' working
    directory: the tables are reused, the traces found under the run, and the paths mended."""
    from uberprof.present.export import export_trace

    work, run, elsewhere = places
    monkeypatch.chdir(work)
    uberprof.load("runs/r")
    m = _manifest(run)
    for e in m["inputs"].values():
        e["path"] = f"runs/r/{e['path']}"  # what the old code kept
    (run / "derived" / D.MANIFEST_FILE).write_bytes(orjson.dumps(m))

    monkeypatch.chdir(elsewhere)
    res = export_trace(run, elsewhere / "old.json")
    assert res.ranks == RANKS and not [n for n in res.notes if "cannot read" in n]
    assert _ranks_in_export(res.path) == set(RANKS)
    again = uberprof.load(run)
    assert again.ranks == RANKS and again._a.analysed == 0  # reused, not read again
    assert all(rel == e["path"] for rel, e in _manifest(run)["inputs"].items())


def test_an_export_that_could_read_no_trace_fails(places: tuple[Path, Path, Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every trace unreadable at export time: exit 1 with the reasons, and no file of findings
    alone passed off as an export."""
    from uberprof.ingest.trace import TraceError
    from uberprof.present.export import merge

    _, run, elsewhere = places

    def unreadable(path: str, *_: Any, **__: Any) -> Any:
        raise TraceError(path, "cannot read: gone")

    monkeypatch.setattr(merge, "scan_file", unreadable)
    out = elsewhere / "lost.json"
    res = CliRunner().invoke(main, ["export", str(run), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "nothing exported" in res.stderr and "cannot read: gone" in res.stderr
    assert not list(elsewhere.glob("lost*"))


def test_analyses_of_one_run_at_once_all_succeed(places: tuple[Path, Path, Path]) -> None:
    """Two `analyze --force` and a `report --json` started together on a run never analysed:
    all exit 0 with every rank, the tables read back, and no temporary file is left."""
    _, run, elsewhere = places
    env = job_env(PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    cmds = [["analyze", str(run), "--force", "--json"], ["analyze", str(run), "--force", "--json"],
            ["report", str(run), "--json"]]
    procs = [subprocess.Popen([PY, "-m", "uberprof", *c], cwd=elsewhere, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in cmds]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert [r["rank"] for r in json.loads(out)["ranks"]] == RANKS

    loaded = uberprof.load(run)
    assert loaded._a.analysed == 0 and loaded.ranks == RANKS
    assert sorted(set(loaded.steps(format="arrow").column("rank").to_pylist())) == RANKS
    for r in RANKS:
        assert loaded.events(r, format="arrow").num_rows > 0
    assert not [p for p in (run / "derived").rglob("*") if p.name.endswith(".tmp")]


# --- units --------------------------------------------------------------------------------------

def test_replacing_keeps_the_old_file_until_the_new_one_is_whole(tmp_path: Path) -> None:
    target = tmp_path / "t.parquet"
    D.write_parquet(pa.table({"a": [1]}), target)
    with pytest.raises(RuntimeError), D.replacing(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_bytes(b"half a tab")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == [target]
    assert pq.read_table(target).column("a").to_pylist() == [1]
    with D.replacing(target) as a, D.replacing(target) as b:
        assert a != b  # two writers at once never share a temporary name
        pq.write_table(pa.table({"a": [2]}), a)
        pq.write_table(pa.table({"a": [3]}), b)
    assert pq.read_table(target).column("a").to_pylist() == [2]  # the last to finish wins
    assert list(tmp_path.iterdir()) == [target]


def test_freshness(tmp_path: Path) -> None:
    f = tmp_path / "trace.json"
    f.write_text("{}")
    made = tmp_path / "summary.json"
    st = f.stat()
    entry = D.input_entry("trace.json", st)
    assert entry["path"] == "trace.json" and entry["key"] == D.entry_key("trace.json")
    assert not D.is_fresh(None, st, made)
    assert not D.is_fresh({**entry, "status": "ok"}, st, made)  # tables missing
    made.write_text("{}")
    assert D.is_fresh({**entry, "status": "ok"}, st, made)
    assert D.is_fresh({**entry, "status": "error"}, st, tmp_path / "none")
    assert not D.is_fresh({**entry, "status": "ok", "version": -1}, st, made)
    f.write_text("{} ")
    assert not D.is_fresh({**entry, "status": "ok"}, f.stat(), made)


def test_no_derived_file_is_ever_written_in_place(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table goes to a unique hidden temporary name in its folder, then is renamed: a
    reader (or a second analysis) never finds a half-written table under a real name."""
    from tests import _traces as T
    from uberprof.analysis.tables.pipeline import analyze

    d = tmp_path / "traces"
    T.write(d / "rank-0.pt.trace.json.gz", T.gpu_step_trace(rank=0))
    T.write(d / "rank-1.pt.trace.json", T.cpu_step_trace(rank=1))
    opened: list[Path] = []
    real_write, real_writer = pq.write_table, pq.ParquetWriter

    def write_table(table: pa.Table, where: Any, *a: Any, **k: Any) -> None:
        opened.append(Path(where))
        real_write(table, where, *a, **k)

    def writer(where: Any, *a: Any, **k: Any) -> Any:
        opened.append(Path(where))
        return real_writer(where, *a, **k)

    monkeypatch.setattr(pq, "write_table", write_table)
    monkeypatch.setattr(pq, "ParquetWriter", writer)
    a = analyze(d, out=tmp_path / "d", workers=1)
    assert a.ranks and [r["rank"] for r in a.ranks] == [0, 1]
    made = {p for p in (tmp_path / "d").rglob("*") if p.is_file()}
    assert {p.name for p in made} >= {"events.parquet", "steps.parquet", "ranks.parquet",
                                      "collectives.parquet", "summary.json", "manifest.json"}
    assert len(opened) >= 9 and not set(opened) & made
    assert all(p.name.startswith(".") and p.name.endswith(".tmp") and p.parent in
               {m.parent for m in made} for p in opened)
    assert len(set(opened)) == len(opened)  # never one temporary name twice


def test_the_cross_rank_step_is_read_back_until_what_it_reads_changes(
        healthy_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A second analysis of an unchanged run reads the run-level tables back (the dashboard's
    and report's start-up on a big run); a changed rank.json, step timeline or --force makes
    the reduce run again."""
    from uberprof.analysis.tables import reduce as R
    from uberprof.analysis.tables.pipeline import analyze

    run = _copy(healthy_run, tmp_path / "run")
    first = analyze(run, workers=1)
    assert (run / "derived" / R.REDUCE_FILE).is_file()
    calls: list[int] = []
    real = R._reduce

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(R, "_reduce", counted)
    again = analyze(run, workers=1)
    assert calls == []
    assert again.summary == first.summary and again.ranks == first.ranks
    assert again.inputs == first.inputs

    rank_json = run / "ranks" / "1" / "rank.json"
    st = rank_json.stat()
    os.utime(rank_json, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert analyze(run, workers=1).summary == first.summary
    assert calls == [1]

    with (run / "ranks" / "2" / "steps.jsonl").open("a") as f:
        f.write("")  # same bytes, a new mtime: the timeline is read again, then the reduce
    os.utime(run / "ranks" / "2" / "steps.jsonl", ns=(st.st_atime_ns, st.st_mtime_ns + 7))
    analyze(run, workers=1)
    assert calls == [1, 1]
    analyze(run, workers=1)
    assert calls == [1, 1]
    analyze(run, workers=1, force=True)
    assert calls == [1, 1, 1]


def _row_path_steps(ctx: Any, rank: int) -> list[dict[str, Any]]:
    """The run-level step rows of one rank as the reduce built them row by row before it
    worked on columns (the reference): traced steps first seen, the timeline's window where it
    has both ends, the timeline's other steps untraced."""
    by_step: dict[int, dict[str, Any]] = {}
    for rel, e in sorted(ctx.run.inputs.items()):
        if e.get("rank") != rank or e.get("status") != "ok":
            continue
        for r in D.read_input_table(ctx.derived, e["key"], D.STEPS_FILE).to_pylist():
            if r["step"] not in by_step:
                by_step[r["step"]] = {**r, "rank": rank, "traced": True, "trace": rel}
    timeline = ctx.run.timeline(ctx.root / "ranks" / str(rank))
    for tl in timeline.to_pylist() if timeline is not None else []:
        start, end = tl["host_start_ns"], tl["host_end_ns"]
        if tl["step"] in by_step:
            if start is not None and end is not None:
                by_step[tl["step"]].update(host_start_ns=start, host_end_ns=end)
            continue
        by_step[tl["step"]] = {"rank": rank, "step": tl["step"], "traced": False, "trace": None,
                               "host_start_ns": start, "host_end_ns": end,
                               "data_wait_ns": tl["data_wait_ns"]}
    rows = []
    for step in sorted(by_step):
        r = by_step[step]
        s, e = r.get("host_start_ns"), r.get("host_end_ns")
        r["step_time_ns"] = e - s if s is not None and e is not None else None
        rows.append({f: r.get(f) for f in D.RUN_STEP_SCHEMA.names})
    return rows


def test_run_steps_are_the_row_paths(tmp_path: Path) -> None:
    """The reduce's column-wise step table against the row-by-row reference, on a run with two
    trace windows, a traced step the timeline lacks, one whose timeline row has no end, and a
    timeline with a repeated step."""
    from tests.test_dashboard import write_synth
    from uberprof.analysis.tables.context import load_context

    run = write_synth(tmp_path / "run", ranks=4, steps=40, counters=False, straggler=None)
    lines = (run / "ranks" / "1" / "steps.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    rows = [r for r in rows if r["step"] != 21]  # traced, not in the timeline
    for r in rows:
        if r["step"] == 20:
            del r["host_end_ns"]  # traced; the timeline's window lacks its end
    rows.append({**rows[5], "host_end_ns": rows[5]["host_end_ns"] + 99})  # step 5 again
    (run / "ranks" / "1" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = load_context(run, workers=1)
    got = ctx.steps()
    for rank in range(4):
        mine = got.filter(pa.compute.equal(got.column("rank"), rank)).to_pylist()
        assert mine == _row_path_steps(ctx, rank), rank
    one = {r["step"]: r for r in got.to_pylist() if r["rank"] == 1}
    assert one[21]["traced"] and one[20]["traced"] and not one[5]["traced"]
    assert one[5]["host_end_ns"] == rows[-1]["host_end_ns"]  # the timeline keeps the last row
