"""`uberprof diff --html`: the comparison as one self-contained HTML file (plotly's JavaScript
inlined once), to share without a server: verdict, step-time distributions, where the time
moved, operators, communication, counters, metadata and findings."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from uberprof.analysis.diff import Comparison

__all__ = ["render_diff_html", "write_diff_html"]

TOP_OPS = 25

_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1200px;padding:0 16px;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:26px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.88em} td,th{padding:3px 8px;border-bottom:1px solid
#eee;text-align:right} td.l,th.l{text-align:left} .dim{color:#666}
.verdict{font-size:1.1em;font-weight:bold;padding:6px 10px;display:inline-block}
.slower{background:#fde8e8;color:#a11} .faster{background:#e6f6ea;color:#16632e}
.same{background:#eef2f7}
"""


def write_diff_html(c: Comparison, path: Path) -> None:
    path.write_text(render_diff_html(c), encoding="utf-8")


def _num(v: Any, digits: int = 2, signed: bool = False) -> str:
    if v is None:
        return "–"
    if isinstance(v, (int, float)):
        return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    return html.escape(str(v))


def _table(head: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Cells are already escaped; the first `left` columns are left-aligned."""
    th = "".join(f"<th class='{'l' if i < left else ''}'>{html.escape(h)}</th>"
                 for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f"<td class='{'l' if i < left else ''}'>{v}</td>"
                                    for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def render_diff_html(c: Comparison) -> str:
    """The comparison as one HTML document."""
    doc = c.to_json()
    e = html.escape
    st = doc["step_time_ms"]
    name = f"{doc['a']['run_id'] or doc['a']['path']} vs {doc['b']['run_id'] or doc['b']['path']}"
    figs = [f for f in (_step_fig(c), _breakdown_fig(doc)) if f is not None]
    plots = [f.to_html(full_html=False, include_plotlyjs=(i == 0),
                       config={"displaylogo": False}) for i, f in enumerate(figs)]
    css = {"slower": "slower", "faster": "faster"}.get(st["verdict"], "same")
    parts = [
        (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>uberprof diff {e(name)}"
         f"</title><style>{_STYLE}</style></head><body>"),
        f"<h1>uberprof diff: {e(name)}</h1>",
        f"<div class='dim'>A: {e(doc['a']['path'])}<br>B: {e(doc['b']['path'])}</div>",
        (f"<p><span class='verdict {css}'>{e(st['verdict'])}</span> "
         f"{e(st['test']['reason'])}</p>"),
        _table(["", "median ms", "p90 ms", "steps"],
               [[k.upper(), _num(st[k]["median"]), _num(st[k]["p90"]), str(st[k]["steps"])]
                for k in ("a", "b")]),
        (f"<p class='dim'>{e(st['test']['name'])}, {st['test']['resamples']} resamples, seed "
         f"{st['test']['seed']}; significant only beyond {st['test']['min_change_pct']:g}%.</p>"),
        *(f"<p class='dim'>note: {e(n)}</p>" for n in doc["notes"]),
        *plots,
        "<h2>Where the time moved (ms per step)</h2>",
        _table(["part", "A", "B", "delta", "share of the change %"],
               [[e(r["label"]), _num(r["a_ms"]), _num(r["b_ms"]), _num(r["delta_ms"],
                                                                        signed=True),
                 _num(r["share_pct"], 1)] for r in doc["breakdown"]]),
        "<h2>Operators and kernels (self time, ms per step)</h2>",
        _ops_html(doc),
        "<h2>Communication per collective class (ms per rank and step)</h2>",
        _coll_html(doc),
        "<h2>Counters (mean over the compared steps)</h2>",
        _table(["source", "metric", "unit", "A", "B", "ratio"],
               [[e(r["source"]), e(r["metric"]), e(r["unit"] or ""), f"{r['a']:.4g}",
                 f"{r['b']:.4g}", _num(r["ratio"], 3)] for r in doc["counters"]], left=3)
        if doc["counters"] else "<p>No counters in both runs.</p>",
        "<h2>Run metadata that differs</h2>",
        _table(["key", "A", "B"], [[e(r["key"]), e(str(r["a"])), e(str(r["b"]))]
                                   for r in doc["metadata_changes"]], left=3)
        if doc["metadata_changes"] else "<p>Nothing differs.</p>",
        "<h2>Findings (time at stake, ms per step)</h2>",
        _findings_html(doc),
        "</body></html>",
    ]
    return "\n".join(parts)


def _ops_html(doc: dict[str, Any]) -> str:
    e = html.escape
    ops = doc["ops"]
    rows = [r for r in ops if r["delta_ms"] > 0][:TOP_OPS] + \
        [r for r in ops if r["delta_ms"] < 0][:TOP_OPS]
    return _table(["kind", "name", "calls A", "calls B", "A ms", "B ms", "delta", "share %",
                   "only in"],
                  [[e(r["kind"]), e(r["name"]), _num(r["a_calls"], 1), _num(r["b_calls"], 1),
                    _num(r["a_ms"], 3), _num(r["b_ms"], 3), _num(r["delta_ms"], 3, True),
                    _num(r["share_pct"], 1), e((r["only_in"] or "").upper())] for r in rows],
                  left=2)


def _coll_html(doc: dict[str, Any]) -> str:
    if not doc["collectives"]:
        return "<p>No collectives in either run.</p>"
    e = html.escape
    keys = ("calls", "time_ms", "busbw_gbit_s", "wait_ms", "transfer_ms", "exposed_ms")
    rows = []
    for r in doc["collectives"]:
        cells = [e(r["group"]), e(r["collective"]), _num(r["bytes"], 0)]
        for k in keys:
            cells.append(" / ".join(_num(s.get(k)) if s else "–" for s in (r["a"], r["b"])))
        rows.append(cells)
    return _table(["group", "collective", "bytes", "calls A/B", "time A/B", "busbw Gbit/s A/B",
                   "wait A/B", "transfer A/B", "exposed A/B"], rows, left=2)


def _findings_html(doc: dict[str, Any]) -> str:
    e = html.escape
    rows = [[what, e(r["kind"]), e(r["title"]), _num(r["a_ms"]), _num(r["b_ms"])]
            for what in ("new", "gone", "changed") for r in doc["findings"][what]]
    return _table(["", "kind", "finding", "A", "B"], rows, left=3) if rows else \
        "<p>No findings in either run.</p>"


def _step_fig(c: Comparison) -> Any:
    import plotly.graph_objects as go

    if not c.a.step_ns and not c.b.step_ns:
        return None
    fig = go.Figure()
    for label, prof in (("A", c.a), ("B", c.b)):
        fig.add_trace(go.Box(y=[v / 1e6 for v in prof.step_ns], name=label, boxpoints="all",
                             jitter=0.3))
    fig.update_layout(title="Step time per step (slowest rank), ms", height=360,
                      margin={"t": 40, "b": 30})
    return fig


def _breakdown_fig(doc: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    rows = [r for r in doc["breakdown"] if (r["a_ms"] or 0) or (r["b_ms"] or 0)]
    if not rows:
        return None
    fig = go.Figure()
    for side in ("a", "b"):
        fig.add_trace(go.Bar(x=[r["label"] for r in rows], y=[r[f"{side}_ms"] for r in rows],
                             name=side.upper()))
    fig.update_layout(title="Per-step breakdown, ms", barmode="group", height=380,
                      margin={"t": 40, "b": 30})
    return fig
