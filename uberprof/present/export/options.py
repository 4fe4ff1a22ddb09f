"""What to export (`ExportOptions`), what came of it (`ExportResult`), and the one error an
export can end in for want of input (`ExportError`): the export's interface, apart from the
stages that do the work, so that each stage can name them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_MAX_MB", "ExportError", "ExportOptions", "ExportResult"]

DEFAULT_MAX_MB = 500  # uncompressed: what a viewer has to load


@dataclass
class ExportOptions:
    """What to export. `steps`: inclusive step range; `ranks`: None for all; `python`: keep
    Python function events (with_stack traces: large); `max_bytes`: budget on the uncompressed
    output (None: no limit); `fmt`: chrome or perfetto. The gap threshold of the marked idle
    gaps is the diagnosis's: give it to `open_run`."""

    steps: tuple[int, int] | None = None
    ranks: set[int] | None = None
    counters: bool = True
    python: bool = False
    max_bytes: int | None = DEFAULT_MAX_MB * 1_000_000
    fmt: str = "chrome"
    gzip: bool = True


@dataclass
class ExportResult:
    """What was written, and what was left out and why."""

    path: Path
    fmt: str
    ranks: list[int]
    events: int  # trace events written (metadata and counters included)
    bytes_uncompressed: int
    bytes_file: int
    seconds: float
    dropped: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class ExportError(Exception):
    """Nothing could be exported (no traces, no rank selected, no usable trace)."""
