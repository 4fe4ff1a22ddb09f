"""Shared pieces of every page: colours, the URL selection, cards, notices, empty figures.

One palette for the whole app so that "exposed comm" or a gap cause has the same colour on
every page, and one `Selection` so that links between pages carry the rank and step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode

import plotly.graph_objects as go
import plotly.io as pio
from dash import Input, Output, State, dcc, html, no_update

# the pages, in the bar's order (nav.py: `uberprof dashboard --help` lists them without Dash)
from uberprof.dashboards.nav import COMPARE_PAGE, PAGES
from uberprof.units import fmt_bytes, fmt_ms, fmt_pct  # noqa: F401 - pages use ui.fmt_*

PART_COLORS = {
    "compute_only": "#4C78A8",
    "compute": "#4C78A8",
    "comm_under_compute": "#72B7B2",
    "comm": "#72B7B2",
    "exposed_comm": "#F58518",
    "memory": "#B279A2",
    "idle": "#BAB0AC",
}
CAUSE_COLORS = {
    "data": "#E45756",
    "sync": "#9D755D",
    "launch": "#EECA3B",
    "host": "#FF9DA6",
    "other": "#8C8C8C",
    "warmup": "#D4D4D4",
}
STRAGGLER = "#D62728"
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B",
           "#9D755D", "#FF9DA6", "#BAB0AC")  # one colour per line (GPU, process, rank)
SEVERITY_COLORS = {"high": "#D62728", "medium": "#F58518", "low": "#4C78A8"}
GRAPH_CONFIG: dict[str, Any] = {"displaylogo": False,
                                "modeBarButtonsToRemove": ["lasso2d", "select2d"]}



@dataclass(frozen=True)
class Selection:
    """What the user is looking at, carried in the URL query: `?rank=3&step=120&node=n0`."""

    rank: int | None = None
    step: int | None = None
    node: str | None = None

    @classmethod
    def parse(cls, search: str | None) -> Selection:
        q = parse_qs((search or "").lstrip("?"))

        def num(k: str) -> int | None:
            v = (q.get(k) or [None])[0]
            try:
                return int(v) if v is not None else None
            except ValueError:
                return None

        node = (q.get("node") or [None])[0]
        return cls(rank=num("rank"), step=num("step"), node=node or None)

    def query(self, **changes: Any) -> str:
        """The query string of this selection with `changes` applied ('' when empty)."""
        d = {"rank": self.rank, "step": self.step, "node": self.node}
        d.update(changes)
        items = {k: v for k, v in d.items() if v is not None}
        return "?" + urlencode(items) if items else ""

    def href(self, path: str, **changes: Any) -> str:
        return path + self.query(**changes)


def page(page_id: str, *children: Any) -> html.Div:
    """A page's body: its children in one `page` block that the tests and the browser find by
    its id."""
    return html.Div(list(children), className="page", id=page_id)


# --- the only callbacks a page has: a control or a click changes the URL -------------------------

Href = Callable[[Any, Selection], "str | None"]


def on_change(app: Any, component: str, prop: str, to: Href) -> None:
    """When `component.prop` changes, go to `to(value, selection)` (None: stay). The
    selection is the URL's, so that every view stays a plain link."""
    @app.callback(Output("url", "href", allow_duplicate=True), Input(component, prop),
                  State("url", "search"), prevent_initial_call=True)
    def _go(value: Any, search: str | None) -> Any:
        href = None if value is None else to(value, Selection.parse(search))
        return no_update if href is None else href


def on_click(app: Any, graph: str, to: Href) -> None:
    """When a point of `graph` is clicked, go to `to(point, selection)` (None: stay)."""
    def first_point(click: dict[str, Any], sel: Selection) -> str | None:
        points = click.get("points") or []
        return to(points[0], sel) if points else None

    on_change(app, graph, "clickData", first_point)


def step_cell(point: dict[str, Any], sel: Selection) -> str | None:
    """A rank x step heatmap cell (the step in its customdata) opens that step on /steps."""
    step = point.get("customdata")
    if step is None or int(step) < 0:
        return None
    return sel.href("/steps", rank=int(point["y"]), step=int(step))


def nav(active: str, sel: Selection, run_label: str, compare: bool = False) -> html.Nav:
    """The top bar: run name and one link per page, each carrying the selection."""
    links = [dcc.Link(title, href=sel.href(path), id=f"nav-{title.lower()}",
                      className="nav-link active" if path == active else "nav-link")
             for path, title in (*PAGES, *((COMPARE_PAGE,) if compare else ()))]
    chips = []
    if sel.rank is not None:
        chips.append(html.Span(f"rank {sel.rank}", className="chip", id="sel-rank"))
    if sel.step is not None:
        chips.append(html.Span(f"step {sel.step}", className="chip", id="sel-step"))
    return html.Nav([html.Span("uberprof", className="brand"),
                     html.Span(run_label, className="run-label", id="run-label"),
                     html.Div(links, className="nav-links"), html.Div(chips, className="chips")],
                    className="nav")


