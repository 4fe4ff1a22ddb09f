"""The `alltoall_imbalance` finding: all-to-alls whose ranks are unequal, in the data they move
(unequal splits: an expert or an embedding shard that gets more tokens or rows) or in when they
arrive (one rank's work before the all-to-all longer than the others'), naming the ranks that
cause it.

Why its own finding: in an all-to-all every rank waits for every other, so one rank with more
tokens or more work holds all of them, every time; the exposed-communication finding sees only
what every rank pays, and the straggler test, which weighs every collective of the run alike,
may name no one when the imbalance lives in the all-to-alls alone.

The two tests, on the matched all-to-all instances of the analysed steps:

- **unequal splits**: per instance, each rank's bytes (the larger of what it sends and what it
  receives, where the trace records both); an instance is unequal when its largest rank moves
  at least `UNEQUAL` times the instance's mean. The heavy ranks are those largest in at least
  half of the unequal instances, counted when the unequal instances are at least
  `MIN_INSTANCES` and a quarter of the all-to-alls.
- **unequal arrival from unequal work**: a rank alone last at least `LAST_SHARE` of the
  all-to-alls it took part in, with a chance under 1% for a healthy rank (Poisson-binomial,
  Bonferroni over ranks: `lateness.sole_last_frequency`), whose compute over the analysed steps
  is at least `MORE_WORK` over the others' median (late without more work is a slower or
  shared host: the straggler test's to judge, with its materiality and busy-time tests).

A finding needs either, and the all-to-alls' waiting must matter: some rank's exposed waiting
at the all-to-alls (`rank_comm`) at least MIN_SHARE of the analysed time. Both
together, over at least MIN_STEPS steps, are `confirmed`; one alone is `suspected` (splits
without a late rank: who holds the others is not shown; a late rank with equal or unrecorded
splits: unequal work, not measured directly). Its time at stake is the delay the late ranks
alone add at the all-to-alls (`lateness.delay_ns`; without a late rank, each instance's last
arrival's); the part of a rank the straggler finding already names is linked to it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from uberprof.analysis.diagnosis.causes import alltoall_imbalance_remedy
from uberprof.analysis.diagnosis.evidence import MIN_STEPS, Test
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind
from uberprof.analysis.diagnosis.lateness import sole_last_frequency
from uberprof.analysis.diagnosis.model import MIN_SHARE, Finding, ranks_text, severity_of
from uberprof.analysis.diagnosis.rank_accounts import waiting_for
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.units import ns_to_ms as _ms

__all__ = ["A2A", "KINDS", "alltoall_imbalance_findings"]

A2A = "alltoall"  # the canonical name of every all-to-all spelling (ingest.classify)
UNEQUAL = 1.25  # an instance's largest rank moves >= 1.25x the mean: unequal splits
MIN_INSTANCES = 4  # unequal instances, and all-to-alls a late rank took part in, at least
LAST_SHARE = 0.75  # a late rank is alone last at >= 3 of 4 of its all-to-alls
P_LATE = 0.01  # ... with a corrected chance under 1% for a healthy rank
MORE_WORK = 0.10  # ... and computes >= 10% more than the others' median: unequal work


def evidence_sentence(f: Finding) -> str:
    """Its splits, its late ranks and who waits for them, in numbers."""
    e = f.evidence
    parts = []
    s = e.get("splits") or {}
    if s.get("heavy_ranks"):
        parts.append(f"unequal splits in {s.get('unequal')}/{s.get('instances')} all-to-alls "
                     f"(largest rank up to {s.get('max_ratio')}x the mean, median "
                     f"{s.get('median_ratio')}x), heaviest {ranks_text(s['heavy_ranks'])}")
    for r in e.get("late_ranks") or []:
        parts.append(f"rank {r['rank']} alone last at {r['last_in']}/{r['instances']} "
                     f"all-to-alls (chance {r['chance']}) with {r['more_work_pct']}% more "
                     f"compute than the others' median, adds {r['delay_ms']} ms")
    w = e.get("others_wait_ms") or {}
    if w:
        parts.append("exposed waiting for them: " + ", ".join(
            f"{v} ms on rank {k}" for k, v in list(w.items())[:4]))
    return "; ".join(parts)


def _change(f: Finding) -> tuple[Change | None, str]:
    late = [r["rank"] for r in f.evidence.get("late_ranks") or []]
    if late:
        return Change("straggler", rank=int(late[0])), ""
    return None, ("unequal splits without a late rank: the replay keeps each rank's measured "
                  "work and cannot move tokens or rows between ranks")


KINDS = (FindingKind(
    "alltoall_imbalance", VERDICT, evidence_sentence, _change, page="/communication",
    remedy_from="alltoall_imbalance_remedy",
    summary="all-to-alls whose ranks move unequal data or arrive unequally late, with the "
            "ranks that cause it",
    whatif="the latest rank's extra work at the others' median (--remove straggler); none "
           "where only the splits are unequal"),)


@dataclass
class _Splits:
    """The all-to-alls' bytes per rank: instances, unequal ones, heaviest rank counts, ratios."""

    instances: int = 0
    ratios: list[float] = field(default_factory=list)  # of the unequal instances
    heavy: Counter[int] = field(default_factory=Counter)

    def heavy_ranks(self) -> list[int]:
        n = len(self.ratios)
        if n < max(MIN_INSTANCES, self.instances / 4):
            return []
        return sorted(r for r, k in self.heavy.items() if k >= n / 2)

    def as_dict(self) -> dict[str, Any]:
        return {"instances": self.instances, "unequal": len(self.ratios),
                "threshold_ratio": UNEQUAL,
                "median_ratio": round(float(np.median(self.ratios)), 2) if self.ratios else None,
                "max_ratio": round(max(self.ratios), 2) if self.ratios else None,
                "heaviest_in": {str(r): k for r, k in sorted(self.heavy.items())},
                "heavy_ranks": self.heavy_ranks()}


