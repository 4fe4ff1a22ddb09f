"""A pipeline's stages, read from its matched sends and receives: what each stage computes, how
long it waits on its neighbours, its bubble, and the schedule's ideal bubble.

Why from the point-to-point pairs: they are what a pipeline is, whatever API built it
(`torch.distributed.pipelining`, Megatron, hand-written send/recv), and they say the direction
of the forward pass. Stages come from the parallelism reading (`stage_of`) when it has them,
else each chain of ranks joined by transfers is ordered by the direction of each step's first
transfer (a step starts with stage 0's forward). The micro-batch count is the forward transfers
per step out of stage 0; the schedule is GPipe when stage 0 posts every forward send of a step
before its first backward receive, else 1F1B-like. Both give the ideal bubble
(p - 1) / (m + p - 1) for p stages and m micro-batches.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from uberprof.units import ns_to_ms as _ms

__all__ = ["SCHEDULE_WORDS", "PipelineStages", "StageStats", "pipeline_stages"]

SCHEDULE_WORDS = {"gpipe": "GPipe", "1f1b": "1F1B"}  # how every view names a schedule


@dataclass
class StageStats:
    """One stage, per analysed step (medians over steps; ns)."""

    stage: int
    ranks: list[int]
    compute_ns: float
    step_ns: float
    wait_prev_ns: float  # waiting for the previous stage's activations (forward)
    wait_next_ns: float  # waiting for the next stage's gradients (backward)
    bubble: float  # share of the step the stage does not compute
    slowest_in: int = 0  # steps in which this stage computed the most

    @property
    def rest_ns(self) -> float:
        """The step besides compute and waiting on a neighbour (other communication, host
        work, idle), floored at 0: medians of parts need not add up."""
        return max(0.0, self.step_ns - self.compute_ns - self.wait_prev_ns - self.wait_next_ns)

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "ranks": self.ranks, "compute_ms": _ms(self.compute_ns),
                "step_ms": _ms(self.step_ns), "wait_prev_ms": _ms(self.wait_prev_ns),
                "wait_next_ms": _ms(self.wait_next_ns), "rest_ms": _ms(self.rest_ns),
                "bubble_pct": round(100 * self.bubble, 1),
                "slowest_in_steps": self.slowest_in}


@dataclass
class PipelineStages:
    """The pipeline as the transfers show it."""

    stages: list[StageStats]
    microbatches: int | None
    schedule: str | None  # "gpipe", "1f1b" (1F1B-like: interleaved or not), None: unknown
    steps: int
    stage_of: dict[int, int] = field(default_factory=dict)

    @property
    def slowest(self) -> StageStats | None:
        """The stage that computed the most in the most steps (then the most compute)."""
        return max(self.stages, key=lambda s: (s.slowest_in, s.compute_ns), default=None)

    @property
    def ideal_bubble(self) -> float | None:
        p, m = len(self.stages), self.microbatches
        return (p - 1) / (m + p - 1) if m and p > 1 else None

    def as_dict(self) -> dict[str, Any]:
        ideal = self.ideal_bubble
        return {"stages": len(self.stages), "microbatches": self.microbatches,
                "schedule": self.schedule,
                "schedule_words": SCHEDULE_WORDS.get(self.schedule or ""), "steps": self.steps,
                "ideal_bubble_pct": round(100 * ideal, 1) if ideal is not None else None,
                "slowest_stage": self.slowest.stage if self.slowest is not None else None,
                "per_stage": [s.as_dict() for s in self.stages]}


def pipeline_stages(traced: pa.Table, pairs: pa.Table,
                    stage_of: dict[int, int] | None = None) -> PipelineStages | None:
    """The stages of a run with point-to-point traffic (module docstring); None without."""
    if pairs.num_rows == 0 or traced.num_rows == 0:
        return None
    p = pairs.to_pydict()
    stage_of = dict(stage_of) if stage_of else _stages_from_transfers(p)
    if len(set(stage_of.values())) < 2:
        return None
    by_stage: dict[int, list[int]] = defaultdict(list)
    for r, s in sorted(stage_of.items()):
        by_stage[s].append(r)
    per_rank_step = _per_rank_step(traced)
    waits = _waits(p, stage_of)
    steps = sorted({s for (_, s) in per_rank_step})
    stats = []
    for stage, ranks in sorted(by_stage.items()):
        rows = [per_rank_step[(r, s)] for r in ranks for s in steps if (r, s) in per_rank_step]
        if not rows:
            continue
        compute = statistics.median(c for c, _ in rows)
        step = statistics.median(w for _, w in rows)
        stats.append(StageStats(
            stage=stage, ranks=ranks, compute_ns=compute, step_ns=step,
            wait_prev_ns=_median_per_step(waits, ranks, steps, "prev"),
            wait_next_ns=_median_per_step(waits, ranks, steps, "next"),
            bubble=max(0.0, 1 - compute / step) if step else 0.0))
    _count_slowest(stats, per_rank_step, steps)
    first = [r for r, s in stage_of.items() if s == min(stage_of.values())]
    second = [r for r, s in stage_of.items() if s == min(stage_of.values()) + 1]
    m, schedule = _microbatches_and_schedule(p, first, second)
    return PipelineStages(stats, m, schedule, len(steps), stage_of)


def _per_rank_step(traced: pa.Table) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, step) -> (compute, step window) ns of the analysed steps."""
    out = {}
    for r, s, c, w in zip(*(traced.column(k).to_pylist()
                            for k in ("rank", "step", "compute_ns", "window_ns"))):
        if c is not None and w:
            out[(r, s)] = (c, w)
    return out


