"""Headers, sentences and docs that say only what the data holds and what the output is (issue 54,
item 5): the report's scope line, the export's track names in docs/export.md, the dashboard's
pages in `--help`, the export's file name and viewer, the README's example and changes."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from click.testing import CliRunner

from tests._export_traces import write_traces
from uberprof.cli import main
from uberprof.present.export.findings import FINDINGS_PROCESS, RANK_TRACKS
from uberprof.present.export.layout import qualify
from uberprof.present.report_terminal import scope_text

ROOT = Path(__file__).resolve().parents[2]


def _run(**kw: object) -> dict:
    base = {"ranks": [0, 1], "world_size": 2, "hosts": {"vm": [0, 1]}, "backend": "nccl",
            "device_type": "cuda"}
    return {**base, **kw}


def test_the_scope_line_says_only_what_the_document_holds() -> None:
    assert scope_text(_run()) == "2 rank(s) on 1 host(s), nccl / cuda"
    # two ranks of a 128-rank job: the terminal and the HTML report both say "2 of 128"
    assert scope_text(_run(world_size=128)).startswith("2 of 128 rank(s)")
    # traces without a host name: not "on 1 host(s)"
    assert scope_text(_run(hosts={"unknown": [0, 1]})) == "2 rank(s) hosts unknown, nccl / cuda"
    assert "on 1 host(s) and hosts unknown for the rest" in scope_text(
        _run(hosts={"vm": [0], "unknown": [1]}))
    # a folder of which no rank could be read: not "? / cpu"
    assert scope_text(_run(ranks=[], world_size=0, hosts={}, backend=None,
                           device_type="cpu")) == "no rank read; hosts, backend and device unknown"
    assert "backend unknown / cuda" in scope_text(_run(backend=None))


def test_the_html_report_says_of_the_world_as_the_terminal_does(tmp_path: Path) -> None:
    """One rank of the 2-rank sample run: both reports say "1 of 2 rank(s)" (the HTML said the
    world size alone)."""
    import shutil

    run = tmp_path / "gloo2"
    shutil.copytree(ROOT / "samples" / "gpu" / "gloo2", run)
    shutil.rmtree(run / "ranks" / "1")
    html = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(run), "--html", str(html)],
                             terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "1 of 2 rank(s) on 1 host(s), gloo / cuda" in res.stdout
    assert "1 of 2 rank(s) on 1 host(s), gloo / cuda" in html.read_text()


def test_the_export_track_names_in_the_docs_are_the_outputs(tmp_path: Path) -> None:
    """The names docs/export.md gives are rendered by the code that names the tracks, and the
    export of a real trace folder names its processes the same way."""
    doc = (ROOT / "docs" / "export.md").read_text()
    names = [qualify("rank 3", "host-b, GPU 1"), *RANK_TRACKS[:3], FINDINGS_PROCESS,
             qualify("node <name>", "counters"), qualify("...", "overlapping 1")]
    for name in names:
        assert f"`{name}`" in doc, name
    assert " · " not in doc  # the old names (`rank 3 · host-b · GPU 1`, `uberprof · idle gaps`)
    write_traces(tmp_path / "t")
    out = tmp_path / "o.json.gz"
    res = CliRunner().invoke(main, ["export", str(tmp_path / "t"), "-o", str(out),
                                    "--format", "chrome", "--workers", "1"])
    assert res.exit_code == 0, res.output
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    procs = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {"rank 0 (host-a, GPU 0)", "rank 1 (host-b, GPU 0)"} <= procs, procs
    assert FINDINGS_PROCESS in procs
    # the viewer it recommends is not one recent Chromium hides
    assert "chrome://tracing" not in res.stderr and "ui.perfetto.dev" in res.stderr


def test_export_says_when_the_file_is_not_the_name_given(tmp_path: Path) -> None:
    write_traces(tmp_path / "t")
    out = tmp_path / "run.pftrace"
    res = CliRunner().invoke(main, ["export", str(tmp_path / "t"), "-o", str(out),
                                    "--format", "chrome", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "run.pftrace.gz").exists() and not out.exists()
    assert f"the file is {out}.gz, not {out}" in " ".join(res.stderr.split())


def test_dashboard_help_lists_every_page_of_the_navigation_bar() -> None:
    from uberprof.dashboards import nav, ui

    assert ui.PAGES is nav.PAGES and ui.COMPARE_PAGE is nav.COMPARE_PAGE
    res = CliRunner().invoke(main, ["dashboard", "--help"])
    text = " ".join(res.output.split())
    listed = re.search(r"Pages: (.*?)\.", text)
    assert listed is not None, text
    for path, _title in (*nav.PAGES, nav.COMPARE_PAGE):
        assert re.search(rf"(^| ){re.escape(path)}( |,|$)", listed.group(1)), path


def test_the_readme_runs_its_example_on_the_repository_and_names_no_saved_format() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme
    example = re.search(r"`uberprof report (samples/\S+)`", readme)
    assert example is not None and (ROOT / example.group(1)).is_dir()
    assert not re.search(r"format \d+", readme)
