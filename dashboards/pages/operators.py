"""`/operators`: the views TensorBoard's profiler plugin had (issue 27). Which host operators
and device kernels the analysed steps spent their time in, as the report saved them
(`run.operators`: calls, self and total time, mean per call, shares of the analysed steps' time,
the spread across ranks per step with the rank at each end), in a table that sorts on any
column; a kind selector (operators, kernels, communication kernels, memory copies); for host
operators whose traces recorded input shapes, a grouping toggle (by name / by name and input
shapes: the document's `operators` or `operators_by_shapes`); and the picked row on every rank
(its self time per analysed step from the saved operator table), so a rank that does more of it
than the others stands out.

The kind, the grouping and the picked row are the page's own state (not in the address): the
table and the bars change in place."""

from __future__ import annotations

import warnings
from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html, no_update

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import operators as q
from uberprof.dashboards.ui import Selection
from uberprof.present.terminal.operators import kernel_label
from uberprof.units import fmt_ms, fmt_num, shorten

PATH = "/operators"
TITLE = "Operators"
NAME_CHARS = 90  # a kernel's name in the table (whole on hover)


def layout(data: RunData, sel: Selection) -> html.Div:
    body: list[Any] = [ui.missing_notices(data.missing())]
    if not data.has_traces:
        return ui.without_traces("page-operators", body,
                                 "Operators and kernels are read from traces.", id="operators-none")
    doc = q.document(data)
    kinds = q.kinds_present(data) if doc is not None else []
    if not kinds:
        body.append(ui.notice(
            "No operators to show: the analysed steps hold no operator or kernel, or this "
            "diagnosis was saved before uberprof saved them (run `uberprof report` on the run "
            "again)." if doc is None else
            "No operators or kernels in the analysed steps.", "info", id="operators-none"))
        return ui.page("page-operators", *body)
    kind = kinds[0]
    rows = q.rows(data, kind)
    body.append(cards(doc))
    body.append(ui.section(
        "Operators and kernels",
        dcc.RadioItems(id="operators-kind", value=kind, inline=True, className="kind-picker",
                       options=[{"label": f" {_kind_label(data, k)}", "value": k}
                                for k in kinds], inputStyle={"marginLeft": "12px"}),
        grouping(data, kind),
        table(rows, kind),
        html.P(f"Basis: {doc.get('basis', '')}. Click a row to see it on every rank.",
               className="section-sub", id="operators-basis"),
        id="operators-section",
        sub="Summed over every rank's analysed steps; the report keeps the top "
            "30 of each list (the whole table is derived/operators.parquet). Click a column's "
            "arrows to sort."))
    first = rows[0]
    body.append(ui.section(
        "Across ranks",
        html.Div(picked_text(first), id="operators-picked", className="finding-title"),
        ui.graph("operators-ranks", bars_figure(data, first, sel.rank)),
        id="operators-ranks-section",
        sub="The picked row's time per analysed step on each rank (host operators: self "
            "time; device work: its time), the dashed line the median rank: a rank far above "
            "the others does extra work there."))
    return ui.page("page-operators", *body)


GROUPINGS = (("name", "by name"), ("shapes", "by name and input shapes"))


def _grouping_style(data: RunData, kind: str) -> dict[str, str]:
    """The grouping toggle shows for host operators whose traces recorded input shapes."""
    return {} if kind == "operator" and q.shapes_recorded(data) else {"display": "none"}


def grouping(data: RunData, kind: str) -> Any:
    """By name, or by name and input shapes (always in the layout: the callback reads it)."""
    return dcc.RadioItems(id="operators-group", value="name", inline=True,
                          className="kind-picker", style=_grouping_style(data, kind),
                          options=[{"label": f" {label}", "value": v} for v, label in GROUPINGS],
                          inputStyle={"marginLeft": "12px"})


def _kind_label(data: RunData, kind: str) -> str:
    label = next(k[1] for k in q.KINDS if k[0] == kind)
    n, of = len(q.rows(data, kind)), q.totals(data, kind)
    return f"{label} ({n} of {of})" if of and of > n else f"{label} ({n})"


