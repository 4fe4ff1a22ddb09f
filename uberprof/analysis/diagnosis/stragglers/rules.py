"""The numbers the straggler rules use and the names of the arrival bases (the reasons for
each number: docs/findings.md, `straggler`, and benchmarks/README.md)."""

from __future__ import annotations

from uberprof.analysis.diagnosis.causes import STRAGGLER_CAUSES as _CAUSES

__all__ = [
    "ABS_MIN_LEAD_NS", "BASIS_ARRIVALS", "BASIS_FLIGHT_RECORDER", "BASIS_STEP_TIMELINE",
    "BASIS_TRACES", "DECIDED_BY_BUSY", "DISPUTED_SHARE", "MATERIAL_SHARE", "MIN_PART_STEPS",
    "PARTS", "REL_MIN_LEAD", "SIGMA_FACTOR", "STRAGGLER_CAUSES", "WORK_CAUSES",
]

STRAGGLER_CAUSES = tuple(_CAUSES)
ABS_MIN_LEAD_NS = 100_000
REL_MIN_LEAD = 0.03  # of the median step time
# of the analysed wall time: the delay a straggler must add. A healthy job has a rank a few
# percent slower throughout (its core, its neighbours), persistently enough for the frequency
# test: healthy 4-rank runs with a core per rank confirmed such ranks at 2.4% and 3.2% of the
# wall time, and healthy runs' candidates came to 1.2-6.1% on an oversubscribed VM, where the
# injected stragglers named (1.3x compute, 30 ms off the CPU a step) added 8.6-25%
# (benchmarks/README.md, accuracy.py)
MATERIAL_SHARE = 0.05
# of the analysed wall time: the delay that confirms a straggler whose bases disagree (healthy
# runs so confirmed came to 8.4-12.3%, injected ones to 19.9-30.6%, benchmarks/accuracy.py,
# 2 ranks on 2 cores)
DISPUTED_SHARE = 0.15
PARTS = 3  # a persistent straggler leads in each third of its steps (test.transient)
MIN_PART_STEPS = 3  # steps in each third to judge it
SIGMA_FACTOR = 2.0  # its lead over the others' spread (3 or more participants)
BASIS_TRACES = "traces"  # the traced window's matched collectives
BASIS_FLIGHT_RECORDER = "flight_recorder"  # untraced steps' arrivals (diagnosis/arrivals.py)
BASIS_ARRIVALS = "arrivals"  # both of the above pooled, each instance once
BASIS_STEP_TIMELINE = "step_timeline"  # live: per step, the longest (diagnosis/step_signals.py)
DECIDED_BY_BUSY = "busy time"  # no excess of its own time cleared the candidate
WORK_CAUSES = ("compute", "host_launch")  # causes that say the rank does more work
