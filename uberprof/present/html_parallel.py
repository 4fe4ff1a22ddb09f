"""The HTML report's sections for pipeline stages, communication per process group and
point-to-point transfers: the same saved values as the terminal's (`terminal/parallel.py`),
as tables; empty for a run that has none."""

from __future__ import annotations

import html
from typing import Any

from uberprof.units import fmt_bytes, fmt_num

__all__ = ["parallel_html"]


def parallel_html(run: dict[str, Any]) -> str:
    """The sections the run has, each an <h2> and a table."""
    return "\n".join(s for s in (_pipeline(run["pipeline"]),
                                 _groups(run["comm_by_group"]),
                                 _p2p(run["p2p"] or {})) if s)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    e = html.escape
    th = "".join(f"<th>{e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{e(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _cell(v: Any) -> str:
    if v is None or isinstance(v, float):
        return fmt_num(v, 1, missing="-")
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


def _pipeline(p: dict[str, Any] | None) -> str:
    if not p or not p.get("per_stage"):
        return ""
    schedule = p.get("schedule_words") or "unknown"
    ideal = p.get("ideal_bubble_pct")
    sub = (f"{p['stages']} stages, schedule {schedule}, {p.get('microbatches') or '?'} "
           f"micro-batches; ideal bubble {ideal if ideal is not None else '?'}%")
    rows = [[s["stage"], s["ranks"], s["compute_ms"], s["step_ms"], s["wait_prev_ms"],
             s["wait_next_ms"], s["bubble_pct"], f"{s['slowest_in_steps']}/{p['steps']}"]
            for s in p["per_stage"]]
    return (f"<h2>Pipeline</h2><div class='dim'>{html.escape(sub)}</div>"
            + _table(["stage", "ranks", "compute ms", "step ms", "waits prev ms",
                      "waits next ms", "bubble %", "slowest in"], rows))


def _groups(groups: list[dict[str, Any]]) -> str:
    if not groups:
        return ""
    rows = [[g["group"], g.get("dim") or "-", g["ranks"],
             ", ".join(f"{k} x{v}" for k, v in g["collectives"].items()), g["time_ms"],
             g["exposed_ms"], g["exposed_pct_of_wall"]] for g in groups]
    return ("<h2>Communication by process group</h2>"
            + _table(["group", "dim", "ranks", "collectives", "time ms", "exposed ms",
                      "exposed % of wall"], rows))


def _p2p(p: dict[str, Any]) -> str:
    if not p.get("pairs") and not p.get("unmatched_calls"):
        return ""
    rows = [[d["src"], d["dst"], d["transfers"], fmt_bytes(d.get("bytes"), missing="-"),
             d["wait_ms"], d["transfer_ms"], d.get("effective_gbit_s")]
            for d in p.get("by_direction") or []]
    return (f"<h2>Point-to-point</h2><div class='dim'>{p['pairs']} send/recv pair(s) matched, "
            f"{p['unmatched_calls']} unmatched</div>"
            + _table(["from", "to", "transfers", "size", "recv waiting ms", "transfer ms",
                      "Gbit/s"], rows))
