"""The dashboard's `/parallelism` page in a real browser (Debian's headless Chromium driven by
Playwright, as in test_dashboard_browser.py), on a real 2-rank 1F1B pipeline whose stage 1
holds three times stage 0's blocks (tests/_parallel_runs.py): the stage table, the per-stage chart and who waits on
whom must render, stage 1 named the slowest, with no browser console error. The screenshot goes
to test-artifacts/dashboard/pipeline-parallelism.png (gitignored) for people to look at.

Skipped when Chromium or Playwright is missing (`make test` installs Chromium)."""

from __future__ import annotations

from typing import Any

from tests._jobs import browser_timeout_ms
from tests._parallel_runs import Report
from tests.jobs.test_dashboard_browser import ARTIFACTS, SETTLED, Served, browser  # noqa: F401

HEAVY = 1  # the stage given three times the work


def test_pipeline_page_draws_stages_and_waits_and_names_stage_1_slowest(
        browser: Any, pipeline_run: Report) -> None:  # noqa: F811
    served = Served(pipeline_run[0])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.set_default_timeout(browser_timeout_ms())
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.goto(served.url + "/parallelism")
        page.wait_for_function(SETTLED, arg="page-parallelism",
                               timeout=browser_timeout_ms(40), polling=100)
        page.wait_for_timeout(300)

        def text(selector: str) -> str:
            return page.locator(selector).first.text_content() or ""

        assert "active" in (page.get_attribute("#nav-parallelism", "class") or "")
        assert "pipeline (2 stages" in text("#parallelism-line")
        rows = page.locator("#stage-table tbody tr")
        assert rows.count() == 2
        assert "stage 0" in rows.nth(0).inner_text()
        slowest = page.locator("#stage-table tr.slowest")
        assert slowest.count() == 1 and f"stage {HEAVY} ◀ slowest" in slowest.inner_text()
        assert f"stage {HEAVY}" in text("#card-slowest-stage")
        assert "ideal bubble" in text("#pipeline-ideal") and "m = 8" in text("#pipeline-ideal")
        # four parts per stage, stacked; the slowest stage's tick says so
        assert page.locator("#stage-breakdown .barlayer .trace").count() == 4
        assert f"stage {HEAVY} · rank {HEAVY} ◀ slowest" in text("#stage-breakdown")
        assert "waiting on the next stage" in text("#stage-breakdown")
        # who waits on whom: both directions of the transfers between the two stages
        assert page.locator("#p2p-waits .barlayer .point").count() == 2
        assert "stage 0 (rank 0) waits on stage 1 (rank 1)" in text("#p2p-waits")
        assert page.locator("#parallelism-findings .finding[data-kind='pipeline_imbalance']"
                            ).count() == 1
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "pipeline-parallelism.png"), full_page=True)
        assert not errors, f"browser console errors on /parallelism: {errors}"
    finally:
        page.close()
        served.close()