def _splits(inst: pa.Table | None) -> _Splits:
    out = _Splits()
    if inst is None or inst.num_rows == 0:
        return out
    per: dict[int, dict[int, int]] = {}
    for i, r, name, b_in, b_out in zip(*(inst.column(c).to_pylist() for c in
                                         ("instance", "rank", "name", "in_bytes", "out_bytes"))):
        if name == A2A:
            per.setdefault(i, {})[r] = max(b_in or 0, b_out or 0)
    for sizes in per.values():
        if len(sizes) < 2:
            continue
        out.instances += 1
        mean = sum(sizes.values()) / len(sizes)
        top = max(sizes.values())
        if mean > 0 and top >= UNEQUAL * mean:
            out.ratios.append(top / mean)
            out.heavy.update(r for r, b in sizes.items() if b == top)
    return out


def _late(lat: pa.Table) -> tuple[list[dict[str, Any]], dict[int, int], int]:
    """The ranks alone last at the all-to-alls beyond chance (`LAST_SHARE`, `P_LATE`), each
    with its counts and the delay it alone adds (ns); the delay of every instance's last
    arrival by rank; the number of all-to-all instances."""
    a = lat.filter(pa.compute.equal(lat.column("name"), A2A)) if lat.num_rows else lat
    if a.num_rows == 0:
        return [], {}, 0
    rank = a.column("rank").to_numpy()
    sole = a.column("sole_last").to_numpy(zero_copy_only=False).astype(bool)
    n_part = a.column("participants").to_numpy()
    delay = a.column("delay_ns").to_numpy()
    ranks = sorted(set(rank.tolist()))
    delay_of = {r: int(delay[(rank == r) & sole].sum()) for r in ranks}
    late = []
    for r in ranks:
        k, n, p = sole_last_frequency(rank == r, sole, n_part)
        p_corr = min(1.0, p * len(ranks))
        if n >= MIN_INSTANCES and k >= LAST_SHARE * n and p_corr <= P_LATE:
            late.append({"rank": r, "last_in": k, "instances": n,
                         "p_value": float(f"{p_corr:.3g}"),
                         "chance": "< 0.1%" if p_corr < 1e-3 else f"{100 * p_corr:.1f}%",
                         "delay_ms": _ms(delay_of[r])})
    return late, delay_of, len(set(a.column("instance").to_pylist()))


def alltoall_imbalance_findings(facts: Facts) -> list[Finding]:
    """At most one finding: the all-to-alls' unequal splits or arrivals, with the ranks that
    cause them (module docstring)."""
    if not facts.wall_ns or facts.lateness.num_rows == 0:
        return []
    splits = _splits(facts.instances)
    late, delay_of, n_inst = _late(facts.lateness)
    _with_work(late, facts.traced)
    late = [r for r in late if r["more_work_pct"] is not None and
            r["more_work_pct"] >= 100 * MORE_WORK]
    causing = {r["rank"] for r in late} | set(splits.heavy_ranks())
    if not causing:
        return []
    at_a2a = max((rc.wait_for(set(facts.rank_comm), {A2A})
                  for rc in facts.rank_comm.values()), default=0.0)
    if at_a2a < MIN_SHARE * facts.wall_ns:  # the all-to-alls' waiting does not matter
        return []
    waits = {r: rc.wait_for(causing, {A2A}) for r, rc in facts.rank_comm.items()}
    return [_finding(facts, splits, late, delay_of, n_inst, causing, waits)]


