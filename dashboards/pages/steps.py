"""`/steps`: one step across all ranks on aligned clocks: compute, communication and memory
per rank as a timeline, idle gaps shaded by cause, and each rank's arrival at every collective
(the last one to arrive in red). Any step can be picked; untraced steps show host step times."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from dash import dcc, html

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import steps as q
from uberprof.dashboards.queries.steps import StepTimeline
from uberprof.dashboards.ui import Selection

PATH = "/steps"
TITLE = "Steps"
RECENT = 200  # steps in the recent-steps figure of a run whose job runs
RECENT_RANKS = 16  # ranks drawn there: the slowest over those steps
STEPPED_ABOVE = 128  # ranks beyond which the per-rank bars are drawn as stepped filled lines:
# 512 ranks made 1,024 SVG bars of a pixel or two, the costliest thing on the page to draw
MAX_OPTIONS = 5000  # beyond, the step picker offers the traced steps (and the selected one)


def default_step(data: RunData, sel: Selection) -> int | None:
    """The selected step, else the first traced step in the middle of the run, else the first."""
    if sel.step is not None:
        return sel.step
    traced = data.traced_steps()
    if traced:
        return traced[len(traced) // 2]
    steps = data.all_steps()
    return steps[len(steps) // 2] if steps else None


def layout(data: RunData, sel: Selection) -> html.Div:
    step = default_step(data, sel)
    traced = data.traced_steps()
    if step is None:
        return ui.page("page-steps", ui.missing_notices(data.missing()),
                       ui.notice("This run has no steps.", "warn"))
    options = step_options(data, step)
    controls = html.Div([
        html.Div([html.Label("Step"),
                  dcc.Dropdown(id="step-picker", options=options, value=step, clearable=False,
                               searchable=True)], className="control"),
        html.Div([html.Label("Traced steps"),
                  html.Div([dcc.Link(str(s), href=sel.href(PATH, step=s),
                                     className="step-link" + (" selected" if s == step else ""))
                            for s in traced[:60]] or "none", className="step-links")],
                 className="control"),
    ], className="controls")
    body: list[Any] = [ui.missing_notices([m for m in data.missing() if "traces" in m]),
                       controls]
    tl = q.step_timeline(data, step, focus=sel.rank) if step in traced else None
    if tl is not None and tl.ranks:
        body.append(ui.section(
            f"Step {step} on every rank (aligned clocks)",
            ui.graph("step-timeline", timeline_figure(tl, data.straggler_rank(), sel.rank)),
            timeline_note(tl, data),
            id="timeline",
            sub="Upper bar: compute; lower bar: communication; shaded: idle gaps by cause; "
                "▶ marks each rank's arrival at a collective (red: the last to arrive)."))
        body.append(ui.section("Late arrivals in this step",
                               arrivals_table(data, tl, sel),
                               id="arrivals"))
    else:
        why = ("this step was not traced: pick a traced step for its timeline"
               if traced else "the run has no traces, so only host step times are known")
        body.append(ui.notice(f"Step {step}: {why}.", "info", id="untraced-note"))
    if data.follower is not None:
        body.append(ui.section(
            "Recent steps: host step time and data wait per rank",
            ui.graph("live-recent", recent_figure(data)), id="live-recent-section",
            sub=f"The last {RECENT} steps, growing while the job runs (the {RECENT_RANKS} "
                "slowest ranks when there are more). Dotted: data wait."))
    body.append(ui.section(f"Step {step}: host step time and data wait per rank",
                           ui.graph("step-ranks", ranks_figure(data, step, sel.rank)),
                           id="step-ranks-section"))
    return ui.page("page-steps", *body)


def step_options(data: RunData, step: int | None) -> list[dict[str, Any]]:
    """The step picker's choices: every step, or the traced ones (and `step`) when there are
    more than `MAX_OPTIONS`."""
    traced = set(data.traced_steps())
    series = data.step_series("step_time_ns")
    span = (max(int(s[-1]) for _, s, _ in series) - min(int(s[0]) for _, s, _ in series) + 1
            if series else 0)
    steps = data.all_steps() if span <= MAX_OPTIONS else \
        sorted(traced | ({step} if step is not None else set()))
    return [{"label": f"step {s}" + (" · traced" if s in traced else ""), "value": s}
            for s in steps]


def recent_figure(data: RunData) -> go.Figure:
    """Host step time (solid) and data wait (dotted) of the last `RECENT` steps per rank."""
    times = data.step_series("step_time_ns")
    if not times:
        return ui.empty_figure("No steps yet.")
    waits = {r: (s, v) for r, s, v in data.step_series("data_wait_ns")}
    hi = max(int(s[-1]) for _, s, _ in times)
    tail = []
    for r, s, v in times:
        keep = s > hi - RECENT
        tail.append((r, s[keep], v[keep]))
    tail = [x for x in tail if x[1].size]
    if len(tail) > RECENT_RANKS:
        tail = sorted(tail, key=lambda x: -float(np.median(x[2])))[:RECENT_RANKS]
    straggler = data.straggler_rank()
    fig = ui.new_figure()
    for i, (r, s, v) in enumerate(sorted(tail, key=lambda x: x[0])):
        color = ui.STRAGGLER if r == straggler else ui.PALETTE[i % len(ui.PALETTE)]
        # steps as a list: plotly.js has no int64 arrays
        fig.add_scatter(x=s.tolist(), y=v / 1e6, mode="lines", name=f"rank {r}",
                        legendgroup=str(r),
                        line={"color": color, "width": 1.5},
                        hovertemplate=f"rank {r}<br>step %{{x}}: %{{y:.1f}} ms<extra></extra>")
        ws, wv = waits.get(r, (s[:0], v[:0]))
        keep = ws > hi - RECENT
        fig.add_scatter(x=ws[keep].tolist(), y=wv[keep] / 1e6, mode="lines",
                        name=f"rank {r} data wait",
                        legendgroup=str(r), showlegend=False,
                        line={"color": color, "width": 1, "dash": "dot"},
                        hovertemplate=f"rank {r} data wait<br>step %{{x}}: %{{y:.1f}} ms"
                                      "<extra></extra>")
    fig.update_xaxes(title="step", tickformat="d")
    fig.update_yaxes(title="ms", rangemode="tozero")
    return ui.base_layout(fig, height=320)


def timeline_figure(tl: StepTimeline, straggler: int | None, focus: int | None) -> go.Figure:
    ranks = [r.rank for r in tl.ranks]
    pos = {r: i for i, r in enumerate(ranks)}
    fig = ui.new_figure()
    # idle gaps first, so that activity draws over their edges
    by_cause: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for r in tl.ranks:
        for g in r.gaps:
            by_cause.setdefault(g["cause"], []).append((r.rank, g))
    for cause, items in sorted(by_cause.items()):
        fig.add_bar(
            orientation="h", base=[g["start"] for _, g in items],
            x=[g["end"] - g["start"] for _, g in items], y=[pos[r] for r, _ in items],
            width=0.9, name=f"idle: {cause}", marker_color=ui.CAUSE_COLORS.get(cause, "#999"),
            opacity=0.45, customdata=[[r, g["ms"], g["before"] or "", g["after"] or ""]
                                      for r, g in items],
            hovertemplate=f"rank %{{customdata[0]}} idle ({cause}) %{{customdata[1]:.3f}} ms"
                          "<br>after %{customdata[2]}<br>before %{customdata[3]}"
                          "<extra></extra>")
    for role, dy, name in (("compute", -0.2, "compute"), ("comm", 0.2, "communication"),
                           ("memory", 0.2, "memory")):
        xs, bases, ys, rk = [], [], [], []
        for r in tl.ranks:
            part = r.parts.get(role)
            if part is None:
                continue
            s, e = part
            bases.append(s)
            xs.append(e - s)
            ys.append(np.full(s.size, pos[r.rank] + dy))
            rk.append(np.full(s.size, r.rank))
        if not xs:
            continue
        fig.add_bar(
            orientation="h", base=np.concatenate(bases), x=np.concatenate(xs),
            y=np.concatenate(ys), width=0.36, name=name, marker_color=ui.PART_COLORS[role],
            marker_line_width=0, customdata=np.concatenate(rk),
            hovertemplate=f"rank %{{customdata}} {name}<br>%{{base:.2f}} ms + %{{x:.3f}} ms"
                          "<extra></extra>")
    if tl.arrivals:
        a = tl.arrivals
        fig.add_scatter(
            x=[x["start_ms"] for x in a], y=[pos[x["rank"]] + 0.2 for x in a], mode="markers",
            name="arrival", marker={"symbol": "triangle-right", "size": [12 if x["last"] else 7
                                                                          for x in a],
                                    "color": [ui.STRAGGLER if x["last"] else "#333" for x in a],
                                    "line": {"width": 0}},
            customdata=[[x["rank"], x["name"], x["instance"], x["lateness_ms"],
                         "last to arrive" if x["last"] else ""] for x in a],
            hovertemplate="rank %{customdata[0]} enters %{customdata[1]} #%{customdata[2]}"
                          "<br>%{customdata[3]:.3f} ms after the first<br>%{customdata[4]}"
                          "<extra></extra>")
    labels = []
    for r in tl.ranks:
        label = ui.rank_label(r.rank, straggler)
        if r.rank == focus and r.rank != straggler:
            label = f"<b>{label}</b>"
        labels.append(label)
    fig.update_yaxes(tickvals=list(range(len(ranks))), ticktext=labels, autorange="reversed",
                     range=None, showgrid=False)
    fig.update_xaxes(title="ms from the step's first device activity (aligned clocks)")
    fig.update_layout(barmode="overlay", bargap=0)
    if straggler is not None and straggler in pos:
        i = pos[straggler]
        fig.add_hrect(y0=i - 0.5, y1=i + 0.5, line_width=0,
                      fillcolor="rgba(214,39,40,0.06)")
    return ui.base_layout(fig, height=max(260, 34 * len(ranks) + 110))


def timeline_note(tl: StepTimeline, data: RunData) -> Any:
    d = data.diagnose()
    parts = [f"Merged to {tl.resolution_ms * 1000:.0f} µs (about a pixel)."]
    if tl.left_out:
        parts.append(f"{tl.left_out} ranks not drawn (a sample of ranks, the selected one and "
                     "the straggler are).")
    if d is not None:
        res = [h.residual_ns for h in d.alignment.hosts if h.residual_ns is not None]
        hosts = len(d.alignment.hosts)
        if hosts > 1:
            parts.append(f"{hosts} host clocks aligned"
                         + (f"; residual up to {max(res) / 1e3:.0f} µs." if res else "."))
    return html.P(" ".join(parts), className="muted")


def arrivals_table(data: RunData, tl: StepTimeline, sel: Selection) -> Any:
    """Ranks by lateness in this step; the run's straggler in red, whoever came last to every
    collective of this step in bold."""
    if not tl.arrivals:
        return ui.notice("No matched collectives in this step.", "info")
    straggler = data.straggler_rank()
    order = q.step_lateness(data, tl.step)
    shown = order[:20] + [r for r in order[20:] if r["rank"] == straggler]
    rows, classes = [], []
    for r in shown:
        rank = r["rank"]
        rows.append([dcc.Link(f"rank {rank}", href=sel.href("/stragglers", rank=rank)),
                     f"{r['median_ms']:.3f}", f"{r['max_ms']:.3f}",
                     f"{r['last_in']}/{r['instances']}",
                     "straggler" if rank == straggler else ""])
        classes.append("straggler" if rank == straggler else
                       "late" if r["last_in"] and r["last_in"] == r["instances"] else "")
    return ui.table(["rank", "median lateness (ms)", "max lateness (ms)", "last to arrive", ""],
                    rows, id="arrivals-table", row_classes=classes)


def ranks_figure(data: RunData, step: int, focus: int | None) -> go.Figure:
    t = q.step_ranks(data, step)
    if t.num_rows == 0:
        return ui.empty_figure(f"No rank recorded step {step}.")
    straggler = data.straggler_rank()
    ranks = t.column("rank").to_pylist()
    ms = [(v or 0) / 1e6 for v in t.column("step_time_ns").to_pylist()]
    dw = [(v or 0) / 1e6 for v in t.column("data_wait_ns").to_pylist()]
    colors = [ui.STRAGGLER if r == straggler else ("#2f5f8f" if r == focus else "#4C78A8")
              for r in ranks]
    fig = ui.new_figure()
    if len(ranks) > STEPPED_ABOVE:  # one filled path per series, the marked ranks as points
        for y, name, color, what in ((ms, "step time", "#4C78A8", ""),
                                     (dw, "data wait", ui.CAUSE_COLORS["data"], " data wait")):
            fig.add_scatter(x=ranks, y=y, name=name, mode="lines", fill="tozeroy",
                            line={"width": 1, "shape": "hvh", "color": color},
                            hovertemplate=f"rank %{{x}}{what}: %{{y:.1f}} ms<extra></extra>")
        marked = [i for i, r in enumerate(ranks) if r in (straggler, focus)]
        if marked:
            fig.add_scatter(x=[ranks[i] for i in marked], y=[ms[i] for i in marked],
                            mode="markers", name="straggler / selected", showlegend=False,
                            marker={"color": [colors[i] for i in marked], "size": 9},
                            hovertemplate="rank %{x}: %{y:.1f} ms<extra></extra>")
    else:
        fig.add_bar(x=ranks, y=ms, name="step time", marker_color=colors,
                    hovertemplate="rank %{x}: %{y:.1f} ms<extra></extra>")
        fig.add_bar(x=ranks, y=dw, name="data wait", marker_color=ui.CAUSE_COLORS["data"],
                    hovertemplate="rank %{x} data wait: %{y:.1f} ms<extra></extra>")
        fig.update_layout(barmode="group")
    fig.update_xaxes(title="rank", type="category" if len(ranks) <= 64 else "linear")
    fig.update_yaxes(title="ms")
    return ui.base_layout(fig, height=300)


def register(app: Any, data_of: Any) -> None:
    """Picking a step opens it; a rank's bar opens that rank on /stragglers."""
    # the picker's first value is the step shown (the default one when the URL names none):
    # going to its URL would build and draw the same page a second time
    ui.on_change(app, "step-picker", "value",
                 lambda step, sel: None if step == default_step(data_of(), sel)
                 else sel.href(PATH, step=int(step)))
    ui.on_click(app, "step-ranks", lambda p, sel: sel.href("/stragglers", rank=int(p["x"])))
