"""What `/parallelism` shows, read from the saved run document (`Diagnosis.run`): how the ranks
divide the work (`parallelism`), a pipeline's stages (`pipeline`), who waits on whom
(`p2p.by_direction`), communication per process group (`comm_by_group`) and the findings about
them. The analysis made every number (docs/json.md); this module only picks them out and labels
them, so that a diagnosis saved without one of these keys (an older uberprof, a job without a
pipeline) reads as "nothing to show" instead of breaking the page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from uberprof.analysis.diagnosis.model import Finding
from uberprof.dashboards.data import RunData

__all__ = ["FINDING_KINDS", "Stage", "Wait", "findings", "group_comm", "is_data_parallel",
           "pipeline", "reading", "slowest_stage", "stage_label", "stages", "waits"]

# The findings this page is about, in the order it lists them.
FINDING_KINDS = ("pipeline_imbalance", "tp_exposed_comm", "exposed_comm")
# Kinds that divide the model (the others each hold a whole model, or a shard of it, and run
# the same step: data parallel).
MODEL_PARALLEL = ("pp", "tp")


@dataclass(frozen=True)
class Stage:
    """One pipeline stage per analysed step (the analysis's medians over steps, ms; `rest_ms`:
    the step besides compute and waiting on a neighbour, `pipeline_stages.StageStats`)."""

    stage: int
    ranks: list[int]
    compute_ms: float
    wait_prev_ms: float
    wait_next_ms: float
    rest_ms: float
    step_ms: float
    bubble_pct: float | None
    slowest_in_steps: int

    @property
    def label(self) -> str:
        return stage_label(self.stage, self.ranks)


@dataclass(frozen=True)
class Wait:
    """A receiver's waiting for one sender over the analysed steps (`p2p.by_direction`): rank
    `dst` posted its receive `wait_ms` before `src` sent, in total."""

    src: int
    dst: int
    src_stage: int | None
    dst_stage: int | None
    wait_ms: float
    transfers: int
    bytes: int | None
    transfer_ms: float | None
    effective_gbit_s: float | None

    @property
    def label(self) -> str:
        """"stage 1 (rank 1) waits on stage 0 (rank 0)": the receiver first."""
        def who(rank: int, stage: int | None) -> str:
            return f"rank {rank}" if stage is None else f"stage {stage} (rank {rank})"
        return f"{who(self.dst, self.dst_stage)} waits on {who(self.src, self.src_stage)}"


def stage_label(stage: int, ranks: list[int]) -> str:
    """"stage 1 · rank 1", "stage 0 · ranks 0,1"."""
    if len(ranks) == 1:
        return f"stage {stage} · rank {ranks[0]}"
    return f"stage {stage} · ranks {','.join(map(str, ranks))}"


def _run(run: RunData) -> dict[str, Any]:
    d = run.diagnose()
    return d.run if d is not None else {}


def reading(run: RunData) -> dict[str, Any] | None:
    """`run.parallelism`: kinds, summary, dims, groups, stage_of, evidence; None when the
    diagnosis has none (no traces, or saved before it was read)."""
    p = _run(run).get("parallelism")
    return p if isinstance(p, dict) else None


def pipeline(run: RunData) -> dict[str, Any] | None:
    """`run.pipeline` (stages, microbatches, schedule, ideal_bubble_pct, per_stage), None when
    the run is no pipeline."""
    p = _run(run).get("pipeline")
    return p if isinstance(p, dict) and p.get("per_stage") else None


def is_data_parallel(run: RunData) -> bool:
    """No stage and no tensor-parallel group: every rank runs the same step (DDP, FSDP, or a
    job whose kind was not read), so the page has nothing of its own beyond a sentence."""
    p = reading(run) or {}
    return pipeline(run) is None and not any(k in MODEL_PARALLEL for k in p.get("kinds") or [])


def stages(run: RunData) -> list[Stage]:
    out = []
    for s in (pipeline(run) or {}).get("per_stage") or []:
        compute, prev, nxt, rest, step = (float(s.get(k) or 0.0) for k in (
            "compute_ms", "wait_prev_ms", "wait_next_ms", "rest_ms", "step_ms"))
        out.append(Stage(stage=int(s["stage"]), ranks=list(s.get("ranks") or []),
                         compute_ms=compute, wait_prev_ms=prev, wait_next_ms=nxt,
                         rest_ms=rest, step_ms=step,
                         bubble_pct=s.get("bubble_pct"),
                         slowest_in_steps=int(s.get("slowest_in_steps") or 0)))
    return sorted(out, key=lambda s: s.stage)


def slowest_stage(run: RunData) -> int | None:
    """The stage the pipeline_imbalance finding names; without that finding, the pipeline's
    (`run.pipeline.slowest_stage`: computed the most in the most steps), None without stages."""
    for f in findings(run):
        if f.kind == "pipeline_imbalance" and f.evidence.get("slowest_stage") is not None:
            return int(f.evidence["slowest_stage"])
    s = (pipeline(run) or {}).get("slowest_stage")
    return int(s) if s is not None else None


def waits(run: RunData, limit: int = 30) -> list[Wait]:
    """The directions of point-to-point traffic, the longest receiver wait first (at most
    `limit`), each rank named with its pipeline stage where the reading has one."""
    stage_of = {int(r): int(s) for r, s in ((reading(run) or {}).get("stage_of") or {}).items()}
    rows = ((_run(run).get("p2p") or {}).get("by_direction")) or []
    out = [Wait(src=int(r["src"]), dst=int(r["dst"]), src_stage=stage_of.get(int(r["src"])),
                dst_stage=stage_of.get(int(r["dst"])), wait_ms=float(r.get("wait_ms") or 0.0),
                transfers=int(r.get("transfers") or 0), bytes=r.get("bytes"),
                transfer_ms=r.get("transfer_ms"), effective_gbit_s=r.get("effective_gbit_s"))
           for r in rows]
    return sorted(out, key=lambda w: (-w.wait_ms, w.dst, w.src))[:limit]


def group_comm(run: RunData) -> list[dict[str, Any]]:
    """`run.comm_by_group` (group, dim, ranks, collectives, time_ms, exposed_ms,
    exposed_pct_of_wall), the most exposed first."""
    rows = [g for g in _run(run).get("comm_by_group") or [] if isinstance(g, dict)]
    return sorted(rows, key=lambda g: -(g.get("exposed_pct_of_wall") or 0.0))


def findings(run: RunData) -> list[Finding]:
    """The diagnosis's findings of FINDING_KINDS, in its order (the time at stake)."""
    return [f for f in run.findings() if f.kind in FINDING_KINDS]
