"""uberprof's own findings as trace events, so the timeline shows what the report says.

Per rank, on tracks of its own process (on the aligned clock, like everything else):

- `idle gaps (uberprof)`: every idle gap over the threshold, named by its cause;
- `straggler waits (uberprof)`: when the diagnosis names a straggler, each other rank's wait
  for it in every collective it arrived last to, and on the straggler how late it came;
- `link-limited collectives (uberprof)`: the collectives of a class the diagnosis calls
  bandwidth-bound or latency-bound, with their busbw against the link's peak.

In a process of their own, first in the file: one track per finding (ranked as in the report)
spanning the steps it concerns (a hang or a crash: an instant at its moment), with its evidence
and remedy as arguments; the analysed steps; and the clock alignment of each host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from uberprof.analysis.diagnosis.causes import GAP_CAUSES, gap_cause
from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.units import fmt_bytes, ns_to_ms

__all__ = ["FINDINGS_PROCESS", "GAP_LABEL", "Mark", "global_marks", "rank_marks"]

CAT = "uberprof"
TRACK_GAPS = "idle gaps (uberprof)"
TRACK_WAITS = "straggler waits (uberprof)"
TRACK_LINK = "link-limited collectives (uberprof)"
TRACK_P2P = "send/recv (uberprof)"
RANK_TRACKS = (TRACK_GAPS, TRACK_WAITS, TRACK_LINK, TRACK_P2P)
P2P_FLOW_BASE = 1 << 40  # flow ids of send -> recv arrows, apart from the traces' own
FINDINGS_PROCESS = "findings (uberprof)"  # the run-wide marks' process

GAP_LABEL = {k: f"idle: {c.label}" for k, c in GAP_CAUSES.items()}
# The findings of a moment (the diagnosis's failure kinds): an instant, not a range.



@dataclass
class Mark:
    """One event of uberprof's own: a range (dur >= 0) or an instant (dur None), aligned ns."""

    track: str
    ts: int
    dur: int | None
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    flow: tuple[str, int] | None = None  # ("s" | "f", id): an arrow from this mark or to it
    flow_at: int | None = None  # where on the mark the arrow binds (aligned ns; its start)


def _in(step: int | None, steps: tuple[int, int] | None) -> bool:
    return steps is None or step is None or steps[0] <= step <= steps[1]


def rank_marks(d: Diagnosis, ranks: Iterable[int],
               steps: tuple[int, int] | None = None) -> dict[int, list[Mark]]:
    """The per-rank marks (see the module doc) of `ranks`, within `steps` when given."""
    want = set(ranks)
    out: dict[int, list[Mark]] = {r: [] for r in want}
    offsets = d.alignment.offsets()
    for g in d.gaps.to_pylist():
        r = g["rank"]
        if r not in want or not _in(g["step"], steps):
            continue
        out[r].append(Mark(TRACK_GAPS, g["start_ns"] + offsets.get(r, 0), g["dur_ns"],
                           f"idle: {gap_cause(g['cause']).label}",
                           {"cause": g["cause"], "step": g["step"], "idle_ms": ns_to_ms(g["dur_ns"]),
                            "before": g["before"], "after": g["after"],
                            "what": "device idle longer than the gap threshold (uberprof)"},
                           g["step"]))
    inst = d.alignment.apply(d.matched.instances, ("start_ns", "end_ns")) \
        if d.matched.instances.num_rows else d.matched.instances
    by_instance: dict[int, list[dict[str, Any]]] = {}
    for row in inst.to_pylist():
        by_instance.setdefault(row["instance"], []).append(row)
    if d.straggler is not None:
        _straggler_marks(d, by_instance, want, steps, out)
    _link_marks(d, by_instance, want, steps, out)
    _group_marks(d, by_instance, want, steps, out)
    _p2p_marks(d, want, steps, out)
    return out


def _group_marks(d: Diagnosis, by_instance: dict[int, list[dict[str, Any]]], want: set[int],
                 steps: tuple[int, int] | None, out: dict[int, list[Mark]]) -> None:
    """On a run with several process groups (a device mesh), each matched collective on a
    track of its group's mesh dimension ("tp collectives (uberprof)"), so a 2-D job's
    tensor-parallel and data-parallel communication sit on separate rows."""
    groups = d.run["comm_by_group"]
    if len(groups) < 2:
        return
    dims = {g["group"]: g.get("dim") or f"group {g['group']}" for g in groups}
    for iid, rows in by_instance.items():
        for x in rows:
            if x["rank"] not in want or not _in(x["step"], steps):
                continue
            dim = dims.get(x["grp"], f"group {x['grp']}")
            out[x["rank"]].append(Mark(
                f"{dim} collectives (uberprof)", x["start_ns"], x["end_ns"] - x["start_ns"],
                f"{x['name']} {fmt_bytes(x['in_bytes'], missing='? B')}",
                {"group": x["grp"], "dim": dim, "instance": iid, "step": x["step"],
                 "participants": x["participants"],
                 "what": "a collective uberprof matched within its process group"}, x["step"]))


