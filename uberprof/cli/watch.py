"""`uberprof watch`: follow a running job from the terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from uberprof.cli.params import FiniteRange
from uberprof.rundir import RunDir


@click.command(short_help="Follow a running job in the terminal.")
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--interval", type=FiniteRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print the current state once and exit.")
def watch(run: Path, interval: float, once: bool) -> None:
    """Show RUN while its job runs: per rank the last and median step time, data wait,
    lateness (from a saved diagnosis), GPU utilisation and SM clock, and the findings.

    Reads only what the job appended since the last refresh. Exits when the job ends, or on
    q / Ctrl-C; exit code 1 when RUN is not a run directory.
    """
    from uberprof.present.terminal.watch import watch as follow

    if not RunDir(run).is_run():
        click.echo(f"uberprof watch: {run} is not a uberprof run directory", err=True)
        sys.exit(1)
    follow(run, Console(), interval=interval, once=once)