def _stages_from_transfers(p: dict[str, list[Any]]) -> dict[int, int]:
    """Stage of each rank joined by transfers: in each step the first transfer goes forward;
    a rank's stage is the number of ranks that precede it on the forward chain."""
    forward: Counter[tuple[int, int]] = Counter()
    first_of_step: dict[Any, tuple[int, int, int]] = {}
    for src, dst, step, t in zip(p["src"], p["dst"], p["step"], p["send_start_ns"]):
        if step not in first_of_step or t < first_of_step[step][0]:
            first_of_step[step] = (t, src, dst)
    for _, src, dst in first_of_step.values():
        forward[(src, dst)] += 1
    edges = set(zip(p["src"], p["dst"]))
    nxt: dict[int, int] = {}
    for a, b in edges:  # the forward direction of each linked pair: the one seen first
        if (b, a) in edges and forward[(b, a)] > forward[(a, b)]:
            continue
        if (b, a) in edges and forward[(b, a)] == forward[(a, b)] and b < a:
            continue
        nxt.setdefault(a, b)
    stage: dict[int, int] = {}
    heads = set(nxt) - set(nxt.values())
    for head in sorted(heads):
        r, k = head, 0
        while r is not None and r not in stage:
            stage[r] = k
            r, k = nxt.get(r), k + 1
    return stage


def _waits(p: dict[str, list[Any]], stage_of: dict[int, int]
           ) -> dict[tuple[int, int, str], int]:
    """(receiving rank, step, "prev" | "next") -> its waiting ns for that neighbour."""
    out: dict[tuple[int, int, str], int] = defaultdict(int)
    for src, dst, step, w in zip(p["src"], p["dst"], p["step"], p["wait_ns"]):
        if w is None or src not in stage_of or dst not in stage_of:
            continue
        side = "prev" if stage_of[src] < stage_of[dst] else "next"
        out[(dst, step, side)] += w
    return out


def _median_per_step(waits: dict[tuple[int, int, str], int], ranks: list[int], steps: list[int],
                     side: str) -> float:
    values = [waits.get((r, s, side), 0) for r in ranks for s in steps]
    return float(statistics.median(values)) if values else 0.0


def _count_slowest(stats: list[StageStats],
                   per_rank_step: dict[tuple[int, int], tuple[int, int]],
                   steps: list[int]) -> None:
    """Each stage's count of steps in which it computed the most (its ranks' median)."""
    for s in steps:
        best, best_c = None, -1.0
        for st in stats:
            cs = [per_rank_step[(r, s)][0] for r in st.ranks if (r, s) in per_rank_step]
            if cs and statistics.median(cs) > best_c:
                best, best_c = st, statistics.median(cs)
        if best is not None:
            best.slowest_in += 1


def _microbatches_and_schedule(p: dict[str, list[Any]], first: list[int], second: list[int]
                               ) -> tuple[int | None, str | None]:
    """Forward transfers per step out of the first stage, and whether it posts them all
    before its first backward receive (GPipe) or not (1F1B-like)."""
    if not first or not second:
        return None, None
    fwd: dict[tuple[int, int], list[int]] = defaultdict(list)  # (rank, step) -> send posts
    bwd: dict[tuple[int, int], list[int]] = defaultdict(list)  # (rank, step) -> recv posts
    for src, dst, step, s0, r0 in zip(p["src"], p["dst"], p["step"], p["send_start_ns"],
                                      p["recv_start_ns"]):
        if src in first and dst in second:
            fwd[(src, step)].append(s0)
        elif src in second and dst in first:
            bwd[(dst, step)].append(r0)
    counts = [len(v) for v in fwd.values()]
    if not counts:
        return None, None
    m = int(statistics.median(counts))
    gpipe = [all(t < min(bwd[k]) for t in v) for k, v in fwd.items() if bwd.get(k)]
    if not gpipe:
        return m, None
    return m, "gpipe" if sum(gpipe) > len(gpipe) / 2 else "1f1b"