def _p2p_marks(d: Diagnosis, want: set[int], steps: tuple[int, int] | None,
               out: dict[int, list[Mark]]) -> None:
    """Each matched send and its receive, with an arrow from one to the other; the receive
    says how long it waited for the send to be posted (a pipeline's bubble) and how long the
    transfer took after."""
    if d.p2p is None or d.p2p.num_rows == 0:
        return
    for p in d.p2p.to_pylist():
        if not _in(p["step"], steps):
            continue
        size = fmt_bytes(p["bytes"], missing="? B")
        args = {"from": p["src"], "to": p["dst"], "bytes": p["bytes"], "step": p["step"],
                "pair": p["pair"],
                "recv_waiting_ms": ns_to_ms(p["wait_ns"]) if p["wait_ns"] is not None else None,
                "transfer_ms": ns_to_ms(p["transfer_ns"]) if p["transfer_ns"] is not None
                else None,
                "what": "a send and the receive uberprof matched to it"}
        fid = P2P_FLOW_BASE + p["pair"]
        if p["src"] in want:
            out[p["src"]].append(Mark(TRACK_P2P, p["send_start_ns"],
                                      max(p["send_end_ns"] - p["send_start_ns"], 0),
                                      f"send {size} to rank {p['dst']}", dict(args), p["step"],
                                      flow=("s", fid) if p["dst"] in want else None))
        if p["dst"] in want:
            out[p["dst"]].append(Mark(TRACK_P2P, p["recv_start_ns"],
                                      max(p["recv_end_ns"] - p["recv_start_ns"], 0),
                                      f"recv {size} from rank {p['src']}", dict(args),
                                      p["step"],
                                      flow=("f", fid) if p["src"] in want else None,
                                      # the data flows once both sides have posted
                                      flow_at=min(max(p["recv_start_ns"], p["send_start_ns"]),
                                                  p["recv_end_ns"])))


def _straggler_marks(d: Diagnosis, by_instance: dict[int, list[dict[str, Any]]], want: set[int],
                     steps: tuple[int, int] | None, out: dict[int, list[Mark]]) -> None:
    s = d.straggler
    assert s is not None
    cause = s.cause or "compute"
    lat = d.lateness
    alone = set(lat.filter(pc.and_(pc.equal(lat.column("rank"), s.rank),
                                   pc.equal(lat.column("sole_last"), True)))
                .column("instance").to_pylist()) if lat.num_rows else set()
    for iid, rows in by_instance.items():
        if iid not in alone or len(rows) < 2:
            continue  # only where the straggler alone arrived last (its `last_in`)
        last = max(rows, key=lambda x: x["start_ns"])
        step = last["step"]
        if not _in(step, steps):
            continue
        first = min(x["start_ns"] for x in rows)
        what = f"{last['name']} (step {step})"
        for x in rows:
            r = x["rank"]
            if r == s.rank or r not in want:
                continue
            end = min(last["start_ns"], x["end_ns"])
            if end <= x["start_ns"]:
                continue
            out[r].append(Mark(TRACK_WAITS, x["start_ns"], end - x["start_ns"],
                               f"waiting for rank {s.rank}",
                               {"collective": what, "instance": iid, "wait_ms":
                                ns_to_ms(end - x["start_ns"]), "straggler": s.rank,
                                "straggler_cause": cause, "confidence": s.confidence,
                                "test": (s.test or {}).get("sentence")}, step))
        if s.rank in want and last["start_ns"] > first:
            out[s.rank].append(Mark(TRACK_WAITS, first, last["start_ns"] - first,
                                    f"late: the others wait (straggler, {cause})",
                                    {"collective": what, "instance": iid,
                                     "late_ms": ns_to_ms(last["start_ns"] - first),
                                     "cause": cause, "confidence": s.confidence,
                                     "test": (s.test or {}).get("sentence")}, step))


def _link_marks(d: Diagnosis, by_instance: dict[int, list[dict[str, Any]]], want: set[int],
                steps: tuple[int, int] | None, out: dict[int, list[Mark]]) -> None:
    bound = {(c.grp, c.name, c.bytes, c.link): c for c in d.classes
             if c.verdict in ("bandwidth-bound", "latency-bound")}
    if not bound or d.bandwidth.num_rows == 0:
        return
    for b in d.bandwidth.to_pylist():
        c = bound.get((b["grp"], b["name"], b["bytes"], b["link"]))
        if c is None or not _in(b["step"], steps):
            continue
        cd = c.as_dict()
        busbw = b["busbw_Bps"] * 8 / 1e9 if b["busbw_Bps"] else None
        args = {"verdict": c.verdict, "collective": b["name"], "bytes": b["bytes"],
                "link": c.link, "link_kind": c.link_kind,
                "busbw_gbit_s": round(busbw, 3) if busbw is not None else None,
                "class_busbw_gbit_s": cd["busbw_gbit_s"], "peak_gbit_s": cd["peak_gbit_s"],
                "peak_source": cd["peak_source"], "class_of_peak_pct": cd["busbw_of_peak_pct"],
                "instance": b["instance"], "step": b["step"],
                "transfer_ms": ns_to_ms(b["t_ns"]) if b.get("t_ns") is not None else None,
                "transfer_basis": b.get("t_basis"), "confidence": cd.get("confidence")}
        label = f"{c.verdict}: {b['name']} {fmt_bytes(b['bytes'], missing='? B')}"
        if busbw is not None:
            label += f" at {busbw:.2f} Gbit/s"
            if cd["peak_gbit_s"]:
                label += f" of {cd['peak_gbit_s']:g}"
        for x in by_instance.get(b["instance"], []):
            if x["rank"] in want:
                out[x["rank"]].append(Mark(TRACK_LINK, x["start_ns"],
                                           x["end_ns"] - x["start_ns"], label, args, b["step"]))


