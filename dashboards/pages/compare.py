"""`/compare` (`uberprof dashboard B --compare A`): this run against a baseline, as `uberprof
diff A B` compares them: the step time of each, their ratio and whether the change is beyond
noise (and by which test), where the time moved per step, and the operators and kernels whose
time changed most. With several runs (`--compare A --compare C`), or two of other world sizes, a
scaling section as `uberprof scaling` prints it: throughput per rank, efficiency against the
smallest run, and where the step time went, part by part (the document as the analysis made
it; nothing is computed here)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import html

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import compare as q
from uberprof.dashboards.ui import Selection
from uberprof.units import fmt_num, shorten

PATH = "/compare"
TITLE = "Compare"
TOP_OPS = 30
_VERDICT_STATUS = {"slower": "bad", "faster": "ok"}


def layout(data: RunData, sel: Selection) -> html.Div:
    c = q.comparison(data)
    if c is None:
        return ui.page("page-compare", ui.notice(
            "No baseline: start the dashboard with `uberprof dashboard B --compare A` to "
            "compare this run (B) against run A.", "info", id="no-baseline"))
    scaled = scaling_section(c.scaling, c.scaling_error)
    if c.doc is None:
        return ui.page("page-compare", ui.notice(c.error, "warn", id="no-comparison"), scaled)
    doc = c.doc
    return ui.page(
        "page-compare",
        scaled,
        headline(doc),
        html.Div([ui.notice(f"note: {n}", "info") for n in doc["notes"]], id="compare-notes"),
        html.Div([
            ui.section("Where the time moved", breakdown_table(doc), id="compare-breakdown",
                       sub="ms per step, B − A; share: of the change in mean step time."),
            ui.section("Change per part", ui.graph("compare-breakdown-graph",
                                                   breakdown_figure(doc))),
        ], className="row"),
        ui.section("Operators and kernels", ops_table(doc), id="compare-ops",
                   sub=f"Self time (ms per step), the {TOP_OPS} largest changes."),
    )


def _side(doc: dict[str, Any], key: str) -> str:
    side = doc[key]
    return side["run_id"] or side["path"]


def headline(doc: dict[str, Any]) -> html.Div:
    st = doc["step_time_ms"]
    test = st["test"]
    ci = test.get("ci")
    ratio = st.get("ratio")
    cards = [
        ui.card("Step time A", ui.fmt_ms(st["a"]["median"]),
                f"median · p90 {ui.fmt_ms(st['a']['p90'])} · {st['a']['steps']} steps · "
                f"{shorten(_side(doc, 'a'), 40)}", id="card-step-a"),
        ui.card("Step time B", ui.fmt_ms(st["b"]["median"]),
                f"median · p90 {ui.fmt_ms(st['b']['p90'])} · {st['b']['steps']} steps · "
                f"{shorten(_side(doc, 'b'), 40)}", id="card-step-b"),
        ui.card("B / A", fmt_num(ratio, 3),
                f"{int(test['confidence'] * 100)}% interval {ci[0]:.3f}–{ci[1]:.3f}" if ci
                else "no interval", id="card-ratio"),
        ui.card("Verdict", st["verdict"], "significant" if st["significant"] else
                "not significant", status=_VERDICT_STATUS.get(st["verdict"], "neutral"),
                id="card-verdict"),
    ]
    return html.Div([
        html.Div(cards, className="cards"),
        html.P([html.B(st["verdict"], id="compare-verdict", **{"data-verdict": st["verdict"]}),
                f": {test['reason']}"], className="compare-reason"),
        html.P(f"Test: {test['name']}, {test['resamples']} resamples, seed {test['seed']}, "
               f"block of {test['block_steps'] or '–'} steps; a change is significant only "
               f"beyond {test['min_change_pct']:g}%.", className="muted", id="compare-test"),
    ], id="compare-headline")


def _signed(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:+.{digits}f}"


def breakdown_table(doc: dict[str, Any]) -> Any:
    rows = [[r["label"], fmt_num(r["a_ms"], 3), fmt_num(r["b_ms"], 3), _signed(r["delta_ms"]),
             fmt_num(r["share_pct"], 1)] for r in doc["breakdown"]]
    return ui.table(["part", "A", "B", "B − A", "share %"], rows, id="compare-breakdown-table")


def breakdown_figure(doc: dict[str, Any]) -> go.Figure:
    rows = [r for r in doc["breakdown"] if r["delta_ms"] is not None]
    if not rows:
        return ui.empty_figure("No breakdown in both runs.")
    fig = ui.new_figure()
    fig.add_bar(y=[r["label"] for r in rows], x=[r["delta_ms"] for r in rows], orientation="h",
                marker_color=[ui.SEVERITY_COLORS["high"] if r["delta_ms"] > 0 else "#2da44e"
                              for r in rows],
                hovertemplate="%{y}: %{x:+.3f} ms per step<extra></extra>")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="B − A (ms per step)", zeroline=True)
    return ui.base_layout(fig, height=max(240, 26 * len(rows) + 90))


def ops_table(doc: dict[str, Any]) -> Any:
    ops = doc["ops"][:TOP_OPS]  # sorted by the size of the change
    if not ops:
        return ui.notice("No operators in either run.", "info")
    rows = [[r["kind"], html.Code(shorten(r["name"], 90), title=r["name"]),
             fmt_num(r["a_calls"], 1), fmt_num(r["b_calls"], 1), fmt_num(r["a_ms"], 3),
             fmt_num(r["b_ms"], 3), _signed(r["delta_ms"]), fmt_num(r["share_pct"], 1),
             (r["only_in"] or "").upper()] for r in ops]
    return ui.table(["kind", "name", "calls A", "calls B", "A ms", "B ms", "B − A", "share %",
                     "only in"], rows, id="compare-ops-table")


# --- scaling (several runs) ---------------------------------------------------------------------

def _run_name(r: dict[str, Any]) -> str:
    return shorten(r["run_id"] or r["path"], 30)


def scaling_section(doc: dict[str, Any] | None, error: str | None) -> Any:
    """The runs' scaling (docs/scaling.md), or why there is none; nothing when the runs do
    not call for one."""
    if doc is None:
        return ui.notice(error, "warn", id="no-scaling") if error else html.Div()
    unit = doc["throughput_unit"]
    notes = [ui.notice(f"differs: {d}", "warn") for d in doc["differences"]] + \
        [ui.notice(f"note: {n}", "info") for n in doc["notes"]]
    return html.Div([
        ui.section("Scaling", scaling_table(doc), *notes, id="compare-scaling",
                   sub=f"Against the smallest run; throughput in {unit}. "
                       f"{doc['basis']['efficiency']}; {doc['basis']['throughput']}."),
        html.Div([
            ui.section("Scaling efficiency", ui.graph("compare-scaling-efficiency",
                                                      efficiency_figure(doc))),
            ui.section("Where the step time went", ui.graph("compare-scaling-lost",
                                                            lost_figure(doc)),
                       sub="ms per step, against the smallest run; "
                           f"{doc['basis']['breakdown']}."),
        ], className="row"),
    ], id="compare-scaling-block")


def scaling_table(doc: dict[str, Any]) -> Any:
    rows = [[_run_name(r), str(r["world_size"]), str(r["nodes"]), str(r["ranks"]),
             str(r["batch_per_rank"]) if r["batch_per_rank"] is not None else "?",
             fmt_num(r["step_ms"], 1), fmt_num(r["throughput_per_rank"], 3),
             fmt_num(r["throughput_total"], 3), fmt_num(r["efficiency"] * 100, 1),
             fmt_num(r["lost_ms_per_step"], 1)] for r in doc["runs"]]
    return ui.table(["run", "world", "nodes", "ranks", "batch/rank", "step ms", "per rank",
                     "total", "efficiency %", "lost ms/step"], rows, id="compare-scaling-table")


def efficiency_figure(doc: dict[str, Any]) -> go.Figure:
    runs = doc["runs"]
    fig = ui.new_figure()
    xs = [r["world_size"] for r in runs]
    fig.add_scatter(x=xs, y=[100.0] * len(xs), mode="lines", name="ideal",
                    line={"dash": "dot", "color": "#888"})
    fig.add_scatter(x=xs, y=[r["efficiency"] * 100 for r in runs], mode="lines+markers",
                    name="efficiency", text=[_run_name(r) for r in runs],
                    hovertemplate="%{text}: %{y:.1f}%<extra></extra>")
    fig.update_xaxes(title={"text": "world size"}, tickvals=sorted(set(xs)))
    fig.update_yaxes(title={"text": "efficiency %"}, rangemode="tozero")
    return ui.base_layout(fig, height=320)


def lost_figure(doc: dict[str, Any]) -> go.Figure:
    runs = doc["runs"][1:]
    if not runs:
        return ui.empty_figure("One run only.")
    x = [f"{r['world_size']} · {_run_name(r)}" for r in runs]
    fig = ui.new_figure()
    for p in doc["parts"]:
        ys = [r["delta_parts_ms"][p["key"]] for r in runs]
        if any(abs(v) >= 0.005 for v in ys):
            fig.add_bar(x=x, y=ys, name=p["label"],
                        hovertemplate=f"{p['label']}: %{{y:+.2f}} ms<extra></extra>")
    fig.add_scatter(x=x, y=[r["delta_step_ms"] for r in runs], mode="markers",
                    name="change in step time",
                    marker={"symbol": "diamond", "size": 11, "color": "#222"},
                    hovertemplate="step time: %{y:+.2f} ms<extra></extra>")
    fig.update_layout(barmode="relative")
    fig.update_yaxes(title={"text": "ms per step"}, zeroline=True)
    return ui.base_layout(fig, height=320)
