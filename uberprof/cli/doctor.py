"""`uberprof doctor`: what this machine lets uberprof collect."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from uberprof.collect.capabilities import check_all, counter_backends
from uberprof.present.terminal.doctor import render_checks


@click.command(short_help="Check what uberprof can collect on this machine.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path),
              default=Path("uberprof-runs"), envvar="UBERPROF_OUT", show_default=True,
              help="The output folder `uberprof run` would use.")
def doctor(out: Path) -> None:
    """Check torch, CUDA, NCCL/Gloo, NVML/GPM, DCGM, NICs, InfiniBand and write access, and say
    what will be collected."""
    checks = check_all(out)
    render_checks(checks, counter_backends(checks), Console())
    if any(c.ok is False for c in checks):
        raise SystemExit(1)
