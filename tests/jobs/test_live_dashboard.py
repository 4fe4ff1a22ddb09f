"""The dashboard following a running job, in headless Chromium: a real 2-rank job under
`uberprof run` while the dashboard is open; the page shows it running, its figures grow by
themselves (no reload), then it shows the job ended and its final diagnosis, and stops asking."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

from tests._jobs import (
    browser_timeout_ms,
    info_json,
    start_followed_job,
    stop,
    time_limit,
    wait_for_steps,
)
from tests.jobs.test_dashboard_browser import ARGS, CHROMIUM, Served

# The last step column drawn in a figure (the overview's heat map: one column per step below
# 250; the steps page's recent step times: a line per rank).
LAST_DRAWN = """(id) => {
  const g = document.querySelector('#' + id + ' .js-plotly-plot');
  if (!g || !g.data || !g.data.length) return -1;
  return Math.max(...g.data.flatMap(t => Array.from(t.x || [])));
}"""
WINDOW = "10-12"


def _status(page: Any) -> str:
    return page.inner_text("#live-status")


def _drawn(page: Any, graph: str) -> int:
    return int(page.evaluate(LAST_DRAWN, graph))


def _grows(page: Any, graph: str, timeout: float) -> None:
    """The figure draws a later step than it does now, by itself."""
    page.wait_for_function(f"() => ({LAST_DRAWN})('{graph}') >= 0", timeout=timeout)
    first = _drawn(page, graph)
    page.wait_for_function(f"() => ({LAST_DRAWN})('{graph}') > {first}", timeout=timeout)


def test_dashboard_follows_a_running_job(tmp_path: Path) -> None:
    """A real 2-rank job under `uberprof run` (rank 1 waits 60 ms for data every step, a
    trace window at steps 10-12) while the dashboard is open in headless Chromium: the page
    says the job runs, the heat map and the steps page's step times grow by themselves, the
    data-loader straggler is indicated, the trace window becomes selectable once analysed;
    after the end the page says so and shows the final diagnosis. Never reloaded. The job
    runs until the page has shown all that (tests/_jobs.followed_job), then ends by itself."""
    from playwright.sync_api import sync_playwright

    job = start_followed_job(tmp_path, "live", tmp_path / "stop", "--trace-steps", WINDOW)
    run = tmp_path / "live"
    served = None
    wait_ms = browser_timeout_ms(30)
    try:
        wait_for_steps(run, 3, job, time_limit(60))
        served = Served(run)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(served.url + "/")
            page.wait_for_selector("#live-status", timeout=wait_ms)
            assert re.search(r"running · \d+ steps", _status(page)), _status(page)
            page.evaluate("() => { window.__notReloaded = true; }")
            _grows(page, "step-heatmap", wait_ms)

            page.click("#nav-steps")  # a link: the app routes it, no reload
            page.wait_for_selector("#live-recent .js-plotly-plot", timeout=wait_ms)
            _grows(page, "live-recent", wait_ms)
            # rank 1's data wait, under the diagnosis's straggler test
            page.wait_for_selector('#live-signals .live-signal.straggler[data-rank="1"]',
                                   timeout=wait_ms)
            # the trace window, analysed in the background: its steps are links on the page
            page.wait_for_selector(".step-links .step-link", timeout=browser_timeout_ms(90))
            links = page.eval_on_selector_all(".step-links .step-link",
                                              "es => es.map(e => e.innerText)")
            assert links == ["10", "11", "12"], links

            (tmp_path / "stop").touch()
            assert job.wait(timeout=time_limit(30)) == 0
            ranks = info_json(run)["ranks"]
            steps = ranks[0]["steps"]  # what the run holds, every rank the same
            assert {r["steps"] for r in ranks} == {steps} and steps > 12, ranks
            page.wait_for_function(
                "() => document.querySelector('#live-status').innerText"
                ".includes('final diagnosis below')", timeout=browser_timeout_ms(90))
            assert _status(page).startswith(f"ended (exit 0) · {steps} steps"), _status(page)
            # the page was rebuilt from the final analysis: no longer following
            page.wait_for_selector("#live-recent", state="detached", timeout=wait_ms)
            page.click("#nav-overview")
            page.wait_for_selector("#findings .finding", timeout=wait_ms)
            assert page.inner_text("#card-steps").split()[1] == str(steps)
            kinds = page.eval_on_selector_all("#findings .finding",
                                              "es => es.map(e => e.dataset.kind)")
            assert {"straggler", "data_stall"} & set(kinds), kinds
            assert page.evaluate("() => window.__notReloaded === true")  # never reloaded
            browser.close()
        assert not errors, errors
    finally:
        stop([job])
        if served is not None:
            served.close()


def test_run_dashboard_serves_beside_the_job(tmp_path: Path) -> None:
    """`uberprof run --dashboard`: the URL is printed when the job starts; the dashboard
    answers (following the job: its layout has the live status) from a process of lower
    priority; it leaves by itself after the job ends (the job runs until the test has seen
    the dashboard: tests/_jobs.followed_job)."""
    import urllib.request

    import psutil

    job = start_followed_job(tmp_path, "side", tmp_path / "stop", "--dashboard",
                             stderr=subprocess.PIPE)
    try:
        assert job.stderr is not None
        url = None
        for line in job.stderr:
            m = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/)", line)
            if m:
                url = m.group(1)
                break
        assert url is not None
        layout = None
        deadline = time.monotonic() + time_limit(60)
        while layout is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "_dash-layout", timeout=5) as resp:
                    layout = resp.read().decode()
            except OSError:
                time.sleep(1)
        assert layout is not None and "live-status" in layout and "running" in layout
        side = [p for p in psutil.process_iter(["cmdline"])  # this run's, not another test's
                if {"uberprof.dashboards.live_server", str(tmp_path / "side")}
                <= set(p.info["cmdline"] or [])]
        assert len(side) == 1 and side[0].nice() >= 10
        (tmp_path / "stop").touch()
        job.stderr.read()
        assert job.wait(timeout=time_limit(30)) == 0
        side[0].wait(timeout=60)  # gone after the job (and a grace for open pages)
    finally:
        stop([job])
