"""The overview's summary saved by the analysis (issue 32 item 4): the dashboard's overview is
drawn from it, without reading the step table, and draws exactly what the step table drew; the
URL is printed before Dash is imported; a diagnosis made in the background leaves the overview
drawn with its findings "being diagnosed", then filled in."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._jobs import PY, ROOT, job_env
from tests.unit.test_dashboard import write_synth
from uberprof.analysis.read import open_tables
from uberprof.analysis.tables.derived import OVERVIEW_FILE, REDUCE_FILE, STEPS_FILE
from uberprof.dashboards.data import RunData
from uberprof.dashboards.pages import overview as page
from uberprof.dashboards.queries import overview as q
from uberprof.dashboards.ui import Selection


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 ranks x 700 steps: more steps than the heat map's 250 columns, so they are binned."""
    root = write_synth(tmp_path_factory.mktemp("overview-summary") / "synth8", steps=700)
    open_tables(root, workers=1)
    return root


def _figure_json(fig: Any) -> str:
    return json.dumps(fig.to_plotly_json(), sort_keys=True,
                      default=lambda a: a.tolist() if hasattr(a, "tolist") else str(a))


def _from_steps(root: Path) -> RunData:
    """The dashboard as it was before the summary was saved: the saved one is not used."""
    data = RunData(root=root, workers=1)
    data._memo["overview"] = None
    return data.load()


def test_the_overview_of_an_analysed_run_reads_no_step_table(run: Path) -> None:
    data = RunData(root=run, workers=1).load()
    assert data.saved_overview() is not None
    page.layout(data, Selection())
    assert data._steps is None  # cards, heat map, bars and findings: none read the 5 M rows


def test_the_saved_summary_draws_what_the_step_table_drew(run: Path) -> None:
    saved, old = RunData(root=run, workers=1).load(), _from_steps(run)
    assert saved.saved_overview() is not None and old.saved_overview() is None
    assert q.health(saved) == q.health(old)
    assert saved.ranks() == old.ranks() and saved.all_steps() == old.all_steps()
    assert saved.traced_steps() == old.traced_steps() != []
    hm = q.step_heatmap(saved)
    assert hm is not None and hm.bin_steps > 1  # the binned case
    straggler = old.straggler_rank()
    assert straggler is not None
    assert _figure_json(page.heatmap_figure(saved, straggler)) == \
        _figure_json(page.heatmap_figure(old, straggler))
    assert _figure_json(page.breakdown_figure(saved, straggler)) == \
        _figure_json(page.breakdown_figure(old, straggler))


def test_a_summary_of_another_reduce_is_not_read(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    opened = open_tables(copy, workers=1)  # the copy's own reduce (its key names its path)
    assert opened.overview() is not None
    mark = copy / "derived" / REDUCE_FILE  # another reduce wrote the tables since
    mark.write_text(json.dumps({**json.loads(mark.read_text()), "key": "another reduce"}))
    assert opened.overview() is None
    data = RunData(root=copy, workers=1)
    data.open(opened)
    assert data.saved_overview() is None and data._steps is not None


def test_a_derived_folder_without_the_summary_gets_one(run: Path, tmp_path: Path) -> None:
    """derived/ from before the summary existed: the reduce runs again (not the traces' map)
    and saves it."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    open_tables(copy, workers=1)  # the copy's own reduce (its key names its path)
    (copy / "derived" / OVERVIEW_FILE).unlink()
    reduced = (copy / "derived" / STEPS_FILE).stat().st_mtime_ns
    opened = open_tables(copy, workers=1)
    assert (copy / "derived" / STEPS_FILE).stat().st_mtime_ns != reduced  # reduced again
    summary = opened.overview()
    assert summary is not None
    original = open_tables(run, workers=1).overview()
    assert original is not None and summary.quantiles == original.quantiles
    assert summary.heatmap is not None and original.heatmap is not None
    np.testing.assert_array_equal(summary.heatmap.z, original.heatmap.z)


def test_the_url_is_printed_before_dash_is_imported(run: Path) -> None:
    """`serve` replaced by a check: by the time the server would serve (the URL printed), no
    Dash module is loaded."""
    code = (
        "import sys\n"
        "import uberprof.cli.dashboard\n"
        "import uberprof.dashboards.startup as d\n"
        "def serve(server, prepare):\n"
        "    print('dash loaded:', any(m == 'dash' or m.startswith('dash.')"
        " for m in sys.modules), flush=True)\n"
        "    server.server_close()\n"
        "    return True\n"
        "d.serve = serve\n"
        "c = sys.modules['uberprof.cli.dashboard']  # the package names the command so\n"
        f"c.dashboard.main([{str(run)!r}, '--port', '0'], standalone_mode=False)\n")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120,
                         env=job_env(), cwd=ROOT, check=True).stdout
    lines = out.splitlines()
    url = next(i for i, ln in enumerate(lines) if "http://127.0.0.1:" in ln)
    check = next(i for i, ln in enumerate(lines) if ln.startswith("dash loaded:"))
    assert url < check and lines[check] == "dash loaded: False"


def _poll(client: Any, search: str = "") -> tuple[int, str]:
    r = client.post("/_dash-update-component", json={
        "output": "page-overview.children",
        "outputs": {"id": "page-overview", "property": "children"},
        "inputs": [{"id": "overview-diagnosis-poll", "property": "n_intervals", "value": 1}],
        "changedPropIds": ["overview-diagnosis-poll.n_intervals"],
        "state": [{"id": "url", "property": "search", "value": search}]})
    return r.status_code, r.get_data(as_text=True)


def test_the_overview_says_being_diagnosed_then_fills_in(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from uberprof.dashboards import data as data_module
    from uberprof.dashboards.app import create_app

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "derived" / "diagnosis", ignore_errors=True)
    (copy / "derived" / "diagnosis.json").unlink(missing_ok=True)
    release = threading.Event()
    real = data_module.diagnose_opened

    def held(*a: Any, **k: Any) -> Any:  # the diagnosis waits until the test lets it go
        if k.get("make", True):  # reading the saved one (make=False) is not held
            assert release.wait(120)
        return real(*a, **k)

    monkeypatch.setattr(data_module, "diagnose_opened", held)
    data = RunData(root=copy, workers=1).load()
    assert not data.read_saved_diagnosis()
    finished = threading.Event()
    data.diagnose_in_background(finished.set)
    assert data.diagnosis_pending()
    app = create_app(data)  # warms the overview while the diagnosis waits: it must not block
    text = str(page.layout(data, Selection()))
    assert "findings-pending" in text and "overview-diagnosis-poll" in text
    assert "finding-0" not in text
    client = app.server.test_client()
    status, _ = _poll(client)
    assert status == 204  # still diagnosing: nothing to update
    release.set()
    assert finished.wait(120) and not data.diagnosis_pending()
    status, body = _poll(client)
    assert status == 200
    assert "finding-0" in body and "findings-pending" not in body
    assert "overview-diagnosis-poll" not in body  # the timer went with the page it replaced
    assert '"card-straggler"' in body and "being diagnosed" not in body
