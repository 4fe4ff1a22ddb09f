"""The saved diagnosis (uberprof.analysis.diagnosis.saved): `uberprof report` writes it, the dashboard and
export read it back while it is fresh, a changed option or input makes it stale; and on a real
run every view shows the same per-rank numbers (one `last_in`, one lateness, one breakdown)."""

from __future__ import annotations

import html as H
import json
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tests import _traces as T
from tests._diag_runs import slow_compute_run  # noqa: F401
from tests.test_report_cli import _two_rank_traces
from uberprof.analysis.diagnosis import advisor
from uberprof.analysis.tables.context import load_context
from uberprof.analysis.diagnosis.saved import load, load_or_diagnose
from uberprof.cli import main


def _no_diagnosis(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("diagnosed again although a fresh diagnosis was saved")
    monkeypatch.setattr(advisor, "diagnose_context", refuse)


def _report(path: Path, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["report", str(path), "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _json(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY))


def test_a_saved_diagnosis_is_read_back_whole(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _two_rank_traces(tmp_path)
    out = tmp_path / "d"
    doc = _report(folder, "--out", str(out))
    first = advisor.diagnose_context(load_context(folder, out=out))
    _no_diagnosis(monkeypatch)
    assert _report(folder, "--out", str(out)) == doc  # the report reuses it
    d = load_or_diagnose(load_context(folder, out=out))
    assert _json(d.to_json()) == _json(first.to_json())
    assert d.summaries.lateness.equals(first.summaries.lateness)
    assert d.summaries.idle.equals(first.summaries.idle)
    assert d.lateness.equals(first.lateness) and d.gaps.equals(first.gaps)
    assert d.alignment.as_dict() == first.alignment.as_dict()
    assert d.matched.instances.equals(first.matched.instances)  # back on the ranks' clocks
    assert d.matched.n_instances == first.matched.n_instances == 2
    assert [c.as_dict() for c in d.classes] == [c.as_dict() for c in first.classes]
    assert d.findings == first.findings and d.top_gaps == _json(first.top_gaps)
    assert d.straggler == first.straggler and d.steps.equals(first.steps)


def test_the_dashboard_reads_the_saved_diagnosis(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from uberprof.dashboards.data import RunData

    folder = _two_rank_traces(tmp_path)
    doc = _report(folder, "--out", str(tmp_path / "d"))
    _no_diagnosis(monkeypatch)
    data = RunData(root=folder.resolve(), out=tmp_path / "d", workers=1).load()
    data.warm()  # what `uberprof dashboard` does before it serves
    assert data._diagnosis_error is None
    assert [f.as_dict() for f in data.findings()] == doc["findings"]
    assert data.diagnose().run["path"] == str(folder.resolve())  # as this caller named it


def test_a_stale_diagnosis_is_made_again(tmp_path: Path) -> None:
    folder = _two_rank_traces(tmp_path)
    out = tmp_path / "d"
    _report(folder, "--out", str(out))
    ctx = load_context(folder, out=out)
    assert load(ctx) is not None
    assert load(ctx, threshold_ns=500_000) is None  # another option
    # another option: diagnosed with it, and saved in place of the old one
    doc = _report(folder, "--out", str(out), "--gap-threshold-us", "500")
    assert doc["run"]["gap_threshold_us"] == 500.0
    assert load(ctx) is None and load(ctx, threshold_ns=500_000) is not None
    # other inputs: rank 1 is now on time, and the analysis picks the change up
    T.write(folder / "rank-1.json", T.cpu_step_trace(rank=1))
    ctx = load_context(folder, out=out)
    assert load(ctx, threshold_ns=500_000) is None
    calls: list[int] = []
    real = advisor.diagnose_context

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(advisor, "diagnose_context", counted)
        load_or_diagnose(ctx, threshold_ns=500_000)
        load_or_diagnose(ctx, threshold_ns=500_000)
    assert calls == [1]  # diagnosed once, then read back


@pytest.mark.slow
def test_every_view_shows_the_same_rank_numbers(slow_compute_run: Path,  # noqa: F811
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
