"""`uberprof scaling --html`: the scaling table as one self-contained HTML file (plotly.js
inlined once): efficiency against world size, and the change in step time against the smallest
run stacked by part. It draws the `uberprof scaling --json` document; nothing is computed
here."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from uberprof.units import fmt_num

__all__ = ["efficiency_figure", "lost_time_figure", "render_scaling_html", "write_scaling_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1200px;
color:#222;padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px} h2{font-size:1.2em;margin-top:28px;border-bottom:1px solid
#ddd;padding-bottom:4px} .dim{color:#666} table{border-collapse:collapse;font-size:.9em}
td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right} td.l,th.l{text-align:left}
"""

# One colour per kind of part (exposed communication groups share a family).
_COLORS = {"waiting": "#f58518", "stragglers": "#b279a2", "idle_data": "#9d755d",
           "idle_host": "#bab0ac", "idle_launch": "#d6cdc8", "compute": "#4c78a8",
           "other": "#dddddd"}
_COMM_COLORS = ("#e45756", "#ff9da6", "#c03d3e", "#ffbf79")


def write_scaling_html(doc: dict[str, Any], path: Path) -> None:
    path.write_text(render_scaling_html(doc), encoding="utf-8")


def _label(r: dict[str, Any]) -> str:
    return f"{r['world_size']} ranks · {r['run_id'] or Path(r['path']).name}"


def _color(key: str, i: int) -> str:
    return _COMM_COLORS[i % len(_COMM_COLORS)] if key.startswith("comm:") else \
        _COLORS.get(key, "#72b7b2")


def efficiency_figure(doc: dict[str, Any]) -> Any:
    """Scaling efficiency (%) against world size, with the ideal at 100%."""
    import plotly.graph_objects as go

    runs = doc["runs"]
    fig = go.Figure()
    xs = [r["world_size"] for r in runs]
    fig.add_trace(go.Scatter(x=xs, y=[100.0] * len(xs), mode="lines", name="ideal",
                             line={"dash": "dot", "color": "#888"}))
    fig.add_trace(go.Scatter(x=xs, y=[r["efficiency"] * 100 for r in runs],
                             mode="lines+markers", name="efficiency",
                             text=[_label(r) for r in runs],
                             hovertemplate="%{text}: %{y:.1f}%<extra></extra>"))
    fig.update_layout(title="Scaling efficiency (throughput per rank over the smallest run's)",
                      xaxis_title="world size", yaxis_title="%", height=360,
                      margin={"t": 40, "b": 40}, yaxis={"rangemode": "tozero"})
    fig.update_xaxes(tickvals=sorted(set(xs)))
    return fig


def lost_time_figure(doc: dict[str, Any]) -> Any:
    """Per run, the change in step time against the smallest run, stacked by part (a part
    that shrank goes below zero); the change in step time itself as a marker."""
    import plotly.graph_objects as go

    runs = doc["runs"][1:]
    if not runs:
        return None
    x = [_label(r) for r in runs]
    fig = go.Figure()
    comm = 0
    for p in doc["parts"]:
        k = p["key"]
        ys = [r["delta_parts_ms"][k] for r in runs]
        if not any(abs(v) >= 0.005 for v in ys):
            continue
        fig.add_trace(go.Bar(x=x, y=ys, name=p["label"], marker_color=_color(k, comm),
                             hovertemplate=f"{html.escape(p['label'])}: %{{y:+.2f}} ms"
                                           "<extra></extra>"))
        comm += k.startswith("comm:")
    fig.add_trace(go.Scatter(x=x, y=[r["delta_step_ms"] for r in runs], mode="markers",
                             name="change in step time", marker={"symbol": "diamond",
                                                                 "size": 11, "color": "#222"},
                             hovertemplate="step time: %{y:+.2f} ms<extra></extra>"))
    fig.update_layout(barmode="relative", height=400, margin={"t": 40, "b": 40},
                      title=f"Where the step time went, against {_label(doc['runs'][0])}",
                      yaxis_title="ms per step")
    return fig


def render_scaling_html(doc: dict[str, Any]) -> str:
    """The scaling document as one HTML page."""
    e = html.escape
    figs = [f for f in (efficiency_figure(doc), lost_time_figure(doc)) if f is not None]
    plots = [f.to_html(full_html=False, include_plotlyjs=(i == 0),
                       config={"displaylogo": False}) for i, f in enumerate(figs)]
    unit = doc["throughput_unit"]
    runs = doc["runs"]
    head = ["run", "world", "nodes", "ranks", "batch/rank", "step ms", f"{unit}/rank",
            f"{unit} total", "efficiency %", "lost ms/step"]
    rows = [[e(r["run_id"] or r["path"]), str(r["world_size"]), str(r["nodes"]),
             str(r["ranks"]), str(r["batch_per_rank"] or "?"), fmt_num(r["step_ms"], 2),
             fmt_num(r["throughput_per_rank"], 3), fmt_num(r["throughput_total"], 3),
             fmt_num(r["efficiency"] * 100, 1), fmt_num(r["lost_ms_per_step"], 2)]
            for r in runs]
    parts_head = ["part", *(e(r["run_id"] or r["path"]) for r in runs)]
    parts_rows = [[e(p["label"]), *(fmt_num(r["parts_ms"][p["key"]], 2) for r in runs)]
                  for p in doc["parts"]]
    parts_rows.append(["step time", *(fmt_num(r["step_ms"], 2) for r in runs)])
    basis = doc["basis"]
    out = [
        (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>uberprof scaling</title>"
         f"<style>{_CSS}</style></head><body>"),
        f"<h1>uberprof scaling: {len(runs)} runs</h1>",
        f"<div class='dim'>baseline (smallest): {e(doc['baseline'])}</div>",
        _table(head, rows),
        "<p class='dim'>" + "<br>".join(f"{e(k)}: {e(v)}" for k, v in basis.items()) + "</p>",
        *(f"<p>differs: {e(d)}</p>" for d in doc["differences"]),
        *(f"<p class='dim'>note: {e(n)}</p>" for n in doc["notes"]),
        "<h2>Plots</h2>", *plots,
        "<h2>Step time by part (ms per step)</h2>", _table(parts_head, parts_rows),
        "</body></html>",
    ]
    return "\n".join(out)


def _table(head: list[str], rows: list[list[str]]) -> str:
    """Cells already escaped; the first column left-aligned."""
    th = "".join(f"<th class='{'l' if i == 0 else ''}'>{html.escape(h)}</th>"
                 for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f"<td class='{'l' if i == 0 else ''}'>{v}</td>"
                                    for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"
