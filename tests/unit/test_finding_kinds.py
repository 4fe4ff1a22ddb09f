"""A finding kind declares itself in its own module (findings/kind.py): its role, evidence
sentence, details, what-if change or the reason it has none, dashboard page and remedy. These
tests hold the declarations to what the rest of the code relies on, and add a toy kind to show
that the report, the HTML report, the dashboard and the export show a new kind with no change
outside its own module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests._export_check import load
from tests._export_traces import write_traces
from uberprof.analysis.diagnosis import causes, findings
from uberprof.analysis.diagnosis.causes import GAP_CAUSES, WARMUP
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind, no_change
from uberprof.analysis.diagnosis.gains import finding_change
from uberprof.analysis.diagnosis.gaps import CAUSES
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.diagnosis.whatif_changes import Change

ROLES = {"failure", "context", "verdict"}


def _kinds() -> list[FindingKind]:
    return [k for p in findings.PRODUCERS for k in p.kinds]


def _bare(kind: str, cause: str | None = None) -> Finding:
    return Finding(kind=kind, severity="low", title="t", ranks=[1], steps=[], cause=cause,
                   time_at_stake_ms=1.0, evidence={}, remedy="r")


def test_every_kind_declares_a_role_a_dashboard_page_and_a_remedy_in_causes() -> None:
    from uberprof.dashboards.ui import PAGES

    pages = {path for path, _ in PAGES}
    names = [k.name for k in _kinds()]
    assert len(names) == len(set(names)), "a kind declared twice"
    for k in _kinds():
        assert k.role in ROLES, k
        assert k.page in pages, (k.name, k.page)
        assert k.remedy_from and hasattr(causes, k.remedy_from), (k.name, k.remedy_from)
        assert k.summary, k.name


def test_the_idle_kinds_are_the_gap_causes_kinds() -> None:
    from uberprof.analysis.diagnosis.findings import idle

    assert {k.name for k in idle.KINDS} == {GAP_CAUSES[c].kind for c in CAUSES if c != WARMUP}


def test_every_kind_gives_a_change_or_a_reason_for_a_finding_with_no_evidence() -> None:
    for k in _kinds():
        change, why = k.change(_bare(k.name))
        assert (change is None) == bool(why), (k.name, change, why)


def test_gains_take_the_change_each_kind_declares() -> None:
    assert finding_change(_bare("straggler")) == (Change("straggler", rank=1), "")
    assert finding_change(_bare("data_stall"))[0] == Change("data")
    assert finding_change(_bare("idle", "sync"))[0] == Change("sync")
    change, why = finding_change(_bare("idle", "host"))
    assert change is None and "'host'" in why
    change, why = finding_change(_bare("hang"))
    assert change is None and "stops" in why
    change, why = finding_change(_bare("no_such_kind"))
    assert change is None and "no_such_kind" in why


def test_declaring_stamps_role_page_sentence_and_details() -> None:
    f = findings.declare([Finding(
        kind="host_cpu", severity="medium", title="t", ranks=[0], steps=[], cause="host_cpu",
        time_at_stake_ms=0.0, remedy="r",
        evidence={"median_pct": 97.0, "p10_pct": 91.0, "samples": 12, "basis": "whole run"})])[0]
    assert (f.role, f.page) == ("context", "/counters")
    assert f.evidence_sentence == "median 97.0%, p10 91.0% over 12 samples (whole run)"
    assert f.stake_words() == "no time of its own: it explains other findings"
    doc = f.as_dict()
    assert doc["role"] == "context" and doc["evidence_sentence"] == f.evidence_sentence


# --- a toy kind, declared here and registered for the test only --------------------------------

TOY_TITLE = "A toy holds the job back on rank 0"
TOY_EVIDENCE = "the toy turned 7 times a step"
TOY_DETAIL = "toy detail: gear 3 of 4"
TOY_REMEDY = "Take the toy away."
TOY_WHY = "no what-if change models a toy"
TOY = FindingKind("toy_kind", VERDICT, lambda f: f"the toy turned {f.evidence['turns']} "
                  "times a step", no_change(TOY_WHY), page="/operators",
                  remedy_from="HOST_CPU", details=lambda f: [TOY_DETAIL],
                  summary="a toy, for this test")


def _toy(facts: Any) -> list[Finding]:
    return [Finding(kind="toy_kind", severity="high", title=TOY_TITLE, ranks=[0], steps=[],
                    cause=None, time_at_stake_ms=0.5, evidence={"turns": 7},
                    remedy=TOY_REMEDY)]


@pytest.fixture()
def toy_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A two-rank trace folder diagnosed with the toy kind registered."""
    from uberprof.analysis.read import open_run

    monkeypatch.setattr(findings, "PRODUCERS",
                        (*findings.PRODUCERS, findings.Producer((TOY,), _toy)))
    write_traces(tmp_path / "traces", world=2)
    return open_run(tmp_path / "traces", out=tmp_path / "derived")


