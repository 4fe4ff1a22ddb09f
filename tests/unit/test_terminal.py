"""The terminal presenters of info, analyze, calibrate and doctor print what they are given."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from uberprof.collect.capabilities import Check
from uberprof.present.terminal.analyze import MAX_ROWS, render_analysis
from uberprof.present.terminal.calibrate import render_calibration
from uberprof.present.terminal.doctor import render_checks
from uberprof.present.terminal.progress import ReadProgress


def _console() -> Console:
    return Console(record=True, width=140, force_terminal=False)


def test_calibration_table_shows_peak_in_gbits_and_sizes() -> None:
    c = _console()
    render_calibration({"groups": [{"scope": "world", "link": "inter-node", "ranks": [0, 1],
                                    "peak_busbw_Bps": 1.25e8, "half_peak_bytes": 1 << 20,
                                    "points": [{"bytes": 1 << 26, "busbw_Bps": 1.25e8}]}]}, c)
    out = c.export_text()
    assert "inter-node" in out and "1.00" in out and "64 MiB" in out and "1 MiB" in out


def test_doctor_lines_and_summary() -> None:
    c = _console()
    render_checks([Check("torch", True, "2.x"), Check("dcgm", None, "absent")], ["psutil"], c)
    out = c.export_text()
    assert "ok   torch" in out and "--   dcgm" in out and "counters: psutil" in out


def test_analysis_rows_are_cut_with_a_pointer() -> None:
    row = {"rank": 0, "mode": "device", "device_type": "cuda", "steps": 3,
           "step_time_median_ms": 1.0, "step_time_p90_ms": 2.0, "idle_pct": 3.0,
           "compute_pct": 90.0, "non_compute_pct": 7.0, "overlap_pct": None,
           "exposed_comm_pct": 1.0}
    c, err = _console(), _console()
    render_analysis([dict(row, rank=r) for r in range(MAX_ROWS + 2)], ["/t/a.json: bad"],
                    Path("/d"), 1, 2, c, err)
    out = c.export_text()
    assert "2 more ranks" in out and "1 unchanged since the last analysis" in out
    # the problems go to stderr, one line each naming the file
    assert "/t/a.json" not in out
    assert err.export_text().strip() == "uberprof analyze: /t/a.json: bad"


def test_progress_on_a_terminal_names_each_stage_and_counts_it_again() -> None:
    c = Console(record=True, width=100, force_terminal=True)
    with ReadProgress(c) as update:
        update(3, 4, "rank-0.json")
        seen = c.export_text()
        update(1, 512, "ranks/7", "reading step timelines")
        later = c.export_text()
    assert "reading traces" in seen and "3/4" in seen
    assert "reading step timelines" in later and "1/512" in later


def test_progress_is_silent_off_a_terminal() -> None:
    c = _console()
    with ReadProgress(c) as update:
        update(1, 2, "x")
    assert c.export_text() == ""
