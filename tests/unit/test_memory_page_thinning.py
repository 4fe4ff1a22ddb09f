"""The /memory page's GPU memory per step on a long run: drawn from each bucket of steps'
extremes (`dashboards/queries/memory.py:_bucket_extremes`), so that a spike, a trough and the
peak's climb stay where they are while the browser draws a few thousand points, not 10,000 a
line."""

from __future__ import annotations

import numpy as np


def test_a_long_series_keeps_its_spike_trough_last_step_and_peak_and_few_points() -> None:
    from uberprof.dashboards.queries.memory import STEP_BUCKETS, _bucket_extremes

    rng = np.random.default_rng(1)
    n = 10_000
    in_use = 1e9 + rng.normal(0, 1e6, n)
    in_use[4321], in_use[777] = 3e9, 2e8  # one spike, one trough
    in_use[5000:5010] = np.nan  # steps without a reading
    peak = np.maximum.accumulate(np.nan_to_num(in_use, nan=0.0)) + 1e6
    keep = _bucket_extremes(in_use, peak)
    assert keep.size <= 4 * STEP_BUCKETS < n
    assert {4321, 777, n - 1} <= set(keep.tolist())
    assert np.all(np.diff(keep) > 0)  # in step order, no repeats
    assert np.nanmax(in_use[keep]) == np.nanmax(in_use)
    assert np.nanmin(in_use[keep]) == np.nanmin(in_use)
    assert peak[keep].max() == peak.max()


def test_a_short_series_is_drawn_whole() -> None:
    from uberprof.dashboards.queries.memory import STEP_BUCKETS, _bucket_extremes

    n = 3 * STEP_BUCKETS
    keep = _bucket_extremes(np.arange(n, dtype=float), np.arange(n, dtype=float))
    assert keep.tolist() == list(range(n))


def test_the_page_table_keeps_the_highest_peaks_and_the_selected_rank() -> None:
    """At 512 ranks the page's table shows MAX_TABLE_ROWS of them (every rank stays in
    `run.memory.ranks`): the highest GPU peaks, in rank order, with the selected rank."""
    from types import SimpleNamespace

    from uberprof.dashboards.queries import memory as q

    rows = [{"rank": r, "gpu_peak_bytes": (r * 7919) % 1000} for r in range(512)]
    d = SimpleNamespace(run={"memory": {"ranks": rows}})
    data = SimpleNamespace(diagnose=lambda: d)
    shown = q.table_rows(data)  # type: ignore[arg-type]
    assert len(shown) == q.MAX_TABLE_ROWS
    assert [r["rank"] for r in shown] == sorted(r["rank"] for r in shown)
    lowest_shown = min(r["gpu_peak_bytes"] for r in shown)
    assert sum(r["gpu_peak_bytes"] > lowest_shown for r in rows) < q.MAX_TABLE_ROWS
    low = min(rows, key=lambda r: r["gpu_peak_bytes"])["rank"]
    with_sel = q.table_rows(data, selected=low)  # type: ignore[arg-type]
    assert low in [r["rank"] for r in with_sel] and len(with_sel) == q.MAX_TABLE_ROWS
    small = SimpleNamespace(diagnose=lambda: SimpleNamespace(run={"memory": {"ranks": rows[:8]}}))
    assert q.table_rows(small) == rows[:8]  # type: ignore[arg-type]
