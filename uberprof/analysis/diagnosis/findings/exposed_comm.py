"""The `exposed_comm` finding: communication not hidden under compute, that every rank pays.

Per step the least exposed rank's time counts (what every rank pays), split into waiting for
peers (linked to the straggler's finding) and transfer (linked to a latency- or
bandwidth-bound class's finding), so that no millisecond is counted twice. Runs after the
straggler and bandwidth producers, whose findings it links to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from uberprof.analysis.diagnosis.bandwidth import BandwidthClass
from uberprof.analysis.diagnosis.causes import exposed_comm_remedy
from uberprof.analysis.diagnosis.evidence import count_test
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind, always
from uberprof.analysis.diagnosis.gaps import around_evidence, around_words
from uberprof.analysis.diagnosis.model import MIN_SHARE, Finding, ranks_text, severity_of
from uberprof.analysis.diagnosis.rank_accounts import EXPOSED
from uberprof.analysis.diagnosis.rank_comm import RankComm
from uberprof.analysis.diagnosis.summaries import sql_rows
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.units import ns_to_ms as _ms

__all__ = ["KINDS", "exposed_comm_findings"]

MAX_RANKS = 8  # ranks listed in the per-rank part


def evidence_sentence(f: Finding) -> str:
    """What every rank pays, split into waiting for peers and transfer, its share of the
    communication and what ran around it."""
    e = f.evidence
    return (f"{e.get('exposed_ms_all_ranks_pay')} ms exposed on every rank "
            f"({e.get('wait_ms')} ms waiting for peers, {e.get('transfer_ms')} ms "
            f"transfer), {e.get('exposed_of_comm_pct')}% of its communication"
            + around_words(e) + _ranks_words(e))


def _ranks_words(e: dict[str, Any]) -> str:
    """The per-rank part in words: the ranks that pay more, whom they wait for and where."""
    rows = e.get("per_rank") or []
    if not rows:
        return ""
    said = []
    for r in rows[:4]:
        waits = ", ".join(
            f"{w['ms']} ms for {'rank ' + str(w['peer']) if w['peer'] is not None else 'peers'}"
            f" in {w['name']}" + (f" ({w['group']})" if w["group"] not in ("default",) else "")
            for w in r["waits_for"][:2])
        said.append(f"rank {r['rank']} {r['exposed_ms']} ms (+{r['more_than_least_ms']}: "
                    + (f"waiting {waits}; " if waits else "")
                    + f"{r['transfer_ms']} ms transfer"
                    + (f", {r['unmatched_ms']} ms in unmatched calls" if r["unmatched_ms"]
                       else "") + ")")
    return (f"; ranks paying more than the least ({e.get('least_rank_exposed_ms')} ms): "
            + "; ".join(said))


KINDS = (FindingKind(
    "exposed_comm", VERDICT, evidence_sentence, always(Change("exposed-comm")),
    summary="communication not hidden under compute that every rank pays",
    whatif="communication hidden where the graph allows (--remove exposed-comm)",
    page="/communication", remedy_from="exposed_comm_remedy"),)


def exposed_comm_findings(facts: Facts) -> list[Finding]:
    """At most one finding: the exposed communication of the analysed steps that every rank
    completed (`complete_steps`)."""
    traced, left_out = complete_steps(facts.traced, failed_in(facts.found))
    left = {r: rc.exposed_ns - facts.claimed(r, EXPOSED) * 1e6
            for r, rc in facts.rank_comm.items()}
    force = max(left.values(), default=0.0) >= 2 * MIN_SHARE * facts.wall_ns
    found = _exposed_comm_findings(traced, facts.lateness, facts.wall_ns, facts.classes,
                                   facts.first("straggler"), facts.of_kind("bandwidth"),
                                   exposed_comm_remedy(facts.parallelism.kinds, facts.traits),
                                   facts.p2p.per_rank_step() if facts.p2p else None,
                                   facts.first("pipeline_imbalance"), left_out,
                                   facts.exposed_around, force)
    for f in found:
        _per_rank_part(f, facts.rank_comm, left, facts.wall_ns)
        _link_alltoall(f, facts.first("alltoall_imbalance"), facts.rank_comm)
    return found


def _link_alltoall(f: Finding, a2a: Finding | None, comm: dict[int, RankComm]) -> None:
    """Where no straggler or pipeline stage holds the waiting every rank pays, the part of it
    that is waiting at the all-to-alls for the ranks an `alltoall_imbalance` finding names is
    that finding's (`caused_by`): the waiting's share, on the least exposed rank, that is for
    them there."""
    if a2a is None or not comm or any(c["kind"] in ("straggler", "pipeline_imbalance")
                                      for c in f.caused_by):
        return
    least = min(comm.values(), key=lambda rc: rc.exposed_ns)
    frac = least.wait_for(set(a2a.ranks), {"alltoall"}) / least.wait_ns if least.wait_ns else 0.0
    ms = min(float(f.evidence.get("wait_ms") or 0.0) * frac, a2a.time_at_stake_ms,
             f.time_at_stake_ms)
    if ms >= 1e-3:
        f.caused_by.insert(0, {"_ref": a2a, "kind": a2a.kind, "ms": round(ms, 3),
                               "part": "waiting at the all-to-alls for their heavy or late "
                                       "ranks"})
        f.time_at_stake_ms -= ms


def _per_rank_part(f: Finding, comm: dict[int, RankComm], left: dict[int, float],
                   wall_ns: int) -> None:
    """The finding's per-rank part: the ranks that pay much more exposed communication than the
    least exposed one (at least MIN_SHARE of the analysed time more), each with its waiting by
    the peer that arrived last and the collective, and its transfer (`rank_comm`); and what it
    explains of every rank's exposed time: what the findings before it left (`accounts_for`)."""
    least = min((rc.exposed_ns for rc in comm.values()), default=0.0)
    more = sorted((rc for rc in comm.values() if rc.exposed_ns - least >= MIN_SHARE * wall_ns),
                  key=lambda rc: -rc.exposed_ns)
    rows = []
    for rc in more[:MAX_RANKS]:
        d = rc.as_dict()
        rows.append({"rank": rc.rank, "exposed_ms": d["exposed_ms"],
                     "more_than_least_ms": _ms(rc.exposed_ns - least),
                     "wait_ms": d["wait_ms"], "transfer_ms": d["transfer_ms"],
                     "unmatched_ms": d["unmatched_ms"], "waits_for": d["top_waits"][:3],
                     "explained_by_earlier_findings_ms":
                         _ms(max(rc.exposed_ns - left.get(rc.rank, rc.exposed_ns), 0.0))})
    f.evidence["per_rank"] = rows
    f.evidence["least_rank_exposed_ms"] = _ms(least)
    if rows:
        top = rows[0]
        w = top["waits_for"][0] if top["waits_for"] else None
        mostly = (f"mostly waiting for "
                  f"{'rank ' + str(w['peer']) if w['peer'] is not None else 'its peers'} "
                  f"in {w['name']}" if w and top["wait_ms"] >= top["exposed_ms"] / 2 else
                  f"{top['transfer_ms']} ms of it transfer, {top['wait_ms']} ms waiting")
        if top["unmatched_ms"]:  # calls no peer's matched: a dead or departed peer's share
            mostly += f", {top['unmatched_ms']} ms in calls no peer matched"
        f.title += (f"; {ranks_text([r['rank'] for r in rows])} "
                    f"{'pays' if len(rows) == 1 else 'pay up to'} "
                    f"{top['more_than_least_ms']} ms more (rank {top['rank']}: {mostly})")
    f.accounts_for = {str(r): {EXPOSED: _ms(v)} for r, v in sorted(left.items()) if v > 5e2}


