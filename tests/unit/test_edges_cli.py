"""The commands at the edges (issue 54, item 4): `whatif` with no change prints the baseline;
an unreadable input is named, refused with a non-zero exit and nothing written beside it;
problems go to stderr; a report that found a crash exits by that verdict."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from uberprof.cli import main

ROOT = Path(__file__).resolve().parents[2]
GLOO2 = ROOT / "samples" / "gpu" / "gloo2"


@pytest.fixture(scope="module")
def gloo2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-rank sample run, copied (whatif analyses it and writes derived/)."""
    out = tmp_path_factory.mktemp("w") / "gloo2"
    shutil.copytree(GLOO2, out)
    return out


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "in"
    d.mkdir()
    (d / "corrupt.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4)
    (d / "fake.pt.trace.json.gz").write_bytes(b"not gzip at all")
    (d / "notes.txt").write_text("hello world\n")
    return {p.name: p for p in d.iterdir()}


@pytest.mark.parametrize("name", ["corrupt.pt.trace.json.gz", "fake.pt.trace.json.gz",
                                  "notes.txt"])
@pytest.mark.parametrize("command", ["analyze", "report", "whatif", "export", "dashboard",
                                     "diff-b", "diff-a", "scaling"])
def test_an_unreadable_input_is_named_refused_and_nothing_is_written_beside_it(
        tmp_path: Path, name: str, command: str) -> None:
    bad = _bad_inputs(tmp_path)[name]
    args = {"analyze": ["analyze", str(bad)], "report": ["report", str(bad)],
            "whatif": ["whatif", str(bad), "--json"],
            "export": ["export", str(bad), "-o", str(tmp_path / "o.json.gz")],
            "dashboard": ["dashboard", str(bad)],
            "diff-b": ["diff", str(GLOO2), str(bad)],
            "diff-a": ["diff", str(bad), str(GLOO2)],
            "scaling": ["scaling", str(GLOO2), str(bad)]}[command]
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0
    assert str(bad) in res.stderr and res.stdout == ""
    assert sorted(p.name for p in bad.parent.iterdir()) == sorted(
        ["corrupt.pt.trace.json.gz", "fake.pt.trace.json.gz", "notes.txt"])  # no derived/
    assert not (tmp_path / "o.json.gz").exists()


def test_diff_against_a_folder_of_which_nothing_could_be_read_fails_naming_the_file(
        tmp_path: Path, gloo2: Path) -> None:
    """A truncated trace: the folder is a trace folder, but no rank could be analysed; the
    comparison would list every finding as gone (it exited 0)."""
    src = next(GLOO2.glob("ranks/0/traces/*.json.gz"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rank0.pt.trace.json.gz").write_bytes(src.read_bytes()[:20000])
    res = CliRunner().invoke(main, ["diff", str(gloo2), str(tmp_path / "b"), "--json"])
    assert res.exit_code == 1 and res.stdout == ""
    assert "rank0.pt.trace.json.gz: truncated gzip" in res.stderr
    assert "no rank could be analysed" in res.stderr


def test_whatif_on_a_folder_of_which_nothing_could_be_read_names_the_file(
        tmp_path: Path) -> None:
    """It said "no data-loader wait ... no rank has a step with a host window"."""
    src = next(GLOO2.glob("ranks/0/traces/*.json.gz"))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "rank0.pt.trace.json.gz").write_bytes(src.read_bytes()[:20000])
    res = CliRunner().invoke(main, ["whatif", str(tmp_path / "t"), "--remove", "data"])
    assert res.exit_code == 1 and res.stdout == ""
    assert "rank0.pt.trace.json.gz: truncated gzip" in res.stderr


def test_analyze_prints_its_problems_on_stderr_not_stdout(tmp_path: Path) -> None:
    src = next(GLOO2.glob("ranks/0/traces/*.json.gz"))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "rank0.pt.trace.json.gz").write_bytes(src.read_bytes()[:20000])
    (tmp_path / "t" / "rank1.pt.trace.json.gz").write_bytes(gzip.compress(
        json.dumps({"traceEvents": []}).encode()))
    res = CliRunner().invoke(main, ["analyze", str(tmp_path / "t")])
    assert res.exit_code == 1
    assert "rank0.pt.trace.json.gz" not in res.stdout
    lines = [x for x in res.stderr.splitlines() if "rank0.pt.trace.json.gz" in x]
    assert lines and lines[0].startswith("uberprof analyze: ")


def test_whatif_with_no_change_prints_the_baseline(gloo2: Path) -> None:
    res = CliRunner().invoke(main, ["whatif", str(gloo2)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("no change given: the baseline")
    assert "replayed ms" in res.stdout and "projected ms" not in res.stdout
    assert "critical path" in res.stdout and "replay error" in res.stdout
    res = CliRunner().invoke(main, ["whatif", str(gloo2), "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["baseline"] is True and doc["changes"] == []
    assert doc["critical_path"]["steps"] and doc["replay"]["median_error_pct"] is not None
    assert [s["gain_ms"] for s in doc["steps"]] == [0.0] * len(doc["steps"])


def test_whatif_remove_straggler_says_when_no_straggler_was_named(gloo2: Path) -> None:
    res = CliRunner().invoke(main, ["whatif", str(gloo2), "--remove", "straggler", "--json"])
    doc = json.loads(res.stdout)
    assert "decision: none" in doc["straggler_basis"]  # the run has no straggler
    res = CliRunner().invoke(main, ["whatif", str(gloo2), "--remove", "straggler"])
    assert "the straggler: no straggler was named; acting on the straggler test's " \
           "candidate" in " ".join(res.stdout.split())


def test_a_report_that_found_a_crash_exits_by_that_verdict(tmp_path: Path) -> None:
    from tests.unit.test_hangs_units import _crashed_before_its_traces

    run = _crashed_before_its_traces(tmp_path)
    res = CliRunner().invoke(main, ["report", str(run.root)])
    assert res.exit_code == 3
    assert "the job failed (crash" in res.stderr
    assert "nothing could be analysed" not in res.stderr
