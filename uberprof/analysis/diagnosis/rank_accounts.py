"""How the findings account for each rank's exposed communication and idle time: the report
document's `ranks[].accounted`, which the terminal report reads to say what no finding explains.

Why: a finding's time at stake is wall time (ranks run in parallel, so a per-rank amount counts
once), and a reader comparing the per-rank table with the findings could not tell where the rest
of a rank's exposed time went (issue 48). Each producer states the part of each rank's own time
its finding explains (`Finding.accounts_for`, taking only what the findings before it left:
`Facts.claimed`); here they are summed per rank, and the remainder is named as unexplained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from uberprof.analysis.diagnosis.causes import WARMUP
from uberprof.analysis.diagnosis.model import Finding
from uberprof.analysis.diagnosis.rank_comm import RankComm

__all__ = ["EXPOSED", "IDLE", "PARTS", "rank_accounting", "waiting_for"]

EXPOSED, IDLE = "exposed_comm_ms", "idle_ms"  # the keys of `Finding.accounts_for`

# the document's part -> (the rank's own time in `analysed`, the key in `accounts_for`)
PARTS = {"exposed_comm": ("exposed_comm_ms", EXPOSED), "idle": ("idle_ms", IDLE)}


def _part(own: float, findings: list[Finding], rank: int, key: str, named: float = 0.0
          ) -> dict[str, Any]:
    by = [{"index": i, "kind": f.kind, "ms": round(float(ms), 3)}
          for i, f in enumerate(findings)
          if (ms := (f.accounts_for.get(str(rank)) or {}).get(key))]
    explained = sum(b["ms"] for b in by)
    return {"ms": round(own, 3), "by_findings": by,
            "unexplained_ms": round(max(own - explained - named, 0.0), 3)}


def _idle(r: dict[str, Any], findings: list[Finding]) -> dict[str, Any]:
    """The idle part: besides the findings', the warm-up gaps (one-time initialisation, named in
    the idle gaps and left out of the verdicts on purpose) are named, not unexplained; the idle
    time in no gap over the threshold (`in_short_gaps_ms`) is said apart within the rest."""
    own = float((r.get("analysed") or {}).get("idle_ms") or 0.0)
    by_cause = (r.get("idle_gaps") or {}).get("ms_by_cause") or {}
    warmup = min(float(by_cause.get(WARMUP) or 0.0), own)
    out = _part(own, findings, r["rank"], IDLE, warmup)
    out["warmup_ms"] = round(warmup, 3)
    out["in_short_gaps_ms"] = round(min(max(own - sum(float(v or 0.0) for v in
                                                     by_cause.values()), 0.0),
                                        out["unexplained_ms"]), 3)
    return out


def rank_accounting(ranks: list[dict[str, Any]], findings: list[Finding]
                    ) -> list[dict[str, Any]]:
    """`ranks` (the document's, in findings' final order) with each rank's `accounted` filled:
    per part its own time, the findings that explain some of it, and the unexplained rest."""
    for r in ranks:
        analysed = r.get("analysed") or {}
        if analysed.get("window_ms") in (None, 0, 0.0):
            continue
        r["accounted"] = {
            "exposed_comm": _part(float(analysed.get("exposed_comm_ms") or 0.0), findings,
                                  r["rank"], EXPOSED),
            "idle": _idle(r, findings)}
    return ranks


def waiting_for(comm: Mapping[int, RankComm], peers: set[int], names: set[str] | None,
                claimed: Callable[[int, str], float]) -> dict[str, dict[str, float]]:
    """`accounts_for` of a finding that explains the ranks' exposed waiting for `peers` (in
    collectives named `names`; all: None), less what earlier findings explain of each rank's
    exposed communication."""
    out: dict[str, dict[str, float]] = {}
    for r, rc in sorted(comm.items()):
        left = rc.exposed_ns / 1e6 - claimed(r, EXPOSED)
        ms = min(rc.wait_for(peers - {r}, names) / 1e6, left)
        if ms > 5e-4:
            out[str(r)] = {EXPOSED: round(ms, 3)}
    return out