def _moment_mark(track: str, f: Any, moment: int, window: tuple[int, int]) -> Mark:
    """A hang or crash as an instant at its moment (when the others began to wait, when the
    first rank failed); one outside the exported window sits at its nearer edge, saying so."""
    lo, hi = window
    at = min(max(moment, lo), hi)
    note = None if at == moment else ("after" if moment > hi else "before") + \
        " the exported window"
    return Mark(track, at, None, f.title,
                {"kind": f.kind, "cause": f.cause, "ranks": f.ranks, "moment_ns": moment,
                 "where": note or "at this moment", "evidence_sentence": f.evidence_sentence,
                 "details": f.details, "remedy": f.remedy})


def global_marks(d: Diagnosis, window: tuple[int, int],
                 steps: tuple[int, int] | None = None,
                 ranks: Iterable[int] | None = None) -> list[Mark]:
    """The findings process: a track per finding, the analysed steps, the clock alignment.
    `window` (aligned ns) spans the export; findings are clipped to it."""
    out: list[Mark] = []
    want = set(ranks) if ranks is not None else None
    st = d.alignment.apply(d.steps, ("host_start_ns", "host_end_ns")) if d.steps.num_rows \
        else d.steps
    rows = [r for r in st.to_pylist() if r["host_start_ns"] is not None
            and r["host_end_ns"] is not None and _in(r["step"], steps)
            and (want is None or r["rank"] in want)]
    lo, hi = window
    for n, f in enumerate(d.findings, 1):
        sel = [r for r in rows if (not f.steps or r["step"] in f.steps)
               and (not f.ranks or r["rank"] in f.ranks)]
        a = min((r["host_start_ns"] for r in sel), default=lo)
        b = max((r["host_end_ns"] for r in sel), default=hi)
        a, b = max(a, lo), min(b, hi)
        if b < a:
            continue
        track = f"{n}. [{f.severity}] {f.kind}" + (f" ({f.cause})" if f.cause else "") + \
            ("" if f.confidence == "confirmed" else f" {f.confidence}")
        moment = f.evidence.get("moment_ns") if f.role == "failure" else None
        if isinstance(moment, int):
            out.append(_moment_mark(track, f, moment, window))
            continue
        out.append(Mark(track, a, b - a, f.title,
                        {"kind": f.kind, "severity": f.severity, "cause": f.cause,
                         "confidence": f.confidence,
                         "evidence_sentence": f.evidence_sentence,
                         "test": (f.evidence.get("test") or {}).get("sentence"),
                         "time_at_stake_ms": round(f.time_at_stake_ms, 3), "ranks": f.ranks,
                         "caused_by": f.caused_by,
                         "steps": f.steps, "remedy": f.remedy, "evidence": f.evidence}))
    per_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        per_step.setdefault(r["step"], []).append(r)
    for s, rs in sorted(per_step.items()):
        # the step timeline's windows may start before the trace window does: clip to it
        a = max(min(r["host_start_ns"] for r in rs), lo)
        b = min(max(r["host_end_ns"] for r in rs), hi)
        if b < a:
            continue
        slowest = max(rs, key=lambda r: r["host_end_ns"] - r["host_start_ns"])
        out.append(Mark("analysed steps (all ranks)", a, b - a,
                        f"step {s}" if s >= 0 else "whole trace",
                        {"step": s, "ranks": len(rs), "slowest_rank": slowest["rank"],
                         "slowest_ms": ns_to_ms(slowest["host_end_ns"] - slowest["host_start_ns"])},
                        s))
    for h in d.alignment.hosts:
        label = (f"{h.host}: reference clock" if h.method == "reference" else
                 f"{h.host}: {h.offset_ns / 1e6:+.3f} ms"
                 + (f" ± {h.error_bound_ns / 1e6:.3f} ms (error bound)"
                    if h.error_bound_ns is not None else "") + f" ({h.method})")
        out.append(Mark("clock alignment", lo, None, label, h.as_dict()))
    return out