def card(title: str, value: Any, sub: Any = None, status: str = "neutral",
         id: str | None = None, hint: str | None = None) -> html.Div:
    """A headline number with a line of context; status colours its edge (ok/warn/bad); `hint`
    shows on hover (the test behind a verdict)."""
    kids = [html.Div(title, className="card-title"), html.Div(value, className="card-value")]
    if sub:
        kids.append(html.Div(sub, className="card-sub"))
    kw: dict[str, Any] = {"id": id} if id else {}
    if hint:
        kw["title"] = hint
    return html.Div(kids, className=f"card {status}", **kw)


def notice(text: Any, kind: str = "info", id: str | None = None) -> html.Div:
    kw = {"id": id} if id else {}
    return html.Div(text, className=f"notice {kind}", **kw)


def without_traces(page_id: str, body: list[Any], why: str, id: str | None = None) -> html.Div:
    """Page `page_id` of a run without traces: `body` (what the run lacks), then why this page
    needs them."""
    return page(page_id, *body, notice(why, "info", id=id))


def missing_notices(missing: list[str]) -> html.Div:
    """What the run lacks, said once at the top of a page."""
    return html.Div([notice(m, "warn") for m in missing], id="missing", className="missing")


def section(title: str, *children: Any, id: str | None = None, sub: str | None = None
            ) -> html.Section:
    head = [html.H2(title)]
    if sub:
        head.append(html.P(sub, className="section-sub"))
    kw = {"id": id} if id else {}
    return html.Section([*head, *children], className="section", **kw)


def graph(id: str, fig: go.Figure, height: int | None = None) -> dcc.Graph:
    kw = {"style": {"height": f"{height}px"}} if height else {}
    return dcc.Graph(id=id, figure=fig, config=GRAPH_CONFIG, **kw)


def new_figure() -> go.Figure:
    """A figure that skips plotly's per-value validation: a 64 x 300 heatmap costs 10 ms
    instead of half a second. Traces go in through `fig.add_<type>(...)`."""
    return go.Figure(_validate=False)


_TEMPLATE: Any = None


def base_layout(fig: go.Figure, height: int = 360, **kw: Any) -> go.Figure:
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = pio.templates["plotly_white"]  # the object: names resolve only when validated
    fig.update_layout(template=_TEMPLATE, height=height,
                      margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      font={"family": "Inter, system-ui, sans-serif", "size": 12},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0,
                              "traceorder": "normal"}, **kw)
    return fig


def empty_figure(message: str, height: int = 220) -> go.Figure:
    fig = new_figure()
    fig.add_annotation(text=message, showarrow=False, font={"size": 14, "color": "#666"},
                       xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return base_layout(fig, height=height)


def rank_label(rank: int, straggler: int | None) -> str:
    """Tick label of a rank; the straggler's is red and says so."""
    if rank == straggler:
        return f"<span style='color:{STRAGGLER}'><b>rank {rank} ◀ straggler</b></span>"
    return f"rank {rank}"


MAX_RANK_TICKS = 16  # labelled ranks per axis: every rank's label costs the browser a measure


def rank_ticks(ranks: list[int], straggler: int | None, positional: bool = False
               ) -> dict[str, list[Any]]:
    """`tickvals`/`ticktext` for a rank axis: at most MAX_RANK_TICKS labels, the straggler's
    always among them. `positional`: the axis is the index into `ranks`, not the rank."""
    idx = list(range(0, len(ranks), max(1, -(-len(ranks) // MAX_RANK_TICKS))))
    if straggler in ranks and ranks.index(straggler) not in idx:
        idx = sorted(idx + [ranks.index(straggler)])
    return {"tickvals": idx if positional else [ranks[i] for i in idx],
            "ticktext": [rank_label(ranks[i], straggler) for i in idx]}


def table(header: list[str], rows: list[list[Any]], id: str | None = None,
          row_classes: list[str] | None = None) -> html.Table:
    """A plain HTML table (cheap to render, easy to test)."""
    kw = {"id": id} if id else {}
    body = [html.Tr([html.Td(c) for c in row],
                    className=(row_classes[i] if row_classes else None) or None)
            for i, row in enumerate(rows)]
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in header])), html.Tbody(body)],
                      className="table", **kw)
