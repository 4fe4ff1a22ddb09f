"""Options several verbs share (analyze, report, export): one definition of each, with the
wording each verb needs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

__all__ = ["derived_option", "gap_threshold_option", "workers_option"]

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
    return click.option("--gap-threshold-us", type=click.FloatRange(min=0), default=50.0,
                        show_default=True, help=f"Shortest device idle gap {verb}.")
