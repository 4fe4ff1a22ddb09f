"""How long work tells a progress bar: the one protocol the analysis calls and the views
implement (the terminal's bar, the dashboard's preparing page). A leaf module: the tables'
stages and the diagnosis both report through it."""

from __future__ import annotations

from typing import Protocol

__all__ = ["READING_TRACES", "Progress"]

READING_TRACES = "reading traces"  # the stage a Progress is in unless told another


class Progress(Protocol):
    """`done` of `total` in `stage` ("reading traces", "reading step timelines", "combining
    ranks", "writing ranks"), `label` the item just done. A new stage starts its own count."""

    def __call__(self, done: int, total: int, label: str, stage: str = ..., /) -> None: ...
