"""`uberprof analyze` on a terminal: one row per rank, then where the tables went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from uberprof.units import fmt_num

__all__ = ["MAX_ROWS", "render_analysis", "render_problems"]

MAX_ROWS = 64


def _cell(v: float | None) -> str:
    """A table cell: ms and % alike, one decimal."""
    return fmt_num(v, 1, missing="-")


def render_analysis(ranks: list[dict[str, Any]], problems: list[str], derived: Path,
                    analysed: int, inputs: int, console: Console, err: Console) -> None:
    """Print the per-rank summary rows (at most MAX_ROWS) and the trace counts on `console`,
    and the problems on `err` (stderr)."""
    # Two-line headers and no column rules: fits 80 columns.
    table = Table(show_edge=False, header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("rank", "device", "steps", "step\nms", "p90\nms", "idle\n%", "comp\n%",
                "non-\ncomp %", "over-\nlap %", "exp.\ncomm %"):
        table.add_column(col, justify="left" if col == "device" else "right")
    shown = ranks if len(ranks) <= MAX_ROWS else ranks[:MAX_ROWS]
    for r in shown:
        device = {"device": r["device_type"], "cpu": "cpu"}.get(r["mode"], "no trace")
        table.add_row(str(r["rank"]), device, str(r["steps"]), _cell(r["step_time_median_ms"]),
                      _cell(r["step_time_p90_ms"]), _cell(r["idle_pct"]), _cell(r["compute_pct"]),
                      _cell(r["non_compute_pct"]), _cell(r["overlap_pct"]),
                      _cell(r["exposed_comm_pct"]))
    if ranks:
        console.print(table)
    if len(ranks) > MAX_ROWS:
        console.print(f"[dim]... {len(ranks) - MAX_ROWS} more ranks: see --json or "
                      f"{_ranks_table_file(derived)}[/dim]")
    reused = inputs - analysed
    console.print(f"[dim]{inputs} trace(s), {analysed} read now"
                  + (f", {reused} unchanged since the last analysis" if reused else "")
                  + f"; tables in {derived}[/dim]", highlight=False)
    render_problems(problems, not ranks, err)


def render_problems(problems: list[str], nothing: bool, err: Console) -> None:
    """The analysis's problems, one line each naming its file, on stderr."""
    if nothing:
        err.print("uberprof analyze: no rank could be analysed", highlight=False)
    for p in problems:
        err.print(f"uberprof analyze: {p}", markup=False, highlight=False, soft_wrap=True)


def _ranks_table_file(derived: Path) -> Path:
    """The per-rank table's file, named by the analysis. Imported here, not at the top: the
    read side pulls in the whole diagnosis (0.45 s), and every command's module is loaded to
    build the CLI."""
    from uberprof.analysis.read import ranks_table_file

    return ranks_table_file(derived)
