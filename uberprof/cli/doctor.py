"""`uberprof doctor`: what this machine lets uberprof collect."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from uberprof.collect.capabilities import check_all, counter_backends


@click.command(short_help="Check what uberprof can collect on this machine.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path),
              default=Path("uberprof-runs"), envvar="UBERPROF_OUT", show_default=True,
              help="The output folder `uberprof run` would use.")
def doctor(out: Path) -> None:
    """Check torch, CUDA, NCCL/Gloo, NVML/GPM, DCGM, NICs, InfiniBand and write access, and say
    what will be collected."""
    console = Console()
    checks = check_all(out)
    for c in checks:
        mark = {True: "[green]ok[/green]  ", False: "[red]FAIL[/red]", None: "[dim]--[/dim]  "}[c.ok]
        console.print(f"{mark} [bold]{c.name:<18}[/bold] {c.detail}")
    console.print()
    counters = counter_backends(checks)
    console.print("[bold]uberprof run will collect:[/bold] step timelines and torch.profiler "
                  "trace windows of every rank; counters: "
                  + ("; ".join(counters) if counters else "none (psutil missing)"))
    if any(c.ok is False for c in checks):
        raise SystemExit(1)
