"""The `tp_exposed_comm` finding: the tensor-parallel group's communication not hidden under
compute, with the remedies that fit tensor parallelism.

Tensor parallelism puts its collectives between the matmuls that need their results, so its
communication is exposed by design, and the cure is not the data-parallel overlap (buckets,
prefetch) but sequence parallelism, async TP or a TP group within a node's fast links. It is
read from the breakdown's columns (`facts.traced`: `exposed_comm_ns`, `comm_ns` per rank and
step), not from event names, so it follows how the analysis classifies communication.

How its time is counted, once (the advisor's accounting, `advisor.account`):

- **Tensor parallel alone** (`kinds == ("tp",)`): every collective of the run is the TP
  group's, so the exposed communication *is* the TP group's. The generic `exposed_comm` finding
  defers to this one (`unless_tensor_parallel_only` wraps its producer in `PRODUCERS`), and this
  one takes the same figure, split and links (waiting for a straggler and the transfer of a
  latency- or bandwidth-bound class stay `caused_by` those findings): one finding, the specific
  one, holds those milliseconds. Deferring rather than linking keeps the severity where the
  time is; a linked duplicate would say the same thing twice with 0 ms of its own.
- **Tensor parallel with another kind** (FSDP x TP, pipeline x TP): the exposed communication
  is both groups' together, and the generic finding keeps the time. When the matched
  collectives say which group each ran in (`facts.groups`: NCCL's metadata, or the Flight
  Recorder / group reading of `tables/groups.py` on Gloo), this one states the TP groups' part
  (their ranks' exposed time in them, the worst TP group's) as `observed_ms`, with its share
  and its strength; otherwise it is `suspected`, states the combined figure and says that the
  split is unknown. Either way it links its time to the generic finding (`caused_by`) and
  stakes nothing of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uberprof.analysis.diagnosis.causes import TP_EXPOSED_COMM
from uberprof.analysis.diagnosis.evidence import Test, count_test
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.exposed_comm import exposed_comm_findings
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind
from uberprof.analysis.diagnosis.group_comm import GroupComm
from uberprof.analysis.diagnosis.model import Finding, severity_of
from uberprof.analysis.diagnosis.whatif_changes import Change

__all__ = ["KINDS", "tp_exposed_comm_findings", "tp_only", "unless_tensor_parallel_only"]


def evidence_sentence(f: Finding) -> str:
    """The TP group's exposed time, waiting and transfer; or, where the groups' parts cannot
    be told apart, the combined figure and that it is not separable."""
    e = f.evidence
    if e.get("separable") is False:
        return (f"{e.get('combined_exposed_ms')} ms exposed over all groups together "
                f"({e.get('combined_share_pct')}%); the TP group's part is not separable")
    return (f"{e.get('exposed_ms_all_ranks_pay')} ms exposed in the TP group of "
            f"{e.get('tp_degree')} ({e.get('wait_ms')} ms waiting for peers, "
            f"{e.get('transfer_ms')} ms transfer), {e.get('exposed_of_comm_pct')}% of its "
            "communication")


def _change(f: Finding) -> tuple[Change | None, str]:
    groups = tuple(tuple(int(r) for r in g) for g in f.evidence.get("tp_groups") or [] if g)
    if not groups:
        return None, "the tensor-parallel groups are not known: nothing to scope the change to"
    return Change("exposed-comm", groups=groups), ""


KINDS = (FindingKind("tp_exposed_comm", VERDICT, evidence_sentence, _change,
                     summary="the tensor-parallel groups' exposed communication",
                     whatif="their collectives hidden (--remove exposed-comm within those "
                            "groups)", page="/parallelism", remedy_from="TP_EXPOSED_COMM"),)

Make = Callable[[Facts], list[Finding]]


def tp_only(facts: Facts) -> bool:
    """Whether tensor parallelism is the run's only parallel kind: then every collective is
    the TP group's."""
    return facts.parallelism.kinds == ("tp",)


def unless_tensor_parallel_only(make: Make) -> Make:
    """The generic exposed-communication producer, deferring to `tp_exposed_comm` on a
    tensor-parallel-only run (module docstring: one finding holds those milliseconds)."""
    def deferring(facts: Facts) -> list[Finding]:
        return [] if tp_only(facts) else make(facts)

    deferring.__doc__ = make.__doc__
    deferring.__name__ = getattr(make, "__name__", "deferring")
    return deferring


def tp_exposed_comm_findings(facts: Facts) -> list[Finding]:
    """At most one finding on a run with tensor parallelism: its exposed communication (the
    whole of it on a TP-only run, a suspected part of the combined figure otherwise)."""
    p = facts.parallelism
    if "tp" not in p.kinds:
        return []
    if tp_only(facts):
        return [_tp_alone(f, facts) for f in exposed_comm_findings(facts)]
    generic = facts.first("exposed_comm")
    if generic is None:
        return []
    tp_groups = [g for g in facts.groups if g.dim == "tp"]
    if tp_groups and facts.wall_ns:
        return [_tp_separated(generic, max(tp_groups, key=lambda g: g.exposed_ns), facts)]
    return [_tp_combined(generic, facts)]


