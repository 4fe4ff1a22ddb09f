"""`/`: the run at a glance: health cards, the top findings with remedies, a rank x step
heatmap of step time, and each rank's time split into compute, overlapped and exposed
communication, memory and idle."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from uberprof.dashboards import ui
from uberprof.dashboards.data import BREAKDOWN_PARTS, RunData
from uberprof.dashboards.queries import overview as q
from uberprof.dashboards.ui import Selection
from uberprof.units import shorten

PATH = "/"
TITLE = "Overview"
TOP_FINDINGS = 6
# Beyond this many ranks the breakdown is drawn as stacked steps, one filled path per part,
# instead of a bar per rank and part: 512 ranks made 2,560 SVG bars (a few pixels wide each)
# that took Chromium 0.3-0.6 s to style and draw, against 0.05-0.07 s for the five paths.
STACKED_STEPS_ABOVE = 128

def layout(data: RunData, sel: Selection) -> html.Div:
    # While the diagnosis is made in the background, everything but its verdicts is drawn and
    # the findings say so; a timer fills them in when it is done (`register`).
    pending = data.diagnosis_pending()
    h = q.health(data)
    straggler = None if pending else data.straggler_rank()
    changes = [] if pending else data.timeline_changes()
    later = ":pending" if pending else ""  # figures drawn without the straggler's outline
    return ui.page(
        "page-overview",
        None if pending else failures_box(data),
        ui.missing_notices(data.missing()),
        health_cards(h),
        ui.section("What holds this run back",
                   diagnosing(data) if pending else findings_list(data, sel), id="findings",
                   sub="Ranked by the time at stake in the analysed steps, with the usual "
                       "remedy." if data.has_traces else None),
        ui.section("Step time per rank and step",
                   *timeline_notices(changes),
                   ui.graph("step-heatmap", data.figure(
                       "overview-heatmap" + later,
                       lambda: heatmap_figure(data, straggler, changes))),
                   sub="Host step time (ms). Click a cell to open that step on every rank."),
        ui.section("Where each rank's time goes",
                   ui.graph("rank-breakdown", data.figure(
                       "overview-breakdown" + later,
                       lambda: breakdown_figure(data, straggler))),
                   sub="Share of each rank's traced time. Click a rank for its idle gaps."),
        problems(data),
    )


DIAGNOSIS_POLL_MS = 1000  # how often the overview asks whether the diagnosis is done


def diagnosing(data: RunData) -> html.Div:
    """The findings' place while the diagnosis runs in the background: what is being done, and
    the timer that rebuilds the page once it is done (and goes with the page it replaces)."""
    return html.Div([
        ui.notice(f"Being diagnosed… ({len(data.ranks())} ranks: findings, the straggler, "
                  "hangs and crashes appear here when it is done; the plots below are "
                  "complete.)", "info pending", id="findings-pending"),
        dcc.Interval(id="overview-diagnosis-poll", interval=DIAGNOSIS_POLL_MS)])


def failures_box(data: RunData) -> Any:
    """A hang or a crash, first and in red: the job stopped, nothing else matters as much.
    Its evidence sentence and its details (the stuck or first failing rank's stack, innermost
    last, the collective the others wait in, mismatches and victims), as its kind saved them
    (findings/hang.py, findings/crash.py)."""
    found = data.failures()
    if not found:
        return None
    boxes = []
    for f in found:
        rows: list[Any] = [html.Div(f.title, className="finding-title")]
        if f.evidence_sentence:
            rows.append(html.Div([html.B("Evidence: "), f.evidence_sentence],
                                 className="finding-evidence"))
        if f.details:
            rows.append(html.Details([html.Summary("details (stacks, innermost last)"),
                                      html.Pre("\n".join(f.details))], open=True))
        rows.append(html.Div([html.B("Remedy: "), f.remedy], className="finding-remedy"))
        boxes.append(html.Div(rows, className=f"finding failure {f.kind}",
                              id=f"failure-{f.kind}"))
    return html.Div(boxes, className="failures", id="failures")


def health_cards(h: dict[str, Any]) -> html.Div:
    s = h.get("straggler")
    b = h.get("breakdown") or {}
    f = h["findings"]
    traced = h["traced_steps"]
    device = h.get("device") or "?"
    cards = [
        ui.card("Ranks", str(h["ranks"]),
                (f"{h['hosts']} host(s)" if h["hosts"] else "hosts unknown") + f" · {device}"
                + (f" · {h['backend']}" if h.get("backend") else ""), id="card-ranks"),
        ui.card("Steps", str(h["steps"]),
                f"{len(traced)} traced" if traced else "none traced", id="card-steps"),
        ui.card("Step time", ui.fmt_ms(h["step_ms_median"]),
                f"median · p90 {ui.fmt_ms(h['step_ms_p90'])}", id="card-step-time"),
    ]
    if b:
        idle, exposed = b.get("idle_pct") or 0.0, b.get("exposed_comm_pct") or 0.0
        status = "bad" if idle + exposed >= 30 else "warn" if idle + exposed >= 10 else "ok"
        cards.append(ui.card("Compute", ui.fmt_pct(b.get("compute_pct")),
                             f"exposed comm {ui.fmt_pct(exposed)} · idle {ui.fmt_pct(idle)}",
                             status=status, id="card-compute"))
    test = h.get("straggler_test") or {}
    sentence = (test.get("test") or {}).get("sentence")
    if s is not None:
        suspected = s.get("confidence") == "suspected"
        cards.append(ui.card("Straggler", f"rank {s['rank']}" + (" (suspected)" if suspected
                                                                 else ""),
                             f"{s['cause']} · {s['lead_ms']:.1f} ms late · alone last in "
                             f"{s['last']}/{s['instances']}",
                             status="warn" if suspected else "bad", id="card-straggler",
                             hint=sentence))
    elif h.get("diagnosis_pending") and traced:
        cards.append(ui.card("Straggler", "…", "being diagnosed", id="card-straggler"))
    elif traced:  # a card holds a short line: the test's sentence shows on hover
        cards.append(ui.card("Straggler", "none",
                             "no rank late beyond chance" if sentence else "no test could be made",
                             status="ok", id="card-straggler", hint=sentence))
    if traced and h.get("diagnosis_pending"):
        cards.append(ui.card("Findings", "…", "being diagnosed", id="card-findings"))
    elif traced:
        n = f["high"] + f["medium"] + f["low"]
        status = "bad" if f["high"] else "warn" if f["medium"] else "ok"
        cards.append(ui.card("Findings", str(n),
                             f"{f['high']} high · {f['medium']} medium · {f['low']} low",
                             status=status, id="card-findings"))
    return html.Div(cards, className="cards", id="health")


def findings_list(data: RunData, sel: Selection) -> Any:
    if not data.has_traces:
        return ui.notice("Findings need traces.", "info")
    found = data.findings()
    if not found:
        return ui.notice("Nothing found that costs more than a few percent of the analysed "
                         "time.", "ok", id="no-findings")
    items = []
    for i, f in enumerate(found[:TOP_FINDINGS]):
        rank = f.ranks[0] if len(f.ranks) == 1 else sel.rank
        step = f.steps[0] if f.steps else sel.step
        page = f.page  # where its kind is looked at in detail (findings/kind.py)
        ev = [html.Li([html.Span(k.replace("_", " "), className="ev-key"), ": ",
                       html.Code(shorten(str(v), 160))]) for k, v in f.evidence.items()]
        test = (f.evidence.get("test") or {}).get("sentence")
        links = "; ".join(f"{c.get('ms')} ms is {c.get('part') or c.get('kind')} (finding "
                          f"{(c['index'] + 1) if c.get('index') is not None else '?'})"
                          for c in f.caused_by)
        items.append(html.Div([
            html.Div([html.Span(f.severity, className=f"badge {f.severity}"),
                      html.Span(f.kind.replace("_", " ")
                                + (" · suspected" if f.confidence == "suspected" else ""),
                                className="kind"),
                      html.Span(f.stake_words(short=True), className="stake",
                                title="time at stake in the analysed steps, counted once")],
                     className="finding-head"),
            html.Div(f.title, className="finding-title"),
            *([html.Div([html.B("Evidence: "), f.evidence_sentence],
                        className="finding-evidence")] if f.evidence_sentence else []),
            *([html.Div([html.B("Test: "), test], className="finding-test")] if test else []),
            *([html.Div([html.B("Accounted elsewhere: "), links], className="finding-links")]
              if links else []),
            html.Div([html.B("Remedy: "), f.remedy], className="finding-remedy"),
            html.Details([html.Summary("evidence"), html.Ul(ev, className="evidence")]),
            dcc.Link("look closer →", href=sel.href(page, rank=rank, step=step),
                     className="finding-link"),
        ], className=f"finding {f.kind}", id=f"finding-{i}",
            **{"data-kind": f.kind, "data-ranks": ",".join(map(str, f.ranks))}))
    more = len(found) - TOP_FINDINGS
    if more > 0:
        items.append(html.Div(f"… and {more} smaller finding(s): see `uberprof report`.",
                              className="muted"))
    return html.Div(items, className="findings")


def timeline_notices(changes: list[dict[str, Any]]) -> list[Any]:
    """The diagnosis's sentence for each change of the step time's level, the lead one first
    (the onsets are marked on the heat map below)."""
    ordered = sorted(changes, key=lambda c: not c["lead"])
    return [ui.notice(c["summary"], "warn" if c["lead"] else "info",
                      id="timeline-change" if c["lead"] else None) for c in ordered]


def heatmap_figure(data: RunData, straggler: int | None,
                   changes: list[dict[str, Any]] | None = None) -> go.Figure:
    """The rank x step heat map of step time (redrawn as steps arrive while the job runs:
    `dashboards/live.py`), with the onset of each change of level the diagnosis found."""
    hm = q.step_heatmap(data)
    if hm is None:
        return ui.empty_figure("No step timelines in this run.")
    z = hm.z
    finite = z[np.isfinite(z)]
    bins = f"{hm.bin_steps} steps" if hm.bin_steps > 1 else "step"
    who = "rank %{y}" if hm.bin_ranks == 1 else f"ranks %{{y}}-%{{y}}+{hm.bin_ranks - 1}"
    fig = ui.new_figure()
    fig.add_heatmap(
        z=z, x=hm.x, y=hm.ranks, customdata=hm.steps, colorscale="Viridis",
        zmin=float(np.min(finite)) if finite.size else None, zmax=_robust_max(finite),
        colorbar={"title": {"text": "ms"}, "thickness": 12},
        hovertemplate=who + "<br>step %{customdata}<br>%{z:.1f} ms<extra></extra>")
    n = len(hm.ranks)
    fig.update_yaxes(**ui.rank_ticks(hm.ranks, straggler), autorange="reversed", title=None)
    fig.update_xaxes(title=f"step (max per {bins})" if hm.bin_steps > 1 else "step",
                     tickformat="d", **({"tickvals": hm.x} if len(hm.x) <= 12 else {}))
    if straggler is not None and straggler in hm.ranks:
        fig.add_shape(type="rect", xref="paper", x0=0, x1=1, y0=straggler - 0.5,
                      y1=straggler + 0.5, line={"color": ui.STRAGGLER, "width": 2})
    for lo, hi in _runs(data.traced_steps()):
        fig.add_annotation(x=(lo + hi) / 2, y=1.0, yref="paper", yanchor="bottom",
                           text="▼ traced", showarrow=False, font={"size": 10, "color": "#555"})
    for c in changes or []:
        fig.add_vline(x=c["onset_step"] - 0.5, line={"color": ui.STRAGGLER, "dash": "dash",
                                                      "width": 2})
        fig.add_annotation(x=c["onset_step"], y=0.0, yref="paper", yanchor="top",
                           xanchor="left", showarrow=False,
                           text=f"{c['direction']} from step {c['onset_step']}",
                           font={"size": 10, "color": ui.STRAGGLER})
    return ui.base_layout(fig, height=max(260, min(14 * n + 80, 560)))


def _robust_max(v: np.ndarray) -> float | None:
    """Top of the colour scale: the upper Tukey fence, so that one very slow step (the first,
    or a checkpoint) saturates instead of washing out the differences between all others."""
    if not v.size:
        return None
    q1, q3 = np.percentile(v, [25, 75])
    return float(min(v.max(), q3 + 3 * (q3 - q1))) if q3 > q1 else float(v.max())


def _runs(steps: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in steps:
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def breakdown_figure(data: RunData, straggler: int | None) -> go.Figure:
    t = data.breakdown_by_rank()
    if t is None:
        return ui.empty_figure("No traces: no compute/communication breakdown.")
    ranks = t.column("rank").to_pylist()
    fig = ui.new_figure()
    steps = len(ranks) > STACKED_STEPS_ABOVE
    # numpy arrays, not lists: plotly checks a list element by element (36 ms at 512 ranks
    # against 5 ms), and the browser gets the same figure
    positions = np.arange(len(ranks))
    rank_col = np.asarray(ranks, dtype=float)
    for key, name in BREAKDOWN_PARTS:
        pct = _floats(t.column(f"{key}_pct"))
        ms = np.nan_to_num(_floats(t.column(f"{key}_ns"))) / 1e6
        kw: dict[str, Any] = {
            "x": positions, "y": pct, "name": name,
            "customdata": np.column_stack([rank_col, ms]),
            "hovertemplate": f"rank %{{customdata[0]}}<br>{name}: %{{y:.1f}}% "
                             "(%{customdata[1]:.1f} ms)<extra></extra>"}
        color = ui.PART_COLORS[key]
        if steps:
            fig.add_scatter(mode="lines", stackgroup="parts", fillcolor=color,
                            line={"width": 0, "shape": "hvh", "color": color}, **kw)
        else:
            fig.add_bar(marker_color=color, **kw)
    fig.update_layout(barmode="stack", bargap=0.15)
    fig.update_xaxes(**ui.rank_ticks(ranks, straggler, positional=True), tickangle=0)
    fig.update_yaxes(title="% of traced time", range=[0, 100])
    if straggler is not None and straggler in ranks:
        i = ranks.index(straggler)
        fig.add_shape(type="rect", x0=i - 0.5, x1=i + 0.5, y0=0, y1=100, yref="y",
                      line={"color": ui.STRAGGLER, "width": 2})
    return ui.base_layout(fig, height=380)


def _floats(column: Any) -> np.ndarray:
    """An Arrow column as float64, nulls as NaN (a gap in the plot, as None was)."""
    return np.asarray(column.cast("float64").to_numpy(zero_copy_only=False), dtype=float)


def problems(data: RunData) -> Any:
    if not data.problems:
        return html.Div()
    return ui.section("Problems reading this run", html.Ul([html.Li(p) for p in data.problems]),
                      id="problems")


def register(app: Any, data_of: Any) -> None:
    """Drill-down: a heatmap cell opens /steps, a breakdown bar opens /gaps, for that rank;
    and the page made again when a diagnosis made in the background is done."""
    ui.on_click(app, "step-heatmap", ui.step_cell)

    @app.callback(Output("page-overview", "children"),
                  Input("overview-diagnosis-poll", "n_intervals"), State("url", "search"),
                  prevent_initial_call=True)
    def _diagnosed(_n: int | None, search: str | None) -> Any:
        """The overview again, with its findings, once the background diagnosis is done."""
        data = data_of()
        if data.diagnosis_pending():
            raise PreventUpdate
        return layout(data, Selection.parse(search)).children
    ui.on_click(app, "rank-breakdown",
                lambda p, sel: sel.href("/gaps", rank=int(p["customdata"][0])))
