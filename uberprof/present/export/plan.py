"""The planning stage: everything decided before the first byte is written.

- the counter sources: which nodes have counters, and which rank owns which of their GPUs;
- the layout: the processes' order (findings, then each host's ranks followed by its node's
  counters), their pids, and the id space of tracks and flows;
- uberprof's marks: per rank and run-wide, from the diagnosis (findings.py);
- the size budget's cut: measured, only when the inputs could exceed the budget, by a first
  pass over the selected files (budget.py says what goes first);
- with no `--steps`, when the events never dropped alone exceed the budget: the steps that fit
  (autosteps.py, from the same pass's per-step tally: stepfit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.ingest.gz import json_size
from uberprof.present.export import counters as C
from uberprof.present.export.budget import Budget, Cut
from uberprof.present.export.events import keep_by_rule, output_ratios, read_scan
from uberprof.present.export.findings import Mark, global_marks, rank_marks
from uberprof.present.export.layout import IdSpace, sort_processes
from uberprof.present.export.options import ExportOptions
from uberprof.present.export.source import PH_X
from uberprof.present.export.stepfit import StepWeights, step_weights
from uberprof.present.export.window import Selection

if TYPE_CHECKING:
    from uberprof.analysis.read import RunContext  # OpenedRun.ctx

__all__ = ["PERFETTO_PER_JSON_BYTE", "Plan", "Sized", "dropped_bytes", "marks_bytes", "plan_cut",
           "plan_layout"]

# Protobuf bytes per JSON byte of the same events (measured on CPU Kineto traces: 32.1 MB against
# 60.7 MB); the budget of a perfetto export is applied through it.
PERFETTO_PER_JSON_BYTE = 0.55


@dataclass
class Plan:
    """The export's layout: counter nodes (name, host) and each rank's (node, GPU), the
    processes' sort order and pids, the id space, and uberprof's marks."""

    nodes: list[tuple[str, str | None]]
    gpu_of: dict[int, tuple[str, str]]
    order: dict[tuple[str, Any], int]
    findings_pid: int
    node_pid: dict[str, int]
    ids: IdSpace
    marks: dict[int, list[Mark]]
    global_marks: list[Mark]

    @property
    def fixed_bytes(self) -> int:
        """What uberprof's own marks weigh in the output: the budget's fixed part. The rank
        marks are measured on a sample (their args vary: a gap's cause and the ops around it
        came to ~640 bytes a mark on nccl_parser_config, where a flat 300 a mark let a 1.6 MB
        budget write 2.3 MB), and so are the run-wide ones (a flat 2000 bytes a mark made the
        20 per-step marks of a 20-step trace weigh 40 kB instead of 7)."""
        return marks_bytes([m for ms in self.marks.values() for m in ms]) \
            + marks_bytes(self.global_marks)


def marks_bytes(marks: list[Mark], sample: int = 2000) -> int:
    """The JSON bytes of `marks` as `overlay.write_marks` writes them, from an even sample."""
    if not marks:
        return 0
    import orjson

    pick = [marks[int(i)] for i in np.linspace(0, len(marks) - 1, min(sample, len(marks)))]
    size = 0
    for m in pick:
        e = {"name": m.name, "cat": "uberprof", "pid": 1000, "tid": 1000,
             "ts": m.ts % 10**11, "args": m.args, "ph": "X", "dur": m.dur or 0}
        size += len(orjson.dumps(e, default=str, option=orjson.OPT_SERIALIZE_NUMPY)) + 1
        size += 110 if m.flow is not None else 0  # its send -> recv arrow
    return size * len(marks) // len(pick)


def plan_layout(ctx: RunContext, d: Diagnosis, sel: Selection, opts: ExportOptions,
                notes: list[str]) -> Plan:
    """The layout of the selection: processes, pids and marks (see the module doc)."""
    nodes, gpu_of = _counter_sources(ctx, sel, opts, notes)
    host_of = {r: ctx.host_of(r) for r in sel.ranks}
    order = sort_processes(sel.ranks, host_of, nodes)
    findings_pid = max(sel.ranks) + 1
    node_pid = {n: findings_pid + 1 + i for i, (n, _) in enumerate(nodes)}
    frame = sel.frame
    return Plan(nodes=nodes, gpu_of=gpu_of, order=order, findings_pid=findings_pid,
                node_pid=node_pid, ids=IdSpace(max_pid=findings_pid + len(nodes)),
                marks=rank_marks(d, sel.ranks, opts.steps),
                global_marks=global_marks(d, frame, opts.steps, sel.ranks)
                if frame is not None else [])


def _counter_sources(ctx: RunContext, sel: Selection, opts: ExportOptions,
                     notes: list[str]) -> tuple[list[tuple[str, str | None]],
                                                dict[int, tuple[str, str]]]:
    """The nodes with counters (and each one's host, when its meta names it) and which rank
    owns which GPU: none without `counters`, outside a run directory, or without a window
    (a note says so: counters are read over the export's window)."""
    nodes: list[tuple[str, str | None]] = []
    gpu_of: dict[int, tuple[str, str]] = {}
    if not opts.counters or not ctx.is_run_dir:
        return nodes, gpu_of
    if sel.lo is None:
        notes.append("counters left out: the traces give no time window")
        return nodes, gpu_of
    run_root = Path(ctx.root)
    for n in C.counter_nodes_of(run_root):
        try:
            from uberprof.rundir.counters import counter_meta

            h = counter_meta(run_root, n).get("host")
        except Exception:  # noqa: BLE001 - unreadable meta: the node keeps its name only
            h = None
        nodes.append((n, h if isinstance(h, str) else None))
    return nodes, C.rank_gpu_labels(run_root)


@dataclass
class Sized:
    """The measuring pass's verdict: the cut, and when the events never dropped exceed the
    budget, what they come to (`kept_bytes`) and, with no `--steps` and steps traced on every
    rank, the per-step tally a fitting window is chosen from (stepfit.py)."""

    cut: Cut
    kept_bytes: int = 0
    tally: StepWeights | None = None


def plan_cut(sel: Selection, opts: ExportOptions, fixed_bytes: int, notes: list[str],
             steps: pa.Table | None = None) -> Sized:
    """What the size budget drops: nothing without a budget or when the inputs' JSON text
    cannot exceed it, else what a measuring pass over the selected files decides. `steps`
    (the run's step table), given when no steps were asked for, lets that pass tally the
    traced steps too, for autosteps.py."""
    if not opts.max_bytes:
        return Sized(Cut())
    bound = sum(json_size(p) for r in sel.ranks for p in sel.files[r])
    if bound <= opts.max_bytes * 0.9:
        return Sized(Cut())
    tally = step_weights(steps, sel.ranks) if steps is not None and not opts.steps else None
    # 2% kept back: the sizes are scaled from samples, and metadata and flow pairing are not
    # measured (nccl_parser_config at a fifth of its size: 0.4% over without it)
    budget = _measure(sel, opts, int(opts.max_bytes * 0.98), notes, tally)
    if budget is None:
        return Sized(Cut())
    budget.add_fixed(fixed_bytes)
    cut = budget.decide()
    cut.limit_bytes = opts.max_bytes
    if not cut.over_bytes:
        return Sized(cut)
    kept = max(cut.estimate_bytes - dropped_bytes(budget, cut), 1)
    if tally is not None:  # autosteps.py chooses steps that fit, and says so
        return Sized(cut, kept, tally)
    # what is never dropped does not fit: say how to make it fit
    notes.append(
        f"over the size budget: the events never dropped (steps, collectives, "
        f"synchronisations, uberprof's findings, counters) come to about {kept / 1e6:.3g} MB "
        f"against {opts.max_bytes / 1e6:.3g} MB; about {min(1.0, opts.max_bytes / kept):.0%} "
        f"of them fit: export fewer steps (--steps) or ranks (--ranks), or raise --max-mb")
    return Sized(cut, kept)


def dropped_bytes(budget: Budget, cut: Cut) -> int:
    """The bytes of the tiers `cut` drops whole."""
    return sum(int(budget.hist[t].sum()) for t in cut.full if t in budget.hist)


def _measure(sel: Selection, opts: ExportOptions, limit: int, notes: list[str],
             tally: StepWeights | None = None) -> Budget | None:
    """The budget's measuring pass: what each kind of event the rules keep weighs, file by
    file (one in memory at a time), in output bytes: each tier's source text scaled by the
    output's bytes per source byte of that tier, sampled on the first readable file (and by
    the protobuf's size per JSON byte for perfetto). `tally` counts the same weights per
    traced step."""
    budget: Budget | None = None
    for r in sel.ranks:
        for p in sel.files[r]:
            scan = read_scan(p, notes)
            if scan is None:
                continue
            keep, _ = keep_by_rule(scan, sel.event_window(r), opts.python)
            if budget is None:
                per = PERFETTO_PER_JSON_BYTE if opts.fmt == "perfetto" else 1.0
                budget = Budget(limit, ratios={t: x * per for t, x in
                                               output_ratios(scan, keep).items()})
            tier, size, bucket = budget.weigh(scan, keep)
            budget.add_weighed(tier, size, bucket)
            if tally is not None:
                ts = scan.ts_ns[keep]
                dur = np.where(scan.ph[keep] == PH_X, np.maximum(scan.dur_ns[keep], 0), 0)
                tally.add(r, ts, ts + dur, tier, size, bucket)
                tally.meta_bytes += 200 * len(scan.tracks)
            del scan
    return budget
