"""The `straggler` finding: the rank that arrives last at the collectives, and why.

The test that names it and its cause are the `stragglers/` package's (run by the advisor before
any producer, since idle and communication findings link their time to it); this module turns the
named straggler into a finding: its time at stake is the delay it alone adds to the analysed
steps, as the share of the time its verdict's basis measured (`Straggler.share_of`), its remedy
the one of its cause (`causes.py`). A compute straggler's finding also names
the operators and kernels behind its excess (`op_excess.py`).
"""

from __future__ import annotations

from typing import Any

from uberprof.analysis.diagnosis.causes import straggler_remedy
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind
from uberprof.analysis.diagnosis.model import Finding, severity_of
from uberprof.analysis.diagnosis.op_excess import operator_excess
from uberprof.analysis.diagnosis.rank_accounts import IDLE as IDLE_MS
from uberprof.analysis.diagnosis.rank_accounts import waiting_for
from uberprof.analysis.diagnosis.stragglers import (
    BASIS_FLIGHT_RECORDER,
    BASIS_TRACES,
    Straggler,
    basis_words,
)
from uberprof.analysis.diagnosis.summaries import RankSummaries
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.analysis.tables.context import RunContext
from uberprof.units import ns_to_ms as _ms

__all__ = ["KINDS", "straggler_findings"]



def evidence_sentence(f: Finding) -> str:
    """Its arrivals, lateness against the others' spread, the delay it adds, its excess per
    step by part, and the GPU clocks and operators behind it where known."""
    e = f.evidence
    x = e.get("excess_per_step_ms") or {}
    parts = [f"last in {e.get('last_in')}/{e.get('instances')} collectives"
             + (" of the traced window" if (e.get("basis") or {}).get("source") ==
                BASIS_FLIGHT_RECORDER else ""),
             (f"median lateness {e.get('median_lateness_ms')} ms (others' spread "
              f"{e.get('others_spread_ms')} ms)"),
             (f"adds {e.get('delay_ms')} ms wall, {e.get('others_wait_ms')} ms of others' "
              "waiting"),
             "excess per step: " + ", ".join(f"{k} {v:+.1f} ms" for k, v in x.items()
                                              if v is not None)]
    g = e.get("gpu")
    if g:
        parts.append(f"GPU SM clock {g.get('sm_clock_mhz')} MHz vs others "
                     f"{g.get('others_sm_clock_mhz')}, slowdown {g.get('slowdown_pct')}%")
    ops = e.get("operators_excess") or []
    if ops:
        parts.append("more than the others' median, per step: " + ", ".join(
            f"{o['name']} {o['excess_ms']:+.1f} ms ({o['calls']:g} vs "
            f"{o['others_median_calls']:g} calls)" for o in ops[:4]))
    return "; ".join(parts)


def _change(f: Finding) -> tuple[Change | None, str]:
    if not f.ranks:
        return None, "no rank was named"
    return Change("straggler", rank=int(f.ranks[0])), ""


KINDS = (FindingKind("straggler", VERDICT, evidence_sentence, _change, page="/stragglers",
                     remedy_from="straggler_remedy", summary="the rank that arrives last at "
                     "the collectives, and why", whatif="its extra work at the others' median "
                     "(--remove straggler)"),)
# causes whose finding names the operators behind the excess: more work, or the same work
# slowed by other load on the host (then with as many calls as the others')
_WORK_CAUSES = ("compute", "host_launch", "preempted")


def straggler_findings(facts: Facts) -> list[Finding]:
    """The straggler the advisor's test named, as one finding (none when it named none)."""
    if facts.straggler is None:
        return []
    f = _straggler_finding(facts.straggler, facts.wall_ns, facts.ctx, facts.summaries,
                           facts.device_type, facts.traits)
    if f.cause in _WORK_CAUSES and facts.straggler.basis != BASIS_FLIGHT_RECORDER:
        more = operator_excess(facts.ctx, facts.straggler.rank, facts.traced)
        if more:
            f.evidence["operators_excess"] = [e.as_dict() for e in more]
            f.title += "; it spends more in " + " and ".join(e.words() for e in more[:2])
    # the others' exposed waiting for it, in every collective, and a data straggler's own
    # data-loader gaps (the data_stall finding leaves them to this one)
    f.accounts_for = waiting_for(facts.rank_comm, {facts.straggler.rank}, None, facts.claimed)
    if f.cause == "data":
        f.accounts_for.setdefault(str(facts.straggler.rank), {})[IDLE_MS] = _ms(
            _own_data_gaps(facts, facts.straggler.rank))
    return [f]


def _own_data_gaps(facts: Facts, rank: int) -> float:
    """The straggler's idle gaps waiting for its data loader (ns), within its idle time."""
    g = facts.gaps
    dur = sum(d for r, c, d in zip(*(g.column(k).to_pylist() for k in ("rank", "cause", "dur_ns")))
              if r == rank and c == "data")
    idle = sum(v or 0 for r, v in zip(facts.traced.column("rank").to_pylist(),
                                      facts.traced.column("idle_ns").to_pylist()) if r == rank)
    return float(min(dur, idle))


def _straggler_finding(s: Straggler, wall_ns: int, ctx: RunContext,
                       summaries: RankSummaries, device_type: str,
                       traits: dict[str, Any] | None = None) -> Finding:
    share = s.share_of(wall_ns)
    late = summaries.lateness_of(s.rank)  # the rank row's (traced window); `basis`: the test's
    ev = {
        "last_in": late["last_in"], "instances": late["instances"],
        "last_pct": round(100 * s.last_fraction, 1),
        "median_lateness_ms": _ms(s.median_lateness_ns),
        "median_lead_ms": _ms(s.median_lead_ns),
        "others_spread_ms": _ms(s.noise_ns),
        "delay_ms": _ms(s.delay_ns), "others_wait_ms": _ms(s.others_wait_ns),
        "steps_analysed": s.steps_analysed,
        "excess_per_step_ms": {k: _ms(v) for k, v in s.factors.items()},
        "host": ctx.host_of(s.rank),
        "share_pct": round(100 * share, 1),
        "share_from": "traced steps" if s.basis_share is None else basis_words(s.basis),
        "test": s.test,
        "basis": {"source": s.basis, "last_in": s.last, "instances": s.instances,
                  "steps": s.steps_analysed},
    }
    if s.counters.get("available"):
        ev["gpu"] = {k: v for k, v in s.counters.items() if k != "available"}
    cause = s.cause or "compute"
    verb = "is a straggler" if s.confidence == "confirmed" else "may be a straggler (suspected)"
    where = "" if s.basis == BASIS_TRACES else f" ({basis_words(s.basis)})"
    title = (f"Rank {s.rank} {verb} ({cause}): last at {s.last}/{s.instances} "
             f"collectives{where}, {ev['median_lead_ms']} ms behind the others' median")
    remedy = straggler_remedy(cause, device_type, traits, s.rank)
    return Finding("straggler", severity_of(share), title, [s.rank], s.steps, cause,
                   share * wall_ns / 1e6, ev, remedy, confidence=s.confidence)
