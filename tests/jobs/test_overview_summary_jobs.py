"""The overview's saved summary on a real run (issue 32 item 4): the 4-rank Gloo run of the
session (tests/_runs.py) draws the same cards and figures from the summary the reduce saved as
from its step table; and in Chromium, an overview served while its diagnosis runs in the
background shows its plots with the findings "being diagnosed", then the findings, without a
reload."""

from __future__ import annotations

import importlib.util
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import browser_timeout_ms
from tests._made_once import copy_run
from tests._runs import TRACE_STEPS

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _figure_json(fig: Any) -> str:
    return json.dumps(fig.to_plotly_json(), sort_keys=True,
                      default=lambda a: a.tolist() if hasattr(a, "tolist") else str(a))


def test_a_real_runs_overview_is_the_same_from_its_saved_summary(
        ddp_runs: dict[int, Path], tmp_path: Path) -> None:
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.pages import overview as page
    from uberprof.dashboards.queries import overview as q
    from uberprof.dashboards.ui import Selection

    run = tmp_path / "ddp4"  # a copy: other tests read the session's run
    copy_run(ddp_runs[4], run, derived=True)
    saved = RunData(root=run, workers=1).load()
    assert saved.saved_overview() is not None
    page.layout(saved, Selection())
    assert saved._steps is None  # the overview read no step table
    old = RunData(root=run, workers=1)
    old._memo["overview"] = None  # the dashboard as it was: from the step table
    old.load()
    assert old._steps is not None and old.steps.num_rows > 0
    assert q.health(saved) == q.health(old)
    lo, hi = TRACE_STEPS
    assert saved.traced_steps() == old.traced_steps() == list(range(lo, hi + 1))
    for draw in (page.heatmap_figure, page.breakdown_figure):
        assert _figure_json(draw(saved, old.straggler_rank())) == \
            _figure_json(draw(old, old.straggler_rank()))


@pytest.mark.skipif(not CHROMIUM.exists() or importlib.util.find_spec("playwright") is None,
                    reason="needs Chromium at /usr/bin/chromium and playwright")
def test_the_overview_fills_in_its_findings_when_the_diagnosis_is_done(
        ddp_runs: dict[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from uberprof.dashboards import data as data_module
    from uberprof.dashboards.app import create_app
    from uberprof.dashboards.data import RunData

    run = tmp_path / "ddp2"
    copy_run(ddp_runs[2], run, derived=True)
    shutil.rmtree(run / "derived" / "diagnosis", ignore_errors=True)
    (run / "derived" / "diagnosis.json").unlink(missing_ok=True)
    release = threading.Event()
    real = data_module.diagnose_opened

    def held(*a: Any, **k: Any) -> Any:  # the diagnosis waits until the page was seen
        if k.get("make", True):
            assert release.wait(300)
        return real(*a, **k)

    monkeypatch.setattr(data_module, "diagnose_opened", held)
    data = RunData(root=run, workers=1).load()
    assert not data.read_saved_diagnosis()
    data.diagnose_in_background()
    server = make_server("127.0.0.1", 0, create_app(data).server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(browser_timeout_ms())
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://127.0.0.1:{server.server_port}/")
            page.wait_for_selector("#findings-pending")
            page.wait_for_selector("#step-heatmap .main-svg")  # the plots do not wait
            page.wait_for_selector("#rank-breakdown .main-svg")
            assert "being diagnosed" in (page.text_content("#card-findings") or "")
            marker = page.evaluate("() => { window.notReloaded = true; return 1; }")
            release.set()
            page.wait_for_selector("#findings-pending", state="detached",
                                   timeout=browser_timeout_ms(60))
            page.wait_for_selector("#findings .finding, #no-findings")
            assert page.evaluate("() => window.notReloaded === true") and marker == 1
            assert "being diagnosed" not in (page.text_content("#health") or "")
            assert not errors, errors
            browser.close()
    finally:
        release.set()
        server.shutdown()
        thread.join(timeout=10)


@pytest.mark.skipif(not CHROMIUM.exists() or importlib.util.find_spec("playwright") is None,
                    reason="needs Chromium at /usr/bin/chromium and playwright")
def test_the_preparing_page_asks_for_the_dashboard_and_opens_it() -> None:
    """The page shown while a run is prepared asks (HEAD, its script) whether the stage changed
    or the dashboard answers in its place: it shows a new stage without reloading, and opens
    the dashboard when it answers."""
    import flask
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from uberprof.dashboards.preparing import Switch, preparing_app

    stage = ["reading traces: 1 of 2"]
    # its question is held until the stage changes or the dashboard answers in its place
    preparing = preparing_app("run", lambda: stage[0], None, None, moved=lambda: switch.moved)
    asked: list[str] = []  # the methods the preparing page was requested with

    def recorded(environ: dict[str, Any], start_response: Any) -> Any:
        asked.append(environ["REQUEST_METHOD"])
        return preparing(environ, start_response)

    switch = Switch(recorded)
    server = make_server("127.0.0.1", 0, switch, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen: list[str] = []
    done = flask.Flask("done")

    @done.route("/")
    def _dashboard() -> str:
        seen.append(flask.request.method)
        return "<p id='the-dashboard'>the dashboard</p>"

    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page()
            page.set_default_timeout(browser_timeout_ms())
            page.goto(f"http://127.0.0.1:{server.server_port}/")
            assert "reading traces: 1 of 2" in (page.text_content("#preparing-stage") or "")
            deadline = time.monotonic() + browser_timeout_ms() / 1000
            while "HEAD" not in asked and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "HEAD" in asked  # its script asks without reloading the page
            page.evaluate("() => { window.notReloaded = true; }")
            stage[0] = "diagnosing 2 rank(s)"
            page.wait_for_function("() => document.getElementById('preparing-stage')"
                                   ".textContent.includes('diagnosing 2 rank(s)')")
            assert page.evaluate("() => window.notReloaded === true")  # shown in place
            switch.to(done.wsgi_app)
            page.wait_for_selector("#the-dashboard")
            browser.close()
    finally:
        server.shutdown()
        thread.join(timeout=10)
    assert "GET" in seen  # opened
