"""The report samples in README.md and docs/report.md are what the code prints today
(uberprof/present/doc_samples.py); a change to the report that changes them fails here until
they are made again."""

from __future__ import annotations

from pathlib import Path

import pytest

from uberprof.present import doc_samples

ROOT = Path(__file__).resolve().parents[2]

SHARED = (ROOT.parent / "shared" / "traces").is_dir()


def test_the_readme_sample_is_the_reports_output_today_on_a_run_in_the_repository() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- sample: straggler -->" in text
    cache: dict[str, str] = {}
    assert doc_samples.regenerate(text, cache) == text, (
        f"README.md: stale sample; run: {doc_samples.COMMAND}")
    assert "ranked by severity" in cache["straggler"]


@pytest.mark.skipif(not SHARED, reason="../shared/traces is not there")
def test_the_report_md_sample_is_the_reports_output_today() -> None:
    text = (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    assert "<!-- sample: trace_filter -->" in text
    cache: dict[str, str] = {}
    assert doc_samples.regenerate(text, cache) == text, (
        f"docs/report.md: stale sample; run: {doc_samples.COMMAND}")
    # the sample shows the one ranking's rule and a finding that says why it gains nothing
    assert "ranked by severity" in cache["trace_filter"]
    assert "no gain projected:" in cache["trace_filter"]


def test_trim_keeps_headings_titles_and_projections_and_drops_the_rest() -> None:
    out = doc_samples.trim("run line\n\nFindings (1, ranked by X; each\nmillisecond)\n"
                           " 1. HIGH   idle (host) SUSPECTED  3.0 ms at stake, 30%\n"
                           "    Device idle 3 ms on rank 0\n    evidence: 2 gaps and a long\n"
                           "wrapped line\n    test: gaps\n"
                           "    no gain projected: none\nmodels it\n    → fix it\n\ntop ops\n")
    assert out == ("run line\n\nFindings (1, ranked by X; each\nmillisecond)\n"
                   " 1. HIGH   idle (host) SUSPECTED  3.0 ms at stake, 30%\n"
                   "    Device idle 3 ms on rank 0\n    no gain projected: none\nmodels it\n"
                   " ...\n")