def failed_in(found: list[Finding]) -> int | None:
    """The first step a rank failed in (a crash: the step after the first failed rank's last
    finished one; a hang: the step the stuck ranks never finished), None when none failed or
    the step is not known."""
    steps = [s for f in found if f.role == "failure" for s in f.steps
             if isinstance(s, int)]
    return min(steps, default=None)


def complete_steps(traced: pa.Table, failed_step: int | None
                   ) -> tuple[pa.Table, dict[int, str]]:
    """The traced steps a claim about every rank may rest on, and why the others are left out
    (step -> reason). A step counts when every traced rank has it and it lies before the step a
    rank failed in: a rank that died inside its trace window leaves a partial last step, or
    none, and the survivors' same step is spent waiting for the dead peer, so the least exposed
    rank of such a step is one survivor's wait, not what every rank pays."""
    if traced.num_rows == 0:
        return traced, {}
    ranks = set(traced.column("rank").to_pylist())
    have: dict[int, set[int]] = {}
    for r, s in zip(traced.column("rank").to_pylist(), traced.column("step").to_pylist()):
        have.setdefault(s, set()).add(r)
    left: dict[int, str] = {}
    for s, rs in sorted(have.items()):
        if failed_step is not None and s >= failed_step:
            left[s] = f"at or after step {failed_step}, where a rank failed"
        elif rs != ranks:
            left[s] = f"not traced on rank(s) {', '.join(map(str, sorted(ranks - rs)))}"
    if not left:
        return traced, {}
    keep = pa.array([s not in left for s in traced.column("step").to_pylist()], pa.bool_())
    return traced.filter(keep), left


