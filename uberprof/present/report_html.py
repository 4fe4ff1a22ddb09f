"""The HTML report: one self-contained file (plotly's JavaScript inlined once) to share without
a server: the run, the rank table, the findings, the top operators and kernels, and plots of
step time, breakdown, lateness, idle gaps by cause and collective bandwidth against the link's
peak."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from uberprof.analysis.diagnosis.causes import GAP_CAUSES
from uberprof.analysis.diagnosis.model import Diagnosis, Finding
from uberprof.present.html_memory import memory_html
from uberprof.present.html_modules import memory_timeline_html, modules_html
from uberprof.present.html_operators import operators_html
from uberprof.present.html_parallel import parallel_html
from uberprof.present.report_terminal import parallelism_line, scope_text, warmup_line
from uberprof.present.terminal.rank_comm import waits_text
from uberprof.present.terminal.timeline import timeline_lines
from uberprof.units import fmt_num

__all__ = ["render_html", "write_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1200px;
color:#222;padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px} h2{font-size:1.2em;margin-top:28px;border-bottom:1px solid
#ddd;padding-bottom:4px} .dim{color:#666} table{border-collapse:collapse;font-size:.9em}
td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
td.l,th.l{text-align:left} tr.strag{background:#fde8e8}
.finding{border-left:5px solid #999;padding:6px 12px;margin:10px 0;background:#fafafa}
.high{border-color:#c0392b} .medium{border-color:#e6a118} .low{border-color:#2e86c1}
.sev{font-weight:bold;text-transform:uppercase;font-size:.8em} .remedy{color:#1e6b34}
pre{white-space:pre-wrap;font-size:.8em;background:#f4f4f4;padding:6px}
.timeline{color:#8a5a00;margin:2px 0} .timeline.lead{font-weight:bold}
"""


def write_html(d: Diagnosis, path: Path) -> None:
    path.write_text(render_html(d), encoding="utf-8")


def render_html(d: Diagnosis) -> str:
    """The report as one HTML document (plotly.js inlined in the first plot)."""
    figs = [f for f in (_step_time_fig(d), _breakdown_fig(d), _lateness_fig(d), _gaps_fig(d),
                        _bandwidth_fig(d)) if f is not None]
    plots = []
    for i, fig in enumerate(figs):
        plots.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0),
                                 config={"displaylogo": False}))
    r = d.run
    e = html.escape
    name = e(str(r["run_id"] or r["path"]))
    head = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>uberprof report {name}"
            f"</title><style>{_CSS}</style></head><body>")
    parts = [head,
             f"<h1>uberprof report: {e(str(r['run_id'] or r['path']))}</h1>",
             f"<div class='dim'>{e(_summary_line(d))}</div>",
             _parallelism_html(r), _timeline_html(r),
             "<h2>Findings</h2>", _findings_html(d), "<h2>Ranks</h2>", _ranks_html(d),
             _rank_comm_html(d),
             parallel_html(r), operators_html(r), memory_html(r),
             modules_html(r), memory_timeline_html(r),
             "<h2>Plots</h2>", *plots, "<h2>Run</h2>",
             f"<pre>{e(_run_text(d))}</pre>", "</body></html>"]
    return "\n".join(parts)


def _summary_line(d: Diagnosis) -> str:
    r = d.run
    steps = r["analysed_steps"]
    span = f"steps {steps[0]}-{steps[-1]}" if steps and steps != [-1] else "whole trace"
    c = r["collectives"]
    return (f"{scope_text(r)}; analysed {span} "
            f"({r['analysed_wall_ms']} ms wall); median step {r['step_time_ms']} ms "
            f"(traced steps; {_inflation(r)}); "
            f"{c.get('matched_instances', 0)} matched collectives, "
            f"{c.get('unmatched_calls', 0)} unmatched; uberprof {r['uberprof_version']}"
            + (f"; {warmup_line(r)}" if warmup_line(r) else ""))


def _parallelism_html(r: dict[str, Any]) -> str:
    """The parallelism line, with what each kind was read from on hover."""
    line = parallelism_line(r)
    if not line:
        return ""
    ev = (r["parallelism"] or {}).get("evidence") or {}
    basis = "; ".join(f"{k}: {v}" for k, v in ev.items()) or "no marker in the traces"
    return (f"<div class='parallelism' title='{html.escape(basis, quote=True)}'>"
            f"{html.escape(line)}</div>")


