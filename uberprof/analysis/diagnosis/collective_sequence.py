"""What each rank issued, in order, and where the ranks departed from one another.

From the Flight Recorder's collectives of a group by sequence number: who is pending where, who
is behind and the mismatches at one number (`sequence_frontier`); what the ranks usually issue
in one step (`usual_step`: the most common sequence over the steps every rank finished); and
where one call departs from it (`departure_of`). The hang and crash findings decide a culprit
from these, never from a rank's index, and say them in the same words (`mismatch_text`,
`ranks_word`), kept here for both.
"""

from __future__ import annotations

import bisect
from typing import Any

from uberprof.analysis.diagnosis.failure_evidence import RankEvidence
from uberprof.rundir.failures import Collective

__all__ = ["RECENT", "collective_text", "departure_of", "mismatch_text", "ranks_word",
           "recorded_departures", "sequence_frontier", "sizes_text", "usual_step"]

RECENT = 8  # collectives shown per rank


def collective_text(c: dict[str, Any]) -> str:
    sizes = "x".join(str(s) for s in c["sizes"][0]) if c.get("sizes") and \
        isinstance(c["sizes"][0], list) else str(c.get("sizes"))
    dtype = c["dtypes"][0] if c.get("dtypes") else "?"
    return f"{c['op']} #{c['seq']} of {c['process_group']} ([{sizes}] {dtype})"


def sequence_frontier(ranks: dict[int, RankEvidence], reason: str) -> dict[str, Any]:
    """Per group, from the Flight Recorder dumps made for `reason`: the collectives the ranks
    are pending in, who is behind, who skipped, and the mismatches at equal sequence numbers
    (each with the ranks that departed from their own usual step, `_mismatch`)."""
    with_fr = {r: ev.flight[reason] for r, ev in ranks.items() if reason in ev.flight}
    groups: dict[str, dict[int, list[Collective]]] = {}
    for r, calls in with_fr.items():
        for c in calls:
            if not c.is_p2p:
                groups.setdefault(c.group, {}).setdefault(r, []).append(c)
    waits: list[dict[str, Any]] = []
    behind: dict[int, dict[str, Any]] = {}
    mismatches: list[dict[str, Any]] = []
    pending_of = {r: next((c for c in calls if not c.completed), None)
                  for r, calls in with_fr.items()}
    for g, per in groups.items():
        by_seq: dict[int, dict[int, Collective]] = {}
        for r, cs in per.items():
            for c in cs:
                by_seq.setdefault(c.seq, {})[r] = c
        usual = usual_step(ranks, per)
        culprits: set[int] = set()
        for seq, calls in sorted(by_seq.items()):
            m = _mismatch(g, seq, calls, ranks, per, usual)
            if m is not None:
                mismatches.append(m)
                culprits |= set(m["ranks"])
        top = max(by_seq)
        at_top = by_seq[top]
        # the collective the others wait in: an innocent rank's call, and only the ranks that
        # issued that same call (a rank that issued another one at this number waits in its own)
        innocent = {r: c for r, c in at_top.items() if r not in culprits} or at_top
        first = min(innocent.values(), key=lambda c: c.time_ns or 0)
        same = {r for r, c in at_top.items() if _signature(c) == _signature(first)}
        if not first.completed:
            waits.append({**first.as_dict(), "ranks": sorted(same),
                          "since_ns": min((at_top[r].time_ns for r in same
                                           if at_top[r].time_ns), default=None)})
            for r in set(with_fr) - set(at_top):
                if r not in per and len(groups) > 1:
                    continue  # not a member of that group
                last = max((c for c in per.get(r, [])), key=lambda c: c.seq, default=None)
                other = pending_of.get(r)
                behind[r] = {"process_group": g, "missing_seq": top,
                             "last_seq": last.seq if last else None,
                             "pending_elsewhere": other.as_dict() if other is not None and
                             other.group != g else None}
    return {"waits": waits, "behind": behind, "mismatches": mismatches}


