"""The `pipeline_imbalance` finding: one pipeline stage computes more than the others, and every
stage waits for it.

In a pipeline the step runs at the pace of its slowest stage: with p stages and m micro-batches
a step takes about (m + p - 1) micro-batch times of the slowest stage, so balancing the stages'
compute would shorten it in the ratio of the mean stage's compute to the slowest's. That gain is
the time at stake. The other stages' waiting for it shows as exposed point-to-point time; the
`exposed_comm` finding (after this one) links that part here rather than to the link, which is
blamed only for what follows both posts (`p2p.py`).

Test: the slowest stage computes at least `MIN_EXCESS` more than the stages' mean (median over
the analysed steps), is the slowest in most steps, and the gain is at least `MIN_SHARE` of the
analysed time; "confirmed" when it persists over enough steps, else "suspected".
"""

from __future__ import annotations

from uberprof.analysis.diagnosis.causes import PIPELINE_IMBALANCE_REMEDY
from uberprof.analysis.diagnosis.evidence import count_test
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind, always
from uberprof.analysis.diagnosis.model import MIN_SHARE, Finding, severity_of
from uberprof.analysis.diagnosis.pipeline_stages import PipelineStages
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.units import ns_to_ms as _ms

__all__ = ["KINDS", "MIN_EXCESS", "pipeline_findings"]


def evidence_sentence(f: Finding) -> str:
    """The slowest stage's compute against the stages' mean, and each stage's waits."""
    e = f.evidence
    waits = "; ".join(f"{stage} waits {w.get('wait_prev_ms')} ms for the previous stage, "
                      f"{w.get('wait_next_ms')} ms for the next"
                      for stage, w in (e.get("waits") or {}).items())
    return (f"stage {e.get('slowest_stage')} computes {e.get('slowest_compute_ms')} ms a step "
            f"against the stages' mean {e.get('mean_compute_ms')} ms "
            f"(+{e.get('excess_pct')}%)" + (f"; {waits}" if waits else ""))


KINDS = (FindingKind("pipeline_imbalance", VERDICT, evidence_sentence, always(Change("balance")),
                     page="/parallelism", remedy_from="PIPELINE_IMBALANCE",
                     whatif="the stages' compute at their mean (--balance-stages)",
                     summary="one pipeline stage computes more than the others"),)
MIN_EXCESS = 0.15  # the slowest stage's compute over the stages' mean


def pipeline_findings(facts: Facts) -> list[Finding]:
    """At most one finding: the slowest stage of an unbalanced pipeline."""
    pipe = facts.pipeline
    if pipe is None or len(pipe.stages) < 2 or not facts.wall_ns:
        return []
    return _imbalance(pipe, facts.wall_ns)


def _imbalance(pipe: PipelineStages, wall_ns: int) -> list[Finding]:
    slow = max(pipe.stages, key=lambda s: s.compute_ns)
    mean = sum(s.compute_ns for s in pipe.stages) / len(pipe.stages)
    if not slow.compute_ns or slow.compute_ns < (1 + MIN_EXCESS) * mean:
        return []
    gain_per_step = slow.step_ns * (1 - mean / slow.compute_ns)
    stake = gain_per_step * pipe.steps
    share = stake / wall_ns
    if share < MIN_SHARE or slow.slowest_in * 2 <= pipe.steps:
        return []
    others = [s for s in pipe.stages if s is not slow]
    waits = {f"stage {s.stage}": {"wait_prev_ms": _ms(s.wait_prev_ns),
                                  "wait_next_ms": _ms(s.wait_next_ns)} for s in pipe.stages}
    ev = {"pipeline": pipe.as_dict(), "slowest_stage": slow.stage, "ranks": slow.ranks,
          "slowest_compute_ms": _ms(slow.compute_ns), "mean_compute_ms": _ms(mean),
          "excess_pct": round(100 * (slow.compute_ns / mean - 1), 1),
          "gain_per_step_ms": _ms(gain_per_step), "share_pct": round(100 * share, 1),
          "waits": waits}
    confidence, test = count_test(
        f"stage {slow.stage} (rank(s) {', '.join(map(str, slow.ranks))}) computes "
        f"{_ms(slow.compute_ns)} ms per step against the stages' mean {_ms(mean)} ms "
        f"(+{ev['excess_pct']}%; threshold +{100 * MIN_EXCESS:.0f}%), the most in "
        f"{slow.slowest_in} of {pipe.steps} steps", slow.slowest_in, pipe.steps)
    ev["test"] = test.as_dict()
    waiting = ", ".join(f"stage {s.stage} waits {_ms(s.wait_prev_ns + s.wait_next_ns)} ms"
                        for s in others)
    title = (f"Pipeline stage {slow.stage} is the slowest: {_ms(slow.compute_ns)} ms of compute "
             f"per step against a mean of {_ms(mean)} ms ({waiting} per step); balanced, a step "
             f"would be about {_ms(gain_per_step)} ms shorter")
    return [Finding("pipeline_imbalance", severity_of(share), title, slow.ranks,
                    [], "imbalance", stake / 1e6, ev, PIPELINE_IMBALANCE_REMEDY,
                    confidence=confidence)]
