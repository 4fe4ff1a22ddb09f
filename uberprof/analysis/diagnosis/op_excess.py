"""What the slow rank does more of: its operators' and kernels' self time per analysed step
against the other ranks' median, so that a straggler finding names the work behind its excess
("aten::mm +25.3 ms per step, 40 more calls") without a second run to diff against.

Self time (`tables/operators.py`) because host operators nest: the excess of `aten::linear`
would otherwise count its `aten::addmm` again. The others are at most `MAX_OTHERS` ranks spread
over the run (each rank's event table is read once, one at a time), their median per operator
(0 where a rank never ran it). An operator counts when the slow rank spends at least `MIN_MS`
more in it per step; the largest excesses come first.

`same_work` asks the converse: did the slow rank do the same work as the others, the same
host operators with the same input shapes as often per step? Then its extra time is the same
work running slower (its core or device shared or slower), not more of it: on two cores shared
by four healthy ranks, one rank ran every operator as often as the others, each slower
(aten::copy_ +11 ms a step over the same 231 calls), and was confirmed a compute straggler
from its traced window alone. Without recorded shapes it cannot be told (uneven inputs run the
same operators as often on larger shapes): None.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uberprof.analysis.tables.context import RunContext
from uberprof.analysis.tables.operators import OpStat, rank_ops
from uberprof.ingest import classify as K

__all__ = ["MAX_OTHERS", "OpExcess", "operator_excess", "same_work"]

MAX_OTHERS = 8
MIN_MS = 0.05  # per step: below this an excess is noise, not work
TOP = 5
SAME_CALLS = 0.01  # calls per step that differ from the others', as a share of the rank's


@dataclass(frozen=True)
class OpExcess:
    """One operator or kernel the slow rank spends more time in, per analysed step."""

    kind: str
    name: str
    rank_ms: float
    others_ms: float  # the others' median
    calls: float
    others_calls: float

    @property
    def excess_ms(self) -> float:
        return self.rank_ms - self.others_ms

    def words(self) -> str:
        """"aten::mm +25.3 ms per step (+40 calls)"."""
        more = self.calls - self.others_calls
        calls = f" ({more:+.0f} calls)" if abs(more) >= 0.5 else ""
        return f"{self.name} {self.excess_ms:+.1f} ms per step{calls}"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "excess_ms": round(self.excess_ms, 3),
                "rank_ms": round(self.rank_ms, 3), "others_median_ms": round(self.others_ms, 3),
                "calls": round(self.calls, 2), "others_median_calls": round(self.others_calls, 2)}


def operator_excess(ctx: RunContext, rank: int, traced: pa.Table,
                    max_others: int = MAX_OTHERS) -> list[OpExcess]:
    """The operators and kernels `rank` spends more self time in per analysed step than the
    others' median (module docstring), largest first; [] when it cannot be told."""
    ranks = sorted(set(traced.column("rank").to_pylist())) if traced.num_rows else []
    others = [r for r in ranks if r != rank]
    if rank not in ranks or not others:
        return []
    if len(others) > max_others:
        others = [others[int(i)] for i in np.linspace(0, len(others) - 1, max_others)]
    mine = _per_step(ctx, rank, traced)
    theirs = [t for t in (_per_step(ctx, r, traced) for r in others) if t]
    if not mine or not theirs:
        return []
    out = []
    for key, st in mine.items():
        self_ms = [t[key].self_ns / 1e6 if key in t else 0.0 for t in theirs]
        calls = [t[key].calls if key in t else 0.0 for t in theirs]
        ex = OpExcess(st.kind, st.name, st.self_ns / 1e6, statistics.median(self_ms),
                      st.calls, statistics.median(calls))
        if ex.excess_ms >= MIN_MS:
            out.append(ex)
    return sorted(out, key=lambda e: -e.excess_ms)[:TOP]


def _per_step(ctx: RunContext, rank: int, traced: pa.Table) -> dict[tuple[str, str], OpStat]:
    """One rank's operators per analysed step (its trace over its traced steps)."""
    steps = traced.filter(pc.equal(traced.column("rank"), rank)).num_rows
    try:
        events = ctx.events(rank)
    except (KeyError, OSError):
        return {}
    n = max(steps, 1)
    return {k: OpStat(s.kind, s.name, s.calls / n, s.self_ns / n, s.incl_ns / n)
            for k, s in rank_ops(events, None).items()}


def same_work(ctx: RunContext, rank: int, traced: pa.Table,
              max_others: int = MAX_OTHERS) -> bool | None:
    """Whether `rank` ran the same host operators with the same input shapes as often per
    analysed step as the others' median (module docstring): True when the calls that differ
    add up to under SAME_CALLS of its own; None when it cannot be told (no other rank's
    operators, or no recorded shapes). Reads the run's operator table (tables/operators.py),
    not the ranks' events."""
    ranks = sorted(set(traced.column("rank").to_pylist())) if traced.num_rows else []
    others = [r for r in ranks if r != rank]
    if rank not in ranks or not others:
        return None
    if len(others) > max_others:
        others = [others[int(i)] for i in np.linspace(0, len(others) - 1, max_others)]
    try:
        ops = ctx.operators()
    except OSError:
        return None
    ops = ops.filter(pc.equal(ops.column("kind"), K.OPERATOR))
    if ops.num_rows == 0 or ops.column("shapes").null_count == ops.num_rows:
        return None
    steps = traced.column("rank").value_counts().to_pylist()
    n_steps = {int(c["values"]): max(int(c["counts"]), 1) for c in steps}
    calls: dict[int, dict[tuple[str, str], float]] = {r: {} for r in (rank, *others)}
    for r, name, shapes, c in zip(*(ops.column(k).to_pylist()
                                    for k in ("rank", "name", "shapes", "calls"))):
        if r in calls:
            key = (name, shapes or "")
            calls[r][key] = calls[r].get(key, 0.0) + c / n_steps[r]
    mine, theirs = calls[rank], [calls[r] for r in others if calls[r]]
    if not mine or not theirs:
        return None
    differ = sum(abs(mine.get(k, 0.0) - statistics.median(t.get(k, 0.0) for t in theirs))
                 for k in set(mine).union(*theirs))
    return differ < SAME_CALLS * sum(mine.values())
