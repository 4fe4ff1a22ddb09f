"""Idle-gap findings: `data_stall`, `launch_bound` and `idle` (sync, host, other).

Each rank's idle gaps (`gaps.py`, found by the per-rank passes) are summed by cause; a cause
becomes a finding where some rank loses at least `MIN_SHARE` of its analysed time to it. Its
kind, label and remedy come from `causes.GAP_CAUSES`. Idle on the straggler is inside the delay
the straggler's finding counts: only the worst other rank's is this finding's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from uberprof.analysis.diagnosis.causes import GAP_CAUSES, WARMUP, gap_remedy
from uberprof.analysis.diagnosis.evidence import count_test, trace_more_hint
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.findings.kind import VERDICT, FindingKind, always
from uberprof.analysis.diagnosis.gaps import CAUSES, around_evidence, around_words
from uberprof.analysis.diagnosis.model import MIN_SHARE, Finding, ranks_text, severity_of
from uberprof.analysis.diagnosis.rank_accounts import IDLE as IDLE_MS
from uberprof.analysis.diagnosis.summaries import sql_rows
from uberprof.analysis.diagnosis.whatif_changes import Change
from uberprof.analysis.tables.metrics import analysed_ns
from uberprof.units import ns_to_ms as _ms
from uberprof.units import shorten

__all__ = ["KINDS", "idle_findings"]


def evidence_sentence(f: Finding) -> str:
    """Its gaps, idle time per rank (the four worst), its largest gap and what ran around
    the idle time."""
    e = f.evidence
    per = e.get("idle_ms_per_rank") or {}
    top = sorted(per.items(), key=lambda kv: -(kv[1] or 0))[:4]
    g = e.get("largest_gap") or {}
    return (f"{e.get('gaps')} gaps; idle ms per rank: "
            + ", ".join(f"{r}: {v}" for r, v in top)
            + (f"; largest {g.get('ms')} ms on rank {g.get('rank')} step {g.get('step')} "
               f"after {shorten(g.get('before'), 48, missing='-')}" if g else "")
            + around_words(e))


def _idle_change(f: Finding) -> tuple[Change | None, str]:
    if f.cause == "sync":
        return Change("sync"), ""
    return None, (f"no what-if change models idle time of cause '{f.cause}' (uberprof "
                  "whatif --op projects a faster operator)")


_GAPS, _REMEDY = "/gaps", "gap_remedy"
DATA_STALL = FindingKind(
    "data_stall", VERDICT, evidence_sentence, always(Change("data")), page=_GAPS,
    remedy_from=_REMEDY, summary="the device waits for the data loader",
    whatif="the data-loader waits removed (--remove data)")
LAUNCH_BOUND = FindingKind(
    "launch_bound", VERDICT, evidence_sentence, always(Change("launch")), page=_GAPS,
    remedy_from=_REMEDY, summary="the device waits for the host to launch work",
    whatif="launch overhead removed (--remove launch)")
IDLE = FindingKind(
    "idle", VERDICT, evidence_sentence, _idle_change, page=_GAPS, remedy_from=_REMEDY,
    summary="the device idles for another cause (sync, host work, other)",
    whatif="cause sync: its waits removed (--remove sync); other causes: none (whatif --op "
           "projects a faster operator)")
KINDS = (DATA_STALL, LAUNCH_BOUND, IDLE)


def idle_findings(facts: Facts) -> list[Finding]:
    """One finding per idle cause that costs some rank at least MIN_SHARE of its time; each
    explains its ranks' idle gaps of its cause (`accounts_for`), within their idle time."""
    found = _gap_findings(facts.gaps, facts.traced, facts.wall_ns, facts.first("straggler"),
                          facts.device_type, facts.traits)
    idle: dict[int, float] = {}
    for r, v in zip(facts.traced.column("rank").to_pylist(),
                    facts.traced.column("idle_ns").to_pylist()):
        idle[r] = idle.get(r, 0.0) + float(v or 0) / 1e6
    taken: dict[int, float] = {r: facts.claimed(r, IDLE_MS) for r in idle}
    for f in found:
        for r, ms in (f.evidence.get("idle_ms_per_rank") or {}).items():
            got = min(float(ms or 0.0), idle.get(int(r), 0.0) - taken.get(int(r), 0.0))
            if got > 5e-4:
                f.accounts_for[r] = {IDLE_MS: round(got, 3)}
                taken[int(r)] = taken.get(int(r), 0.0) + got
    return found


def _gap_findings(gaps: pa.Table, traced: pa.Table, wall_ns: int,
                  s_finding: Finding | None, device_type: str,
                  traits: dict[str, Any] | None = None) -> list[Finding]:
    """Idle gaps by cause: the worst rank's time (ranks run in parallel). Idle on the
    straggler is inside the delay its finding counts: only the worst other rank's is this
    finding's own, the rest links to the straggler. In stages: each rank's analysed time, the
    gaps summed by cause and rank, then one finding per cause."""
    if gaps.num_rows == 0 or not wall_ns:
        return []
    rank_time = _rank_time(traced)
    totals = _gap_totals(gaps)
    out = []
    for cause in CAUSES:
        if cause == WARMUP:  # named in each rank's idle gaps, never a steady-state verdict
            continue
        f = _cause_finding(cause, totals, rank_time, wall_ns, s_finding, device_type, traits)
        if f is not None:
            out.append(f)
    return out


def _rank_time(traced: pa.Table) -> dict[int, int]:
    """Per rank, its analysed wall time (its steps' host or device windows, whichever is longer:
    `metrics.analysed_ns`): the share is of each rank's own analysed time."""
    rank_time: dict[int, int] = {}
    for r, t in zip(traced.column("rank").to_pylist(), analysed_ns(traced).tolist()):
        rank_time[r] = rank_time.get(r, 0) + int(t)
    return rank_time


