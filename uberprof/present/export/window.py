"""The selection stage: which ranks, which of their trace files, and which span of time the
export covers, all read from the opened run's tables and the diagnosis's clock alignment.

Each rank is exported over a window on its own clock: the selected steps' host and device
windows (`--steps`), else its traces' first to last event. Shifted onto the aligned clock,
the windows give the export's frame (`lo`, `hi`) and its time base: a whole millisecond before
anything written, so that every timestamp is small, positive and exact in a double.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.present.export.options import ExportError, ExportOptions
from uberprof.rundir import parse_trace_file_name

if TYPE_CHECKING:
    from uberprof.analysis.read import RunContext  # OpenedRun.ctx

__all__ = ["Selection", "select_window"]

Span = tuple[int, int]


@dataclass
class Selection:
    """The ranks to export (each with a readable trace and, under `--steps`, a traced step),
    their trace files, each rank's window (own clock) and clock offset, the export's frame on
    the aligned clock (None without any window) and its time base."""

    ranks: list[int]
    files: dict[int, list[str]]
    windows: dict[int, Span]
    offsets: dict[int, int]
    steps: tuple[int, int] | None
    lo: int | None
    hi: int | None
    base: int

    @property
    def frame(self) -> Span | None:
        return (self.lo, self.hi) if self.lo is not None and self.hi is not None else None

    def event_window(self, rank: int) -> Span | None:
        """The window a rank's events are cut to: its selected steps' (None: everything)."""
        return self.windows.get(rank) if self.steps else None

    def shift(self, rank: int) -> int:
        """Added to a rank's source ns: onto the aligned clock, relative to the time base."""
        return self.offsets.get(rank, 0) - self.base


def select_window(ctx: RunContext, d: Diagnosis, opts: ExportOptions,
                  notes: list[str]) -> Selection:
    """The selection of `opts` in this run; what is left out is told to `notes`. Raises
    `ExportError` when no rank is left."""
    offsets = d.alignment.offsets()
    ranks = _chosen_ranks(ctx.rank_ids, opts.ranks, notes)
    # the analysis' own trace files, under the run as named now (never the manifest's cwd)
    files = {r: [str(p) for p in ctx.run.trace_files(r)
                 if not opts.steps or _file_overlaps(p.name, opts.steps)] for r in ranks}
    windows = _step_windows(ctx, ranks, opts.steps)
    ranks = _with_traces(ranks, files, windows, opts.steps, notes)
    spans = _trace_spans(ctx, ranks)
    if not opts.steps:
        windows = {r: spans.get(r, windows.get(r)) for r in ranks
                   if spans.get(r, windows.get(r)) is not None}
    lo, hi, first = _frame(ranks, windows, spans, offsets)
    return Selection(ranks, files, windows, offsets, opts.steps, lo, hi, _base(first))


def _chosen_ranks(have: list[int], want: set[int] | None, notes: list[str]) -> list[int]:
    """The run's ranks that `--ranks` names (all without it); names it lacks are a note."""
    ranks = [r for r in have if want is None or r in want]
    if want is not None:
        missing = sorted(set(want) - set(have))
        if missing:
            notes.append(f"rank(s) {_list(missing)} not in this run (it has {_list(have)})")
    return ranks


def _with_traces(ranks: list[int], files: dict[int, list[str]], windows: dict[int, Span],
                 steps: tuple[int, int] | None, notes: list[str]) -> list[int]:
    """The ranks with a trace file (and a traced step when steps are selected): a rank
    without is left out with a note, and none left is an `ExportError` saying why."""
    for r in ranks:
        if not files[r] or (steps and r not in windows):
            notes.append(f"rank {r}: no traced step" +
                         (f" in {steps[0]}-{steps[1]}" if steps else "") + "; left out")
    kept = [r for r in ranks if files[r] and (not steps or r in windows)]
    if not kept:
        raise ExportError("nothing to export: " + ("; ".join(notes) or "no trace window"))
    return kept


def _step_windows(ctx: RunContext, ranks: list[int],
                  steps: tuple[int, int] | None) -> dict[int, Span]:
    """Per rank, the time span (own clock) to export: the whole trace, or the selected steps'
    host and device windows."""
    out: dict[int, Span] = {}
    if steps is None:
        for r in ranks:
            w = ctx.ranks[r].window
            if w is not None:
                out[r] = w
        return out
    for row in ctx.steps().to_pylist():
        r, s = row["rank"], row["step"]
        if r not in ranks or not row.get("traced") or not (steps[0] <= s <= steps[1]):
            continue
        vals = [v for v in (row.get("host_start_ns"), row.get("device_start_ns")) if v is not None]
        ends = [v for v in (row.get("host_end_ns"), row.get("device_end_ns")) if v is not None]
        if not vals or not ends:
            continue
        a, b = min(vals), max(ends)
        if r in out:
            a, b = min(a, out[r][0]), max(b, out[r][1])
        out[r] = (a, b)
    return out


def _trace_spans(ctx: RunContext, ranks: list[int]) -> dict[int, Span]:
    """Per rank, its traces' first event start and last event end (own clock), from the
    analysis' per-input summaries."""
    out: dict[int, Span] = {}
    for r, s in ctx.run.input_summaries():
        a, b = s.get("first_ns"), s.get("last_ns")
        if r in ranks and isinstance(a, int) and isinstance(b, int):
            out[r] = (min(a, out[r][0]), max(b, out[r][1])) if r in out else (a, b)
    return out


def _frame(ranks: list[int], windows: dict[int, Span], spans: dict[int, Span],
           offsets: dict[int, int]) -> tuple[int | None, int | None, int | None]:
    """The export's frame on the aligned clock (`lo`, `hi`: the windows' union), and the
    first moment written: before every event, even those that start before the selected
    steps and reach into them."""
    aligned = [(windows[r][0] + offsets.get(r, 0), windows[r][1] + offsets.get(r, 0))
               for r in ranks if r in windows]
    lo = min((a for a, _ in aligned), default=None)
    hi = max((b for _, b in aligned), default=None)
    first = min([spans[r][0] + offsets.get(r, 0) for r in ranks if r in spans]
                + ([lo] if lo is not None else []), default=None)
    return lo, hi, first


def _base(first: int | None) -> int:
    """The output's time base: a whole millisecond at least one before anything in it, so
    every timestamp is small, positive and exact in a double (and viewers open on the data)."""
    if first is None:
        return 0
    return (first // 1_000_000 - 1) * 1_000_000


def _file_overlaps(name: str, steps: tuple[int, int]) -> bool:
    span = parse_trace_file_name(name)
    return span is None or (span[0] <= steps[1] and steps[0] <= span[1])


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:12])) + (f" (+{len(xs) - 12})" if len(xs) > 12 else "")
