"""`uberprof doctor` on a terminal: one line per check, then what `uberprof run` will collect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rich.console import Console

__all__ = ["CheckResult", "render_checks"]


class CheckResult(Protocol):
    """What is shown of a check (collect.capabilities.Check; the presenters never import the
    collect side)."""

    @property
    def name(self) -> str: ...
    @property
    def ok(self) -> bool | None: ...  # None: optional and absent
    @property
    def detail(self) -> str: ...

_MARK = {True: "[green]ok[/green]  ", False: "[red]FAIL[/red]", None: "[dim]--[/dim]  "}


def render_checks(checks: Sequence[CheckResult], counters: Sequence[str], console: Console) -> None:
    """Print each check with its verdict, and the counter sources a run would sample."""
    for c in checks:
        console.print(f"{_MARK[c.ok]} [bold]{c.name:<18}[/bold] {c.detail}")
    console.print()
    console.print("[bold]uberprof run will collect:[/bold] step timelines and torch.profiler "
                  "trace windows of every rank; counters: "
                  + ("; ".join(counters) if counters else "none (psutil missing)"))