@dataclass
class _GapTotals:
    """The idle gaps summed by cause and rank, and each cause's largest gap."""

    by: dict[str, dict[int, int]]  # cause -> rank -> idle time (ns)
    steps_of: dict[str, dict[int, set[int]]]  # cause -> rank -> steps with such a gap
    counts: dict[str, int]  # cause -> gaps
    n_of: dict[tuple[str, int], int]  # (cause, rank) -> gaps
    largest: dict[str, dict[str, Any]]  # cause -> its largest gap (rank, step, ...)
    # cause -> (rank, activity before, activity after, idle ns, gaps) of its gaps
    around: dict[str, list[tuple[int, str | None, str | None, int, int]]]


def _gap_totals(gaps: pa.Table) -> _GapTotals:
    """The gaps of the run summed by cause and rank (one query), and each cause's largest."""
    t = _GapTotals(by={c: {} for c in CAUSES}, steps_of={c: {} for c in CAUSES},
                   counts={c: 0 for c in CAUSES}, n_of={}, largest={},
                   around={c: [] for c in CAUSES})
    for c, r, total, n, steps in sql_rows(
            "SELECT cause, rank, sum(dur_ns), count(*), list(DISTINCT step) FROM g "
            "GROUP BY cause, rank", g=gaps):
        t.by[c][r] = int(total)
        t.steps_of[c][r] = set(steps)
        t.counts[c] += int(n)
        t.n_of[(c, r)] = int(n)
    fields = ["cause", "rank", "step", "dur_ns", "before", "after"]
    for row in sql_rows("SELECT cause, arg_max(rank, dur_ns), arg_max(step, dur_ns), max(dur_ns), "
                    "arg_max(before, dur_ns), arg_max(after, dur_ns) FROM g GROUP BY cause",
                    g=gaps):
        t.largest[row[0]] = dict(zip(fields, row))
    for c, r, before, after, total, n in sql_rows(
            "SELECT cause, rank, before, after, sum(dur_ns), count(*) FROM g GROUP BY ALL",
            g=gaps):
        t.around[c].append((r, before, after, int(total), int(n)))
    return t


def _around(t: _GapTotals, cause: str, ranks: list[int]) -> dict[str, Any] | None:
    """The activity right before and right after the gaps of `cause` on `ranks`, by idle time
    (`gaps.around_evidence`: operators on CPU ranks, kernels on accelerator ranks)."""
    rows = [x for x in t.around[cause] if x[0] in ranks]
    return around_evidence([x[1] for x in rows], [x[2] for x in rows], [x[3] for x in rows],
                           [x[4] for x in rows])


def _cause_finding(cause: str, t: _GapTotals, rank_time: dict[int, int], wall_ns: int,
                   s_finding: Finding | None, device_type: str,
                   traits: dict[str, Any] | None = None) -> Finding | None:
    """The finding of one idle cause, or None where no rank loses MIN_SHARE of its analysed
    time to it (data wait on the straggler is the straggler finding's, not this one's). Its
    remedy is the first whose precondition holds on what the job already does (`traits`:
    `run.job_traits`, `causes.gap_remedy`)."""
    by = t.by[cause]
    s_rank = s_finding.ranks[0] if s_finding is not None else None
    ranks = sorted(r for r, v in by.items()
                   if rank_time.get(r) and v / rank_time[r] >= MIN_SHARE)
    if s_finding is not None and s_finding.cause == "data" and cause == "data":
        ranks = [r for r in ranks if r != s_rank]  # the straggler finding says it
    if not ranks:
        return None
    worst = max(ranks, key=lambda r: by[r])
    stake = by[worst]
    own = max((by[r] for r in ranks if r != s_rank), default=0)
    caused: list[dict[str, Any]] = []
    if s_finding is not None and stake > own:
        caused.append({"_ref": s_finding, "kind": "straggler", "ms": _ms(stake - own),
                       "part": f"idle on the straggler, rank {s_rank}: inside the delay "
                               "its finding counts"})
    share = own / wall_ns
    g = t.largest[cause]
    ev = {
        "idle_ms_per_rank": {str(r): _ms(by[r]) for r in ranks},
        "share_of_rank_time_pct": {str(r): round(100 * by[r] / rank_time[r], 1)
                                   for r in ranks},
        "gaps": t.counts[cause],
        "largest_gap": {"rank": g["rank"], "step": g["step"], "ms": _ms(g["dur_ns"]),
                        "before": g["before"], "after": g["after"]},
        "share_pct": round(100 * share, 1),
        "observed_share_pct": round(100 * stake / wall_ns, 1),
        "around": _around(t, cause, ranks),
    }
    c = GAP_CAUSES[cause]
    title = (f"Device idle {_ms(stake)} ms on {ranks_text([worst])} ({c.phrase}); "
             f"{len(ranks)} rank(s) affected")
    steps = sorted(set().union(*(t.steps_of[cause][r] for r in ranks)))
    confidence, test = count_test(
        f"idle gaps ({c.label}) on rank {worst}, {_ms(stake)} ms = "
        f"{ev['share_of_rank_time_pct'][str(worst)]}% of its analysed time (threshold "
        f"{100 * MIN_SHARE:.0f}%)", t.n_of[(cause, worst)], len(t.steps_of[cause][worst]))
    if confidence == "suspected":
        test.sentence += "; to confirm, " + trace_more_hint(steps)
    ev["test"] = test.as_dict()
    return Finding(c.kind, severity_of(share), title, ranks, steps, cause, own / 1e6,
                   ev, gap_remedy(c, device_type, traits), confidence=confidence,
                   observed_ms=stake / 1e6, caused_by=caused)