def _signature(c: Collective) -> tuple[str, str, str]:
    return (c.op, _shape(c.sizes), _shape(c.dtypes))


def _steps_of(ev: RankEvidence, calls: list[Collective]) -> list[int | None]:
    """The step each collective was issued in, from the rank's step ends (a collective issued
    after the end of step s-1 and before that of step s belongs to step s); None where the
    rank has no step timeline or the collective no time."""
    rows = ev.step_ends()
    if not rows:
        return [None] * len(calls)
    ends = [t for t, _ in rows]
    out: list[int | None] = []
    for c in calls:
        if not c.time_ns:
            out.append(None)
            continue
        i = bisect.bisect_left(ends, c.time_ns)
        out.append(rows[i][1] if i < len(rows) else rows[-1][1] + 1)
    return out


def _by_step(ranks: dict[int, RankEvidence], per: dict[int, list[Collective]]
             ) -> dict[int, dict[int, list[Collective]]]:
    """Per rank, its collectives of one group by the step it issued them in."""
    out: dict[int, dict[int, list[Collective]]] = {}
    for r, cs in per.items():
        steps = _steps_of(ranks[r], cs)
        for c, s in zip(cs, steps, strict=True):
            if s is not None:
                out.setdefault(r, {}).setdefault(s, []).append(c)
    return out


def usual_step(ranks: dict[int, RankEvidence], per: dict[int, list[Collective]]
                ) -> dict[str, Any] | None:
    """What the ranks of a group usually issue in one step: the most common sequence of
    collectives (op, sizes, dtypes) over the steps every rank finished, with `by_step` (per
    rank, its collectives by step); None without two finished steps to compare."""
    by_step = _by_step(ranks, per)
    counts: dict[tuple[Any, ...], int] = {}
    example: dict[tuple[Any, ...], list[Collective]] = {}
    for r, steps in by_step.items():
        last = ranks[r].last_step
        for s, cs in steps.items():
            if last is not None and s <= last and s > min(steps):  # finished, not the first
                key = tuple(_signature(c) for c in cs)
                counts[key] = counts.get(key, 0) + 1
                example.setdefault(key, cs)
    if not counts:
        return None
    pattern = max(counts, key=lambda k: counts[k])
    return {"pattern": pattern, "steps_seen": sum(counts.values()), "by_step": by_step,
            "calls": [{"op": c.op, "sizes": c.sizes, "dtypes": c.dtypes}
                      for c in example[pattern]]}


