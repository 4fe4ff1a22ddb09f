"""`uberprof calibrate` on a terminal: the peak bus bandwidth each group of links reached."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from uberprof.units import fmt_bytes

__all__ = ["render_calibration"]


def render_calibration(doc: dict[str, Any], console: Console) -> None:
    """Print a calibration document (RUN/calibration.json) as one row per measured group."""
    table = Table(show_edge=False, header_style="bold", title="all-reduce sweep (busbw)")
    table.add_column("group")
    table.add_column("link")
    table.add_column("ranks", justify="right")
    table.add_column("peak Gbit/s", justify="right")
    table.add_column("at size", justify="right")
    table.add_column("half peak from", justify="right")
    for g in doc.get("groups") or []:
        pts = g.get("points") or []
        peak = g.get("peak_busbw_Bps")
        at = max(pts, key=lambda p: p["busbw_Bps"])["bytes"] if pts else None
        table.add_row(
            g.get("scope", "?") + (f" {g['hosts'][0]}" if g.get("scope") == "host" else ""),
            g.get("link", "?"), str(len(g.get("ranks") or [])),
            f"{peak * 8 / 1e9:.2f}" if peak else "-", _size(at),
            _size(g.get("half_peak_bytes")))
    console.print(table)


def _size(b: int | None) -> str:
    return fmt_bytes(b or None, missing="-", spec="g")
