"""The report's memory section: per rank, the GPU's peak allocated bytes against the device,
what it holds between steps and how that changed from the first step to the last, and the
host process's resident set size, as the diagnosis saved them (`run.memory`, docs/json.md).
Nothing when the run has none; the ranks with the highest and lowest GPU peaks when there are
many."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from uberprof.units import fmt_bytes

__all__ = ["MAX_MEMORY_ROWS", "memory_rows", "render_memory"]

MAX_MEMORY_ROWS = 8  # more ranks: the highest GPU (else host) peaks, then the lowest two
PrintTable = Callable[[Console, Table], None]


def memory_rows(ranks: list[dict[str, Any]], limit: int = MAX_MEMORY_ROWS
                ) -> list[dict[str, Any]]:
    """The rows to print, in rank order: all of them, or the `limit - 2` highest peaks and
    the two lowest."""
    if len(ranks) <= limit:
        return ranks
    key = "gpu_peak_bytes" if any(r.get("gpu_peak_bytes") for r in ranks) else "rss_peak_bytes"
    order = sorted(ranks, key=lambda r: -(r.get(key) or 0))
    keep = order[:limit - 2] + order[-2:]
    return sorted(keep, key=lambda r: r["rank"])


def _b(v: Any) -> str:
    return fmt_bytes(v, missing="-")


def _step(s: Any) -> str:
    return "-" if s is None else str(s)


def _growth(r: dict[str, Any]) -> str:
    g = r.get("gpu_growth_bytes")
    if g is None:
        return "-"
    sign = "+" if g > 0 else "-" if g < 0 else "±"
    return f"{sign}{_b(abs(g))} ({r.get('gpu_first_step')}→{r.get('gpu_last_step')})"


def _peak(r: dict[str, Any]) -> str:
    pct = r.get("gpu_peak_pct")
    return _b(r.get("gpu_peak_bytes")) + (f" ({pct:.0f}%)" if pct is not None else "")


def render_memory(run: dict[str, Any], console: Console, print_table: PrintTable) -> None:
    """Print the memory section when the run has one."""
    ranks = ((run["memory"] or {}).get("ranks")) or []
    if not ranks:
        return
    gpu = any(r.get("gpu_peak_bytes") is not None for r in ranks)
    host = any(r.get("rss_peak_bytes") is not None for r in ranks)
    table = Table(show_edge=False, header_style="bold", pad_edge=False, title="memory",
                  title_justify="left")
    cols = ["rank", *(["GPU peak", "at step", "in use", "growth"] if gpu else []),
            *(["RSS peak", "at step", "RSS median"] if host else [])]
    for c in cols:
        table.add_column(c, justify="right", no_wrap=True)
    for r in memory_rows(ranks):
        g = [_peak(r), _step(r.get("gpu_peak_step")), _b(r.get("gpu_in_use_median_bytes")),
             _growth(r)] if gpu else []
        h = [_b(r.get("rss_peak_bytes")), _step(r.get("rss_peak_step")),
             _b(r.get("rss_median_bytes"))] if host else []
        table.add_row(str(r["rank"]), *g, *h)
    print_table(console, table)
    notes = []
    if gpu:
        notes.append("GPU peak: allocated bytes, % of the device; in use: median between "
                     "steps; growth: in use at the last step against the first")
    if host:
        notes.append("RSS: the rank process's resident memory (counters)")
    console.print(f"[dim]{'; '.join(notes)}[/dim]")
    if len(ranks) > MAX_MEMORY_ROWS:
        console.print(f"[dim]{len(ranks) - MAX_MEMORY_ROWS} more ranks (the highest and lowest "
                      "peaks shown): see --json or --html[/dim]")
    console.print()
