"""The `hang` finding: from what the watchdog recorded (`nodes/<node>/hang.json`), which ranks
are stuck, frozen or departed, and where the others wait.

For each rank the record has its last finished step, its Python stacks (the helper thread's
`hang.json`, else faulthandler's `stacks.txt`) and the Flight Recorder's collectives. Per process
group, the *frontier* is the highest sequence number any rank issued
(`collective_sequence.sequence_frontier`): a member whose last collective there is below it never
joined: it is **stuck** (where its stack says), and the others **wait** in the frontier's
collective. A member pending in another group's collective *skipped* one; a mismatch at one
sequence number names the rank that departed from its usual step. A live rank that answered
nothing (stopped, in the kernel, swapped out) is **frozen**, named with its last step and last
known collective. Without Flight Recorder data, ranks outside torch.distributed while others are
inside it are stuck; failing that, those with the fewest steps.
"""

from __future__ import annotations

import time
from typing import Any

from uberprof.analysis.diagnosis.causes import FROZEN_REMEDY, HANG_REMEDY, MISMATCH_REMEDY
from uberprof.analysis.diagnosis.collective_sequence import (
    RECENT,
    collective_text,
    mismatch_text,
    ranks_word,
    sequence_frontier,
)
from uberprof.analysis.diagnosis.failure_evidence import (
    RankEvidence,
    frames_lines,
    in_distributed,
    where,
)
from uberprof.analysis.diagnosis.findings.kind import failure_kind
from uberprof.analysis.diagnosis.model import Finding
from uberprof.rundir.flight_log import read_flight_log

__all__ = ["FROZEN_STATES", "HANG", "hang_finding"]


def evidence_sentence(f: Finding) -> str:
    """How long no step finished, by which timeout, on which nodes, and what was done."""
    e = f.evidence
    return (f"no step finished for {e.get('timeout_s')} s ({e.get('timeout_source')} "
            f"timeout) on node(s) {', '.join(e.get('nodes') or [])}; action "
            f"{e.get('action')}" + (" (steps resumed later)" if e.get("resumed_ns") else ""))


def details(f: Finding) -> list[str]:
    """The stuck and departed ranks' stacks, the collective the others wait in, and each
    mismatch of the collective sequences."""
    e = f.evidence
    out: list[str] = []
    for r in e.get("ranks") or []:
        if r.get("state") in ("stuck", "departed") and r.get("stack"):
            out.append(f"rank {r['rank']} ({r['state']}, last step {r.get('last_step')}), "
                       "main thread:")
            out += frames_lines(r.get("stack") or [])
    w = e.get("waiting_in")
    if w:
        out.append(f"the others wait in {w.get('op')} #{w.get('seq')} of "
                   f"{w.get('process_group')}, sizes {w.get('sizes')} {w.get('dtypes')}")
    for m in e.get("mismatches") or []:
        calls = "; ".join(f"rank {k}: {c['op']} {c['sizes']} {c['dtypes']}"
                          for k, c in (m.get("calls") or {}).items())
        out.append(f"mismatch at #{m['seq']} of {m['process_group']}: {calls}")
    return out


HANG = failure_kind("hang", evidence_sentence, details, "HANG_REMEDY",
                    "no step finished for longer than the hang timeout: the stuck rank, where, "
                    "why")

