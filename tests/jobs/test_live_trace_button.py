"""The live dashboard's "record a trace" button, in headless Chromium on a real running 2-rank
job under `uberprof run --no-trace`: the click answers with the steps the window will cover,
the window is recorded and appears on the page by itself; once the job has ended the button
says why it cannot."""

from __future__ import annotations

from pathlib import Path

from tests._jobs import (
    browser_timeout_ms,
    info_json,
    start_followed_job,
    stop,
    time_limit,
    wait_for_steps,
)
from tests.jobs.test_dashboard_browser import ARGS, CHROMIUM, Served


def test_the_trace_button_records_a_window_on_the_running_job(tmp_path: Path) -> None:
    """Click "record a trace" (2 steps, every rank) on the open page of a running job: the
    answer names steps A-B on ranks 0-1, the window's steps become links on the steps page
    (analysed in the background, no reload), `uberprof info` lists the window on both ranks as
    opened on demand; after the job ended, a click answers that the job ended."""
    from playwright.sync_api import sync_playwright

    job = start_followed_job(tmp_path, "button", tmp_path / "stop")
    run = tmp_path / "button"
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
            page.goto(served.url + "/steps")
            page.wait_for_selector("#trace-button", timeout=wait_ms)
            page.fill("#trace-steps", "2")
            page.click("#trace-button")
            outcome = page.wait_for_selector("#trace-outcome", timeout=browser_timeout_ms(40))
            assert outcome is not None
            text = outcome.inner_text()
            first, last = int(outcome.get_attribute("data-first") or -1), \
                int(outcome.get_attribute("data-last") or -1)
            assert outcome.get_attribute("data-ok") == "true", text
            assert last == first + 1 and first > 3, text
            assert f"trace window on steps {first}-{last} on rank(s) 0-1" in text, text
            # the window, recorded and analysed in the background: its steps are links
            page.wait_for_selector(".step-links .step-link", timeout=browser_timeout_ms(90))
            links = page.eval_on_selector_all(".step-links .step-link",
                                              "es => es.map(e => e.innerText)")
            assert links == [str(first), str(last)], links
            (tmp_path / "stop").touch()
            assert job.wait(timeout=time_limit(30)) == 0
            page.click("#trace-button")
            page.wait_for_function(
                "() => (document.querySelector('#trace-outcome') || {innerText: ''})"
                ".innerText.includes('the job ended')", timeout=wait_ms)
            browser.close()
        assert not errors, errors
        windows = {r["rank"]: r["trace_windows"] for r in info_json(run)["ranks"]}
        assert set(windows) == {0, 1}, windows
        for rank, wins in windows.items():
            assert [(w["steps"], w["trigger"]) for w in wins] == [([first, last], "on demand")], \
                (rank, wins)
    finally:
        stop([job])
        if served is not None:
            served.close()
