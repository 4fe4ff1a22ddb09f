"""`/memory`: how much memory each rank holds and whether it grows (issue 27). Per rank, the
GPU's peak allocated bytes and what it holds between steps, step by step (the saved step
timeline), the host process's resident set size over time (the counters), and the summary the
diagnosis saved (`run.memory`: peak against the device, median in use, first and last step,
host RSS), and the memory timeline of the trace window (`run.memory_timeline`, `uberprof run
--profile-memory`: allocated bytes over the window, its peak's moment and operator marked). A
run without GPU memory rows, counters or memory events gets what it has, or one sentence."""

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
_MIB = float(1 << 20)


def layout(data: RunData, sel: Selection) -> html.Div:
    body: list[Any] = [ui.missing_notices(data.missing())]
    rows = q.summary(data)
    entries = q.timeline_entries(data)
    if not rows and not entries:
        body.append(ui.notice("No memory to show: the step timelines hold no GPU memory rows "
                              "(a CPU run, or recorded by an older uberprof), the counters "
                              "no process memory and the traces no memory events (`uberprof "
                              "run --profile-memory`); or this diagnosis was saved before "
                              "uberprof saved memory (run `uberprof report` on the run again).",
                              "info", id="memory-none"))
        return ui.page("page-memory", *body)
    ranks = q.drawn_ranks(data, sel.rank)
    if rows:
        body.append(cards(rows))
    gpu = q.gpu_series(data, ranks)
    if gpu:
        body.append(_graph_section(
            data, "gpu", ranks, "GPU memory per step", lambda: gpu_figure(gpu, sel.rank),
            "Per rank at each step boundary: the caching allocator's peak allocated bytes "
            "so far (dashed) and what is allocated between steps (solid). A steady job "
            "holds the same at every step; a line that climbs is a leak."
            + (f" Over {q.STEP_BUCKETS} runs of steps, each one's lowest and highest "
               "points are drawn." if any(s.thinned for s in gpu) else "")))
    rss = q.rss_series(data, ranks)
    if rss:
        body.append(_graph_section(
            data, "rss", ranks, "Host memory", lambda: rss_figure(rss, sel.rank),
            "Each rank process's resident set size, sampled by the counters (seconds "
            "from the run's first step)."))
    if entries:
        body.append(window_section(data, ranks, entries, sel.rank))
    if rows:
        shown = q.table_rows(data, sel.rank)
        body.append(ui.section("Per rank", summary_table(shown, sel.rank), id="memory-summary",
                               sub=q.basis(data)))
    if len(ranks) < len(rows or {e["rank"] for e in entries}):
        table = ("the table has every rank" if len(shown) == len(rows) else
                 f"the table {len(shown)} (every rank is in `uberprof report --json`, "
                 "run.memory.ranks)") if rows else "the table has every rank"
        body.append(ui.notice(f"The plots draw {len(ranks)} of {len(rows)} ranks (the highest "
                              f"peaks, and the selected rank); {table}.",
                              "info", id="memory-drawn"))
    return ui.page("page-memory", *body)


def _graph_section(data: RunData, key: str, ranks: list[int], title: str,
                   figure: Any, sub: str) -> Any:
    """Section `memory-<key>-section`: one graph, its figure made once for the drawn ranks."""
    return ui.section(title, ui.graph(f"memory-{key}", data.figure(f"memory-{key}:{ranks}",
                                                                  figure)),
                      id=f"memory-{key}-section", sub=sub)


def window_section(data: RunData, ranks: list[int], entries: list[dict[str, Any]],
                   selected: int | None) -> html.Div:
    """The trace window's memory timeline (allocated bytes after each allocation and free,
    its peak marked with step and operator) and its peaks per rank."""
    series = q.timeline_series(data, ranks)
    kids: list[Any] = []
    if series:
        kids.append(ui.graph("memory-window", data.figure(
            f"memory-window:{ranks}:{selected}", lambda: window_figure(series, selected))))
    else:
        kids.append(ui.notice("The memory events behind this timeline were not found in the "
                              "saved tables (run `uberprof analyze` on the run again).", "info",
                              id="memory-window-none"))
    kids.append(window_table(entries, selected))
    thin = " Long windows are thinned to each time bucket's lowest and highest points." \
        if any(s.thinned for s in series) else ""
    return ui.section(
        "Memory timeline of the trace window", *kids, id="memory-window-section",
        sub="Allocated bytes after each allocation and free torch.profiler recorded (`uberprof "
            "run --profile-memory`), per rank from the start of its first analysed step; the "
            "diamond marks the peak, with its step and the operator running then. "
            + (q.timeline_note(data) or "") + "." + thin)


def window_figure(series: list[q.WindowSeries], selected: int | None) -> go.Figure:
    fig = ui.new_figure()
    colors: dict[int, str] = {}
    # one peak is labelled in the plot (the selected rank's, else the highest), the rest on hover
    labelled = next((s for s in series if s.rank == selected),
                    max(series, key=lambda s: s.peak_bytes, default=None))
    for s in series:
        color = colors.setdefault(s.rank, _color(len(colors)))
        name = f"rank {s.rank} {s.device}"
        width = 3 if s.rank == selected else 1.5
        fig.add_scatter(x=s.ms, y=s.allocated / _MIB, mode="lines", name=name,
                        line={"color": color, "width": width, "shape": "hv"},
                        legendgroup=name,
                        hovertemplate=f"{name}, %{{x:.2f}} ms: %{{y:.2f}} MiB allocated"
                                      "<extra></extra>")
        what = (f"peak {fmt_bytes(s.peak_bytes)}, step {s.peak_step}, "
                f"{s.peak_operator or 'no operator'}")
        fig.add_scatter(x=[s.peak_ms], y=[s.peak_bytes / _MIB],
                        mode="markers+text" if s is labelled else "markers",
                        name=f"{name} peak", legendgroup=name, showlegend=False,
                        marker={"color": color, "size": 11, "symbol": "diamond"},
                        text=[what], textposition="top right",
                        hovertemplate=f"{name}: {what} at %{{x:.2f}} ms<extra></extra>")
    fig.update_xaxes(title="ms from the first analysed step")
    fig.update_yaxes(title="MiB allocated", rangemode="tozero")
    return ui.base_layout(fig, height=380)


def window_table(entries: list[dict[str, Any]], selected: int | None) -> html.Table:
    body = [[str(e["rank"]), str(e["device"]), _b(e.get("peak_allocated_bytes")),
             "-" if e.get("peak_step") is None else str(e["peak_step"]),
             "-" if e.get("peak_in_step_ms") is None else f"{e['peak_in_step_ms']:.2f}",
             str(e.get("peak_operator") or "-"), _b(e.get("first_allocated_bytes")),
             _b(e.get("last_allocated_bytes")), str(e.get("events"))] for e in entries]
    return ui.table(["rank", "device", "peak", "peak at step", "ms into the step",
                     "operator then", "allocated at the start", "at the end", "events"],
                    body, id="memory-window-table",
                    row_classes=["selected" if e["rank"] == selected else "" for e in entries])


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
