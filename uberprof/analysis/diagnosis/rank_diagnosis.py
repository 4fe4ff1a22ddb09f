"""The per-rank part of the diagnosis, as a map: each rank's idle gaps, the exposed part of its
collectives and its longest gaps with their context, computed where that rank's event table is
read (the analysis's forked workers, or a Dask cluster's), so that the client never holds an
event table and only combines small per-rank results (docs/DESIGN.md, §5).

`rank_pass` is a top-level function of picklable arguments, like the analysis's map
(`uberprof.analysis.tables.rank`); `rank_passes` runs it for every rank.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.bandwidth import exposed_ns
from uberprof.analysis.diagnosis.gaps import (
    AROUND_SCHEMA,
    GAP_SCHEMA,
    exposed_around,
    gap_context,
    idle_gaps,
)
from uberprof.analysis.diagnosis.warmup import EVIDENCE_SCHEMA, Cut, cut_window, step_evidence
from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables import metrics as M
from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.pool import map_calls

__all__ = ["TOP_GAPS", "RankResult", "rank_pass", "rank_passes"]

TOP_GAPS = 5  # the longest gaps of each rank kept with their context


@dataclass
class RankResult:
    """What the cross-rank diagnosis needs of one rank's events."""

    rank: int
    gaps: pa.Table  # GAP_SCHEMA
    exposed: dict[tuple[int, int], int]  # (instance, rank) -> exposed ns of its span
    top_gaps: list[dict[str, Any]]
    problem: str | None = None  # why this rank has no result (its process died)
    # its exposed communication per step by the compute around it (gaps.AROUND_SCHEMA)
    exposed_around: pa.Table = field(default_factory=AROUND_SCHEMA.empty_table)
    # its warm-up evidence per step (warmup.EVIDENCE_SCHEMA), and without step markers the cut
    warmup: pa.Table = field(default_factory=EVIDENCE_SCHEMA.empty_table)
    cut: Cut | None = None

    @classmethod
    def empty(cls, rank: int, problem: str | None = None) -> RankResult:
        """A rank without events (no trace, unreadable tables), or whose pass failed."""
        return cls(rank, GAP_SCHEMA.empty_table(), {}, [], problem)


def rank_pass(derived: str, keys: list[str], rank: int, steps: pa.Table, instances: pa.Table,
              threshold_ns: int) -> RankResult:
    """One rank: its event table (the inputs `keys` under `derived`) is read, used, dropped.
    `steps`: its analysed steps (RUN_STEP_SCHEMA); `instances`: its matched collectives
    (`instance`, `start_ns`, `end_ns`)."""
    events = D.read_events_if_any(Path(derived), keys)
    if events is None:
        return RankResult.empty(rank)
    act = M.device_activity(events)
    rg = idle_gaps(rank, events, steps, threshold_ns, act)
    exposed: dict[tuple[int, int], int] = {}
    if instances.num_rows:
        ex = exposed_ns(act.compute, instances.column("start_ns").to_numpy(),
                        instances.column("end_ns").to_numpy())
        exposed = {(int(i), rank): int(x) for i, x in
                   zip(instances.column("instance").to_numpy().tolist(), ex.tolist())}
    top = [{**g, "rank": rank} for g in gap_context(events, rg.gaps, TOP_GAPS)]
    return RankResult(rank, rg.gaps, exposed, top,
                      exposed_around=exposed_around(rank, events, steps, act),
                      warmup=step_evidence(rank, events, steps),
                      cut=cut_window(events, steps, act))


def rank_passes(ctx: RunContext, traced: pa.Table, instances: pa.Table,
                threshold_ns: int) -> Iterator[RankResult]:
    """`rank_pass` for every rank of `ctx`, on its workers (`ctx.workers`, `ctx.executor`);
    each rank is sent only its own steps and collectives. In rank order."""
    keys = D.rank_input_keys(ctx.run.inputs)
    inst = instances.select(["rank", "instance", "start_ns", "end_ns"])
    by_rank_steps = _split(traced, ctx.rank_ids)
    by_rank_inst = _split(inst, ctx.rank_ids)
    calls = [(str(ctx.derived), keys.get(r, []), r, by_rank_steps[r], by_rank_inst[r],
              threshold_ns) for r in ctx.rank_ids]
    workers = ctx.workers if ctx.workers is not None else _default_workers(len(calls))
    done: dict[int, RankResult] = {}
    for i, res in map_calls(rank_pass, calls, workers, ctx.executor):
        r = calls[i][2]
        done[r] = res if isinstance(res, RankResult) else RankResult.empty(
            r, f"rank {r}: its idle gaps and exposed communication could not be computed ({res})")
    for r in ctx.rank_ids:
        yield done[r]


def _split(table: pa.Table, ranks: list[int]) -> dict[int, pa.Table]:
    """`table`'s rows per rank, each in its own buffers (a slice would pickle its whole
    table) and in the table's order: one stable sort, not a filter per rank."""
    col = table.column("rank").to_numpy(zero_copy_only=False)
    order = np.argsort(col, kind="stable")
    col = col[order]
    out = {}
    for r in ranks:
        lo, hi = int(col.searchsorted(r, "left")), int(col.searchsorted(r, "right"))
        out[r] = table.take(pa.array(order[lo:hi]))
    return out


def _default_workers(n: int) -> int:
    # Forking costs ~50 ms a worker; a handful of ranks is quicker in this process.
    return 1 if n < 8 else min(os.cpu_count() or 1, n)