def _timeline_html(r: dict[str, Any]) -> str:
    """The story in time, as the terminal prints it (`timeline_lines`): the lead change bold."""
    lines = timeline_lines(r)
    return "".join(f"<div class='timeline{' lead' if lead else ''}'>{html.escape(line)}</div>"
                   for line, lead in lines)


def _inflation(r: dict[str, Any]) -> str:
    st = r["step_time"] or {}
    infl, iv = st.get("profiler_inflation"), st.get("profiler_inflation_interval")
    text = (f"profiler inflation {infl}x" + (f", 95% interval {iv[0]}-{iv[1]}x" if iv else "")
            if infl else "profiler inflation unknown (no untraced steps)")
    if st.get("uberprof_cost_ms"):
        text += f"; uberprof's own cost {st['uberprof_cost_ms']} ms after trace windows"
    return text


def _findings_html(d: Diagnosis) -> str:
    if not d.ranks and not d.findings:  # a hang or crash is reported without traces
        return ("<p><b>Nothing could be analysed</b>: no rank has a usable trace or step "
                "timeline (see the problems).</p>")
    if not d.findings:
        return "<p>No findings: nothing holds this run back beyond the thresholds.</p>"
    e = html.escape
    out = []
    for f in d.findings:
        ranks = ", ".join(map(str, f.ranks[:16])) + (" ..." if len(f.ranks) > 16 else "")
        out.append(
            f"<div class='finding {e(f.severity)}'><span class='sev'>{e(f.severity)}</span> "
            f"<b>{e(f.kind)}</b>{' (' + e(f.cause) + ')' if f.cause else ''} "
            f"{' <i>' + e(f.confidence) + '</i>' if f.confidence != 'confirmed' else ''} "
            f"&middot; {e(f.stake_words())}"
            f"{' &middot; ranks ' + e(ranks) if ranks else ''}<br>{e(f.title)}"
            f"{_evidence_html(f)}"
            f"{_test_html(f)}"
            f"{_gain_html(f)}"
            f"<div class='remedy'>&rarr; {e(f.remedy)}</div>"
            f"<details><summary class='dim'>evidence</summary><pre>{e(_pretty(f.evidence))}"
            f"</pre></details></div>")
    both = d.run["fix_top_two"]
    if isinstance(both, dict) and both.get("sentence"):
        out.append(f"<p class='together'><b>Together</b>: {e(both['sentence'])}</p>")
    replay = d.run["replay"]
    for caveat in (replay.get("caveats") or []) if isinstance(replay, dict) else []:
        out.append(f"<p class='caution'><b>Caution</b> (projected gains): {e(caveat)}</p>")
    return "\n".join(out)


def _evidence_html(f: Finding) -> str:
    """Its evidence sentence and supporting lines (stacks), as its kind made and saved them."""
    e = html.escape
    out = (f"<div class='evidence'><span class='dim'>evidence:</span> "
           f"{e(f.evidence_sentence)}</div>" if f.evidence_sentence else "")
    if f.details:
        out += f"<pre class='details'>{e(chr(10).join(f.details))}</pre>"
    return out


def _gain_html(f: Finding) -> str:
    """What fixing the finding gains in the replay (diagnosis/gains.py), as saved."""
    g = f.projected_gain
    if not g:
        return ""
    lo, hi = g.get("interval_ms") or (None, None)
    span = f"{lo:.1f}-{hi:.1f}" if lo is not None and hi is not None else "?"
    return (f"<div class='gain'><b>{html.escape(str(g.get('sentence')))}</b> "
            f"<span class='dim'>(projected {span} ms)</span></div>")


def _test_html(f: Finding) -> str:
    """The finding's test in words, and the time other findings account for."""
    e = html.escape
    out = ""
    test = (f.evidence.get("test") or {}).get("sentence")
    if test:
        out += f"<div class='dim'>test: {e(test)}</div>"
    around = (f.evidence.get("around") or {}).get("sentence")
    if around:
        out += f"<div class='dim around'>around it: {e(around)}</div>"
    if f.caused_by:
        links = "; ".join(f"{c.get('ms')} ms is {c.get('part') or c.get('kind')} (finding "
                          f"{(c['index'] + 1) if c.get('index') is not None else '?'})"
                          for c in f.caused_by)
        out += f"<div class='dim'>accounted elsewhere: {e(links)}</div>"
    return out


