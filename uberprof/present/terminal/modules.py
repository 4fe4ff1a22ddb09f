"""The report's "time per module" and "memory timeline" sections, printed from what the
diagnosis saved (`run.modules`, `run.memory_timeline`, docs/json.md) and nothing when a run
has neither (`uberprof run --modules`, `--profile-memory`). Short on purpose: `--json` has the
rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from uberprof.units import fmt_bytes, fmt_num, shorten

__all__ = ["TOP_ROWS", "render_memory_timeline", "render_modules"]

TOP_ROWS = 10
PrintTable = Callable[[Console, Table], None]


def render_modules(run: dict[str, Any], console: Console, print_table: PrintTable) -> None:
    """The top modules by total time, with self time and the spread across ranks per step."""
    doc = run["modules"] or {}
    rows = (doc.get("modules") or [])[:TOP_ROWS]
    if not rows:
        return
    total = doc.get("modules_total") or 0
    more = f" ({len(rows)} of {total}; the rest: --json)" if total > len(rows) else ""
    table = _table("time per module (forward)" + more,
                   ("module", "calls", "total ms", "step%", "self ms", "ms/step"))
    n_ranks = doc.get("ranks") or 0
    for r in rows:
        s = r.get("total_ms_per_step") or {}
        spread = (f"{_num(s.get('min'), 2)}-{_num(s.get('max'), 2)} r{s.get('max_rank')}"
                  if n_ranks > 1 else _num(s.get("max"), 2))
        table.add_row(shorten(r["module"], 48), str(r["calls"]), _num(r["total_ms"]),
                      _num(r["total_pct"]), _num(r["self_ms"]), spread)
    print_table(console, table)
    console.print(f"[dim]over {doc.get('rank_steps')} analysed rank-step(s) of {n_ranks} "
                  f"rank(s); self: less child modules; from {', '.join(doc.get('sources') or [])}"
                  " (docs/modules.md)[/dim]")
    console.print()


def render_memory_timeline(run: dict[str, Any], console: Console,
                           print_table: PrintTable) -> None:
    """Each rank's peak allocated memory in the trace window, and when it came."""
    doc = run["memory_timeline"] or {}
    rows = doc.get("ranks") or []
    if not rows:
        return
    table = _table("memory timeline (trace window)",
                   ("rank", "device", "peak", "step", "at ms", "operator then", "start", "end"))
    for r in rows[:16]:
        table.add_row(str(r["rank"]), r["device"], fmt_bytes(r["peak_allocated_bytes"]),
                      _num(r.get("peak_step"), 0), _num(r.get("peak_in_step_ms"), 1),
                      shorten(r.get("peak_operator") or "-", 32),
                      fmt_bytes(r.get("first_allocated_bytes")),
                      fmt_bytes(r.get("last_allocated_bytes")))
    print_table(console, table)
    more = f"; {len(rows) - 16} more: --json" if len(rows) > 16 else ""
    console.print(f"[dim]allocated bytes per torch.profiler's \\[memory] events; at ms: into "
                  f"the step; {escape(doc.get('categories_note') or '')}{more}[/dim]")
    console.print()


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(show_edge=False, header_style="bold", pad_edge=False, title=title,
                  title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i in (0, 1) else "right", no_wrap=True)
    return table


def _num(v: Any, digits: int = 1) -> str:
    return fmt_num(v, digits, missing="-")
