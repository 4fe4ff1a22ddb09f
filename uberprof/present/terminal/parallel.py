"""The report's sections for jobs that are not only data-parallel: the pipeline's stages,
communication per process group, and point-to-point transfers. They print what the diagnosis
saved (`run.pipeline`, `run.comm_by_group`, `run.p2p`: docs/json.md) and nothing when a run has
none of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from uberprof.units import fmt_bytes, fmt_num

__all__ = ["render_parallel"]

PrintTable = Callable[[Console, Table], None]


def render_parallel(run: dict[str, Any], console: Console, print_table: PrintTable) -> None:
    """Print the pipeline, group and point-to-point sections the run has."""
    _pipeline(run["pipeline"], console, print_table)
    _groups(run["comm_by_group"], console, print_table)
    _p2p(run["p2p"] or {}, console, print_table)


def _num(v: Any, digits: int = 1) -> str:
    return fmt_num(v, digits, missing="-")


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...]) -> Table:
    table = Table(show_edge=False, header_style="bold", pad_edge=False, title=title,
                  title_justify="left")
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right", no_wrap=True)
    return table


def _pipeline(p: dict[str, Any] | None, console: Console, print_table: PrintTable) -> None:
    if not p or not p.get("per_stage"):
        return
    schedule = p.get("schedule_words") or "schedule ?"
    ideal = p.get("ideal_bubble_pct")
    title = (f"pipeline: {p['stages']} stages, {schedule}, {p.get('microbatches') or '?'} "
             f"micro-batches" + (f" (ideal bubble {ideal}%)" if ideal is not None else ""))
    table = _table(title, ("stage", "ranks", "compute ms", "step ms", "waits prev ms",
                           "waits next ms", "bubble %", "slowest in"), ("ranks",))
    for s in p["per_stage"]:
        table.add_row(str(s["stage"]), ",".join(map(str, s["ranks"])), _num(s["compute_ms"]),
                      _num(s["step_ms"]), _num(s["wait_prev_ms"]), _num(s["wait_next_ms"]),
                      _num(s["bubble_pct"]), f"{s['slowest_in_steps']}/{p['steps']}")
    print_table(console, table)
    console.print("[dim]per analysed step (median); waits: in recv for the previous stage's "
                  "activations (prev) or the next stage's gradients (next)[/dim]")
    console.print()


def _groups(groups: list[dict[str, Any]], console: Console, print_table: PrintTable) -> None:
    if len(groups) < 2 and not any(g.get("dim") not in (None, "world") for g in groups):
        return  # one world group: the rank table's exposed communication says it all
    table = _table("communication by process group", ("group", "dim", "ranks", "collectives",
                                                      "time ms", "exposed ms", "exposed %"),
                   ("group", "dim", "ranks", "collectives"))
    for g in groups[:12]:
        table.add_row(str(g["group"]), g.get("dim") or "-", ",".join(map(str, g["ranks"])),
                      ", ".join(f"{k} x{v}" for k, v in g["collectives"].items()),
                      _num(g["time_ms"]), _num(g["exposed_ms"]), _num(g["exposed_pct_of_wall"]))
    print_table(console, table)
    console.print("[dim]per rank of the group (mean), over the analysed steps; exposed %: of the "
                  "analysed wall time[/dim]")
    console.print()


def _p2p(p: dict[str, Any], console: Console, print_table: PrintTable) -> None:
    if not p.get("pairs") and not p.get("unmatched_calls"):
        return
    table = _table(f"point-to-point: {p['pairs']} send/recv pair(s) matched, "
                   f"{p['unmatched_calls']} unmatched",
                   ("from", "to", "transfers", "size", "recv waiting ms", "transfer ms",
                    "Gbit/s"), ())
    for d in p.get("by_direction") or []:
        table.add_row(str(d["src"]), str(d["dst"]), str(d["transfers"]),
                      fmt_bytes(d.get("bytes"), missing="-"), _num(d["wait_ms"]),
                      _num(d["transfer_ms"]), _num(d.get("effective_gbit_s"), 2))
    print_table(console, table)
    console.print("[dim]waiting: the receiver posted before the sender did; transfer: from the "
                  "later post to the receive's end (latency included)[/dim]")
    console.print()
