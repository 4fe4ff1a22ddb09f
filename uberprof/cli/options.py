"""Options several verbs share (analyze, report, export): one definition of each, with the
wording each verb needs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

from uberprof.cli.params import FiniteRange

__all__ = ["dask_executor_or_exit", "dask_option", "derived_option", "gap_threshold_option",
           "workers_option"]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def workers_option(help: str = "Processes for reading traces (default: one per CPU).") -> Decorator:
    """`--workers N`: processes for reading traces; None lets the pipeline choose."""
    return click.option("--workers", type=click.IntRange(min=1), default=None, help=help)


def derived_option(name: str, help: str) -> Decorator:
    """`--out` / `--derived DIR`: the folder of the analysis tables (default PATH/derived)."""
    return click.option(name, type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=help)


def gap_threshold_option(verb: str) -> Decorator:
    """`--gap-threshold-us`: the shortest device idle gap the verb reports or marks."""
    return click.option("--gap-threshold-us", type=FiniteRange(min=0), default=50.0,
                        show_default=True, help=f"Shortest device idle gap {verb}.")


def dask_option(work: str) -> Decorator:
    """`--dask ADDRESS`: run the per-rank `work` on a Dask cluster."""
    return click.option(
        "--dask", "dask_address", metavar="ADDRESS", default=None,
        help=f"{work} on a Dask cluster (scheduler address, or 'local' for one on this machine "
             "with --workers processes); needs uberprof[dask] and a file system shared with "
             "the workers (docs/analyze.md).")


def dask_executor_or_exit(stack: ExitStack, address: str | None, workers: int | None,
                          verb: str) -> Any:
    """The Dask executor for --dask (None without it), closed with `stack`; a clear message
    and exit code 2 when Dask is missing or the cluster cannot be reached."""
    if address is None:
        return None
    from rich.console import Console

    from uberprof.analysis.tables.distributed import DaskUnavailable, dask_executor

    try:
        return stack.enter_context(dask_executor(address, workers=workers))
    except DaskUnavailable as exc:
        Console(stderr=True).print(f"uberprof {verb}: {exc}", markup=False, highlight=False)
        sys.exit(2)
