"""`/gaps`: where the device sits idle and why: idle time by cause and rank, how long the gaps
are, and the largest ones with what the host was doing (of the whole run, or of one rank)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from dash import dcc, html

from uberprof.analysis.diagnosis.causes import GAP_CAUSES
from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import gaps as q
from uberprof.dashboards.ui import Selection
from uberprof.units import shorten

PATH = "/gaps"
TITLE = "Gaps"


def layout(data: RunData, sel: Selection) -> html.Div:
    body: list[Any] = [ui.missing_notices(data.missing())]
    if not data.has_traces or data.diagnose() is None:
        body.append(ui.notice("Idle gaps need traces: the device timeline of each rank.",
                              "info"))
        return ui.page("page-gaps", *body)
    by = q.gaps_by_rank(data)
    d = data.diagnose()
    threshold = d.run["gap_threshold_us"]
    if by is None or by.num_rows == 0:
        body.append(ui.notice(f"No idle gap longer than {threshold:g} µs in the traced steps.",
                              "ok", id="no-gaps"))
        return ui.page("page-gaps", *body)
    ranks = data.ranks()
    rank_opts = [{"label": "all ranks", "value": -1}] + [{"label": f"rank {r}", "value": r}
                                                          for r in ranks]
    body.append(html.Div([html.Div([html.Label("Largest gaps of"),
                                    dcc.Dropdown(id="gaps-rank", options=rank_opts,
                                                 value=sel.rank if sel.rank is not None else -1,
                                                 clearable=False)], className="control")],
                         className="controls"))
    body.append(ui.section(
        "Idle time by cause and rank", ui.graph("gaps-by-rank", by_rank_figure(data)),
        html.Ul([html.Li([html.B(k), f": {c.explanation}"]) for k, c in GAP_CAUSES.items()],
                className="muted cause-legend"),
        sub=f"Gaps longer than {threshold:g} µs with no device activity, in the traced steps "
            "(ms). Click a bar for that rank's largest gaps.", id="gaps-summary"))
    body.append(html.Div([
        ui.section("Largest gaps" + (f" of rank {sel.rank}" if sel.rank is not None else ""),
                   largest_table(data, sel), id="largest-gaps"),
        ui.section("How long the gaps are", ui.graph("gap-hist", histogram(data, sel.rank)),
                   sub="Count of gaps by duration and cause."),
    ], className="row"))
    return ui.page("page-gaps", *body)


def by_rank_figure(data: RunData) -> go.Figure:
    by = q.gaps_by_rank(data)
    assert by is not None
    straggler = data.straggler_rank()
    # every traced rank has a place, so that a rank without gaps shows as such
    traced = data.breakdown_by_rank()
    ranks = sorted(set(by.column("rank").to_pylist())
                   | set(traced.column("rank").to_pylist() if traced is not None else []))
    pos = {r: i for i, r in enumerate(ranks)}
    fig = ui.new_figure()
    rows = by.to_pylist()
    for cause in GAP_CAUSES:
        mine = [r for r in rows if r["cause"] == cause]
        if not mine:
            continue
        fig.add_bar(
            x=[pos[r["rank"]] for r in mine], y=[r["ms"] for r in mine], name=cause,
            marker_color=ui.CAUSE_COLORS[cause],
            customdata=[[r["rank"], r["gaps"]] for r in mine],
            hovertemplate=f"rank %{{customdata[0]}}: %{{y:.2f}} ms {cause} idle in "
                          "%{customdata[1]} gaps<extra></extra>")
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig.update_xaxes(**ui.rank_ticks(ranks, straggler, positional=True),
                     range=[-0.5, len(ranks) - 0.5])
    fig.update_yaxes(title="idle ms")
    return ui.base_layout(fig, height=320)


def largest_table(data: RunData, sel: Selection) -> Any:
    gaps = q.largest_gaps(data, sel.rank)
    if not gaps:
        return ui.notice("No gaps" + (f" on rank {sel.rank}." if sel.rank is not None else "."),
                         "info")
    rows = []
    for g in gaps:
        rows.append([
            dcc.Link(f"rank {g['rank']}", href=sel.href("/gaps", rank=g["rank"])),
            dcc.Link(f"step {g['step']}", href=sel.href("/steps", rank=g["rank"],
                                                        step=g["step"])),
            f"{g['dur_ns'] / 1e6:.3f}",
            html.Span(g["cause"], style={"color": ui.CAUSE_COLORS.get(g["cause"], "#333"),
                                         "fontWeight": 600}),
            html.Code(shorten(g.get("before"))), html.Code(shorten(g.get("after"))),
            shorten(g.get("host"), missing="–"),
        ])
    return ui.table(["rank", "step", "ms", "cause", "device: last before", "device: first after",
                     "host was in"], rows, id="gaps-table")


def histogram(data: RunData, rank: int | None) -> go.Figure:
    g = q.gap_durations(data, rank)
    if g is None or g.num_rows == 0:
        return ui.empty_figure("No gaps.")
    us = g.column("dur_ns").to_numpy() / 1e3
    causes = np.array(g.column("cause").to_pylist(), dtype=object)
    edges = np.logspace(np.log10(max(us.min(), 1.0)), np.log10(us.max() * 1.01 + 1), 30)
    fig = ui.new_figure()
    for cause in GAP_CAUSES:
        m = causes == cause
        if not m.any():
            continue
        counts, _ = np.histogram(us[m], bins=edges)
        fig.add_bar(x=np.sqrt(edges[:-1] * edges[1:]), y=counts, name=cause,
                    marker_color=ui.CAUSE_COLORS[cause],
                    hovertemplate=f"{cause}: %{{y}} gaps near %{{x:.0f}} µs<extra></extra>")
    fig.update_layout(barmode="stack", bargap=0)
    fig.update_xaxes(type="log", title="gap (µs)", dtick=1)
    fig.update_yaxes(title="gaps")
    return ui.base_layout(fig, height=300)


def _rank_href(rank: int | None, sel: Selection) -> str | None:
    return None if rank == sel.rank else sel.href(PATH, rank=rank)


def register(app: Any, data_of: Any) -> None:
    """The rank picker and a click on a rank's bar show that rank's largest gaps."""
    ui.on_change(app, "gaps-rank", "value",
                 lambda rank, sel: _rank_href(None if rank == -1 else int(rank), sel))
    ui.on_click(app, "gaps-by-rank",
                lambda p, sel: sel.href(PATH, rank=int(p["customdata"][0])))
