"""`/counters`: one node's GPU and host counters over the run, with step boundaries, the traced
windows, and the moments a GPU throttled (a clock slowdown reason set) marked."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import dcc, html
from plotly.subplots import make_subplots

from uberprof.dashboards import ui
from uberprof.dashboards.data import RunData
from uberprof.dashboards.queries import counters as q
from uberprof.dashboards.ui import Selection

PATH = "/counters"
TITLE = "Counters"

# (source, metric, panel title): GPU panels first, then the host's, then the network's.
PANELS = (
    ("nvml", "util.gpu", "GPU utilisation (%)"),
    ("nvml", "clock.sm", "GPU SM clock (MHz)"),
    ("nvml", "temp.gpu", "GPU temperature (°C)"),
    ("nvml", "power", "GPU power (W)"),
    ("nvml", "mem.used", "GPU memory used (B)"),
    ("host", "cpu.util", "host CPU (%)"),
    ("host", "mem.used", "host memory used (B)"),
    ("proc", "cpu.util", "rank processes: CPU (%)"),
    ("nic", "rx_rate", "NIC receive (B/s)"),
    ("nic", "tx_rate", "NIC transmit (B/s)"),
    ("ib", "rx_rate", "InfiniBand receive (B/s)"),
    ("ib", "tx_rate", "InfiniBand transmit (B/s)"),
)
MAX_DEVICES = 16


def _node(data: RunData, sel: Selection) -> str | None:
    """The node shown: the one in the URL, else the selected rank's, else the first."""
    nodes = data.counter_catalog()["nodes"]
    return sel.node if sel.node in nodes else data.node_of_rank(sel.rank)


def _panels(data: RunData, node: str) -> list[tuple[str, str, str]]:
    series = data.counter_catalog()["nodes"][node]["series"]
    return [(s, m, t) for s, m, t in PANELS if m in series.get(s, {})]


def _rank_on_node(data: RunData, node: str, sel: Selection) -> int | None:
    return q.rank_on_node(data, data.counter_catalog()["nodes"][node]["host"], sel.rank)


def layout(data: RunData, sel: Selection) -> html.Div:
    cat = data.counter_catalog()
    body: list[Any] = [ui.missing_notices([m for m in data.missing() if "counters" in m.lower()
                                           or "GPU" in m])]
    if not cat["nodes"]:
        body.append(ui.notice("This run has no counters to show.", "info", id="no-counters"))
        return ui.page("page-counters", *body)
    node = _node(data, sel)
    assert node is not None
    info = cat["nodes"][node]
    rank_on_node = _rank_on_node(data, node, sel)
    opts = [{"label": f"{n} ({i['host']})" if i["host"] != n else n, "value": n}
            for n, i in cat["nodes"].items()]
    body.append(html.Div([
        html.Div([html.Label("Node"), dcc.Dropdown(id="counters-node", options=opts, value=node,
                                                   clearable=False)], className="control"),
        html.Div([html.Label("Step boundaries of"),
                  html.Div(f"rank {rank_on_node}" if rank_on_node is not None else "–",
                           id="counters-rank")], className="control"),
    ], className="controls"))
    panels = _panels(data, node)
    if not panels:
        body.append(ui.notice(f"Node {node} has counters, but none of the usual ones.", "info"))
        return ui.page("page-counters", *body)
    if "nvml" not in info["series"]:
        body.append(ui.notice(f"No GPU counters on {node}: host counters only.", "info",
                              id="no-gpu-counters"))
    spans = q.throttle_spans(data, node)
    if spans:
        gpus = sorted({d for d, _, _ in spans})
        body.append(ui.notice(f"Clock slowdown (throttling) on {', '.join(gpus)}: "
                              f"{len(spans)} period(s), marked in red.", "bad",
                              id="throttle-note"))
    body.append(ui.section(f"Counters of {node}",
                           ui.graph("counters-graph", figure(data, node, panels, rank_on_node,
                                                             spans, sel.rank)),
                           sub="Averaged into at most 600 points per line. Grey: traced "
                               "steps; dotted: step boundaries; red: throttling.",
                           id="counters-section"))
    return ui.page("page-counters", *body)


def figure_of(data: RunData, sel: Selection) -> go.Figure | None:
    """The counters figure the page shows for `sel` (None without one): what a page
    following a running job redraws as samples arrive."""
    node = _node(data, sel) if data.counter_catalog()["nodes"] else None
    panels = _panels(data, node) if node is not None else []
    if node is None or not panels:
        return None
    return figure(data, node, panels, _rank_on_node(data, node, sel),
                  q.throttle_spans(data, node), sel.rank)


