"""`uberprof info`: what a run directory holds, and what is missing from it."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson
from rich.console import Console

from uberprof.inventory import NotARunDirectory, inventory
from uberprof.present.terminal.info import render_info


@click.command(short_help="Show what a run directory holds, and what is missing.")
@click.argument("runs", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (docs/info.md).")
@click.option("--no-verify", is_flag=True, help="Skip reading trace archives to the end.")
def info(runs: tuple[Path, ...], as_json: bool, no_verify: bool) -> None:
    """Summarise RUNS: ranks, steps, trace windows, counters and problems.

    Give one run directory, or several local directories of one multi-node job to read them as
    one run. Exits with 1 when the folder is not a run directory.
    """
    try:
        inv = inventory(list(runs), check_traces=not no_verify)
    except NotARunDirectory as exc:
        click.echo(f"uberprof info: {exc}", err=True)
        sys.exit(1)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(inv, option=orjson.OPT_INDENT_2) + b"\n")
        return
    render_info(inv, Console())

