"""`uberprof scaling` in the terminal: the runs side by side (throughput and efficiency), then
where each run's step time went beyond the smallest run's, part by part. It prints the
`uberprof scaling --json` document as it is; nothing is computed here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from uberprof.units import fmt_num, shorten

__all__ = ["render_scaling"]


def _signed(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:+.{digits}f}"


def _name(r: dict[str, Any]) -> str:
    return shorten(r["run_id"] or r["path"], 28)


def render_scaling(doc: dict[str, Any], console: Console) -> None:
    """Print the scaling document (docs/scaling.md)."""
    runs = doc["runs"]
    unit = doc["throughput_unit"]
    console.print(f"[bold]Scaling[/bold] of {len(runs)} runs against the smallest, "
                  f"{escape(_name(runs[0]))} (world size {runs[0]['world_size']})")
    t = Table(show_edge=False, pad_edge=False)
    for col in ("run", "world", "nodes", "ranks", "batch", "step ms", "per rank", "total",
                "eff.", "lost ms"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for r in runs:
        eff = r["efficiency"]
        style = "green" if eff >= 0.9 else "yellow" if eff >= 0.7 else "red"
        t.add_row(escape(_name(r)), str(r["world_size"]), str(r["nodes"]), str(r["ranks"]),
                  str(r["batch_per_rank"]) if r["batch_per_rank"] is not None else "?",
                  fmt_num(r["step_ms"], 1), fmt_num(r["throughput_per_rank"], 2),
                  fmt_num(r["throughput_total"], 2),
                  f"[{style}]{eff * 100:.0f}%[/{style}]", fmt_num(r["lost_ms_per_step"], 1))
    console.print(t)
    basis = doc["basis"]
    console.print(f"[dim]batch: per rank and step; per rank, total: throughput in {unit}; "
                  "lost ms: step time beyond the one that keeps the smallest run's throughput "
                  "per rank[/dim]", soft_wrap=True)
    console.print(f"[dim]throughput: {escape(basis['throughput'])}; efficiency: "
                  f"{escape(basis['efficiency'])}; step time: {escape(basis['step_time'])}"
                  "[/dim]", soft_wrap=True)
    if len(runs) > 1 and doc["parts"]:
        console.print()
        console.print("[bold]Where the step time went[/bold] (ms per step, change against "
                      f"{escape(_name(runs[0]))})")
        b = Table(show_edge=False, pad_edge=False)
        b.add_column("part")
        b.add_column(escape(_name(runs[0])), justify="right")
        for r in runs[1:]:
            b.add_column(f"{escape(_name(r))} Δ", justify="right")
        for p in doc["parts"]:
            k = p["key"]
            if not any(abs(r["parts_ms"][k]) >= 0.05 for r in runs):
                continue
            b.add_row(escape(p["label"]), fmt_num(runs[0]["parts_ms"][k], 1),
                      *(_signed(r["delta_parts_ms"][k]) for r in runs[1:]))
        b.add_row("[bold]step time[/bold]", fmt_num(runs[0]["step_ms"], 1),
                  *(f"[bold]{_signed(r['delta_step_ms'])}[/bold]" for r in runs[1:]))
        console.print(b)
        console.print(f"[dim]parts: {escape(basis['breakdown'])}[/dim]", soft_wrap=True)
    for d in doc["differences"]:
        console.print(f"[yellow]differs:[/yellow] {escape(d)}", soft_wrap=True)
    for n in doc["notes"]:
        console.print(f"[dim]note: {escape(n)}[/dim]", soft_wrap=True)
    for r in runs:
        for n in r["notes"]:
            console.print(f"[dim]note: {escape(_name(r))}: {escape(n)}[/dim]", soft_wrap=True)
