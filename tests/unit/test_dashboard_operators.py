"""The dashboard's `/operators` page without a browser, on a real run: samples/gpu/straggler
(two ranks sharing an H100, rank 1 running its forward pass twice: samples/gpu/README.md),
copied because the analysis writes into the run directory. The table holds the report's
`run.operators` rows of the picked kind; picking a row (the app's own callback, as the browser
asks for it) draws that operator on every rank, the numbers the document's spread was made of."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests._jobs import SAMPLES
from tests.unit.test_dashboard import _client, _component, _ids, _route, _text

STRAGGLER = 1  # samples/gpu/straggler: rank 1 computes twice


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from uberprof.dashboards.data import RunData

    run = Path(shutil.copytree(SAMPLES / "gpu" / "straggler",
                               tmp_path_factory.mktemp("dash-ops") / "straggler"))
    data = RunData(root=run, workers=1).load()
    data.warm()
    return data


def _layout(data: Any) -> Any:
    from uberprof.dashboards.pages import operators
    from uberprof.dashboards.ui import Selection

    return operators.layout(data, Selection())


OUTPUTS = [("operators-table", "data"), ("operators-table", "columns"),
           ("operators-table", "tooltip_data"), ("operators-table", "active_cell"),
           ("operators-table", "selected_cells"),
           ("operators-table", "sort_by"), ("operators-ranks", "figure"),
           ("operators-picked", "children"), ("operators-group", "style")]


def _pick(client: Any, kind: str, cell: dict[str, Any] | None, changed: str,
          group: str = "name") -> dict[str, Any]:
    """What the page's callback answers when the kind selector, the grouping toggle or the
    active cell changes (the request the browser makes); {output id: value}, absent where it
    did not change."""
    r = client.post("/_dash-update-component", json={
        "output": ".." + "...".join(f"{i}.{p}" for i, p in OUTPUTS) + "..",
        "outputs": [{"id": i, "property": p} for i, p in OUTPUTS],
        "inputs": [{"id": "operators-kind", "property": "value", "value": kind},
                   {"id": "operators-group", "property": "value", "value": group},
                   {"id": "operators-table", "property": "active_cell", "value": cell}],
        "changedPropIds": [changed],
        "state": [{"id": "url", "property": "search", "value": ""}]})
    assert r.status_code in (200, 204), r.get_data(as_text=True)[:500]
    if r.status_code == 204:
        return {}
    resp = json.loads(r.get_data(as_text=True))["response"]
    return {f"{i}.{p}": v for i, props in resp.items() for p, v in props.items()}


def test_the_table_holds_the_reports_rows_of_each_kind(gpu_data: Any) -> None:
    doc = gpu_data.diagnose().run["operators"]
    lay = _layout(gpu_data)
    assert {"operators-table", "operators-kind", "operators-ranks", "card-top-operator",
            "operators-cards"} <= _ids(lay)
    table = _component(lay, "operators-table")
    assert table.sort_action == "native"
    names = [c["name"] for c in table.columns]
    assert names[:5] == ["name", "calls", "self ms", "total ms", "mean µs"]
    assert {"min ms/step", "min rank", "max ms/step", "max rank", "self % of steps"} <= set(names)
    ops = doc["operators"]
    assert len(table.data) == len(ops) == min(30, doc["operators_total"]) == 30
    for rec, e in zip(table.data, ops):
        assert (rec["name"], rec["calls"], rec["self_ms"], rec["total_ms"], rec["mean_us"],
                rec["share_pct"]) == (e["name"], e["calls"], e["self_ms"], e["total_ms"],
                                      e["mean_us"], e["self_pct"])
        s = e["self_ms_per_step"]
        assert (rec["min_ms"], rec["min_rank"], rec["max_ms"], rec["max_rank"]) == \
            (s["min"], s["min_rank"], s["max"], s["max_rank"])
    assert table.data[0]["name"] == "aten::mm"  # the top operator by self time
    # the selector offers what the run has: a Gloo job has no communication kernel
    options = _component(lay, "operators-kind").options
    assert [o["value"] for o in options] == ["operator", "kernel", "memory"]
    assert not doc["comm_kernels"]
    assert f"operators (30 of {doc['operators_total']})" in options[0]["label"]
    assert "aten::mm" in _text(_component(lay, "operators-picked"))


def test_the_kind_selector_fills_the_table_with_that_kind(gpu_data: Any) -> None:
    from uberprof.dashboards.queries import operators as q

    doc = gpu_data.diagnose().run["operators"]
    c = _client(gpu_data)
    got = _pick(c, "kernel", None, "operators-kind.value")
    rows = got["operators-table.data"]
    kernels = [e for e in doc["kernels"] if e["kind"] == "kernel"]
    assert len(rows) == len(kernels) > 10
    assert [r["calls"] for r in rows] == [e["calls"] for e in kernels]
    assert [r["self_ms"] for r in rows] == [e["time_ms"] for e in kernels]
    assert "% of device" in [col["name"] for col in got["operators-table.columns"]]
    assert got["operators-table.active_cell"] is None
    assert got["operators-table.tooltip_data"][0]["name"]["value"] == kernels[0]["name"]
    mem = _pick(c, "memory", None, "operators-kind.value")["operators-table.data"]
    assert mem and {r["kind"] for r in mem} <= {"memcpy", "memset"}
    assert len(mem) == sum(e["kind"] in ("memcpy", "memset") for e in doc["kernels"])
    assert q.rows(gpu_data, "comm_kernel") == []


def test_picking_an_operator_draws_one_bar_per_rank(gpu_data: Any) -> None:
    doc = gpu_data.diagnose().run["operators"]
    c = _client(gpu_data)
    for kind, key, spread in (("operator", "operators", "self_ms_per_step"),
                              ("kernel", "kernels", "ms_per_step")):
        entries = doc[key]
        i = 3 if kind == "operator" else 0
        cell = {"row": 0, "column": 0, "column_id": "name", "row_id": f"{kind}:{i}"}
        got = _pick(c, kind, cell, "operators-table.active_cell")
        assert "operators-table.data" not in got  # the table stays as it is (sorted)
        fig = got["operators-ranks.figure"]
        (bars,) = [t for t in fig["data"] if t["type"] == "bar"]
        assert len(bars["x"]) == len(bars["y"]) == doc["ranks"] == 2  # one bar per rank
        assert [cd[0] for cd in bars["customdata"]] == [0, 1]
        y = bars["y"]
        s = entries[i][spread]
        assert round(min(y), 3) == s["min"] and round(max(y), 3) == s["max"]
        assert [cd[0] for cd in bars["customdata"]][y.index(max(y))] == s["max_rank"]
        assert entries[i]["name"][:20] in got["operators-picked.children"] or kind == "kernel"
        colors = bars["marker"]["color"]
        assert colors[STRAGGLER] != colors[0]  # the straggler's bar is red
    # the straggler runs its forward pass twice: the top kernel (a GEMM) has twice the calls
    (top,) = [t for t in fig["data"] if t["type"] == "bar"]
    calls = [cd[1] for cd in top["customdata"]]
    assert calls[STRAGGLER] == 2 * calls[0]


def test_the_page_is_in_the_nav_and_answers_its_route(gpu_data: Any) -> None:
    c = _client(gpu_data)
    status, body = _route(c, "/operators", "?rank=1")
    assert status == 200 and "page-operators" in body and "operators-table" in body
    assert "nav-operators" in body and "Traceback" not in body
    from uberprof.dashboards.ui import PAGES

    paths = [p for p, _ in PAGES]
    assert paths.index("/operators") == paths.index("/parallelism") + 1


def test_a_diagnosis_without_operators_says_so(gpu_data: Any) -> None:
    from uberprof.dashboards.data import RunData

    d = gpu_data.opened.diagnosis
    old = dataclasses.replace(d, run={**d.run, "operators": None})
    data = RunData.of(dataclasses.replace(gpu_data.opened, diagnosis=old), workers=1)
    lay = _layout(data)
    assert "operators-none" in _ids(lay) and "operators-table" not in _ids(lay)
    assert "uberprof report" in _text(lay)


def test_the_grouping_toggle_shows_operators_by_name_and_input_shapes(gpu_data: Any) -> None:
    """The sample's traces recorded input shapes (its ranks run Gloo): the toggle shows, and
    by name and input shapes the table holds the document's `operators_by_shapes`, with an
    input shapes column; a row picked there is drawn with only its calls of those shapes."""
    doc = gpu_data.diagnose().run["operators"]
    assert doc["shapes_recorded"] and doc["operators_by_shapes"]
    lay = _layout(gpu_data)
    assert _component(lay, "operators-group").style == {}  # shown for host operators
    c = _client(gpu_data)
    got = _pick(c, "operator", None, "operators-group.value", group="shapes")
    rows = got["operators-table.data"]
    shaped = doc["operators_by_shapes"]
    assert [(r["name"], r["shapes"], r["calls"], r["self_ms"]) for r in rows] == \
        [(e["name"], e["shapes"] or "(not recorded)", e["calls"], e["self_ms"]) for e in shaped]
    assert "input shapes" in [col["name"] for col in got["operators-table.columns"]]
    # one operator name split by shapes: its by-shape rows are more than its by-name row
    assert doc["operators_by_shapes_total"] > doc["operators_total"]
    i = next(i for i, e in enumerate(shaped) if e["shapes"])
    cell = {"row": i, "column": 0, "column_id": "name", "row_id": f"operator+shapes:{i}"}
    got = _pick(c, "operator", cell, "operators-table.active_cell", group="shapes")
    (bars,) = [t for t in got["operators-ranks.figure"]["data"] if t["type"] == "bar"]
    s = shaped[i]["self_ms_per_step"]
    assert round(max(bars["y"]), 3) == s["max"] and round(min(bars["y"]), 3) == s["min"]
    assert sum(cd[1] for cd in bars["customdata"]) == shaped[i]["calls"]
    # kernels have no shapes: the toggle hides
    got = _pick(c, "kernel", None, "operators-kind.value", group="shapes")
    assert got["operators-group.style"] == {"display": "none"}
    assert "input shapes" not in [col["name"] for col in got["operators-table.columns"]]
