"""The saved diagnosis on a real run: every view (`report --json`, its straggler finding, the
dashboard's data layer, the HTML report) shows the same per-rank numbers (one `last_in`, one
lateness, one breakdown). Saving, reading back and staleness: tests/unit/test_diagnosis_saved.py."""

from __future__ import annotations

import html as H
import re
import shutil
from pathlib import Path

import pytest

from tests.unit.test_diagnosis_saved import _no_diagnosis, _report


def test_every_view_shows_the_same_rank_numbers(slow_compute_run: Path,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """One real run: `report --json`, its straggler finding, the dashboard's data layer and
    the HTML report agree on each rank's lateness, last arrivals, breakdown and step time."""
    import pyarrow.parquet as pq

    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.queries.gaps import gaps_by_rank
    from uberprof.dashboards.queries.overview import health
    from uberprof.dashboards.queries.stragglers import lateness_ranking

    run = tmp_path / "run"
    shutil.copytree(slow_compute_run, run, ignore=shutil.ignore_patterns("derived"))
    page = tmp_path / "report.html"
    doc = _report(run, "--html", str(page))
    rows = {r["rank"]: r for r in doc["ranks"]}

    # one last_in per rank: the times it alone arrived last, in the finding as in the row
    lat = pq.read_table(run / "derived" / "diagnosis" / "lateness.parquet").to_pylist()
    for r, row in rows.items():
        mine = [x for x in lat if x["rank"] == r]
        alone = sum(1 for x in mine if x["last"] and sum(
            y["last"] for y in lat if y["instance"] == x["instance"]) == 1)
        assert row["lateness_ms"]["last_in"] == alone, (r, row["lateness_ms"])
        assert row["lateness_ms"]["instances"] == len(mine)
    [f] = [f for f in doc["findings"] if f["kind"] == "straggler"]
    s = f["ranks"][0]
    assert f["evidence"]["last_in"] == rows[s]["lateness_ms"]["last_in"]
    assert f["evidence"]["instances"] == rows[s]["lateness_ms"]["instances"]
    b = f["evidence"]["basis"]  # the title states the test's basis (every step, if it can)
    assert f"last at {b['last_in']}/{b['instances']}" in f["title"]

    # the dashboard: read from the saved diagnosis, the same numbers
    _no_diagnosis(monkeypatch)
    data = RunData(root=run.resolve(), workers=1).load()
    data.warm()
    for x in lateness_ranking(data):
        lt = rows[x["rank"]]["lateness_ms"]
        assert (x["last_in"], x["instances"]) == (lt["last_in"], lt["instances"])
        assert round(x["median_ms"], 3) == lt["median"] and round(x["p90_ms"], 3) == lt["p90"]
    assert (health(data)["straggler"]["last"], health(data)["straggler"]["instances"]) == \
        (b["last_in"], b["instances"])  # the straggler's test, as in the title
    for b in data.breakdown_by_rank().to_pylist():
        pct = rows[b["rank"]]["breakdown_pct"]
        assert b["compute_only_pct"] + b["comm_under_compute_pct"] == \
            pytest.approx(pct["compute"], abs=0.01)
        for k in ("exposed_comm", "memory", "idle", "overlap"):
            assert b[f"{k}_pct"] == pytest.approx(pct[k], abs=0.01), k
        assert b["step_time_median_ms"] == rows[b["rank"]]["step_time_ms"]["median"]
    for g in gaps_by_rank(data).to_pylist():
        assert round(g["ms"], 3) == rows[g["rank"]]["idle_gaps"]["ms_by_cause"][g["cause"]]

    # the HTML report's rank table
    text = page.read_text()
    table = text[text.index("<th>rank</th>"):]
    for r, row in rows.items():
        m = re.search(rf"<tr[^>]*><td>{r}</td>(.*?)</tr>", table)
        assert m, r
        cells = [H.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", m.group(1))]
        lt = row["lateness_ms"]
        assert cells[-1] == f"{lt['last_in']}/{lt['instances']}"
        assert cells[-2] == f"{lt['median']:.2f}"
        assert cells[1] == f"{row['step_time_ms']['median']:.2f}"