def test_a_toy_kind_shows_in_every_view_with_no_change_outside_its_module(
        toy_opened: Any, tmp_path: Path) -> None:
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.pages import overview
    from uberprof.dashboards.ui import Selection
    from uberprof.present.export import ExportOptions, export_trace
    from uberprof.present.report_html import render_html
    from uberprof.present.report_terminal import render_report

    d = toy_opened.diagnosis
    toy = next(f for f in d.findings if f.kind == "toy_kind")
    assert (toy.evidence_sentence, toy.details, toy.page) == (TOY_EVIDENCE, [TOY_DETAIL],
                                                              "/operators")
    assert toy.projected_gain is None and toy.projected_gain_why == TOY_WHY
    saved = json.loads(json.dumps(d.to_json()))
    doc = next(f for f in saved["findings"] if f["kind"] == "toy_kind")
    assert doc["evidence_sentence"] == TOY_EVIDENCE and doc["details"] == [TOY_DETAIL]

    console = Console(record=True, width=200)
    render_report(d, console)
    text = console.export_text()
    for words in (TOY_TITLE, TOY_EVIDENCE, TOY_DETAIL, TOY_REMEDY):
        assert words in text, words

    page = render_html(d)
    for words in (TOY_TITLE, TOY_EVIDENCE, TOY_DETAIL, TOY_REMEDY):
        assert words in page, words

    listed = overview.findings_list(RunData.of(toy_opened, workers=1), Selection())
    box = _find(listed, lambda c: getattr(c, "id", "").startswith("finding-")
                and TOY_TITLE in _text(c))
    assert TOY_EVIDENCE in _text(box) and TOY_REMEDY in _text(box)
    link = _find(box, lambda c: getattr(c, "className", None) == "finding-link")
    assert link.href.startswith("/operators"), link.href

    out = export_trace(toy_opened, tmp_path / "merged.json", ExportOptions(gzip=False))
    marks = [e for e in load(out.path)["traceEvents"]
             if (e.get("args") or {}).get("kind") == "toy_kind"]
    assert marks and marks[0]["args"]["evidence_sentence"] == TOY_EVIDENCE
    assert marks[0]["name"] == TOY_TITLE


def _text(component: Any) -> str:
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return " ".join(_text(c) for c in component)
    return _text(getattr(component, "children", None))


def _find(component: Any, pred: Any) -> Any:
    """The first component of a Dash tree that `pred` accepts (fails when none does)."""
    stack = [component]
    while stack:
        c = stack.pop(0)
        if isinstance(c, (list, tuple)):
            stack[:0] = list(c)
        elif c is not None and not isinstance(c, (str, int, float)):
            if pred(c):
                return c
            stack[:0] = [getattr(c, "children", None)]
    raise AssertionError("no such component")


def test_the_kinds_table_in_findings_md_is_the_one_the_declarations_make() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "findings.md"
    text = page.read_text()
    assert findings.with_kinds_table(text) == text, (
        "docs/findings.md's kinds table is stale: run "
        "`python -m uberprof.analysis.diagnosis.findings docs/findings.md`")


def test_a_findings_document_has_exactly_the_keys_its_generated_table_lists() -> None:
    from uberprof.analysis.diagnosis.schema_doc import schema_rows

    f = findings.declare([_bare("exposed_comm")])[0]
    assert set(f.as_dict()) == {name for name, _, _ in schema_rows(Finding)}
    assert all(doc for _, _, doc in schema_rows(Finding))