def hang_finding(ranks: dict[int, RankEvidence], hangs: list[dict[str, Any]]
                  ) -> Finding | None:
    """The `hang` finding of the watchdog's records (module docstring), or None without one.
    In stages: the first record and each rank's state in it, the Flight Recorder's frontier,
    the stuck ranks, each rank's document, then the title and the cause."""
    if not hangs:
        return None
    rec = min(hangs, key=lambda h: h.get("detected_ns") or 0)
    state = {int(x["rank"]): x for h in hangs for x in h.get("ranks") or []
             if isinstance(x, dict) and isinstance(x.get("rank"), int)}
    fr = sequence_frontier(ranks, "hang")
    in_hang = [r for r in ranks if r in state]
    frozen = _frozen_ranks(ranks, state, in_hang)
    stuck = sorted(set(_stuck_ranks(ranks, state, fr, in_hang)) | set(frozen))
    departed = sorted({r for m in fr["mismatches"] for r in m["ranks"]})
    rank_docs = _hang_rank_docs(ranks, state, in_hang, stuck, frozen, departed)
    waits = fr["waits"]
    waiting_in = max(waits, key=lambda w: len(w["ranks"])) if waits else None
    since = (waiting_in or {}).get("since_ns") or rec.get("last_progress_ns")
    detected = rec.get("detected_ns")
    resumed = rec.get("resumed_ns")
    title = _hang_title(ranks, rec, fr, stuck, waiting_in, since, frozen)
    cause = "mismatch" if fr["mismatches"] else \
        "skipped_collective" if any(fr["behind"].get(r, {}).get("pending_elsewhere")
                                    for r in stuck) else "frozen_rank" if frozen else \
        "stuck_rank" if stuck else "unknown"
    named = sorted(set(stuck) | set(departed))
    stalled_ns = ((resumed or detected or 0) - (rec.get("last_progress_ns") or 0))
    steps = sorted({ev.last_step + 1 for r, ev in ranks.items()
                    if r in named and ev.last_step is not None})
    return Finding(
        kind="hang", severity="high", title=title, ranks=named, steps=steps, cause=cause,
        # The stall lies after the analysed steps: it is evidence, not time at stake in them
        # (the findings' stakes add up to at most the analysed wall time; a hang ranks first).
        time_at_stake_ms=0.0,
        evidence={
            "stalled_ms": round(max(stalled_ns, 0) / 1e6, 3),
            "moment_ns": since, "detected_ns": detected,
            "last_progress_ns": rec.get("last_progress_ns"),
            "since_ns": since, "resumed_ns": resumed, "timeout_s": rec.get("timeout_s"),
            "timeout_source": rec.get("timeout_source"), "action": rec.get("action"),
            "nodes": sorted({h["node"] for h in hangs}),
            "stuck_ranks": stuck,
            "frozen_ranks": frozen,
            "departed_ranks": departed,
            "waiting_in": waiting_in,
            "mismatches": fr["mismatches"],
            "ranks": rank_docs,
        },
        remedy=MISMATCH_REMEDY if fr["mismatches"] else
        FROZEN_REMEDY if cause == "frozen_rank" else HANG_REMEDY)


def _stuck_ranks(ranks: dict[int, RankEvidence], state: dict[int, dict[str, Any]],
                 fr: dict[str, Any], in_hang: list[int]) -> list[int]:
    """The stuck ranks, from the best evidence there is: behind the Flight Recorder's frontier;
    else dead in the watchdog's record; else outside torch.distributed while others are
    inside it; else those with the fewest steps (when not all have as few)."""
    stuck = sorted(fr["behind"])
    if not stuck:
        stuck = sorted(r for r in in_hang if not state[r].get("alive"))
    if not stuck:
        stacks = {r: ranks[r].main_stack() for r in in_hang}
        inside = {r for r, s in stacks.items() if s and in_distributed(s)}
        if inside and len(inside) < len(stacks):
            stuck = sorted(set(stacks) - inside)
    if not stuck and in_hang:
        least = min(ranks[r].steps for r in in_hang)
        if any(ranks[r].steps != least for r in in_hang):
            stuck = sorted(r for r in in_hang if ranks[r].steps == least)
    return stuck


def _frozen_ranks(ranks: dict[int, RankEvidence], state: dict[int, dict[str, Any]],
                  in_hang: list[int]) -> list[int]:
    """The ranks alive but frozen: they answered neither the watchdog's request nor its
    capture signal (no stacks), or /proc showed them stopped (SIGSTOP, a debugger) or in the
    kernel. A record without `answered` (an older run) names none."""
    return sorted(r for r in in_hang if state[r].get("alive") and
                  state[r].get("answered") is False and not ranks[r].hang and
                  (not state[r].get("stacks") or
                   state[r].get("process_state") in FROZEN_STATES))


FROZEN_STATES = {"T": "stopped (SIGSTOP, a debugger)", "t": "stopped by a tracer",
                 "D": "in the kernel (uninterruptible sleep)"}


def _last_known(ev: RankEvidence, ranks: dict[int, RankEvidence]) -> dict[str, Any] | None:
    """A frozen rank's last known collective: the newest of its own Flight Recorder dumps and
    always-on arrivals (flight-recorder.jsonl), and of the collectives the others' hang dumps
    show completed (a collective completes only once every member joined it), or None."""
    best: dict[str, Any] | None = None

    def offer(c: dict[str, Any], source: str) -> None:
        nonlocal best
        if c.get("time_ns") and (best is None or c["time_ns"] > (best["time_ns"] or 0)):
            best = {**c, "from": source}

    for calls in ev.flight.values():
        for c in calls:
            offer(c.as_dict(), "own_flight_recorder")
    log = read_flight_log(ev.meta.folder)
    for a in (log.arrivals if log is not None else []):
        group = a.group if not a.group.isdigit() else f"group {a.group}"
        offer({"process_group": group, "seq": a.seq, "op": a.op, "time_ns": a.time_ns},
              "own_flight_log")
    for r, other in ranks.items():
        if r != ev.rank:
            for c in other.flight.get("hang", []):
                if c.completed and not c.is_p2p:
                    offer(c.as_dict(), f"completed_with_rank_{r}")
    return best