def _ranks_html(d: Diagnosis) -> str:
    e = html.escape
    strag = d.straggler.rank if d.straggler else None
    head = ("<tr><th>rank</th><th class='l'>host</th><th>step ms</th><th>p90</th>"
            "<th>compute %</th><th>exposed comm %</th><th>idle %</th><th>overlap %</th>"
            + "".join(f"<th>{c} idle ms</th>" for c in GAP_CAUSES)
            + "<th>lateness ms</th><th>last</th></tr>")
    rows = []
    for x in d.ranks:
        b, g, lt = x["breakdown_pct"], x["idle_gaps"]["ms_by_cause"], x["lateness_ms"]
        cells = [x["rank"], x["host"], x["step_time_ms"]["median"], x["step_time_ms"]["p90"],
                 b["compute"], b["exposed_comm"], b["idle"], b["overlap"],
                 *(g.get(c) for c in GAP_CAUSES), lt["median"],
                 f"{lt['last_in']}/{lt['instances']}" if lt["instances"] else None]
        tds = "".join(f"<td{' class=l' if i == 1 else ''}>{e(_fmt(v))}</td>"
                      for i, v in enumerate(cells))
        rows.append(f"<tr{' class=strag' if x['rank'] == strag else ''}>{tds}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _rank_comm_html(d: Diagnosis) -> str:
    """Each rank's exposed communication split into waiting (the largest waits: the peer that
    arrived last, the collective, the group) and transfer, and what no finding explains."""
    e = html.escape
    rows = sorted((x for x in d.ranks if (x.get("exposed_comm") or {}).get("exposed_ms")),
                  key=lambda x: -x["exposed_comm"]["exposed_ms"])
    if not rows:
        return ""
    head = ("<tr><th>rank</th><th>exposed ms</th><th>waiting ms</th><th>transfer ms</th>"
            "<th>unmatched ms</th><th class='l'>largest waits</th><th>unexplained exposed ms"
            "</th><th>unexplained idle ms</th></tr>")
    out = []
    for x in rows:
        c, acc = x["exposed_comm"], x.get("accounted") or {}
        waits = waits_text(c["top_waits"], ms=str)
        cells = [x["rank"], c["exposed_ms"], c["wait_ms"], c["transfer_ms"], c["unmatched_ms"],
                 waits, (acc.get("exposed_comm") or {}).get("unexplained_ms"),
                 (acc.get("idle") or {}).get("unexplained_ms")]
        out.append("<tr>" + "".join(f"<td{' class=l' if i == 5 else ''}>{e(_fmt(v))}</td>"
                                    for i, v in enumerate(cells)) + "</tr>")
    return ("<h3>Exposed communication per rank</h3><p class='dim'>waiting for the peer that "
            "arrived last and transfer (docs/analyze.md); unexplained: what no finding "
            f"accounts for</p><table>{head}{''.join(out)}</table>")


def _fmt(v: Any) -> str:
    if v is None or isinstance(v, float):
        return fmt_num(v, 2, missing="-")
    return str(v)


def _pretty(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2, default=str)


def _run_text(d: Diagnosis) -> str:
    r = {k: v for k, v in d.run.items() if k != "bandwidth"}
    return _pretty(r)


# --- plots --------------------------------------------------------------------------------------

def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _laid_out(fig: Any, title: str, x: str, y: str, height: int = 360, **layout: Any) -> Any:
    """`fig` with the report's common layout: its title, axis titles, height and margins."""
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=height,
                      margin={"t": 40, "b": 40}, **layout)
    return fig


def _step_time_fig(d: Diagnosis) -> Any:
    t = d.steps
    if t.num_rows == 0:
        return None
    go = _go()
    fig = go.Figure()
    ranks = np.array(t.column("rank").to_pylist())
    st = np.array([x if x is not None else np.nan for x in t.column("step_time_ns").to_pylist()],
                  dtype=np.float64) / 1e6
    for r in sorted(set(ranks.tolist())):
        fig.add_trace(go.Box(y=st[ranks == r], name=str(r), boxpoints="all", jitter=0.3,
                             showlegend=False))
    return _laid_out(fig, "Step time per rank (analysed steps)", "rank", "ms")


