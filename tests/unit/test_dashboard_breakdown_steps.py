"""Per-rank bars at scale, on the overview and /steps. The overview's breakdown: a bar per rank and part for a few ranks, one stacked
filled path per part beyond `STACKED_STEPS_ABOVE` ranks (2,560 SVG bars at 512 ranks were
the costliest thing Chromium drew on the overview), with the same values, ranks and hover."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pyarrow as pa


def _data(n: int) -> Any:
    from uberprof.dashboards.data import BREAKDOWN_PARTS

    cols: dict[str, list[Any]] = {"rank": list(range(n))}
    for i, (key, _) in enumerate(BREAKDOWN_PARTS):
        cols[f"{key}_pct"] = [100.0 / len(BREAKDOWN_PARTS) + (r % 3) * (i - 2) for r in range(n)]
        cols[f"{key}_ns"] = [1_000_000 * (r + i) for r in range(n)]
    return SimpleNamespace(breakdown_by_rank=lambda: pa.table(cols))


def test_few_ranks_get_a_bar_per_rank_and_part_many_get_one_stacked_path_per_part() -> None:
    from uberprof.dashboards.data import BREAKDOWN_PARTS
    from uberprof.dashboards.pages.overview import STACKED_STEPS_ABOVE, breakdown_figure

    few = breakdown_figure(_data(STACKED_STEPS_ABOVE), straggler=3)
    assert [t.type for t in few.data] == ["bar"] * len(BREAKDOWN_PARTS)
    n = 4 * STACKED_STEPS_ABOVE
    many = breakdown_figure(_data(n), straggler=3)
    assert [t.type for t in many.data] == ["scatter"] * len(BREAKDOWN_PARTS)
    assert {t.stackgroup for t in many.data} == {"parts"}
    table = _data(n).breakdown_by_rank()
    for trace, (key, name) in zip(many.data, BREAKDOWN_PARTS):
        assert trace.name == name and list(trace.y) == table.column(f"{key}_pct").to_pylist()
        assert [c[0] for c in trace.customdata] == list(range(n))  # a click names the rank
        assert trace.customdata[7][1] == table.column(f"{key}_ns")[7].as_py() / 1e6
    assert many.layout.shapes[0].x0 == 3 - 0.5  # the straggler still outlined


def test_steps_rank_bars_become_stepped_lines_beyond_the_limit_with_marked_ranks_kept(
        monkeypatch: Any) -> None:
    """/steps' step time and data wait per rank: two bars per rank up to `STEPPED_ABOVE`
    ranks; beyond, one filled stepped line per series with the same values, and the
    straggler and the selected rank as points (a click still names the rank by its x)."""
    from uberprof.dashboards.pages import steps as page

    def table(n: int) -> pa.Table:
        return pa.table({"rank": list(range(n)),
                         "step_time_ns": [100_000_000 + 1_000 * r for r in range(n)],
                         "data_wait_ns": [2_000_000 + r for r in range(n)]})

    data = SimpleNamespace(straggler_rank=lambda: 5)
    n = page.STEPPED_ABOVE
    monkeypatch.setattr(page.q, "step_ranks", lambda _d, _s: table(n))
    few = page.ranks_figure(data, 3, focus=9)  # type: ignore[arg-type]
    assert [t.type for t in few.data] == ["bar", "bar"] and len(few.data[0].x) == n
    n = 4 * page.STEPPED_ABOVE
    monkeypatch.setattr(page.q, "step_ranks", lambda _d, _s: table(n))
    many = page.ranks_figure(data, 3, focus=9)  # type: ignore[arg-type]
    assert [t.type for t in many.data] == ["scatter"] * 3
    t = table(n)
    assert list(many.data[0].y) == [v / 1e6 for v in t.column("step_time_ns").to_pylist()]
    assert list(many.data[1].y) == [v / 1e6 for v in t.column("data_wait_ns").to_pylist()]
    assert list(many.data[2].x) == [5, 9] and many.data[2].mode == "markers"


def test_breakdown_hands_plotly_arrays_with_the_values_and_nulls_as_gaps() -> None:
    """The breakdown's traces carry numpy arrays (plotly checks a list element by element:
    36 ms at 512 ranks against 5 ms), with the table's values, a null share a gap (NaN) and a
    null time 0 ms in the hover."""
    import numpy as np

    from uberprof.dashboards.data import BREAKDOWN_PARTS
    from uberprof.dashboards.pages.overview import breakdown_figure

    n = 600
    base = _data(n).breakdown_by_rank()
    key = BREAKDOWN_PARTS[0][0]
    pct = base.column(f"{key}_pct").to_pylist()
    ns = base.column(f"{key}_ns").to_pylist()
    pct[5], ns[6] = None, None
    table = base.set_column(base.schema.get_field_index(f"{key}_pct"), f"{key}_pct",
                            pa.array(pct, pa.float64()))
    table = table.set_column(table.schema.get_field_index(f"{key}_ns"), f"{key}_ns",
                             pa.array(ns, pa.int64()))
    fig = breakdown_figure(SimpleNamespace(breakdown_by_rank=lambda: table), straggler=None)
    first = fig.data[0]
    for trace in fig.data:
        assert all(isinstance(v, np.ndarray) for v in (trace.x, trace.y, trace.customdata))
    assert np.isnan(first.y[5]) and first.y[4] == pct[4]
    assert first.customdata[6][1] == 0 and first.customdata[7][1] == ns[7] / 1e6
    assert list(first.customdata[:, 0]) == list(range(n))


def test_breakdown_rank_columns_join_as_the_sql_join_did_without_duckdb() -> None:
    """The breakdown's per-rank step times and host: the inner join on rank, by rank, that
    DuckDB made before (a rank on one side only is left out), now in Arrow so that the start
    does not import DuckDB."""
    from uberprof.analysis.read import sql_table
    from uberprof.dashboards.data import _with_rank_columns

    shares = pa.table({"rank": [3, 0, 2, 7], "idle_pct": [1.0, 2.0, None, 4.0]})
    rt = pa.table({"rank": [0, 2, 3, 5], "host": ["a", "b", None, "d"],
                   "step_time_median_ms": [1.5, 2.5, 3.5, 4.5], "mode": ["gpu"] * 4})
    got = _with_rank_columns(shares, rt, ("step_time_median_ms", "host"))
    want = sql_table("SELECT t.*, r.step_time_median_ms, r.host FROM t JOIN r USING (rank) "
                     "ORDER BY rank", t=shares, r=rt)
    assert got.equals(want)
    assert got.column("rank").to_pylist() == [0, 2, 3]
    assert got.column("host").to_pylist() == ["a", "b", None]
