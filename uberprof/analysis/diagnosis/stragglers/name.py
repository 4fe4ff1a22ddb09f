"""The one procedure that names a run's straggler (`name_straggler`, called by the advisor):
the traced window's own test, the test over every arrival the run has (bases.py), the named
straggler with its cost (`find_straggler`), then its cause (cause.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.arrivals import flight_basis
from uberprof.analysis.diagnosis.gpu_clocks import throttled_vs_others
from uberprof.analysis.diagnosis.op_excess import same_work
from uberprof.analysis.diagnosis.stragglers.bases import ArrivalBasis, combined_straggler_test
from uberprof.analysis.diagnosis.stragglers.cause import (
    note_traced_view,
    settle_cause,
    step_factors,
)
from uberprof.analysis.diagnosis.stragglers.cost import Straggler, delay_per_step
from uberprof.analysis.diagnosis.stragglers.rules import BASIS_FLIGHT_RECORDER, BASIS_TRACES
from uberprof.analysis.diagnosis.stragglers.test import StragglerTest, straggler_test
from uberprof.analysis.tables.steptime import step_walls

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.busy import BusyTimes
    from uberprof.analysis.diagnosis.gpu_clocks import GpuClocks
    from uberprof.analysis.tables.align import Alignment
    from uberprof.analysis.tables.context import RunContext

__all__ = ["StragglerTests", "find_straggler", "name_straggler"]


@dataclass
class StragglerTests:
    """The straggler test over all the run's arrivals, the traced window's own, the named
    straggler and the Flight Recorder basis described (None when the run has none)."""

    test: StragglerTest | None
    traced: StragglerTest | None
    straggler: Straggler | None
    flight_recorder: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any] | None:
        """`run.straggler_test` of the report document (docs/json.md)."""
        doc = self.test.as_dict() if self.test is not None else None
        if doc is not None and self.flight_recorder is not None:
            doc["flight_recorder"] = self.flight_recorder
            doc["traced"] = self.traced.as_dict() if self.traced else None
        return doc


def name_straggler(ctx: RunContext, alignment: Alignment, traced: pa.Table, gaps: pa.Table,
                   lat: pa.Table, clocks: dict[int, GpuClocks], median_step: float | None,
                   wall_ns: int, busy: BusyTimes | None) -> StragglerTests:
    """The run's straggler test and named straggler, in order: the traced window's test; the
    test over every arrival (with the Flight Recorder's, pooled: bases.py); the straggler it
    names, its cost from the traced steps; its cause from its per-step excess, GPU clocks and
    busy time (cause.py); and, where the Flight Recorder decided, which basis the cause was
    read from. `lat` is the traced collectives' lateness, `busy` the run's busy times."""
    traced_test = straggler_test(lat, median_step, wall_ns, busy=busy)
    test, straggler, basis_doc = _on_all_arrivals(ctx, alignment, lat, traced_test,
                                                  median_step, wall_ns, busy)
    if straggler is not None:
        work_ns = settle_cause(straggler, test, step_factors(traced, gaps, lat),
                               throttled_vs_others(straggler.rank, clocks),
                               lambda rank: same_work(ctx, rank, traced))
        if basis_doc is not None:
            note_traced_view(straggler, traced_test, work_ns)
    return StragglerTests(test, traced_test, straggler, basis_doc)


def _on_all_arrivals(ctx: RunContext, alignment: Alignment, lat: pa.Table,
                     traced_test: StragglerTest | None, median_step: float | None,
                     wall_ns: int, busy: BusyTimes | None = None
                     ) -> tuple[StragglerTest | None, Straggler | None, dict[str, Any] | None]:
    """The one straggler test over every arrival the run has: the traced window's collectives
    and the Flight Recorder's arrivals over the untraced steps, pooled. Returns the test, the
    straggler (its cost from the traced steps) and the Flight Recorder basis described (None
    when the run has none)."""
    fr = flight_basis(ctx, alignment.offsets())
    if fr is None:
        return traced_test, find_straggler(lat, median_step, wall_ns, test=traced_test), None
    walls = step_walls(ctx.steps())
    covered = set(lat.column("step").to_pylist()) | set(fr.steps)
    w = [walls[s][0] for s in covered if s in walls]
    test, pooled = combined_straggler_test(
        [ArrivalBasis(BASIS_TRACES, lat, median_step, wall_ns),
         ArrivalBasis(BASIS_FLIGHT_RECORDER, fr.lateness, fr.median_step_ns, fr.wall_ns)],
        float(np.median(w)) if w else median_step, busy)
    return test, find_straggler(lat, median_step, wall_ns, test=test,
                                basis=pooled), fr.as_dict()


def find_straggler(lat: pa.Table, median_step_ns: float | None,
                   wall_ns: float | None = None, test: StragglerTest | None = None,
                   basis: pa.Table | None = None) -> Straggler | None:
    """The persistent straggler, confirmed or suspected, or None (see `straggler_test`).
    `test` made on `basis` (the Flight Recorder's lateness) decides when given; the delay it
    added is `lat`'s, over the analysed (traced) steps, and its share of the time is the
    test's where the test read more steps (`Straggler.share_of`)."""
    t = test if test is not None else straggler_test(lat, median_step_ns, wall_ns)
    if t is None or t.decision == "none":
        return None
    src = lat if basis is None else basis
    mine = src.column("rank").to_numpy() == t.rank
    step = src.column("step").to_numpy()[mine]
    sole_last = src.column("sole_last").to_numpy(zero_copy_only=False)[mine]
    last_steps = sorted({int(s) for s, sl in zip(step.tolist(), sole_last.tolist()) if sl})
    cost = lat.column("rank").to_numpy() == t.rank
    per_step = delay_per_step(lat.column("step").to_numpy()[cost],
                              lat.column("delay_ns").to_numpy()[cost],
                              lat.column("participants").to_numpy()[cost])
    late = src.column("lateness_ns").to_numpy()[mine]
    return Straggler(
        rank=t.rank, instances=t.instances, last=t.last, steps=last_steps,
        median_lateness_ns=int(np.median(late)) if late.size else 0,
        median_lead_ns=t.median_lead_ns, noise_ns=t.noise_ns,
        delay_ns=int(sum(d for d, _ in per_step.values())),
        others_wait_ns=int(sum(d * (k - 1) for d, k in per_step.values())),
        steps_analysed=t.steps, confidence=t.decision, test=t.test_doc(),
        basis=t.basis, basis_share=t.share if t.basis != BASIS_TRACES else None)
