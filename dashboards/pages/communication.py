"""`/communication`: what the collectives cost and what limits them: time per collective kind
and message size, bus bandwidth of every matched instance against the peak of the link it
crosses, and how much of the communication is hidden under compute on each rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from dash import html

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import communication as q
from uberprof.dashboards.ui import Selection
from uberprof.present.terminal.rank_comm import waits_text
from uberprof.units import fmt_num

PATH = "/communication"
TITLE = "Communication"
_VERDICT_COLORS = {"bandwidth-bound": "#D62728", "latency-bound": "#F58518", "fine": "#2da44e",
                   "unknown": "#8C8C8C"}


def layout(data: RunData, sel: Selection) -> html.Div:
    body: list[Any] = [ui.missing_notices(data.missing())]
    if not data.has_traces:
        return ui.without_traces("page-communication", body,
                                 "Communication needs traces: collective kernels or Gloo spans.")
    kinds = q.collectives_by_kind(data)
    if kinds is None:
        body.append(ui.notice("No collective in the traced steps: a single-rank run, or "
                              "communication uberprof does not recognise.", "info",
                              id="no-collectives"))
        body.append(ui.section("Communication per rank", ui.graph("comm-by-rank",
                                                                   by_rank_figure(data))))
        return ui.page("page-communication", *body)
    body.append(ui.section("Bandwidth per collective class", classes_table(data),
                           id="bandwidth-classes",
                           sub="Per group, collective and message size: median bus bandwidth "
                               "(nccl-tests definition) against the peak of the slowest link "
                               "the group crosses, and the verdict."))
    body.append(html.Div([
        ui.section("Bus bandwidth vs message size", ui.graph("busbw", busbw_figure(data)),
                   sub="Every matched instance; dashed: the link's peak."),
        ui.section("Time per collective kind and size",
                   ui.graph("comm-kinds", kinds_figure(data)),
                   sub="Total time inside each kind of collective, summed over ranks."),
    ], className="row"))
    body.append(ui.section("Hidden vs exposed communication per rank",
                           ui.graph("comm-by-rank", by_rank_figure(data)),
                           sub="Communication under compute costs nothing; exposed "
                               "communication adds to the step."))
    body.append(ui.section("Exposed communication per rank: waiting and transfer",
                           rank_comm_table(data), id="rank-comm",
                           sub="Each rank's exposed time split into waiting for the peer that "
                               "arrived last (the largest waits: peer, collective, group) and "
                               "transfer; unexplained: what no finding accounts for."))
    return ui.page("page-communication", *body)


def rank_comm_table(data: RunData) -> Any:
    rows = q.rank_comm(data)
    if not rows:
        return ui.notice("No rank has exposed communication in the analysed steps.", "info")
    out = []
    for r in rows[:64]:
        waits = waits_text(r["top_waits"], ms=lambda v: f"{v:.1f}")
        out.append([str(r["rank"]), fmt_num(r["exposed_ms"]), fmt_num(r["wait_ms"]),
                    fmt_num(r["transfer_ms"]), fmt_num(r["unmatched_ms"]), waits,
                    fmt_num(r["unexplained_ms"])])
    return ui.table(["rank", "exposed ms", "waiting ms", "transfer ms", "unmatched ms",
                     "largest waits", "unexplained ms"], out, id="rank-comm-table")


def classes_table(data: RunData) -> Any:
    classes = q.bandwidth_classes(data)
    if not classes:
        return ui.notice("No collective instance could be matched across ranks.", "info")
    rows = []
    for c in classes[:30]:
        rows.append([c["group"], c["collective"], ui.fmt_bytes(c["bytes"]), str(c["instances"]),
                     f"{c['link']}" + (f" ({c['link_kind']})" if c.get("link_kind") else ""),
                     fmt_num(c["busbw_gbit_s"]), fmt_num(c["peak_gbit_s"]),
                     fmt_num(c["busbw_of_peak_pct"], unit="%"),
                     f"{c['transfer_ms']:.1f}", f"{c['exposed_ms']:.1f}",
                     html.Span(c["verdict"], style={"color": _VERDICT_COLORS.get(c["verdict"]),
                                                    "fontWeight": 600},
                               className=f"verdict {c['verdict']}")])
    return ui.table(["group", "collective", "size", "calls", "link", "busbw Gbit/s",
                     "peak Gbit/s", "of peak", "transfer ms", "exposed ms", "verdict"], rows,
                    id="classes-table")


def busbw_figure(data: RunData) -> go.Figure:
    bw = q.bandwidth_instances(data, limit=5000)
    if bw is None:
        return ui.empty_figure("No matched collective instances.")
    fig = ui.new_figure()
    names = bw.column("name").to_pylist()
    size = np.array([b or np.nan for b in bw.column("bytes").to_pylist()], dtype=float)
    busbw = np.array([(b or np.nan) * 8 / 1e9 for b in bw.column("busbw_Bps").to_pylist()])
    steps = bw.column("step").to_pylist()
    for name in sorted(set(names)):
        m = np.array([n == name for n in names])
        fig.add_scatter(
            x=size[m], y=busbw[m], mode="markers", name=name, marker={"size": 6, "opacity": 0.7},
            customdata=np.array(steps, dtype=object)[m],
            hovertemplate=f"{name} %{{x:.3s}}B<br>busbw %{{y:.2f}} Gbit/s<br>step "
                          "%{customdata}<extra></extra>")
    peaks = {}
    for link, kind, p in zip(bw.column("link").to_pylist(), bw.column("link_kind").to_pylist(),
                             bw.column("peak_Bps").to_pylist()):
        if p:
            peaks[(link, kind)] = p * 8 / 1e9
    for (link, kind), p in peaks.items():
        fig.add_hline(y=p, line_dash="dash", line_color="#555",
                      annotation_text=f"{link} peak ({kind}) {p:.0f} Gbit/s",
                      annotation_position="top left", annotation_font_size=10)
    known = size[np.isfinite(size) & (size > 0)]
    rng = [np.log10(known.min() / 3), np.log10(known.max() * 3)] if known.size else None
    fig.update_xaxes(type="log", title="message size (nccl-tests S)", range=rng,
                     tickformat=".2~s", ticksuffix="B")
    fig.update_yaxes(title="busbw (Gbit/s)", rangemode="tozero")
    return ui.base_layout(fig, height=340)


def kinds_figure(data: RunData) -> go.Figure:
    k = q.collectives_by_kind(data)
    if k is None:
        return ui.empty_figure("No collectives.")
    rows = k.to_pylist()[:20]
    labels = [f"{r['name']} {ui.fmt_bytes(r['bytes'])}" for r in rows]
    fig = ui.new_figure()
    fig.add_bar(
        y=labels, x=[r["total_ms"] for r in rows], orientation="h", marker_color="#72B7B2",
        customdata=[[r["calls"], r["ranks"], r["median_ms"]] for r in rows],
        hovertemplate="%{y}<br>%{x:.1f} ms in %{customdata[0]} calls on %{customdata[1]} "
                      "ranks<br>median %{customdata[2]:.3f} ms<extra></extra>")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="total ms (all ranks)")
    return ui.base_layout(fig, height=340)


def by_rank_figure(data: RunData) -> go.Figure:
    t = data.breakdown_by_rank()
    if t is None:
        return ui.empty_figure("No traces.")
    straggler = data.straggler_rank()
    ranks = t.column("rank").to_pylist()
    x = list(range(len(ranks)))
    fig = ui.new_figure()
    fig.add_bar(x=x, y=[(v or 0) / 1e6 for v in t.column("comm_under_compute_ns").to_pylist()],
                name="comm under compute", marker_color=ui.PART_COLORS["comm_under_compute"],
                customdata=ranks, hovertemplate="rank %{customdata}: %{y:.1f} ms hidden"
                                                "<extra></extra>")
    fig.add_bar(x=x, y=[(v or 0) / 1e6 for v in t.column("exposed_comm_ns").to_pylist()],
                name="exposed comm", marker_color=ui.PART_COLORS["exposed_comm"],
                customdata=ranks, hovertemplate="rank %{customdata}: %{y:.1f} ms exposed"
                                                "<extra></extra>")
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig.update_xaxes(**ui.rank_ticks(ranks, straggler, positional=True))
    fig.update_yaxes(title="ms in the traced steps")
    return ui.base_layout(fig, height=300)