def _tp_separated(generic: Finding, worst: GroupComm, facts: Facts) -> Finding:
    """The TP groups' part of the combined exposed communication, from the matched
    collectives of each group; the generic finding keeps the time (module docstring)."""
    p = facts.parallelism
    observed = min(worst.exposed_ns / 1e6, generic.observed_ms or generic.time_at_stake_ms)
    share = observed * 1e6 / facts.wall_ns
    confidence, test = count_test(
        f"the TP group of ranks {', '.join(map(str, worst.ranks))} leaves {round(observed, 3)} "
        f"ms of its collectives exposed per rank ({round(100 * share, 1)}% of the analysed "
        f"time), of the {generic.observed_ms} ms all groups of {p.summary()} leave exposed",
        sum(worst.collectives.values()), len(generic.steps))
    ev = {**_group_evidence(facts), "separable": True, "tp_exposed_ms": round(observed, 3),
          "share_pct": round(100 * share, 1), "worst_tp_group": worst.as_dict(),
          "combined_exposed_ms": generic.evidence.get("exposed_ms_all_ranks_pay"),
          "basis": "the TP group's matched collectives, each one's span outside compute",
          "test": test.as_dict()}
    title = (f"Tensor-parallel communication not hidden under compute: {round(observed, 3)} ms "
             f"({ev['share_pct']}% of the analysed time) in the TP group of ranks "
             f"{', '.join(map(str, worst.ranks))}, part of the exposed communication of "
             f"{p.summary()}")
    caused = [{"_ref": generic, "kind": generic.kind, "ms": round(observed, 3),
               "part": "the TP groups' part of the exposed communication"}]
    return Finding(TP_EXPOSED_COMM.kind, severity_of(share), title, worst.ranks, generic.steps,
                   None, 0.0, ev, TP_EXPOSED_COMM.remedy, confidence=confidence,
                   observed_ms=observed, caused_by=caused)


def _group_evidence(facts: Facts) -> dict[str, Any]:
    """The TP group as the parallelism reading found it, and what the reading rests on."""
    p = facts.parallelism
    return {"tp_degree": p.degree("tp"), "tp_groups": p.groups.get("tp", []),
            "parallelism": p.summary(), "parallelism_evidence": p.evidence.get("tp")}


def _tp_alone(f: Finding, facts: Facts) -> Finding:
    """The generic finding's figure, split and links, as the TP group's."""
    ev = {**f.evidence, **_group_evidence(facts),
          "basis": "every collective of a tensor-parallel-only run is the TP group's: the "
                   "breakdown's exposed communication (per step, the least exposed rank's)"}
    degree = ev["tp_degree"]
    title = (f"Tensor-parallel communication not hidden under compute: "
             f"{ev['exposed_ms_all_ranks_pay']} ms ({ev['share_pct']}% of the analysed time) "
             f"in the TP group{f' of {degree} ranks' if degree else ''} "
             f"({ev['wait_ms']} ms waiting for peers, {ev['transfer_ms']} ms transfer)")
    return Finding(TP_EXPOSED_COMM.kind, f.severity, title, f.ranks, f.steps,
                   None, f.time_at_stake_ms, ev, TP_EXPOSED_COMM.remedy,
                   confidence=f.confidence, observed_ms=f.observed_ms,
                   caused_by=list(f.caused_by), accounts_for=dict(f.accounts_for))


def _tp_combined(generic: Finding, facts: Facts) -> Finding:
    """A suspected share of the combined exposed communication: the traces cannot say which
    group's collectives it was, so nothing of its own is staked."""
    p = facts.parallelism
    others = [k for k in p.kinds if k != "tp"]
    g = generic.evidence
    observed = generic.observed_ms if generic.observed_ms is not None else \
        generic.time_at_stake_ms
    combined = g.get("exposed_ms_all_ranks_pay")
    sentence = (f"tensor parallelism runs beside {', '.join(others)} ({p.summary()}); the "
                f"exposed communication of all groups together is {combined} "
                f"ms ({g.get('share_pct')}% of the analysed time), and these traces do not say "
                "which group each collective ran in, so the tensor-parallel part is not known: "
                "suspected; traces whose collectives name their process group (NCCL) would "
                "separate it")
    test = Test(name="exposed communication of the combined groups",
                statistic=f"{g.get('exposed_ms_all_ranks_pay')} ms exposed, all groups",
                instances=len(generic.steps), threshold="not separable by group",
                sentence=sentence)
    ev = {**_group_evidence(facts), "combined_exposed_ms": g.get("exposed_ms_all_ranks_pay"),
          "combined_share_pct": g.get("share_pct"), "separable": False,
          "basis": "the breakdown's exposed communication of every group together",
          "test": test.as_dict()}
    title = (f"Tensor-parallel communication may be part of the {combined} "
             f"ms of exposed communication ({g.get('share_pct')}% of the analysed time, all "
             f"groups of {p.summary()} together; not separable by group in these traces)")
    caused = [{"_ref": generic, "kind": generic.kind, "ms": round(observed, 3),
               "part": "the exposed communication of every group together"}]
    return Finding(TP_EXPOSED_COMM.kind, severity_of(0.0), title, generic.ranks, generic.steps,
                   None, 0.0, ev, TP_EXPOSED_COMM.remedy,
                   confidence="suspected", observed_ms=observed, caused_by=caused)
