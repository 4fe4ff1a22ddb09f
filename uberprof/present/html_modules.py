"""The HTML report's "time per module" and "memory timeline" sections: the terminal's
(`terminal/modules.py`) with every row the document holds, from the saved `run.modules` and
`run.memory_timeline` (docs/json.md, docs/modules.md); each empty for a run that has none
(`uberprof run --modules`, `--profile-memory`)."""

from __future__ import annotations

import html
from typing import Any

from uberprof.units import fmt_bytes, fmt_num

__all__ = ["memory_timeline_html", "modules_html"]


def _num(v: Any, digits: int = 2) -> str:
    return fmt_num(v, digits, missing="-")


def _bytes(v: Any) -> str:
    return fmt_bytes(v, missing="-")


def _table(table_id: str, head: list[str], rows: list[list[str]]) -> str:
    """The first column left-aligned (names), the rest as numbers."""
    e = html.escape
    th = f"<th class='l'>{e(head[0])}</th>" + "".join(f"<th>{e(h)}</th>" for h in head[1:])
    body = "".join(f"<tr><td class='l'>{e(r[0])}</td>"
                   + "".join(f"<td>{e(c)}</td>" for c in r[1:]) + "</tr>" for r in rows)
    return f"<table id='{table_id}'><tr>{th}</tr>{body}</table>"


def modules_html(run: dict[str, Any]) -> str:
    """An <h2> section with every module the document holds, largest total first."""
    doc = run["modules"] or {}
    rows = doc.get("modules") or []
    if not rows:
        return ""
    total = doc.get("modules_total") or len(rows)
    shown = f" (top {len(rows)} of {total})" if total > len(rows) else ""
    head = ["module", "calls", "total ms", "total % of step", "self ms", "self % of step",
            "mean µs", "ranks", "ms/step min", "median", "max", "rank of max"]
    body = []
    for r in rows:
        s = r.get("total_ms_per_step") or {}
        body.append([r["module"], str(r["calls"]), _num(r["total_ms"]), _num(r["total_pct"]),
                     _num(r["self_ms"]), _num(r["self_pct"]), _num(r.get("mean_us")),
                     str(r.get("ranks")), _num(s.get("min")), _num(s.get("median")),
                     _num(s.get("max")), str(s.get("max_rank", "-"))])
    note = (f"Over {doc.get('rank_steps')} analysed rank-steps of {doc.get('ranks')} rank(s), "
            f"{_num(doc.get('step_time_ms'))} ms of step time; spans from "
            f"{', '.join(doc.get('sources') or [])}; {doc.get('basis') or ''}.")
    return (f"<h2>Time per module (forward){html.escape(shown)}</h2>"
            f"<div class='dim'>{html.escape(note)}</div>"
            + _table("modules-table", head, body))


def memory_timeline_html(run: dict[str, Any]) -> str:
    """An <h2> section with each rank's (and device's) peak in the trace window: how much,
    when (step, time into it) and the operator running then."""
    doc = run["memory_timeline"] or {}
    rows = doc.get("ranks") or []
    if not rows:
        return ""
    head = ["rank", "device", "peak allocated", "peak at step", "ms into the step",
            "operator then", "allocated at the start", "at the end", "max reserved", "events",
            "steps"]
    body = [[str(r["rank"]), str(r["device"]), _bytes(r.get("peak_allocated_bytes")),
             _num(r.get("peak_step"), 0), _num(r.get("peak_in_step_ms")),
             str(r.get("peak_operator") or "-"), _bytes(r.get("first_allocated_bytes")),
             _bytes(r.get("last_allocated_bytes")), _bytes(r.get("max_reserved_bytes")),
             str(r.get("events")), "-".join(map(str, r.get("steps") or []))] for r in rows]
    note = "; ".join(p for p in (doc.get("basis"), doc.get("categories_note")) if p)
    return ("<h2>Memory timeline (trace window)</h2>"
            f"<div class='dim'>{html.escape(note)}.</div>"
            + _table("memory-timeline-table", head, body))
