"""Every view tells the story in time as the diagnosis saved it (`run.timeline_changes`): the
terminal and HTML reports near their top, the dashboard's overview above its step heat map,
with each onset marked on it. On the kept step timelines of a real slowdown
(`samples/timelines/slowdown`: rank 1 computes twice as long from step 150)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from uberprof.analysis.read import open_run
from uberprof.dashboards.data import RunData
from uberprof.dashboards.pages import overview
from uberprof.present.report_html import render_html
from uberprof.present.report_terminal import render_report

TIMELINES = Path(__file__).resolve().parents[2] / "samples" / "timelines"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("views") / "slowdown"
    shutil.copytree(TIMELINES / "slowdown", dest)
    return dest


def test_the_reports_say_the_lead_change_before_the_findings(run: Path) -> None:
    d = open_run(run, workers=1).diagnosis
    assert d is not None
    (lead,) = [c for c in d.run["timeline_changes"] if c["lead"]]
    out = io.StringIO()
    render_report(d, Console(file=out, width=400))
    text = out.getvalue()
    assert lead["summary"] in text
    assert text.index(lead["summary"]) < text.index("step time (longest rank per step)")
    page = render_html(d)
    assert "class='timeline lead'" in page and f"from step {lead['onset_step']}," in page
    assert page.index("class='timeline lead'") < page.index("<h2>Findings</h2>")


def test_the_overview_marks_each_onset_on_the_step_heat_map(run: Path) -> None:
    data = RunData(root=run, workers=1).load()
    changes = data.timeline_changes()
    assert changes, "the kept slowdown has a change"
    fig = overview.heatmap_figure(data, None, changes)
    marks = [s.x0 for s in fig.layout.shapes if s.line.dash == "dash"]
    assert marks == [c["onset_step"] - 0.5 for c in changes]
    texts = [a.text for a in fig.layout.annotations]
    assert all(f"{c['direction']} from step {c['onset_step']}" in texts for c in changes)
    notices = overview.timeline_notices(changes)
    assert notices[0].children == next(c for c in changes if c["lead"])["summary"]
    assert "warn" in notices[0].className
