"""What the cross-rank stage of the diagnosis established, handed to every finding producer.

The advisor computes these once (matched collectives, aligned clocks, lateness, idle gaps,
bandwidth classes, GPU clocks, the straggler) and each producer in `findings/` reads them; none
recomputes another's numbers. `found` holds the findings made so far, in registry order, so a
producer can link the part of its time another finding already counts (`caused_by`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.tables.parallelism import Parallelism

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.bandwidth import BandwidthClass
    from uberprof.analysis.diagnosis.gpu_clocks import GpuClocks
    from uberprof.analysis.diagnosis.group_comm import GroupComm
    from uberprof.analysis.diagnosis.pipeline_stages import PipelineStages
    from uberprof.analysis.diagnosis.rank_comm import RankComm
    from uberprof.analysis.diagnosis.stragglers import Straggler
    from uberprof.analysis.diagnosis.summaries import RankSummaries
    from uberprof.analysis.tables.context import RunContext
    from uberprof.analysis.tables.p2p import P2P

__all__ = ["Facts"]


@dataclass
class Facts:
    """One run's cross-rank facts (times in ns; `traced` in RUN_STEP_SCHEMA, `lateness` in
    LATENESS_SCHEMA on aligned clocks, `gaps` in GAP_SCHEMA on each rank's own clock)."""

    ctx: RunContext
    traced: pa.Table  # the analysed (traced) steps of every rank
    wall_ns: int  # wall time of the analysed steps: per step the longest rank's, summed
    lateness: pa.Table
    gaps: pa.Table
    classes: list[BandwidthClass]
    clocks: dict[int, GpuClocks]
    straggler: Straggler | None
    summaries: RankSummaries
    device_type: str  # the run's accelerator type, "cpu" when no rank has one
    window: tuple[int, int] | None  # the analysed window (padded by the clock offsets), ns
    p2p: P2P | None = None  # matched send/recv pairs on aligned clocks
    pipeline: PipelineStages | None = None  # the pipeline's stages, when there is one
    groups: list[GroupComm] = field(default_factory=list)  # exposed communication per group
    parallelism: Parallelism = field(default_factory=Parallelism)  # read once, used by all
    traits: dict[str, Any] = field(default_factory=dict)  # run.job_traits: what the job does
    exposed_around: pa.Table | None = None  # gaps.AROUND_SCHEMA: exposed comm by its neighbours
    # each rank's exposed communication split by the peer waited for and transfer (rank_comm)
    rank_comm: dict[int, RankComm] = field(default_factory=dict)
    instances: pa.Table | None = None  # the matched collectives, aligned (INSTANCE_SCHEMA)
    found: list[Finding] = field(default_factory=list)

    def first(self, kind: str) -> Finding | None:
        """The first finding of `kind` made so far, None when there is none."""
        return next((f for f in self.found if f.kind == kind), None)

    def claimed(self, rank: int, part: str) -> float:
        """The ms of rank `rank`'s `part` (`exposed_comm_ms`, `idle_ms`) that the findings made
        so far explain (`Finding.accounts_for`): a later finding explains only the rest."""
        return sum(float((f.accounts_for.get(str(rank)) or {}).get(part) or 0.0)
                   for f in self.found)

    def of_kind(self, kind: str) -> list[Finding]:
        """Every finding of `kind` made so far."""
        return [f for f in self.found if f.kind == kind]
