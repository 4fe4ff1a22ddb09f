"""The derived folder on a real run (issue 13 items 0 and 4): what it stores reads the same from
any working directory, commands work from anywhere and fail loudly when they lose all their data,
and analyses of one run at once all succeed. Its units: tests/unit/test_derived.py."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

import uberprof
from tests._jobs import PY, ROOT, job_env
from tests._made_once import copy_run
from uberprof.analysis.tables import derived as D
from uberprof.cli import main

RANKS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def four_ranks(ddp_runs: dict[int, Path]) -> Path:
    """The session's 4-rank run (tests/_runs.py: 3 traced steps a rank). What these tests check
    (paths, every rank present, concurrent writers, the reduce's reuse) needs four ranks and
    a trace each, not the diagnosis runs' ten traced steps: every command here reads a third
    as much (they used healthy_run)."""
    return ddp_runs[4]


def _copy(run: Path, dst: Path) -> Path:
    """A private copy of a session run, without its tables."""
    return copy_run(run, dst)


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`uberprof ARGS` in its own process, run from `cwd` (which is not the repository)."""
    env = job_env(PYTHONPATH=str(ROOT))
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
def places(four_ranks: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(a working directory, a run under it as runs/r, an unrelated working directory)."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _copy(four_ranks, work / "runs" / "r")
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
    from uberprof.analysis.read import open_run
    from uberprof.present.export import export_trace

    work, run, elsewhere = places
    monkeypatch.chdir(work)
    uberprof.load("runs/r")
    m = _manifest(run)
    for e in m["inputs"].values():
        e["path"] = f"runs/r/{e['path']}"  # what the old code kept
    (run / "derived" / D.MANIFEST_FILE).write_bytes(orjson.dumps(m))

    monkeypatch.chdir(elsewhere)
    res = export_trace(open_run(run), elsewhere / "old.json")
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
    from uberprof.present.export import events

    _, run, elsewhere = places

    def unreadable(path: str, *_: Any, **__: Any) -> Any:
        raise TraceError(path, "cannot read: gone")

    monkeypatch.setattr(events, "scan_file", unreadable)
    out = elsewhere / "lost.json"
    res = CliRunner().invoke(main, ["export", str(run), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "nothing exported" in res.stderr and "cannot read: gone" in res.stderr
    assert not list(elsewhere.glob("lost*"))


def test_analyses_of_one_run_at_once_all_succeed(places: tuple[Path, Path, Path]) -> None:
    """Two `analyze --force` and a `report --json` started together on a run never analysed:
    all exit 0 with every rank, the tables read back, and no temporary file is left."""
    _, run, elsewhere = places
    env = job_env(PYTHONPATH=str(ROOT))
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


def test_the_cross_rank_step_is_read_back_until_what_it_reads_changes(
        four_ranks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second analysis of an unchanged run reads the run-level tables back (the dashboard's
    and report's start-up on a big run); a changed rank.json, step timeline or --force makes
    the reduce run again."""
    from uberprof.analysis.tables import reduce as R
    from uberprof.analysis.tables.pipeline import analyze

    run = _copy(four_ranks, tmp_path / "run")
    first = analyze(run, workers=1)
    assert (run / "derived" / D.REDUCE_FILE).is_file()
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