def _hang_rank_docs(ranks: dict[int, RankEvidence], state: dict[int, dict[str, Any]],
                    in_hang: list[int], stuck: list[int], frozen: list[int],
                    departed: list[int]) -> list[dict[str, Any]]:
    """One document per rank of the hang (every rank where the record names none): its
    state, last step, stack and where it stopped, and its pending and recent collectives;
    for a frozen rank its process state and last known collective."""
    rank_docs = []
    for r in sorted(in_hang or ranks):
        ev = ranks[r]
        stack = ev.main_stack()
        calls = ev.flight.get("hang", [])
        pending = next((c for c in calls if not c.completed), None)
        extra: dict[str, Any] = {}
        if r in frozen:
            extra = {"process_state": state[r].get("process_state"),
                     "answered": state[r].get("answered"),
                     "last_collective": _last_known(ev, ranks)}
        rank_docs.append({
            "rank": r, "alive": state.get(r, {}).get("alive"),
            "exited_during_capture": state.get(r, {}).get("exited_during_capture"),
            "last_step": ev.last_step,
            "last_step_end_ns": ev.last_step_end_ns, **extra,
            "state": "frozen" if r in frozen else "stuck" if r in stuck else
            "departed" if r in departed else "waiting" if pending else "unknown",
            "where": where(stack), "stack": stack,
            "collective": pending.as_dict() if pending is not None else None,
            "recent_collectives": [c.as_dict() for c in calls[-RECENT:]],
            "stacks_from": "helper" if ev.hang else "signal" if ev.stacks else None,
        })
    return rank_docs


def _hang_title(ranks: dict[int, RankEvidence], rec: dict[str, Any], fr: dict[str, Any],
                stuck: list[int], waiting_in: dict[str, Any] | None, since: int | None,
                frozen: list[int]) -> str:
    """The hang in one line: the frozen ranks and their last known place, where the stuck
    ranks stopped, the collective the others wait in and since when, a collective skipped,
    the first mismatch and who departed, and how long until it resumed."""
    stuck_where = {r: where(ranks[r].main_stack()) for r in stuck}
    state = {int(x["rank"]): x for x in rec.get("ranks") or []
             if isinstance(x, dict) and isinstance(x.get("rank"), int)}
    parts = []
    if frozen:
        parts.append(", ".join(_frozen_text(r, ranks, state.get(r, {})) for r in frozen))
    if [r for r in stuck if r not in frozen]:
        parts.append(", ".join(f"rank {r}" + (f" stopped in {stuck_where[r]}"
                                              if stuck_where[r] else "")
                               for r in stuck if r not in frozen))
    if waiting_in is not None:
        others = [r for r in waiting_in["ranks"] if r not in stuck]
        parts.append(f"{ranks_word(others)} {'waits' if len(others) == 1 else 'wait'} in "
                     f"{collective_text(waiting_in)}"
                     + (f" since {_clock(since)}" if since else ""))
    for r in stuck:
        elsewhere = fr["behind"].get(r, {}).get("pending_elsewhere")
        if elsewhere:
            parts.append(f"rank {r} skipped it and waits in {collective_text(elsewhere)}")
    if fr["mismatches"]:
        parts.append(mismatch_text(fr["mismatches"][0]))
    resumed = rec.get("resumed_ns")
    if not parts:
        timeout = rec.get("timeout_s")
        parts.append("no rank finished a step" + (f" for {timeout:g} s" if isinstance(
            timeout, (int, float)) else "") + "; the evidence names no rank")
    return "Hang: " + "; ".join(parts) + \
        (f" (resumed after {(resumed - rec['last_progress_ns']) / 1e9:.0f} s)"
         if isinstance(resumed, int) and isinstance(rec.get("last_progress_ns"), int) else "")


def _frozen_text(r: int, ranks: dict[int, RankEvidence], st: dict[str, Any]) -> str:
    ev = ranks[r]
    how = FROZEN_STATES.get(st.get("process_state") or "", "not answering (swapped out, or "
                            "in the kernel)")
    text = f"rank {r} is frozen: {how}, it never answered the watchdog"
    place = []
    if ev.last_step is not None:
        place.append(f"after step {ev.last_step}")
    last = _last_known(ev, ranks)
    if last is not None:
        place.append(f"last collective {last['op']} #{last['seq']} of {last['process_group']}")
    return text + (f" ({', '.join(place)})" if place else "")


def _clock(ns: int | None) -> str | None:
    if not ns:
        return None
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) + f".{ns % 10**9 // 10**6:03d}"
