"""How long work tells a progress bar: the one protocol the analysis calls and the views
implement (the terminal's bar, the dashboard's preparing page). A leaf module: the tables'
stages and the diagnosis both report through it."""

from __future__ import annotations

from typing import Protocol

__all__ = ["COMBINING_RANKS", "READING_TIMELINES", "READING_TRACES", "WRITING_RANKS",
           "Progress"]

# The stages, in the words the bar and the preparing page show.
READING_TRACES = "reading traces"  # the map's traces: the stage unless told another
READING_TIMELINES = "reading step timelines"  # the map's rank folders, after the traces
COMBINING_RANKS = "combining ranks"  # the reduce's ranks' parts
WRITING_RANKS = "writing ranks"  # export's ranks


class Progress(Protocol):
    """`done` of `total` in `stage` (the names above), `label` the item just done. A new stage
    starts its own count."""

    def __call__(self, done: int, total: int, label: str, stage: str = ..., /) -> None: ...
