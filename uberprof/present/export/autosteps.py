"""The steps an export writes when it was given no `--steps` and the events it never drops
(steps, collectives, synchronisations, uberprof's marks) alone exceed the size budget.

Today's alternative was a file over the budget that a viewer may not open. Instead: the
contiguous run of traced steps around the slowest one that fits (stepfit.py chooses it from the
measuring pass's per-step tally), selected and planned exactly as `--steps A-B` would be, with
the cut decided from the same tally (no second pass over the traces). What the export writes
besides the traces' events (uberprof's marks, the GPU and node counters, the GPU memory per
step, the tracks' names) is weighed by writing it once to a scratch file over the window's
frame, so the window fits the file as written; if it does not, the step farthest from the
slowest goes and the window is weighed again. A note says what was chosen and why.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.present.export.budget import Budget, Cut
from uberprof.present.export.findings import RANK_TRACKS
from uberprof.present.export.layout import IdSpace, ProcessInfo
from uberprof.present.export.options import ExportOptions
from uberprof.present.export.overlay import (
    NodeCounterReader,
    marks_tracks,
    write_findings_process,
    write_node_counters,
    write_rank_overlay,
)
from uberprof.present.export.plan import (
    PERFETTO_PER_JSON_BYTE,
    Plan,
    Sized,
    marks_bytes,
    plan_layout,
)
from uberprof.present.export.stepfit import StepWeights, StepWindow, grow_window
from uberprof.present.export.tracks import RankState
from uberprof.present.export.window import Selection, select_window

if TYPE_CHECKING:
    from uberprof.analysis.read import RunContext  # OpenedRun.ctx

__all__ = ["plan_window", "weigh_overlay"]


def plan_window(ctx: RunContext, d: Diagnosis, opts: ExportOptions, sel: Selection, plan: Plan,
                sized: Sized, memory: Any, notes: list[str]
                ) -> tuple[ExportOptions, Selection, Plan, Cut]:
    """The options, selection, plan and cut of the steps that fit (see the module doc); the
    note that says so is added to `notes`. `sel`, `plan`: the whole run's; `memory`: the step
    timelines the GPU memory counters come from."""
    w = sized.tally
    assert w is not None and opts.max_bytes
    limit = int(opts.max_bytes * 0.98)  # as plan_cut keeps 2% back
    per = PERFETTO_PER_JSON_BYTE if opts.fmt == "perfetto" else 1.0
    per_step, other = _marks_per_step(plan, w.steps)
    # the rest of the overlay (counters, memory, names), shared out over the steps by count
    rest = max(weigh_overlay(ctx, d, sel, plan, memory) - int(per_step.sum()) - other, 0)
    per_step = per_step + int(rest / len(w.steps))
    win = grow_window(w, per_step * per, int((other + w.meta_bytes) * per), limit)
    while True:
        o = replace(opts, steps=(w.steps[win.i], w.steps[win.j]))
        said: list[str] = []
        wsel = select_window(ctx, d, o, said)
        wplan = plan_layout(ctx, d, wsel, o, said)
        budget = Budget.from_categories(limit, w.weights(win.i, win.j))
        budget.add_fixed(int((weigh_overlay(ctx, d, wsel, wplan, memory) + w.meta_bytes
                              + _summary_bytes(d, wsel, notes + said)) * per))
        cut = budget.decide()
        cut.limit_bytes = opts.max_bytes
        if not cut.over_bytes or win.i == win.j:
            break
        # the estimate per step fell short: the step farthest from the slowest goes
        if win.j - win.anchor >= win.anchor - win.i:
            win.j -= 1
        else:
            win.i += 1
    notes.extend(n for n in said if n not in notes)
    never = budget.other_bytes + budget.fixed_bytes
    notes.append(_window_note(w, win, sized.kept_bytes, opts.max_bytes,
                              never if cut.over_bytes else 0))
    return o, wsel, wplan, cut


def weigh_overlay(ctx: RunContext, d: Diagnosis, sel: Selection, plan: Plan,
                  memory: Any) -> int:
    """The JSON bytes of what the export writes besides the traces' events, for `sel` and
    `plan`: each rank's process, marks, GPU counters and GPU memory, the findings' process and
    the nodes' counters, written as the export writes them to a scratch file (the plan's ids
    and marks are copied: writing numbers tracks and lanes)."""
    from uberprof.present.export.chrome import ChromeWriter

    plan = replace(plan, ids=IdSpace(max_pid=plan.ids.max_pid),
                   marks={r: [replace(m, args=dict(m.args)) for m in ms]
                          for r, ms in plan.marks.items()},
                   global_marks=[replace(m, args=dict(m.args)) for m in plan.global_marks])
    with tempfile.TemporaryDirectory(prefix="uberprof-weigh-") as tmp:
        writer = ChromeWriter(Path(tmp) / "overlay.json", False, {})
        try:
            counters = NodeCounterReader(Path(ctx.root), d, plan, sel.frame, sel.base)
            for r in sel.ranks:
                st = RankState(r, r, f"rank {r}")
                writer.process(ProcessInfo(st.pid, st.name, plan.order[("rank", r)],
                                           f"rank {r}"))
                marks_tracks(writer, plan.ids, st, plan.marks.get(r, []), RANK_TRACKS)
                write_rank_overlay(writer, plan, sel, st, counters, memory)
            write_findings_process(writer, plan, sel.base)
            write_node_counters(writer, plan, counters, sel.ranks, sel.base)
            return writer.bytes_written
        finally:
            writer.abort()


def _summary_bytes(d: Diagnosis, sel: Selection, notes: list[str]) -> int:
    """About what the file's own record (merge's summary) weighs: its fixed part, the clock
    alignment and counts per rank, the findings' titles, the notes (this one's included)."""
    return 1500 + 30 * len(sel.ranks) + 550 * len(d.alignment.hosts) \
        + sum(len(f.title) + 4 for f in d.findings) + sum(len(n) + 4 for n in notes) + 500


def _window_note(w: StepWeights, win: StepWindow, kept_all: int, limit: int,
                 over: int) -> str:
    """`N of M traced steps written (steps a-b ...)`: what the export chose, and why; `over`:
    what the one step's events never dropped come to when even they exceed the budget."""
    n, m = win.j - win.i + 1, len(w.steps)
    a, b, k = w.steps[win.i], w.steps[win.j], w.steps[win.anchor]
    which = f"step {a}, the slowest" if n == 1 else \
        f"steps {a}-{b}, around step {k}, the slowest"
    head = (f"{n} of {m} traced steps written ({which}): all {m} would need about "
            f"{_mb(kept_all)} MB against the {_mb(limit)} MB budget (the events never "
            "dropped: steps, collectives, synchronisations, uberprof's marks)")
    if over:
        return head + (f"; even step {k} alone comes to about {_mb(over)} MB, over the "
                       "budget: --ranks for fewer ranks, --steps or --max-mb to choose")
    return head + "; --steps or --max-mb to choose"


def _mb(nbytes: int) -> str:
    mb = nbytes / 1e6
    return f"{mb:,.0f}" if mb >= 100 else f"{mb:.3g}"


def _marks_per_step(plan: Plan, steps: list[int]) -> tuple[np.ndarray, int]:
    """What uberprof's marks weigh per candidate step (each kind's mean size, rank marks and
    run-wide ones, times their number), and what those of no candidate step weigh: every
    window keeps them."""
    index = {s: k for k, s in enumerate(steps)}
    per_step = np.zeros(len(steps), dtype=np.float64)
    other = 0.0
    for marks in ([m for ms in plan.marks.values() for m in ms], plan.global_marks):
        if not marks:
            continue
        mean = marks_bytes(marks) / len(marks)
        for mk in marks:
            k = index.get(mk.step) if mk.step is not None else None
            if k is None:
                other += mean
            else:
                per_step[k] += mean
    return np.rint(per_step).astype(np.int64), int(other)
