"""The `throttle` finding: GPU clocks slowed down (power, thermal or other throttle reasons).

Read from the NVML counters over the analysed window (`gpu_clocks.py`). A straggler whose cause
is the throttle already says it; its rank is left out here. The time at stake is the compute
time the lower clock costs the worst rank.
"""

from __future__ import annotations

import pyarrow as pa

from uberprof.analysis.diagnosis.causes import THROTTLE_REMEDY
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind, no_change
from uberprof.analysis.diagnosis.gpu_clocks import SLOWDOWN_FRACTION, GpuClocks
from uberprof.analysis.diagnosis.model import Finding, ranks_text, severity_of
from uberprof.analysis.diagnosis.stragglers import Straggler

__all__ = ["KINDS", "throttle_findings"]



def evidence_sentence(f: Finding) -> str:
    """Each throttled GPU's SM clock, slowdown and throttle reasons."""
    return "; ".join(f"rank {r}: {g.get('sm_clock_mhz')} MHz, slowdown "
                     f"{g.get('slowdown_pct')}% {g.get('reasons')}"
                     for r, g in (f.evidence.get("gpus") or {}).items())


THROTTLE = FindingKind(
    "throttle", VERDICT, evidence_sentence,
    no_change("the replay has no model of clock speed: the throttled GPUs' kernels are "
              "not re-timed at full clock; ranked by its own time at stake"),
    page="/counters", remedy_from="THROTTLE_REMEDY",
    summary="GPU clocks slowed down by power, thermal or other throttle reasons")
KINDS = (THROTTLE,)


def throttle_findings(facts: Facts) -> list[Finding]:
    """At most one finding: the GPUs whose clocks were slowed down in the analysed window."""
    return _throttle_findings(facts.clocks, facts.traced, facts.wall_ns, facts.straggler)


def _throttle_findings(clocks: dict[int, GpuClocks], traced: pa.Table, wall_ns: int,
                       straggler: Straggler | None) -> list[Finding]:
    out = []
    hit = {r: c for r, c in clocks.items() if c.slowdown_fraction >= SLOWDOWN_FRACTION}
    if straggler is not None and straggler.cause == "clock_throttle":
        hit.pop(straggler.rank, None)
    if not hit or not wall_ns:
        return out
    compute: dict[int, int] = {}
    for r, c in zip(traced.column("rank").to_pylist(), traced.column("compute_ns").to_pylist()):
        compute[r] = compute.get(r, 0) + (c or 0)
    stakes = {}
    for r, c in hit.items():
        slow = 1.0 - (c.sm_clock_mhz / c.sm_clock_max_mhz) if c.sm_clock_mhz and \
            c.sm_clock_max_mhz else 0.0
        stakes[r] = compute.get(r, 0) * max(slow, 0.0) * c.slowdown_fraction
    worst = max(stakes, key=lambda r: stakes[r])
    share = stakes[worst] / wall_ns
    reasons = sorted({k for c in hit.values() for k, v in c.reasons.items() if v > 0})
    ev = {"gpus": {str(r): c.as_dict() for r, c in hit.items()},
          "share_pct": round(100 * share, 1)}
    title = (f"GPU clocks slowed down on {ranks_text(sorted(hit))}"
             + (f" ({', '.join(reasons)})" if reasons else ""))
    out.append(Finding("throttle", severity_of(share), title, sorted(hit), [],
                       ", ".join(reasons) or None, stakes[worst] / 1e6, ev, THROTTLE_REMEDY))
    return out