def cards(doc: dict[str, Any]) -> html.Div:
    ops = doc.get("operators") or []
    kernels = doc.get("kernels") or []
    kids = [
        ui.card("Analysed", f"{doc.get('ranks')} rank(s)",
                f"{doc.get('rank_steps')} rank-steps, {fmt_ms(doc.get('step_time_ms'))} in all",
                id="card-operators-steps"),
    ]
    if doc.get("device_time_ms") is not None:
        kids.append(ui.card("Device activity", fmt_ms(doc.get("device_time_ms")),
                            "kernels, communication kernels, copies and sets",
                            id="card-device-time"))
    if ops:
        o = ops[0]
        kids.append(ui.card("Top operator", shorten(o["name"], 18),
                            f"self {fmt_ms(o.get('self_ms'))}, "
                            f"{fmt_num(o.get('self_pct'), unit='%')} of the steps' time",
                            id="card-top-operator", hint=o["name"]))
    if kernels:
        k = kernels[0]
        kids.append(ui.card("Top kernel", shorten(kernel_label(k["name"]), 18),
                            f"{fmt_ms(k.get('time_ms'))}, {fmt_num(k.get('device_pct'), unit='%')}"
                            " of device time", id="card-top-kernel", hint=k["name"]))
    return html.Div(kids, className="cards", id="operators-cards")


def _columns(kind: str, by_shapes: bool = False) -> list[dict[str, Any]]:
    from dash.dash_table.Format import Format, Scheme

    def num(cid: str, name: str, digits: int = 2) -> dict[str, Any]:
        return {"id": cid, "name": name, "type": "numeric",
                "format": Format(precision=digits, scheme=Scheme.fixed)}

    host = kind == "operator"
    cols = [{"id": "name", "name": "name", "type": "text"}]
    if host and by_shapes:
        cols.append({"id": "shapes", "name": "input shapes", "type": "text"})
    if kind == "memory":
        cols.append({"id": "kind", "name": "kind", "type": "text"})
    cols += [{"id": "calls", "name": "calls", "type": "numeric"}]
    cols += [num("self_ms", "self ms"), num("total_ms", "total ms")] if host else \
        [num("self_ms", "ms")]
    cols += [num("mean_us", "mean µs", 1),
             num("share_pct", "self % of steps" if host else "% of steps", 2),
             num("total_pct", "total % of steps" if host else "% of device", 2),
             {"id": "ranks", "name": "ranks", "type": "numeric"},
             num("min_ms", "min ms/step", 3), {"id": "min_rank", "name": "min rank",
                                                "type": "numeric"},
             num("max_ms", "max ms/step", 3), {"id": "max_rank", "name": "max rank",
                                                "type": "numeric"}]
    return cols


def _records(rows: list[q.Row]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        rec = {k: getattr(r, k) for k in ("id", "kind", "calls", "self_ms", "total_ms", "mean_us",
                                          "share_pct", "total_pct", "ranks", "min_ms",
                                          "min_rank", "max_ms", "max_rank")}
        rec["name"] = r.name if r.kind == "operator" else kernel_label(r.name, NAME_CHARS)
        rec["shapes"] = r.shapes if r.shapes is not None else "(not recorded)"
        out.append(rec)
    return out


def _tooltips(rows: list[q.Row]) -> list[dict[str, Any]]:
    return [{"name": {"value": r.name, "type": "text"},
             **({"shapes": {"value": r.shapes, "type": "text"}} if r.shapes else {})}
            for r in rows]


def table(rows: list[q.Row], kind: str) -> Any:
    from dash import dash_table

    with warnings.catch_warnings():  # Dash 4 says DataTable will leave its built-ins
        warnings.simplefilter("ignore", DeprecationWarning)
        return dash_table.DataTable(
            id="operators-table", columns=_columns(kind), data=_records(rows),
            tooltip_data=_tooltips(rows), tooltip_delay=300, tooltip_duration=None,
            sort_action="native", sort_mode="single", page_action="none",
            cell_selectable=True, style_as_list_view=True,
            style_table={"overflowX": "auto"},
            style_header={"fontWeight": "600", "backgroundColor": "#f6f7f9",
                          "whiteSpace": "normal", "height": "auto"},
            style_cell={"fontFamily": "Inter, system-ui, sans-serif", "fontSize": "12px",
                        "padding": "4px 6px", "textAlign": "right"},
            style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left"}
                                    for c in ("name", "kind", "shapes")] + [
                {"if": {"column_id": "shapes"}, "maxWidth": "260px", "overflow": "hidden",
                 "textOverflow": "ellipsis", "whiteSpace": "nowrap"}] + [
                {"if": {"column_id": "name"}, "maxWidth": "320px", "overflow": "hidden",
                 "textOverflow": "ellipsis", "whiteSpace": "nowrap"}],
            style_data_conditional=[{"if": {"state": s}, "backgroundColor": "#eef4fb",
                                     "border": "1px solid #4C78A8"}
                                    for s in ("selected", "active")],
        )


