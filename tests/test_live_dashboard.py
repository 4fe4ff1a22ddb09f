"""The dashboard following a running job, in headless Chromium: a real 2-rank job under
`uberprof run` while the overview is open; the page shows it running, its step-time heat map
grows by itself (no reload), then it shows the job ended and stops asking."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.jobs import PY, start_slow_job
from tests.test_dashboard_browser import ARGS, CHROMIUM, Served
from uberprof.rundir.follow import RunFollower

# The last step column drawn in the overview's heat map (one column per step below 250).
LAST_DRAWN = """() => {
  const g = document.querySelector('#step-heatmap .js-plotly-plot');
  if (!g || !g.data || !g.data.length || !g.data[0].x) return -1;
  return Math.max(...Array.from(g.data[0].x));
}"""


def _status(page: Any) -> str:
    return page.inner_text("#live-status")


def test_dashboard_follows_a_running_job(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    run = tmp_path / "live"
    job = start_slow_job(tmp_path, "live", 150)
    served = None
    try:
        deadline = time.monotonic() + 180
        while RunFollower(run).poll().steps < 5 and time.monotonic() < deadline:
            time.sleep(0.5)
        served = Served(run)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(served.url + "/")
            page.wait_for_selector("#live-status", timeout=60_000)
            assert re.search(r"running · \d+ steps", _status(page)), _status(page)
            page.wait_for_function(f"() => ({LAST_DRAWN})() >= 0", timeout=60_000)
            first = page.evaluate(LAST_DRAWN)
            page.wait_for_function(f"() => ({LAST_DRAWN})() > {first}", timeout=60_000)
            assert job.wait(timeout=300) == 0
            page.wait_for_function(
                "() => document.querySelector('#live-status').innerText.startsWith('ended')",
                timeout=30_000)
            assert "ended (exit 0) · 150 steps" in _status(page)
            assert "re-open the dashboard to see the final diagnosis" in _status(page)
            page.wait_for_function(f"() => ({LAST_DRAWN})() == 149", timeout=30_000)
            assert page.url == served.url + "/"  # never reloaded nor navigated
            browser.close()
        assert not errors, errors
    finally:
        if job.poll() is None:
            job.kill()
        if served is not None:
            served.close()


def test_an_ended_run_is_not_followed(tmp_path: Path) -> None:
    """Old runs behave as before: no timer, no status line."""
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.live import live_for

    run = tmp_path / "synth"
    subprocess.run([PY, str(Path(__file__).parent.parent / "benchmarks" / "synth_run.py"),
                    str(run), "--ranks", "2", "--steps", "20", "--trace-steps", "5-6"],
                   check=True, capture_output=True, timeout=300)
    assert live_for(RunData(root=run).load()) is None
    node = next((run / "nodes").iterdir()) / "node.json"
    node.write_text(re.sub(r'"end_ns": \d+', '"end_ns": null', node.read_text()))
    live = live_for(RunData(root=run).load())
    assert live is not None and live.state.running


def test_run_dashboard_serves_beside_the_job(tmp_path: Path) -> None:
    """`uberprof run --dashboard`: the URL is printed when the job starts; the dashboard
    answers (following the job: its layout has the live status) from a process of lower
    priority; it leaves by itself after the job ends."""
    import urllib.request

    import psutil

    job = start_slow_job(tmp_path, "side", 120, "--dashboard", stderr=subprocess.PIPE)
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
        deadline = time.monotonic() + 180
        while layout is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "_dash-layout", timeout=5) as resp:
                    layout = resp.read().decode()
            except OSError:
                time.sleep(1)
        assert layout is not None and "live-status" in layout and "running" in layout
        side = [p for p in psutil.process_iter(["cmdline"])
                if "uberprof.cli.live" in " ".join(p.info["cmdline"] or [])]
        assert len(side) == 1 and side[0].nice() >= 10
        job.stderr.read()
        assert job.wait(timeout=300) == 0
        side[0].wait(timeout=60)  # gone after the job (and a grace for open pages)
    finally:
        if job.poll() is None:
            job.kill()