def _with_work(late: list[dict[str, Any]], traced: pa.Table) -> None:
    """Each late rank's compute over the analysed steps beyond the others' median, in % (null
    where unknown): arriving late from more work, not from a slower or shared host alone."""
    work: dict[int, float] = {}
    for r, c in zip(traced.column("rank").to_pylist(), traced.column("compute_ns").to_pylist()):
        work[r] = work.get(r, 0.0) + float(c or 0)
    for x in late:
        others = [v for r, v in work.items() if r != x["rank"]]
        med = float(np.median(others)) if others else 0.0
        x["more_work_pct"] = (round(100 * (work.get(x["rank"], 0.0) / med - 1), 1)
                              if med > 0 else None)


def _test(splits: _Splits, late: list[dict[str, Any]], n_steps: int, n_inst: int
          ) -> tuple[str, Test]:
    both = bool(splits.heavy_ranks()) and bool(late)
    confirmed = both and n_steps >= MIN_STEPS
    said = []
    if splits.heavy_ranks():
        said.append(f"unequal splits (largest rank >= {UNEQUAL}x the mean) in "
                    f"{len(splits.ratios)} of {splits.instances} all-to-alls")
    else:
        said.append(f"splits equal or not recorded ({len(splits.ratios)} unequal of "
                    f"{splits.instances})")
    said += [f"rank {r['rank']} alone last at {r['last_in']} of {r['instances']} (chance "
             f"{r['chance']}, corrected), {r['more_work_pct']}% more compute" for r in late] or [
        "no rank alone last beyond chance with more work"]
    why = "" if confirmed else (
        "; suspected: " + (f"fewer than {MIN_STEPS} steps" if both else
                           "only one of unequal splits and a late rank is shown"))
    return ("confirmed" if confirmed else "suspected",
            Test(name="unequal all-to-all splits and sole-last frequency at the all-to-alls",
                 statistic="; ".join(said), instances=n_inst,
                 threshold=(f"splits: >= {UNEQUAL}x the mean in >= {MIN_INSTANCES} and a "
                            f"quarter of the all-to-alls; arrival: alone last >= "
                            f"{LAST_SHARE:.0%} with corrected p <= {P_LATE} and >= "
                            f"{MORE_WORK:.0%} more compute; both over >= "
                            f"{MIN_STEPS} steps to confirm"),
                 sentence="; ".join(said) + f", over {n_steps} step(s)" + why))


def _finding(facts: Facts, splits: _Splits, late: list[dict[str, Any]],
             delay_of: dict[int, int], n_inst: int, causing: set[int],
             waits: dict[int, float]) -> Finding:
    late_ranks = {r["rank"] for r in late}
    delay = sum(delay_of[r] for r in late_ranks) if late_ranks else sum(delay_of.values())
    # wall time: the worst rank's exposed waiting for them (ranks run in parallel), at most
    # the delay their arrivals add
    stake = min(float(delay), max(waits.values()))
    caused: list[dict[str, Any]] = []
    s = facts.first("straggler")
    if s is not None and s.ranks and s.ranks[0] in causing:
        part = max(facts.rank_comm[r].wait_for({s.ranks[0]}, {A2A}) for r in facts.rank_comm)
        if part > 0:
            caused.append({"_ref": s, "kind": "straggler", "ms": _ms(min(part, stake)),
                           "part": f"waiting for rank {s.ranks[0]} at the all-to-alls, inside "
                                   "the straggler's delay"})
    own = max(stake - sum(c["ms"] for c in caused) * 1e6, 0.0)
    steps = sorted(set(facts.lateness.filter(pa.compute.equal(
        facts.lateness.column("name"), A2A)).column("step").to_pylist()))
    confidence, test = _test(splits, late, len(steps), n_inst)
    ranks = sorted(causing | set(splits.heavy_ranks()))
    ev = {"splits": splits.as_dict(), "late_ranks": late,
          "others_wait_ms": {str(r): _ms(w) for r, w in
                             sorted(waits.items(), key=lambda kv: -kv[1]) if w > 0},
          "delay_ms": _ms(delay), "share_pct": round(100 * own / facts.wall_ns, 1),
          "test": test.as_dict()}
    who = ", ".join(f"rank {r['rank']} alone last at {r['last_in']}/{r['instances']}"
                    for r in late) or "no rank consistently last"
    verb = "" if confidence == "confirmed" else " (suspected)"
    title = (f"All-to-all imbalance{verb} caused by {ranks_text(ranks)}: "
             + (f"unequal splits (up to {ev['splits']['max_ratio']}x the mean), "
                if splits.heavy_ranks() else "") + f"{who}; others wait "
             f"{_ms(max(waits.values()))} ms for them")
    f = Finding("alltoall_imbalance", severity_of(own / facts.wall_ns), title, ranks, steps,
                None, own / 1e6, ev, alltoall_imbalance_remedy(facts.traits),
                confidence=confidence, observed_ms=stake / 1e6, caused_by=caused)
    f.accounts_for = waiting_for(facts.rank_comm, causing, {A2A}, facts.claimed)
    return f