def picked_text(row: q.Row) -> str:
    what = "self time" if row.kind == "operator" else "time"
    name = row.name if row.kind == "operator" else kernel_label(row.name, 120)
    if row.shapes is not None:
        name = f"{name} {shorten(row.shapes, 80)}"
    return f"{name}: {what} per analysed step by rank"


def bars_figure(data: RunData, row: q.Row, selected: int | None) -> go.Figure:
    bars = q.per_rank(data, row.kind, row.name, row.shapes)
    if bars is None or not bars.ranks:
        return ui.empty_figure("No rank has this operator in its analysed steps.")
    straggler = data.straggler_rank()
    colors = [ui.STRAGGLER if r == straggler else "#1f3b63" if r == selected
              else ui.PART_COLORS["compute"] for r in bars.ranks]
    fig = ui.new_figure()
    fig.add_bar(x=list(range(len(bars.ranks))), y=bars.ms_per_step.tolist(), marker_color=colors,
                customdata=[[r, int(c), int(n)] for r, c, n in zip(bars.ranks, bars.calls,
                                                                     bars.steps)],
                hovertemplate=f"rank %{{customdata[0]}}: %{{y:.3f}} ms {bars.time} time per "
                              "step<br>%{customdata[1]} call(s) in %{customdata[2]} analysed "
                              "step(s)<extra></extra>", name=bars.time)
    if row.median_ms is not None and len(bars.ranks) > 1:
        fig.add_hline(y=row.median_ms, line={"dash": "dash", "color": "#666", "width": 1},
                      annotation_text=f"median {row.median_ms:.3f} ms",
                      annotation_position="top left")
    fig.update_xaxes(**ui.rank_ticks(bars.ranks, straggler, positional=True))
    fig.update_yaxes(title=f"ms {bars.time} time per step", rangemode="tozero")
    fig.update_layout(bargap=0.15 if len(bars.ranks) > 32 else 0.35, showlegend=False)
    return ui.base_layout(fig, height=320)


def _row_of(data: RunData, kind: str, row_id: Any, by_shapes: bool = False) -> q.Row | None:
    rows = q.rows(data, kind, by_shapes)
    return next((r for r in rows if r.id == row_id), rows[0] if rows else None)


def register(app: Any, data_of: Any) -> None:
    """The kind selector and the grouping toggle fill the table (its top row picked); a
    click on a row draws that row on every rank."""
    @app.callback(Output("operators-table", "data"), Output("operators-table", "columns"),
                  Output("operators-table", "tooltip_data"),
                  Output("operators-table", "active_cell"),
                  Output("operators-table", "selected_cells"),
                  Output("operators-table", "sort_by"),
                  Output("operators-ranks", "figure"), Output("operators-picked", "children"),
                  Output("operators-group", "style"),
                  Input("operators-kind", "value"), Input("operators-group", "value"),
                  Input("operators-table", "active_cell"),
                  State("url", "search"), prevent_initial_call=True)
    def _pick(kind: str | None, group: str | None, cell: dict[str, Any] | None,
              search: str | None) -> tuple[Any, ...]:
        data = data_of()
        kind = kind or "operator"
        by_shapes = group == "shapes" and kind == "operator"
        sel = Selection.parse(search)
        if dash.ctx.triggered_id in ("operators-kind", "operators-group"):
            style = _grouping_style(data, kind)
            rows = q.rows(data, kind, by_shapes)
            if not rows:
                return ([], _columns(kind, by_shapes), [], None, [], [],
                        ui.empty_figure("Nothing of this kind."), "", style)
            row = rows[0]
            fig = data.recent(("operators-bars", row.kind, row.name, row.shapes, sel.rank),
                              lambda: bars_figure(data, row, sel.rank))
            return (_records(rows), _columns(kind, by_shapes), _tooltips(rows), None, [], [],
                    fig, picked_text(row), style)
        if not cell or cell.get("row_id") is None:
            return (no_update,) * 9
        row = _row_of(data, kind, cell["row_id"], by_shapes)
        if row is None:
            return (no_update,) * 9
        fig = data.recent(("operators-bars", row.kind, row.name, row.shapes, sel.rank),
                          lambda: bars_figure(data, row, sel.rank))
        return (no_update,) * 6 + (fig, picked_text(row), no_update)
