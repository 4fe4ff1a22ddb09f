"""The saved diagnosis (uberprof.analysis.diagnosis.saved): `uberprof report` writes it,
the dashboard and export read it back while it is fresh, a changed option or input makes it
stale. On a real run every view shows the same per-rank numbers:
tests/jobs/test_diagnosis_saved_jobs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from tests import _traces as T
from tests.unit.test_report_cli import _two_rank_traces
from uberprof.analysis.diagnosis import advisor
from uberprof.analysis.diagnosis.saved import load, load_or_diagnose
from uberprof.analysis.tables.context import load_context
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




def test_analysing_again_with_force_makes_the_saved_diagnosis_stale(tmp_path: Path) -> None:
    folder = _two_rank_traces(tmp_path)
    out = tmp_path / "d"
    _report(folder, "--out", str(out))
    assert load(load_context(folder, out=out)) is not None
    # the same inputs, analysed again (a newer uberprof's tables): nothing says the saved
    # diagnosis was made from these tables, so it is not reused
    ctx = load_context(folder, out=out, force=True)
    assert load(ctx) is None