def _around(around: pa.Table | None, counted: set[tuple[int, int]]) -> dict[str, Any] | None:
    """The compute right before and right after the exposed communication counted (per step,
    the least exposed rank's), by exposed time (`gaps.around_evidence`)."""
    if around is None or not around.num_rows:
        return None
    rows = [x for x in zip(*(around.column(c).to_pylist()
                             for c in ("rank", "step", "before", "after", "dur_ns", "n")))
            if (x[0], x[1]) in counted]
    return around_evidence([x[2] for x in rows], [x[3] for x in rows], [x[4] for x in rows],
                           [x[5] for x in rows])


def _wait_transfer(lat: pa.Table, p2p_split: dict[tuple[int, int], tuple[int, int]] | None
                   ) -> dict[tuple[int, int], tuple[float, float]]:
    """Per (rank, step), its collective time before and after the last arrival (and its
    send/recv time before and after both sides posted)."""
    split: dict[tuple[int, int], tuple[float, float]] = {}
    if lat.num_rows:
        for r, st, w, t in sql_rows("SELECT rank, step, sum(wait_ns), sum(transfer_ns) FROM l "
                                    "GROUP BY rank, step", l=lat):
            split[(r, st)] = (float(w or 0), float(t or 0))
    for key, (w, t) in (p2p_split or {}).items():
        a = split.get(key, (0.0, 0.0))
        split[key] = (a[0] + w, a[1] + t)
    return split


@dataclass
class _Paid:
    """What every rank pays: per step the least exposed rank's exposed time, summed, its
    waiting part, the least communication time, the steps with any, and the rank-steps
    counted."""

    stake: float = 0.0
    wait: float = 0.0
    comm: int = 0
    steps: list[int] = field(default_factory=list)
    counted: set[tuple[int, int]] = field(default_factory=set)
    ranks: list[int] = field(default_factory=list)
    n_steps: int = 0


def _everyone_pays(traced: pa.Table, split: dict[tuple[int, int], tuple[float, float]]
                   ) -> _Paid:
    """Per step, the least exposed rank's exposed communication (what every rank pays), its
    waiting part in the proportion of that rank's wait and transfer (`split`)."""
    per_step: dict[int, list[tuple[int, int, int]]] = {}
    for r, s, x, c in zip(*(traced.column(k).to_pylist()
                            for k in ("rank", "step", "exposed_comm_ns", "comm_ns"))):
        per_step.setdefault(s, []).append((r, x or 0, c or 0))
    out = _Paid(ranks=sorted({r for rows in per_step.values() for r, _, _ in rows}),
                n_steps=len(per_step))
    for s, rows in per_step.items():
        r_least, least, _ = min(rows, key=lambda x: x[1])
        out.counted.add((r_least, s))
        out.stake += least
        w, t = split.get((r_least, s), (0.0, 0.0))
        out.wait += least * w / (w + t) if w + t > 0 else 0.0
        out.comm += min(c for _, _, c in rows)
        if least > 0:
            out.steps.append(s)
    return out


