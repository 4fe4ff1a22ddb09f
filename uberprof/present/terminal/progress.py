"""The progress bar shown on stderr while traces are read (analyze, report, export, dashboard)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

__all__ = ["ReadProgress"]


class ReadProgress:
    """A context manager yielding `update(done, total, label)`: a rich bar on a terminal, a
    no-op elsewhere (pipes, CI logs)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> Callable[[int, int, str], None]:
        if not self.console.is_terminal:
            return lambda done, total, label: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        # No refresh thread: the workers are forked, and forking a process with threads that
        # may hold locks is asking for deadlocks. The bar is redrawn on every update instead.
        self.bar = Progress(TextColumn("reading traces"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("[dim]{task.description}"),
                            console=self.console, transient=True, auto_refresh=False)

        def update(done: int, total: int, label: str) -> None:
            if total == 0:
                return
            if self.task is None:
                self.bar.start()
                self.task = self.bar.add_task("", total=total)
            self.bar.update(self.task, completed=done, description=label[-60:], refresh=True)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.stop()
