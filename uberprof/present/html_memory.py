"""The HTML report's memory section: the terminal's (`terminal/memory.py`) as a table of every
rank, from the saved `run.memory` (docs/json.md); empty for a run that has none."""

from __future__ import annotations

import html
from typing import Any

from uberprof.units import fmt_bytes

__all__ = ["memory_html"]

_COLUMNS = (  # (header, key, kind)
    ("rank", "rank", "int"), ("host", "host", "str"),
    ("device", "device_total_bytes", "bytes"), ("GPU peak", "gpu_peak_bytes", "bytes"),
    ("% of device", "gpu_peak_pct", "pct"), ("peak at step", "gpu_peak_step", "int"),
    ("in use (median)", "gpu_in_use_median_bytes", "bytes"),
    ("in use, first step", "gpu_in_use_first_bytes", "bytes"),
    ("in use, last step", "gpu_in_use_last_bytes", "bytes"),
    ("growth", "gpu_growth_bytes", "signed"), ("RSS peak", "rss_peak_bytes", "bytes"),
    ("RSS peak at step", "rss_peak_step", "int"), ("RSS median", "rss_median_bytes", "bytes"),
    ("host memory", "host_mem_total_bytes", "bytes"),
)


def _cell(v: Any, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "bytes":
        return fmt_bytes(v)
    if kind == "signed":
        return ("+" if v > 0 else "-" if v < 0 else "±") + fmt_bytes(abs(v))
    if kind == "pct":
        return f"{v:.1f}%"
    return str(v)


def memory_html(run: dict[str, Any]) -> str:
    """An <h2> and a table of every rank's memory, or "" when the run has none."""
    mem = run["memory"] or {}
    ranks = mem.get("ranks") or []
    if not ranks:
        return ""
    cols = [c for c in _COLUMNS if any(r.get(c[1]) is not None for r in ranks)]
    e = html.escape
    th = "".join(f"<th>{e(h)}</th>" for h, _, _ in cols)
    body = "".join("<tr>" + "".join(f"<td>{e(_cell(r.get(k), kind))}</td>"
                                    for _, k, kind in cols) + "</tr>" for r in ranks)
    first, last = ranks[0].get("gpu_first_step"), ranks[0].get("gpu_last_step")
    sub = (f"{mem.get('basis') or ''}. Growth: in use at the last step ({last}) against the "
           f"first ({first}); a steady job holds the same at every step.")
    return (f"<h2>Memory</h2><div class='dim'>{e(sub)}</div>"
            f"<table id='memory-table'><tr>{th}</tr>{body}</table>")