def _links(wait: float, transfer: float, straggler_finding: Finding | None,
           pipeline_finding: Finding | None, bandwidth: list[Finding]) -> list[dict[str, Any]]:
    """The parts another finding already counts (`caused_by`): the wait the straggler's (or
    the slowest pipeline stage's), the transfer the bandwidth classes'."""
    caused: list[dict[str, Any]] = []
    if straggler_finding is not None and wait > 0:
        caused.append({"_ref": straggler_finding, "kind": "straggler", "ms": _ms(wait),
                       "part": "waiting for the straggler"})
    elif pipeline_finding is not None and wait > 0:
        caused.append({"_ref": pipeline_finding, "kind": pipeline_finding.kind,
                       "ms": _ms(min(wait, pipeline_finding.time_at_stake_ms * 1e6)),
                       "part": "stages waiting for the slowest stage"})
    left = transfer
    for b in bandwidth:
        take = min(left, b.time_at_stake_ms * 1e6)
        if take > 0:
            caused.append({"_ref": b, "kind": b.kind, "ms": _ms(take),
                           "part": f"transfer of a {b.cause} class"})
            left -= take
    return caused


def _exposed_comm_findings(traced: pa.Table, lat: pa.Table, wall_ns: int,
                           classes: list[BandwidthClass], straggler_finding: Finding | None,
                           bandwidth: list[Finding], remedy: str | None = None,
                           p2p_split: dict[tuple[int, int], tuple[int, int]] | None = None,
                           pipeline_finding: Finding | None = None,
                           left_out: dict[int, str] | None = None,
                           around: pa.Table | None = None, force: bool = False
                           ) -> list[Finding]:
    """Communication not hidden under compute that every rank pays (per step, the least
    exposed rank's), so that waiting for a straggler is not counted twice. Split into waiting
    for peers and transfer in the proportion of that rank's collective time before and after
    the last arrival (for sends and receives, `p2p_split`: before and after both sides posted);
    the wait is a straggler's or an unbalanced pipeline's when there is one, the transfer a
    latency- or bandwidth-bound class's when there is one (`caused_by`). `remedy`: the one that
    fits the run's parallelism (`causes.exposed_comm_remedy`). `left_out`: steps left out as
    incomplete (`complete_steps`), said in the evidence and its test. `around`: each rank's
    exposed communication by the compute right before and after it (gaps.AROUND_SCHEMA); the
    evidence names those of the rank-steps counted. `force`: a rank's own exposed time
    that no earlier finding explains is over the threshold, so the finding is made (for its
    per-rank part) even where what every rank pays is under it."""
    if traced.num_rows == 0 or not wall_ns:
        return []
    t = _everyone_pays(traced, _wait_transfer(lat, p2p_split))
    stake, wait, comm_total, steps, counted = t.stake, t.wait, t.comm, t.steps, t.counted
    share = stake / wall_ns
    if share < MIN_SHARE * 2 and not force:
        return []
    transfer = stake - wait
    ranks = t.ranks
    bound = [c.as_dict() for c in classes if c.verdict in ("bandwidth-bound", "latency-bound")]
    caused = _links(wait, transfer, straggler_finding, pipeline_finding, bandwidth)
    own = stake - sum(c["ms"] * 1e6 for c in caused)
    n_steps = t.n_steps
    ev = {"exposed_ms_all_ranks_pay": _ms(stake),
          "wait_ms": _ms(wait), "transfer_ms": _ms(transfer),
          "comm_ms_least_rank": _ms(comm_total),
          "exposed_of_comm_pct": round(100 * stake / comm_total, 1) if comm_total else None,
          "share_pct": round(100 * share, 1),
          "limited_collectives": bound[:3],
          "around": _around(around, counted)}
    note = ""
    if left_out:
        ev["steps_left_out"] = {str(k): v for k, v in sorted(left_out.items())}
        note = (f"; step(s) {', '.join(map(str, sorted(left_out)))} left out, not complete on "
                "every rank")
    confidence, test = count_test(
        f"communication not hidden under compute on every rank: {_ms(stake)} ms "
        f"({ev['share_pct']}% of the analysed time; threshold {200 * MIN_SHARE:.0f}%), of which "
        f"{_ms(wait)} ms waiting for peers and {_ms(transfer)} ms transfer{note}",
        len(steps), n_steps)
    ev["test"] = test.as_dict()
    title = (f"Communication not hidden under compute: {_ms(stake)} ms "
             f"({ev['share_pct']}% of the analysed time) on every rank "
             f"({_ms(wait)} ms waiting for peers, {_ms(transfer)} ms transfer)")
    return [Finding("exposed_comm", severity_of(share), title, ranks, sorted(steps), None,
                    max(own, 0.0) / 1e6, ev, remedy or exposed_comm_remedy(()),
                    confidence=confidence,
                    observed_ms=stake / 1e6, caused_by=caused)]