def figure(data: RunData, node: str, panels: list[tuple[str, str, str]], rank: int | None,
           spans: list[tuple[str, float, float]], focus: int | None) -> go.Figure:
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.025,
                        subplot_titles=[t for _, _, t in panels], figure=ui.new_figure())
    gpu_of_focus = data.rank_gpu(focus) if focus is not None else None
    extent: dict[int, tuple[float, float]] = {}
    in_legend: set[str] = set()
    colors: dict[str, str] = {}  # one colour per device across panels
    proc_devices = ([f"rank:{r}" for r in data.ranks() if data.node_of_rank(r) == node][
        :MAX_DEVICES] or None) if any(s == "proc" for s, _, _ in panels) else None
    by_source: dict[str, dict[str, Any]] = {}  # one read of each source's stream
    for source in dict.fromkeys(s for s, _, _ in panels):
        by_source[source] = data.counter_series_of(
            node, source, [m for s, m, _ in panels if s == source],
            devices=proc_devices if source == "proc" else None)
    for i, (source, metric, _title) in enumerate(panels, start=1):
        cs = by_source[source][metric]
        if cs is None:
            continue
        for dev, (t, v) in list(cs.devices.items())[:MAX_DEVICES]:
            if v.size:
                lo, hi = extent.get(i, (float(v.min()), float(v.max())))
                extent[i] = (min(lo, float(v.min())), max(hi, float(v.max())))
            hot = gpu_of_focus is not None and gpu_of_focus == (node, dev)
            color = colors.setdefault(dev, ui.PALETTE[len(colors) % len(ui.PALETTE)])
            fig.add_scatter(
                x=t, y=v, mode="lines", name=dev + (f" (rank {focus})" if hot else ""),
                legendgroup=dev, showlegend=dev not in in_legend,
                line={"width": 3 if hot else 1.2, "color": color},
                hovertemplate=f"{dev}<br>%{{x:.1f}} s: %{{y:.4g}} {cs.unit or ''}"
                              "<extra></extra>", row=i, col=1)
            in_legend.add(dev)
        if cs.unit in ("B", "B/s"):  # 60 GB, not plotly's "60B" (billions)
            fig.update_yaxes(tickformat=".3~s", ticksuffix=cs.unit, row=i, col=1)
    # Bands over every panel: one paper-high shape each, set at once (add_vrect per panel
    # is quadratic in plotly and takes minutes with hundreds of bands).
    shapes = []
    if rank is not None:
        shapes += [_band(lo, hi, "rgba(0,0,0,0.08)") for lo, hi, _, _ in data.traced_spans(rank)]
    shapes += [_band(lo, hi, "rgba(214,39,40,0.18)") for lo, hi in q.merge_spans(spans)]
    if rank is not None:
        starts, every = q.step_boundaries(data, rank, max_lines=150)
        if starts.size:
            xs: list[Any] = []
            for x in starts.tolist():
                xs += [x, x, None]
            for i, (lo, hi) in extent.items():
                fig.add_scatter(
                    x=xs, y=[min(lo, 0.0), hi, None] * starts.size, mode="lines",
                    line={"color": "rgba(0,0,0,0.18)", "width": 1, "dash": "dot"},
                    hoverinfo="skip", showlegend=False, row=i, col=1)
            fig.add_annotation(text=f"step boundaries of rank {rank}"
                               + (f" (every {every}th)" if every > 1 else ""),
                               xref="paper", yref="paper", x=1, y=1.0, yanchor="bottom",
                               showarrow=False, font={"size": 10, "color": "#666"})
    fig.update_layout(shapes=shapes)
    fig.update_xaxes(title="s since the first step", row=len(panels), col=1)
    fig = ui.base_layout(fig, height=190 * len(panels) + 60)
    fig.update_annotations(font_size=11)
    return fig


def _band(lo: float, hi: float, color: str) -> dict[str, Any]:
    return {"type": "rect", "xref": "x", "yref": "paper", "x0": lo, "x1": hi, "y0": 0, "y1": 1,
            "fillcolor": color, "line": {"width": 0}, "layer": "below"}


def register(app: Any, data_of: Any) -> None:
    """The node picker shows that node's counters."""
    # the picker's first value is the node shown (the default one when the URL names none):
    # going to its URL would build and draw the same page a second time
    ui.on_change(app, "counters-node", "value",
                 lambda node, sel: None if not node or node == _node(data_of(), sel)
                 else sel.href(PATH, node=node))