def _breakdown_fig(d: Diagnosis) -> Any:
    if not d.ranks:
        return None
    go = _go()
    ranks = [str(x["rank"]) for x in d.ranks]
    parts = [("compute", "compute_ms", "#4c78a8"), ("exposed comm", "exposed_comm_ms", "#e45756"),
             ("memory", "memory_ms", "#f58518"), ("idle", "idle_ms", "#bab0ac")]
    fig = go.Figure()
    for label, key, color in parts:
        fig.add_trace(go.Bar(x=ranks, y=[x["analysed"][key] or 0 for x in d.ranks], name=label,
                             marker_color=color))
    return _laid_out(fig, "Where the analysed steps' time goes, per rank", "rank", "ms",
                     barmode="stack")


def _lateness_fig(d: Diagnosis) -> Any:
    lat = d.lateness
    if lat.num_rows == 0:
        return None
    go = _go()
    iid = np.array(lat.column("instance").to_pylist())
    rank = np.array(lat.column("rank").to_pylist())
    val = np.array(lat.column("lateness_ns").to_pylist(), dtype=np.float64) / 1e6
    ranks = sorted(set(rank.tolist()))
    insts = sorted(set(iid.tolist()))
    if len(insts) > 2000:  # keep the file small
        insts = insts[:2000]
    pos = {v: i for i, v in enumerate(insts)}
    rpos = {v: i for i, v in enumerate(ranks)}
    z = np.full((len(ranks), len(insts)), np.nan)
    for i, r, v in zip(iid.tolist(), rank.tolist(), val.tolist()):
        if i in pos:
            z[rpos[r], pos[i]] = v
    fig = go.Figure(go.Heatmap(z=z, x=insts, y=[str(r) for r in ranks], colorscale="Reds",
                               colorbar={"title": "ms late"}))
    return _laid_out(fig, "Lateness at each collective (aligned clocks)",
                     "collective instance", "rank", height=max(260, 24 * len(ranks) + 120))


def _gaps_fig(d: Diagnosis) -> Any:
    if not d.ranks:
        return None
    go = _go()
    ranks = [str(x["rank"]) for x in d.ranks]
    fig = go.Figure()
    for c in GAP_CAUSES:
        ys = [x["idle_gaps"]["ms_by_cause"].get(c) or 0 for x in d.ranks]
        if any(ys):
            fig.add_trace(go.Bar(x=ranks, y=ys, name=c))
    if not fig.data:
        return None
    thr = d.run["gap_threshold_us"]
    return _laid_out(fig, f"Idle gaps over {thr} µs by cause", "rank", "ms", barmode="stack")


def _bandwidth_fig(d: Diagnosis) -> Any:
    bw = d.bandwidth
    if bw.num_rows == 0:
        return None
    go = _go()
    size = np.array([x or np.nan for x in bw.column("bytes").to_pylist()], dtype=np.float64)
    bus = np.array([x if x is not None else np.nan for x in bw.column("busbw_Bps").to_pylist()],
                   dtype=np.float64) * 8 / 1e9
    names = bw.column("name").to_pylist()
    links = bw.column("link").to_pylist()
    fig = go.Figure()
    for key in sorted(set(zip(names, links))):
        m = np.array([(n, lk) == key for n, lk in zip(names, links)])
        fig.add_trace(go.Scatter(x=size[m], y=bus[m], mode="markers",
                                 name=f"{key[0]} ({key[1]})"))
    peaks = {}
    for lk, p in zip(links, bw.column("peak_Bps").to_pylist()):
        if p:
            peaks[lk] = p * 8 / 1e9
    for lk, p in peaks.items():
        fig.add_hline(y=p, line_dash="dash", annotation_text=f"{lk} peak {p:.2f} Gbit/s")
    return _laid_out(fig, "Bus bandwidth of each collective", "bytes", "busbw (Gbit/s)",
                     height=380, xaxis_type="log")
