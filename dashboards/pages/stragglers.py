"""`/stragglers`: who arrives last at the collectives, how late, why, and the straggler's
counters (GPU clocks, temperature, power, utilisation; host processes on CPU runs) beside those
of the median rank."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import dcc, html
from plotly.subplots import make_subplots

from uberprof.analysis.diagnosis.causes import straggler_cause_text
from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import stragglers as q
from uberprof.dashboards.ui import Selection

PATH = "/stragglers"
TITLE = "Stragglers"

GPU_METRICS = (("clock.sm", "SM clock"), ("temp.gpu", "temperature"), ("power", "power"),
               ("util.gpu", "utilisation"))
PROC_METRICS = (("cpu.util", "process CPU"), ("mem.rss", "process memory"))


def layout(data: RunData, sel: Selection) -> html.Div:
    body: list[Any] = [ui.missing_notices(data.missing())]
    if not data.has_traces:
        return ui.without_traces("page-stragglers", body, "Lateness needs traces: the "
                                 "collectives' start times on every rank.")
    s = data.straggler()
    body.append(verdict(data))
    hm = q.lateness_heatmap(data)
    if hm is None:
        body.append(ui.notice("No collective could be matched across ranks, so lateness is "
                              "unknown (see the problems on the overview).", "warn"))
        return ui.page("page-stragglers", *body)
    body.append(html.Div([
        ui.section("Lateness per rank and step",
                   ui.graph("lateness-heatmap", lateness_figure(data)),
                   sub="Largest lateness (ms) of each rank over the step's collectives: how "
                       "long after the first rank it arrived. Click a cell to open the step."),
        ui.section("Ranking", ranking_table(data, sel), id="ranking",
                   sub="Ranks that arrive latest first."),
    ], className="row"))
    focus = sel.rank if sel.rank is not None else (s.rank if s is not None else None)
    median = q.median_rank(data)
    if focus is not None:
        body.append(ui.section(
            f"Counters: rank {focus} beside rank {median} (median lateness)",
            counters_block(data, focus, median), id="straggler-counters"))
    return ui.page("page-stragglers", *body)


def verdict(data: RunData) -> Any:
    s = data.straggler()
    if s is None:
        return ui.notice("No persistent straggler: no rank arrives last at the collectives "
                         "clearly more often than chance, by a margin above the noise.", "ok",
                         id="straggler-verdict")
    f = q.straggler_factors(data)
    factors = f.get("factors_ms", {})
    ev = [html.Dt("arrives last"), html.Dd(f"{s.last} of {s.instances} collectives "
                                           f"({100 * s.last_fraction:.0f}%)"),
          html.Dt("lead over the others"), html.Dd(f"{s.median_lead_ns / 1e6:.2f} ms (median); "
                                                   f"their spread {s.noise_ns / 1e6:.3f} ms"),
          html.Dt("delay it adds"), html.Dd(f"{s.delay_ns / 1e6:.1f} ms over "
                                            f"{s.steps_analysed} analysed steps; the others "
                                            f"wait {s.others_wait_ns / 1e6:.1f} ms in all"),
          html.Dt("host"), html.Dd(data.host_of(s.rank) or "?")]
    if factors:
        ev += [html.Dt("excess per step"),
               html.Dd(", ".join(f"{k.replace('_', ' ')} {v:+.2f} ms"
                                 for k, v in sorted(factors.items(), key=lambda kv: -kv[1])))]
    c = f.get("counters") or {}
    if c.get("available") and c.get("sm_clock_mhz"):
        ev += [html.Dt("SM clock"),
               html.Dd(f"{c['sm_clock_mhz']:.0f} MHz vs {c.get('others_sm_clock_mhz') or 0:.0f}"
                       f" MHz on the others; slowdown {c.get('slowdown_pct', 0)}% of samples"
                       + (f" ({', '.join(c.get('reasons', {}))})" if c.get("reasons") else ""))]
    return html.Div([
        html.Div([html.Span("straggler", className="badge high"),
                  html.Span(f" rank {s.rank}", className="straggler-rank",
                            id="straggler-rank")], className="finding-head"),
        html.Div(f"Rank {s.rank} holds the others back: {straggler_cause_text(s.cause)}"
                 f" (cause: {s.cause}).", className="finding-title", id="straggler-cause",
                 **{"data-cause": s.cause or ""}),
        html.Dl(ev, className="kv"),
    ], className="section straggler-box", id="straggler-verdict",
        **{"data-rank": str(s.rank)})


def lateness_figure(data: RunData) -> go.Figure:
    hm = q.lateness_heatmap(data)
    assert hm is not None
    straggler = data.straggler_rank()
    n = len(hm.ranks)
    fig = ui.new_figure()
    fig.add_heatmap(
        z=hm.z, x=[str(s) for s in hm.x], y=hm.ranks, customdata=hm.steps, colorscale="Reds",
        zmin=0, colorbar={"title": {"text": "ms"}, "thickness": 12},
        hovertemplate="rank %{y}<br>step %{customdata}<br>%{z:.3f} ms late<extra></extra>")
    fig.update_yaxes(**ui.rank_ticks(hm.ranks, straggler), autorange="reversed")
    fig.update_xaxes(title="traced step", type="category")
    return ui.base_layout(fig, height=max(260, min(16 * n + 90, 600)))


def ranking_table(data: RunData, sel: Selection) -> Any:
    ranking = q.lateness_ranking(data)
    straggler = data.straggler_rank()
    rows, classes = [], []
    shown = ranking[:15]
    if sel.rank is not None and all(r["rank"] != sel.rank for r in shown):
        shown += [r for r in ranking if r["rank"] == sel.rank]
    for r in shown:
        rows.append([dcc.Link(f"rank {r['rank']}", href=sel.href(PATH, rank=r["rank"])),
                     r.get("host") or "", f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}",
                     f"{r['last_in']}/{r['instances']}",
                     "straggler" if r["rank"] == straggler else ""])
        classes.append("straggler" if r["rank"] == straggler else
                       "selected" if r["rank"] == sel.rank else "")
    more = len(ranking) - len(shown)
    return html.Div([
        ui.table(["rank", "host", "median late (ms)", "p90 late (ms)", "last", ""], rows,
                 id="ranking-table", row_classes=classes),
        html.P(f"… {more} more ranks" if more > 0 else "", className="muted")])


def counters_block(data: RunData, rank: int, median: int | None) -> Any:
    """The two ranks' GPU counters (or their processes' on CPU runs), one panel per metric."""
    ranks = [rank] + ([median] if median is not None and median != rank else [])
    gpu = {r: data.rank_gpu(r) for r in ranks}
    if all(gpu[r] is not None for r in ranks):
        series = {}
        for r in ranks:  # one read of the node's stream per rank, every metric at once
            got = data.counter_series_of(gpu[r][0], "nvml", [m for m, _ in GPU_METRICS],
                                         devices=[gpu[r][1]], points=300)
            series[r] = [got[m] for m, _ in GPU_METRICS]
        names = [n for _, n in GPU_METRICS]
        where = {r: f"{gpu[r][0]} {gpu[r][1]}" for r in ranks}
        note = None
    else:
        series = {}
        for r in ranks:
            node = data.node_of_rank(r)
            got = data.counter_series_of(node, "proc", [m for m, _ in PROC_METRICS],
                                         devices=[f"rank:{r}"], points=300) if node else {}
            series[r] = [got.get(m) for m, _ in PROC_METRICS]
        names = [n for _, n in PROC_METRICS]
        where = {r: f"{data.node_of_rank(r) or '?'} process" for r in ranks}
        note = ui.notice("No GPU counters for these ranks: their processes' CPU and memory "
                         "instead.", "info")
    if not any(x is not None for v in series.values() for x in v):
        return ui.notice("No counters for these ranks in this run.", "info",
                         id="no-rank-counters")
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names,
                        horizontal_spacing=0.06, figure=ui.new_figure())
    straggler = data.straggler_rank()
    for r in ranks:
        color = ui.STRAGGLER if r == straggler else ("#4C78A8" if r != rank else "#F58518")
        for j, cs in enumerate(series[r]):
            if cs is None:
                continue
            for t, v in cs.devices.values():
                fig.add_scatter(
                    x=t, y=v, mode="lines", line={"color": color, "width": 1.5},
                    name=f"rank {r} ({where[r]})", legendgroup=str(r), showlegend=j == 0,
                    hovertemplate=f"rank {r}<br>%{{x:.1f}} s: %{{y:.1f}} {cs.unit or ''}"
                                  "<extra></extra>", row=1, col=j + 1)
    fig.update_layout(shapes=[
        {"type": "rect", "xref": f"x{j + 1 if j else ''}", "yref": f"y{j + 1 if j else ''} domain",
         "x0": lo, "x1": hi, "y0": 0, "y1": 1, "fillcolor": "rgba(0,0,0,0.07)",
         "line": {"width": 0}, "layer": "below"}
        for lo, hi, _, _ in data.traced_spans(rank) for j in range(len(names))])
    fig.update_xaxes(title="s")
    fig = ui.base_layout(fig, height=300)
    return html.Div([note or html.Div(), ui.graph("rank-counters", fig),
                     html.P("Grey bands: traced steps.", className="muted")])


def register(app: Any, data_of: Any) -> None:
    """A heatmap cell opens that rank's step on /steps."""
    ui.on_click(app, "lateness-heatmap", ui.step_cell)
