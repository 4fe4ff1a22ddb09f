"""The arrival bases of the straggler test and how they combine (`combined_straggler_test`).

A run's arrivals come from the traced window's matched collectives and, where the run has
them, the Flight Recorder's arrivals over every untraced step (analysis/diagnosis/arrivals.py).
With both, the test is made on them pooled, each instance once, and each basis's own test is
kept beside it (`StragglerTest.alone`). Neither overrules the other, except that the larger
basis alone decides where it says more than the pool (a weaker basis never overrules a
stronger one), unless the pool was held by what only all its steps show. A confirmed verdict
that a basis alone contradicts is held at suspected where its evidence is thin (`_dispute`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from uberprof.analysis.diagnosis.lateness import LATENESS_SCHEMA, pooled_lateness
from uberprof.analysis.diagnosis.stragglers.rules import (
    BASIS_ARRIVALS,
    BASIS_TRACES,
    DISPUTED_SHARE,
    SIGMA_FACTOR,
)
from uberprof.analysis.diagnosis.stragglers.test import StragglerTest, straggler_test

if TYPE_CHECKING:
    from uberprof.analysis.diagnosis.busy import BusyTimes

__all__ = ["ArrivalBasis", "combined_straggler_test"]

_STRENGTH = {"none": 0, "suspected": 1, "confirmed": 2}


@dataclass(frozen=True)
class ArrivalBasis:
    """One source of arrivals for the straggler test: its lateness (LATENESS_SCHEMA) with the
    median step time and wall time of the steps it covers."""

    name: str  # BASIS_TRACES | BASIS_FLIGHT_RECORDER
    lateness: pa.Table
    median_step_ns: float | None
    wall_ns: float | None


def combined_straggler_test(bases: list[ArrivalBasis], median_step_ns: float | None,
                            busy: BusyTimes | None = None
                            ) -> tuple[StragglerTest | None, pa.Table]:
    """The one straggler test of a run over all its arrivals (module docstring), and the
    lateness it was made on. `bases` cover different steps; `median_step_ns` is that of all
    the steps they cover. With two bases or more the test is made on them pooled, each
    instance once, and each basis's own test is kept in `alone`."""
    used = [b for b in bases if b.lateness.num_rows]
    if not used:
        return None, LATENESS_SCHEMA.empty_table()
    if len(used) == 1:
        b = used[0]
        return straggler_test(b.lateness, b.median_step_ns, b.wall_ns, b.name, busy), b.lateness
    pooled = pooled_lateness([b.lateness for b in used])
    wall = sum(b.wall_ns or 0 for b in used) or None
    # persistence is judged on the untraced steps: the profiler slows ranks unevenly, and a
    # 1.3x straggler was level with the other rank over a traced window (accuracy.py, s6)
    untraced = {int(s) for b in used if b.name != BASIS_TRACES
                for s in b.lateness.column("step").to_pylist()}
    test = straggler_test(pooled, median_step_ns, wall, BASIS_ARRIVALS, busy,
                          persistence_on=untraced or None)
    alone = {b.name: straggler_test(b.lateness, b.median_step_ns, b.wall_ns, b.name, busy)
             for b in bases}
    largest = max(used, key=lambda b: b.lateness.num_rows)
    big = alone[largest.name]
    if big is not None and (test is None or (_STRENGTH[big.decision] > _STRENGTH[test.decision]
                                             and not test.held)):
        # the larger basis alone says more than the pool: the smaller one (a traced window
        # the profiler skewed, say) must not dilute it. Not where the pool was held back by
        # what only all its steps show (its work slight or the OS's delay larger over them,
        # or a lead that fades in a part of the run): that is no dilution of arrivals
        big.alone, big.overrules_pool = alone, True
        return _dispute(big), largest.lateness
    if test is not None:
        test.alone = alone
    return _dispute(test), pooled


def _dispute(test: StragglerTest | None) -> StragglerTest | None:
    """A confirmed pooled verdict that a basis alone contradicts (clears its rank, or names
    another) is suspected unless its lead stands clear of the others' spread, the delay is at
    least `DISPUTED_SHARE` (not for a verdict by elimination: late off the CPU) or its own work
    accounts for its lead, whether or not its frequency needed that work (`by_work` is the
    case where it did: a 4-rank 1.3x straggler, +34% CPU time the most in 27 of 27 steps,
    frequent by its arrivals, was held at suspected on a lead 0.1 ms inside the spread)."""
    if test is None or test.decision != "confirmed":
        return test
    work = test.busy
    by_own_work = work is not None and work.accounts_for_lead
    by_elimination = work is not None and work.off_cpu
    if by_own_work or test.median_lead_ns >= SIGMA_FACTOR * test.noise_ns or \
            (test.share is not None and test.share >= DISPUTED_SHARE and not by_elimination):
        return test
    if any(t is not None and (t.decision == "none" or t.rank != test.rank)
           for t in test.alone.values()):
        test.decision, test.disputed = "suspected", True
    return test