def departure_of(r: int, c: Collective, usual: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where rank r's call c departs from the group's usual step: {step, position, expected}
    (expected None: the usual step has no collective there), or None when it is what the rank
    and the others issued at that point of earlier steps; None also without history."""
    if usual is None:
        return None
    steps = usual["by_step"].get(r, {})
    step = next((s for s, cs in steps.items() if c in cs), None)
    if step is None:
        return None
    calls = steps[step]
    pos = calls.index(c)
    pattern = usual["pattern"]
    for i, x in enumerate(calls[:pos + 1]):
        if i >= len(pattern) or _signature(x) != pattern[i]:
            return {"step": step, "position": i, "seq": x.seq, "issued": x.op,
                    "issued_sizes": x.sizes,
                    "expected": usual["calls"][i] if i < len(pattern) else None}
    return None


def _mismatch(g: str, seq: int, calls: dict[int, Collective], ranks: dict[int, RankEvidence],
              per: dict[int, list[Collective]], usual: dict[str, Any] | None
              ) -> dict[str, Any] | None:
    """The mismatch at one sequence number, or None: the ranks that departed (`ranks`), how
    that was decided (`decided_by`): `history` (their call departs from what they and the
    others issued at that point of earlier steps, and the others' does not), `majority` (no
    history tells them apart; the others issued one same call and outnumber them), or
    `undecided` (nothing tells them apart: every rank at the mismatch is named)."""
    sig = {r: _signature(c) for r, c in calls.items()}
    if len(set(sig.values())) < 2:
        return None
    departs = {r: d for r, c in calls.items() if (d := departure_of(r, c, usual)) is not None}
    counts: dict[Any, int] = {}
    for s in sig.values():
        counts[s] = counts.get(s, 0) + 1
    ranked = sorted(counts.values(), reverse=True)
    if departs and len(departs) < len(calls):
        odd, how = sorted(departs), "history"
    elif ranked[0] > ranked[1]:
        common = max(counts, key=lambda s: counts[s])
        odd, how = sorted(r for r, s in sig.items() if s != common), "majority"
    else:
        odd, how = sorted(calls), "undecided"
    ref = next((sig[r] for r in sorted(calls) if r not in odd), None)
    what = [k for k, i in (("collective", 0), ("sizes", 1), ("dtypes", 2))
            if len({s[i] for s in sig.values()}) > 1 and (ref is None or
                                                         any(sig[r][i] != ref[i] for r in odd))]
    return {"process_group": g, "seq": seq, "differs_in": what, "ranks": odd,
            "decided_by": how, "departures": {str(r): d for r, d in sorted(departs.items())},
            "usual_step": usual["calls"] if usual else None,
            "calls": {str(r): calls[r].as_dict() for r in sorted(calls)}}


def _shape(v: list[Any]) -> str:
    return repr(v)


def recorded_departures(ranks: dict[int, RankEvidence], reason: str
                   ) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """From the Flight Recorder dumps made for `reason`: the ranks whose last step departs
    from the usual step of a group (`departure_of`, at its last collective), and those whose last
    step keeps to it in every group they had collectives in."""
    groups: dict[str, dict[int, list[Collective]]] = {}
    for r, ev in ranks.items():
        for c in ev.flight.get(reason, []):
            if not c.is_p2p:
                groups.setdefault(c.group, {}).setdefault(r, []).append(c)
    departed: dict[int, dict[str, Any]] = {}
    judged: set[int] = set()
    for g, per in groups.items():
        usual = usual_step(ranks, per)
        if usual is None:
            continue
        for r, cs in per.items():
            d = departure_of(r, cs[-1], usual)
            judged.add(r)
            if d is not None and r not in departed:
                departed[r] = {**d, "process_group": g}
    return departed, judged - set(departed)


def mismatch_text(m: dict[str, Any], named: bool = True) -> str:
    """A mismatch in words: who departed and from what, or that nothing tells them apart
    (`named`: ending with the ranks that departed)."""
    head = f"mismatch at #{m['seq']} of {m['process_group']}: "
    calls = m["calls"]
    if m.get("decided_by") == "undecided":
        return head + "; ".join(f"rank {r} issued {c['op']} {sizes_text(c)}"
                                for r, c in calls.items()) + \
            f" (nothing tells them apart: {ranks_word(m['ranks'])} named)"
    odd = m["ranks"]
    issued = sorted({f"{calls[str(r)]['op']} {sizes_text(calls[str(r)])}" for r in odd})
    others = sorted({f"{c['op']} {sizes_text(c)}" for r, c in calls.items() if int(r) not in odd})
    text = head + f"{ranks_word(odd)} issued {' / '.join(issued)} where " + \
        (f"the others issued {' / '.join(others)}" if others else "the others did not")
    if m.get("decided_by") == "history":
        exp = next((d.get("expected") for d in m["departures"].values()), None)
        text += " and every earlier step had " + (f"{exp['op']} {sizes_text(exp)}" if exp
                                                  else "no collective") + " there"
    return text + (f" ({ranks_word(odd)} departed)" if named else "")


def sizes_text(c: dict[str, Any]) -> str:
    sizes = c.get("sizes") or []
    return "[" + ", ".join("x".join(map(str, s)) if isinstance(s, list) else str(s)
                           for s in sizes) + "]"


def ranks_word(ranks: list[int]) -> str:
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
