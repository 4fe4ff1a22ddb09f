"""`/memory`: how much memory each rank holds and whether it grows (issue 27). Per rank, the
GPU's peak allocated bytes and what it holds between steps, step by step (the saved step
timeline), the host process's resident set size over time (the counters), and the summary the
diagnosis saved (`run.memory`: peak against the device, median in use, first and last step,
host RSS). A run without GPU memory rows or counters gets what it has, or one sentence."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import html

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import memory as q
from uberprof.dashboards.ui import Selection
from uberprof.units import fmt_bytes

PATH = "/memory"
TITLE = "Memory"
_GIB = float(1 << 30)


def layout(data: RunData, sel: Selection) -> html.Div:
    body: list[Any] = [ui.missing_notices(data.missing())]
    rows = q.summary(data)
    if not rows:
        body.append(ui.notice("No memory to show: the step timelines hold no GPU memory rows "
                              "(a CPU run, or recorded by an older uberprof) and the counters "
                              "no process memory; or this diagnosis was saved before uberprof "
                              "saved memory (run `uberprof report` on the run again).", "info",
                              id="memory-none"))
        return ui.page("page-memory", *body)
    ranks = q.drawn_ranks(data, sel.rank)
    body.append(cards(rows))
    gpu = q.gpu_series(data, ranks)
    if gpu:
        body.append(ui.section(
            "GPU memory per step",
            ui.graph("memory-gpu", data.figure(f"memory-gpu:{ranks}",
                                               lambda: gpu_figure(gpu, sel.rank))),
            id="memory-gpu-section",
            sub="Per rank at each step boundary: the caching allocator's peak allocated bytes "
                "so far (dashed) and what is allocated between steps (solid). A steady job "
                "holds the same at every step; a line that climbs is a leak."))
    rss = q.rss_series(data, ranks)
    if rss:
        body.append(ui.section(
            "Host memory",
            ui.graph("memory-rss", data.figure(f"memory-rss:{ranks}",
                                               lambda: rss_figure(rss, sel.rank))),
            id="memory-rss-section",
            sub="Each rank process's resident set size, sampled by the counters (seconds "
                "from the run's first step)."))
    body.append(ui.section("Per rank", summary_table(rows, sel.rank), id="memory-summary",
                           sub=q.basis(data)))
    if len(ranks) < len(rows):
        body.append(ui.notice(f"The plots draw {len(ranks)} of {len(rows)} ranks (the highest "
                              "peaks, and the selected rank); the table has every rank.",
                              "info", id="memory-drawn"))
    return ui.page("page-memory", *body)


def cards(rows: list[dict[str, Any]]) -> html.Div:
    def top(key: str) -> dict[str, Any] | None:
        have = [r for r in rows if r.get(key) is not None]
        return max(have, key=lambda r: r[key]) if have else None

    kids = []
    g = top("gpu_peak_bytes")
    if g is not None:
        pct = g.get("gpu_peak_pct")
        kids.append(ui.card("GPU peak", fmt_bytes(g["gpu_peak_bytes"]),
                            f"rank {g['rank']}, step {g.get('gpu_peak_step')}"
                            + (f", {pct:.1f}% of {fmt_bytes(g.get('device_total_bytes'))}"
                               if pct is not None else ""), id="card-gpu-peak"))
    grow = top("gpu_growth_bytes")
    if grow is not None:
        b = grow["gpu_growth_bytes"]
        kids.append(ui.card("Largest growth", _growth(b),
                            f"rank {grow['rank']}, in use from step {grow.get('gpu_first_step')}"
                            f" to {grow.get('gpu_last_step')}", id="card-gpu-growth"))
    h = top("rss_peak_bytes")
    if h is not None:
        of = h.get("host_mem_total_bytes")
        kids.append(ui.card("Host RSS peak", fmt_bytes(h["rss_peak_bytes"]),
                            f"rank {h['rank']}" + (f" of {fmt_bytes(of)} on {h.get('host')}"
                                                   if of else ""), id="card-rss-peak"))
    return html.Div(kids, className="cards", id="memory-cards")


def _color(i: int) -> str:
    return ui.PALETTE[i % len(ui.PALETTE)]


def gpu_figure(series: list[q.GpuSeries], selected: int | None) -> go.Figure:
    fig = ui.new_figure()
    for i, s in enumerate(series):
        width = 3 if s.rank == selected else 1.5
        fig.add_scatter(x=s.steps, y=s.in_use / _GIB, mode="lines", name=f"rank {s.rank} in use",
                        line={"color": _color(i), "width": width}, legendgroup=str(s.rank),
                        hovertemplate=f"rank {s.rank}, step %{{x}}: %{{y:.3f}} GiB in use"
                                      "<extra></extra>")
        fig.add_scatter(x=s.steps, y=s.peak / _GIB, mode="lines", name=f"rank {s.rank} peak",
                        line={"color": _color(i), "width": width, "dash": "dash"},
                        legendgroup=str(s.rank),
                        hovertemplate=f"rank {s.rank}, step %{{x}}: peak %{{y:.3f}} GiB"
                                      "<extra></extra>")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="GiB allocated", rangemode="tozero")
    return ui.base_layout(fig, height=360)


def rss_figure(series: dict[int, Any], selected: int | None) -> go.Figure:
    fig = ui.new_figure()
    for i, (r, (t, v)) in enumerate(sorted(series.items())):
        fig.add_scatter(x=t, y=v / _GIB, mode="lines", name=f"rank {r}",
                        line={"color": _color(i), "width": 3 if r == selected else 1.5},
                        hovertemplate=f"rank {r}, %{{x:.1f}} s: %{{y:.3f}} GiB RSS"
                                      "<extra></extra>")
    fig.update_xaxes(title="seconds from the first step")
    fig.update_yaxes(title="GiB resident", rangemode="tozero")
    return ui.base_layout(fig, height=320)


def _b(v: Any) -> str:
    return fmt_bytes(v, missing="-")


def _growth(v: Any) -> str:
    if v is None:
        return "-"
    return ("+" if v > 0 else "-" if v < 0 else "±") + fmt_bytes(abs(v))


def summary_table(rows: list[dict[str, Any]], selected: int | None) -> html.Table:
    body = []
    for r in rows:
        pct = r.get("gpu_peak_pct")
        body.append([
            str(r["rank"]), str(r.get("host") or "-"), _b(r.get("device_total_bytes")),
            _b(r.get("gpu_peak_bytes")), "-" if pct is None else f"{pct:.1f}%",
            "-" if r.get("gpu_peak_step") is None else str(r["gpu_peak_step"]),
            _b(r.get("gpu_in_use_median_bytes")), _b(r.get("gpu_in_use_first_bytes")),
            _b(r.get("gpu_in_use_last_bytes")), _growth(r.get("gpu_growth_bytes")),
            _b(r.get("rss_peak_bytes")),
            "-" if r.get("rss_peak_step") is None else str(r["rss_peak_step"]),
            _b(r.get("rss_median_bytes"))])
    return ui.table(["rank", "host", "device", "GPU peak", "of device", "peak at step",
                     "in use (median)", "in use, first step", "in use, last step", "growth",
                     "RSS peak", "RSS peak at step", "RSS median"], body, id="memory-table",
                    row_classes=["selected" if r["rank"] == selected else "" for r in rows])
