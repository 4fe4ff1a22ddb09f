"""Stragglers: who arrives last at the collectives, persistently, and why.

The procedure (`name_straggler`, name.py), in order; each rule's condition, effect, tests and
the benchmark that motivated it are docs/findings.md's decision table:

1. Bases (bases.py): the traced window's collectives and the Flight Recorder's untraced
   arrivals, pooled, each instance once; each basis's own test kept beside the verdict.
2. Candidate (test.py): the rank least likely to be alone last so often by chance.
3. Frequency: Poisson-binomial tail, Bonferroni over ranks; confirmed at p <= 1%, suspected at
   5%; with confirmed extra work also a second look, or its work alone (`by_work`).
4. Materiality: last fraction, lead (floors; 2x the others' spread with 3+ ranks) and delay
   (5% of the time); confirmed extra work waives the fraction and the spread.
5. Busy time with no excess of its own clears it, unless it waited off the CPU by itself.
6. Holds at suspected: the OS delayed it more than it worked extra, its extra work is slight,
   its lead fades in a third of its steps.
7. Bases combined: the larger basis alone decides where it says more than an unheld pool; a
   thin verdict a basis contradicts is disputed.
8. Cost (cost.py): the delay it alone adds, measured on the basis that decided.
9. Cause (cause.py): largest per-step excess (clocks, busy time, run-queue wait weigh in);
   the same work run slower holds it; `off_cpu`; `preempted`. Wording: wording.py.
"""

from __future__ import annotations

from uberprof.analysis.diagnosis.stragglers.bases import ArrivalBasis, combined_straggler_test
from uberprof.analysis.diagnosis.stragglers.bases import (  # for its unit test
    _dispute as _dispute,
)
from uberprof.analysis.diagnosis.stragglers.cause import (
    hold_for_same_work,
    step_factors,
    straggler_cause,
)
from uberprof.analysis.diagnosis.stragglers.cost import Straggler
from uberprof.analysis.diagnosis.stragglers.name import (
    StragglerTests,
    find_straggler,
    name_straggler,
)
from uberprof.analysis.diagnosis.stragglers.rules import (
    ABS_MIN_LEAD_NS,
    BASIS_ARRIVALS,
    BASIS_FLIGHT_RECORDER,
    BASIS_STEP_TIMELINE,
    BASIS_TRACES,
    DECIDED_BY_BUSY,
    DISPUTED_SHARE,
    MATERIAL_SHARE,
    MIN_PART_STEPS,
    PARTS,
    REL_MIN_LEAD,
    SIGMA_FACTOR,
    STRAGGLER_CAUSES,
    WORK_CAUSES,
)
from uberprof.analysis.diagnosis.stragglers.test import StragglerTest, straggler_test
from uberprof.analysis.diagnosis.stragglers.wording import basis_words

__all__ = [
    "ABS_MIN_LEAD_NS",
    "BASIS_ARRIVALS",
    "BASIS_FLIGHT_RECORDER",
    "BASIS_STEP_TIMELINE",
    "BASIS_TRACES",
    "DECIDED_BY_BUSY",
    "DISPUTED_SHARE",
    "MATERIAL_SHARE",
    "MIN_PART_STEPS",
    "PARTS",
    "REL_MIN_LEAD",
    "SIGMA_FACTOR",
    "STRAGGLER_CAUSES",
    "WORK_CAUSES",
    "ArrivalBasis",
    "Straggler",
    "StragglerTest",
    "StragglerTests",
    "basis_words",
    "combined_straggler_test",
    "find_straggler",
    "hold_for_same_work",
    "name_straggler",
    "step_factors",
    "straggler_cause",
    "straggler_test",
]
