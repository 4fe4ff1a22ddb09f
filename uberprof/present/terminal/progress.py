"""The progress bar shown on stderr while traces are read and ranks combined or written (analyze,
report, export, dashboard): one bar, its stage named in front (`analysis.progress.Progress`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from uberprof.analysis.progress import READING_TRACES

__all__ = ["ReadProgress"]


class ReadProgress:
    """A context manager yielding `update(done, total, label, stage)` (a `model.Progress`): a
    rich bar on a terminal, its count started again at each new stage; a no-op elsewhere
    (pipes, CI logs)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Any = None
        self.task: Any = None
        self.stage: str | None = None

    def __enter__(self) -> Callable[[int, int, str], None]:
        if not self.console.is_terminal:
            return lambda done, total, label, stage=READING_TRACES: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        # No refresh thread: the workers are forked, and forking a process with threads that
        # may hold locks is asking for deadlocks. The bar is redrawn on every update instead.
        self.bar = Progress(TextColumn("{task.fields[stage]}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("[dim]{task.description}"),
                            console=self.console, transient=True, auto_refresh=False)

        def update(done: int, total: int, label: str, stage: str = READING_TRACES) -> None:
            if total == 0:
                return
            if self.task is None:
                self.bar.start()
            if stage != self.stage:  # a new count: its own bar, in place of the last
                if self.task is not None:
                    self.bar.remove_task(self.task)
                self.task = self.bar.add_task("", total=total, stage=stage)
                self.stage = stage
            self.bar.update(self.task, completed=done, total=total, description=label[-60:],
                            refresh=True)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.stop()
