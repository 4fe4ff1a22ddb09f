"""`/parallelism`: how the ranks divide the work and what that costs (issue 25). A pipeline's
time goes to its slowest stage and to stages waiting on each other; a 2-D job's exposed
communication belongs to one of its groups, and the remedy depends on which. So the page shows
the reading (kinds and what they were read from), each stage's step split into compute,
waiting on the previous and on the next stage, and the rest, who waits on whom, the exposed
communication of each group, and the findings about them with their remedies. A data-parallel
job has none of this: it gets one sentence."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import dcc, html

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import parallelism as q
from uberprof.dashboards.ui import Selection
from uberprof.units import fmt_num

PATH = "/parallelism"
TITLE = "Parallelism"
_STAGE_PARTS = (  # (Stage attribute, legend name, colour): drawn bottom to top
    ("compute_ms", "compute", ui.PART_COLORS["compute"]),
    ("wait_prev_ms", "waiting on the previous stage", "#E45756"),
    ("wait_next_ms", "waiting on the next stage", ui.PART_COLORS["exposed_comm"]),
    ("rest_ms", "rest of the step", ui.PART_COLORS["idle"]),
)


def layout(data: RunData, sel: Selection) -> html.Div:
    body: list[Any] = [ui.missing_notices(data.missing())]
    if not data.has_traces:
        return ui.without_traces("page-parallelism", body,
                                 "The parallelism is read from traces: process groups, "
                                 "point-to-point transfers and API markers.")
    reading = q.reading(data)
    body.append(ui.section("How the ranks divide the work", reading_box(data, reading),
                           id="parallelism-summary"))
    if q.pipeline(data) is not None:
        body += [pipeline_section(data), waits_section(data)]
    elif q.waits(data):  # send/recv without stages the analysis could order
        body.append(waits_section(data))
    groups = q.group_comm(data)
    if groups and (len(groups) > 1 or not q.is_data_parallel(data)):
        body.append(groups_section(groups))
    found = q.findings(data)
    if found:
        body.append(ui.section("What the parallel layout costs", findings_list(found, sel),
                               id="parallelism-findings",
                               sub="The findings about stages and groups, with the usual "
                                   "remedy."))
    return ui.page("page-parallelism", *body)


def reading_box(data: RunData, reading: dict[str, Any] | None) -> html.Div:
    """The summary line, then each kind's evidence and groups; for a data-parallel job, the
    sentence that there is nothing else to see here."""
    if reading is None:
        return ui.notice("This diagnosis holds no reading of the parallelism (saved by an "
                         "older uberprof): run `uberprof report` on the run again.", "info",
                         id="parallelism-none")
    summary = reading.get("summary") or "not known"
    kids: list[Any] = [html.Div([html.B("Layout: "), summary], id="parallelism-line",
                                className="finding-title")]
    if q.is_data_parallel(data):
        first = (f"This job reads as data-parallel ({summary})" if reading.get("kinds")
                 else "No pipeline or tensor parallelism in the traces")
        kids.append(ui.notice(f"{first}: every rank runs the same step, so no stage waits on "
                              "another. Its collectives are on the Communication page.", "ok",
                              id="parallelism-plain"))
    groups = reading.get("groups") or {}
    dims = reading.get("dims") or {}
    items = []
    for kind, why in (reading.get("evidence") or {}).items():
        of = groups.get(kind)
        size = f" size {dims[kind]}" if kind in dims else ""
        items.append(html.Li([html.Span(f"{kind}{size}", className="ev-key"), ": ", why,
                              *([html.Span(" · groups " + " ".join(
                                  "{" + ",".join(map(str, g)) + "}" for g in of),
                                  className="muted")] if of else [])]))
    if items:
        kids.append(html.Ul(items, className="evidence", id="parallelism-evidence"))
    return html.Div(kids)


def pipeline_section(data: RunData) -> html.Section:
    p = q.pipeline(data) or {}
    slowest = q.slowest_stage(data)
    schedule = p.get("schedule_words") or "unknown schedule"
    m = p.get("microbatches")
    ideal = p.get("ideal_bubble_pct")
    ideal_text = (f"ideal bubble {fmt_num(ideal, unit='%')} of the step "
                  f"((p - 1) / (m + p - 1) with p = {p.get('stages')}, m = {m})"
                  if ideal is not None else "ideal bubble unknown (micro-batches not read)")
    cards = html.Div([
        ui.card("Stages", str(p.get("stages")), f"over {p.get('steps')} analysed step(s)",
                id="card-stages"),
        ui.card("Schedule", schedule, f"{m} micro-batch(es)" if m else "micro-batches unknown",
                id="card-schedule"),
        ui.card("Ideal bubble", fmt_num(ideal, unit="%") if ideal is not None else "?",
                "the schedule's own idle share", id="card-ideal-bubble"),
        ui.card("Slowest stage", f"stage {slowest}" if slowest is not None else "?",
                "computes the most per step", status="bad" if any(
                    f.kind == "pipeline_imbalance" for f in q.findings(data)) else "neutral",
                id="card-slowest-stage"),
    ], className="cards", id="pipeline-cards")
    return ui.section(
        "Pipeline stages", cards,
        html.P(f"{schedule}, {m or '?'} micro-batch(es): {ideal_text}. Each stage's measured "
               "bubble is the share of its step it does not compute.", id="pipeline-ideal",
               className="section-sub"),
        stage_table(data, slowest),
        ui.graph("stage-breakdown", data.figure("parallelism-stages",
                                                lambda: stages_figure(data, slowest))),
        id="pipeline",
        sub="Per stage and analysed step (medians): compute, waiting for the previous stage's "
            "activations, waiting for the next stage's gradients, and the rest.")


def stage_table(data: RunData, slowest: int | None) -> html.Table:
    rows, classes = [], []
    for s in q.stages(data):
        mark = " ◀ slowest" if s.stage == slowest else ""
        rows.append([f"stage {s.stage}{mark}", ", ".join(map(str, s.ranks)),
                     f"{s.compute_ms:.1f}", f"{s.wait_prev_ms:.1f}", f"{s.wait_next_ms:.1f}",
                     f"{s.step_ms:.1f}", fmt_num(s.bubble_pct, unit="%"),
                     str(s.slowest_in_steps)])
        classes.append("straggler slowest" if s.stage == slowest else "")
    return ui.table(["stage", "ranks", "compute ms", "wait prev ms", "wait next ms", "step ms",
                     "bubble", "slowest in steps"], rows, id="stage-table", row_classes=classes)


def stages_figure(data: RunData, slowest: int | None) -> go.Figure:
    ss = q.stages(data)
    if not ss:
        return ui.empty_figure("No pipeline stages.")
    labels = [_stage_tick(s, slowest) for s in ss]
    fig = ui.new_figure()
    for attr, name, color in _STAGE_PARTS:
        fig.add_bar(x=labels, y=[getattr(s, attr) for s in ss], name=name, marker_color=color,
                    customdata=[[s.step_ms, s.bubble_pct] for s in ss],
                    hovertemplate=f"%{{x}}<br>{name}: %{{y:.1f}} ms of %{{customdata[0]:.1f}} "
                                  "ms (bubble %{customdata[1]}%)<extra></extra>")
    fig.update_layout(barmode="stack", bargap=0.35)
    fig.update_yaxes(title="ms per step (median)")
    return ui.base_layout(fig, height=340)


def _stage_tick(s: q.Stage, slowest: int | None) -> str:
    if s.stage == slowest:
        return f"<span style='color:{ui.STRAGGLER}'><b>{s.label} ◀ slowest</b></span>"
    return s.label


def waits_section(data: RunData) -> html.Section:
    return ui.section(
        "Who waits on whom",
        ui.graph("p2p-waits", data.figure("parallelism-waits", lambda: waits_figure(data))),
        id="waits",
        sub="Point-to-point transfers per direction: how long the receiver waited for its "
            "sender, summed over the analysed steps. Stage k waits on stage k-1 for "
            "activations (forward) and on stage k+1 for gradients (backward).")


def waits_figure(data: RunData) -> go.Figure:
    ws = q.waits(data)
    if not ws:
        return ui.empty_figure("No point-to-point transfers matched.")
    fig = ui.new_figure()
    fig.add_bar(
        y=[w.label for w in ws], x=[w.wait_ms for w in ws], orientation="h",
        marker_color=ui.PART_COLORS["exposed_comm"],
        customdata=[[w.transfers, ui.fmt_bytes(w.bytes), w.transfer_ms or 0.0,
                     fmt_num(w.effective_gbit_s)] for w in ws],
        hovertemplate="%{y}: %{x:.1f} ms waiting<br>%{customdata[0]} transfers of "
                      "%{customdata[1]}, %{customdata[2]:.1f} ms moving data "
                      "(%{customdata[3]} Gbit/s)<extra></extra>")
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_xaxes(title="receiver waiting, ms over the analysed steps", rangemode="tozero")
    return ui.base_layout(fig, height=max(200, 40 * len(ws) + 100))


def groups_section(groups: list[dict[str, Any]]) -> html.Section:
    rows = [[_group_label(g), g.get("group"),
             ", ".join(f"{k} × {v}" for k, v in (g.get("collectives") or {}).items()),
             f"{g.get('time_ms') or 0:.1f}", f"{g.get('exposed_ms') or 0:.1f}",
             fmt_num(g.get("exposed_pct_of_wall"), unit="%")] for g in groups]
    return ui.section(
        "Communication per group",
        ui.graph("group-comm", groups_figure(groups)),
        ui.table(["group", "id", "collectives", "time ms", "exposed ms", "exposed of wall"],
                 rows, id="group-table"),
        id="groups",
        sub="Exposed communication of each process group, as a share of the analysed wall "
            "time (its ranks' mean; overlapping collectives can count twice, so a share is an "
            "upper bound).")


def _group_label(g: dict[str, Any]) -> str:
    ranks = g.get("ranks") or []
    return f"{g.get('dim') or g.get('group')} · ranks {','.join(map(str, ranks))}"


def groups_figure(groups: list[dict[str, Any]]) -> go.Figure:
    fig = ui.new_figure()
    fig.add_bar(
        y=[_group_label(g) for g in groups],
        x=[g.get("exposed_pct_of_wall") or 0.0 for g in groups], orientation="h",
        marker_color=ui.PART_COLORS["exposed_comm"],
        customdata=[[g.get("exposed_ms") or 0.0, g.get("time_ms") or 0.0] for g in groups],
        hovertemplate="%{y}<br>%{x:.1f}% of wall exposed<br>%{customdata[0]:.1f} ms exposed "
                      "of %{customdata[1]:.1f} ms<extra></extra>")
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_xaxes(title="exposed, % of the analysed wall time", rangemode="tozero")
    return ui.base_layout(fig, height=max(200, 40 * len(groups) + 100))


def findings_list(found: list[Any], sel: Selection) -> html.Div:
    items = []
    for i, f in enumerate(found):
        test = (f.evidence.get("test") or {}).get("sentence")
        items.append(html.Div([
            html.Div([html.Span(f.severity, className=f"badge {f.severity}"),
                      html.Span(f.kind.replace("_", " "), className="kind"),
                      html.Span(f.stake_words(short=True), className="stake",
                                title="time at stake in the analysed steps, counted once")],
                     className="finding-head"),
            html.Div(f.title, className="finding-title"),
            *([html.Div([html.B("Test: "), test], className="finding-test")] if test else []),
            html.Div([html.B("Remedy: "), f.remedy], className="finding-remedy"),
            dcc.Link(f"{f.page.strip('/')} →", href=sel.href(f.page), className="finding-link")
            if f.page not in ("/", PATH) else None,
        ], className=f"finding {f.kind}", id=f"parallelism-finding-{i}",
            **{"data-kind": f.kind}))
    return html.Div(items, className="findings")
