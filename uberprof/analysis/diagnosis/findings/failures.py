"""Hangs and crashes, judged from the run directory alone (no trace needed): which rank, where,
and why, as `hang` and `crash` findings that the advisor ranks before every other finding and
that `uberprof report` gives also for a run without any trace window.

A **hang** is what the watchdog recorded (`nodes/<node>/hang.json`). For each rank it has the
last finished step, the Python stacks (the helper thread's `hang.json`, else faulthandler's
`stacks.txt`) and the Flight Recorder's collectives. Per process group, the *frontier* is the
highest sequence number any rank issued; a member whose last collective there is below it never
joined: it is **stuck** (where its stack says), and the others **wait** in the frontier's
collective, since it was issued. A member pending in another group's collective *skipped* one;
ranks that issued different collectives, sizes or dtypes at one sequence number are a
**mismatch**, and the rank that *departed* is decided from evidence, never from an index: the
one whose call differs from what it and the others issued at that point of earlier steps (each
rank's collectives placed in its steps), else the outnumbered one, else every rank there is
named. A live rank that answered nothing (stopped, in the kernel, swapped out) is **frozen**,
named with its last step and last known collective. Without Flight Recorder data, ranks outside
torch.distributed while others are inside it are stuck; failing that, those with the fewest
steps.

A **crash** is a rank that ended abnormally: an uncaught exception (`exceptions.jsonl`), a fatal
signal (`fatal.txt`), an exit status the launcher saw (`exits-*.jsonl`), or no end recorded at
all. The *first failure* is found by kind, then by time: an exception, fatal signal or
non-SIGTERM signal is a cause; a rank that only lost its connection to a dead peer
("Connection reset by peer", ...) or was terminated by its launcher (SIGTERM) is a *victim*;
a rank that stopped without any record comes in between (SIGKILL, e.g. the OOM killer, leaves
none inside the rank). Ranks stopped by `--on-hang stop` are not crashes. A crash in a
collective after the ranks departed from one another is reported as that **desync**, naming the
rank that departed first (`_desync`), not the peer that happened to abort.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from uberprof.analysis.diagnosis.causes import OUT_OF_MEMORY
from uberprof.analysis.diagnosis.facts import Facts
from uberprof.analysis.diagnosis.failure_evidence import (
    RankEvidence,
    in_distributed,
    load_evidence,
    main_of,
    where,
)
from uberprof.analysis.diagnosis.host_memory import host_memory_at
from uberprof.analysis.diagnosis.model import FAILURE_KINDS, Finding
from uberprof.rundir import RunDir, list_nodes
from uberprof.rundir.failures import (
    Collective,
)
from uberprof.rundir.flight_log import read_flight_log
from uberprof.rundir.ranks import read_step_timeline
from uberprof.rundir.step_table import StepTail

__all__ = ["FAILURE_KINDS", "KINDS", "failure_findings", "hang_summary", "run_failure_findings"]

KINDS = FAILURE_KINDS
VICTIM_PATTERNS = re.compile(
    r"connection reset by peer|connection closed by peer|broken pipe|connection refused|"
    r"connection timed out|socket timeout|read error|communicator was aborted|"
    r"nccl.*(abort|error|timeout)|watchdog caught collective operation timeout|"
    r"process group.*(destroyed|aborted)|peer .*(closed|disconnected)|"
    r"ProcessExitedException|detected a failure on another rank", re.IGNORECASE)
FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT",
                 "Floating point exception": "SIGFPE", "Bus error": "SIGBUS",
                 "Illegal instruction": "SIGILL"}
HANG_REMEDY = ("Look at the stuck rank's stack: a rank that never joins the collective the "
               "others wait in is blocked elsewhere (I/O, a lock, a data loader, an infinite "
               "loop) or took another code path (a collective under a rank- or data-dependent "
               "condition). Make every rank issue the same collectives in the same order; "
               "a mismatch names the calls that differ.")
CRASH_REMEDY = ("Fix the first failure: the other ranks failing afterwards are victims that "
                "lost their peer. Its exception and stack say where; a rank killed without a "
                "trace (SIGKILL) is often the OOM killer: check host memory (dmesg, the "
                "node's counters) around that time.")
MISMATCH_REMEDY = ("The ranks issued different collectives at the same sequence number: a "
                   "collective skipped or added on some ranks (rank- or data-dependent control "
                   "flow), or tensors of different shape or dtype. Make every rank issue the "
                   "same collectives in the same order with the same shapes.")
FROZEN_REMEDY = ("A frozen rank answered nothing, not even the signal that makes any running "
                 "process write its stacks: it was stopped (SIGSTOP, a debugger, job control: "
                 "send SIGCONT or detach), is blocked in the kernel (uninterruptible I/O on a "
                 "hung file system or device: see /proc/<pid>/stack and dmesg) or swapped out "
                 "(check host memory). The others wait for it in the collective named.")
RECENT = 8  # collectives shown per rank

def failure_findings(roots: Path | Iterable[Path],
                     tails: Callable[[Path], StepTail | None] | None = None) -> list[Finding]:
    """The `hang` and `crash` findings of a run directory (none for a healthy run); `tails`
    as for `load_evidence`."""
    roots = [roots] if isinstance(roots, Path | str) else list(roots)
    ranks, hangs = load_evidence([Path(r) for r in roots], tails)
    running = {n.node for r in roots for n in list_nodes(RunDir(Path(r)))
               if n.readable and n.end_ns is None}
    out = []
    hang = _hang_finding(ranks, hangs)
    if hang is not None:
        out.append(hang)
    stopped_at = min((h["detected_ns"] for h in hangs if h.get("action") == "stop"
                      and isinstance(h.get("detected_ns"), int)), default=None)
    crash = _crash_finding(ranks, stopped_at, running)
    if crash is not None:
        out.append(crash)
    return out


def hang_summary(root: Path) -> str:
    """The stuck rank(s) and where, in one phrase (for the watchdog's line on stderr)."""
    ranks, hangs = load_evidence([root])
    f = _hang_finding(ranks, hangs)
    return f.title if f is not None else "no stuck rank could be named"


# --- frames -------------------------------------------------------------------------------------

def _clock(ns: int | None) -> str | None:
    if not ns:
        return None
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) + f".{ns % 10**9 // 10**6:03d}"


# --- hangs --------------------------------------------------------------------------------------

def _collective_text(c: dict[str, Any]) -> str:
    sizes = "x".join(str(s) for s in c["sizes"][0]) if c.get("sizes") and \
        isinstance(c["sizes"][0], list) else str(c.get("sizes"))
    dtype = c["dtypes"][0] if c.get("dtypes") else "?"
    return f"{c['op']} #{c['seq']} of {c['process_group']} ([{sizes}] {dtype})"


def _frontier(ranks: dict[int, RankEvidence], reason: str) -> dict[str, Any]:
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
        usual = _usual_step(ranks, per)
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


def _usual_step(ranks: dict[int, RankEvidence], per: dict[int, list[Collective]]
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


def _departs(r: int, c: Collective, usual: dict[str, Any] | None) -> dict[str, Any] | None:
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
    departs = {r: d for r, c in calls.items() if (d := _departs(r, c, usual)) is not None}
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


def _hang_finding(ranks: dict[int, RankEvidence], hangs: list[dict[str, Any]]
                  ) -> Finding | None:
    """The `hang` finding of the watchdog's records (module docstring), or None without one.
    In stages: the first record and each rank's state in it, the Flight Recorder's frontier,
    the stuck ranks, each rank's document, then the title and the cause."""
    if not hangs:
        return None
    rec = min(hangs, key=lambda h: h.get("detected_ns") or 0)
    state = {int(x["rank"]): x for h in hangs for x in h.get("ranks") or []
             if isinstance(x, dict) and isinstance(x.get("rank"), int)}
    fr = _frontier(ranks, "hang")
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
            "rank": r, "alive": state.get(r, {}).get("alive"), "last_step": ev.last_step,
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
        parts.append(f"{_ranks_word(others)} {'waits' if len(others) == 1 else 'wait'} in "
                     f"{_collective_text(waiting_in)}"
                     + (f" since {_clock(since)}" if since else ""))
    for r in stuck:
        elsewhere = fr["behind"].get(r, {}).get("pending_elsewhere")
        if elsewhere:
            parts.append(f"rank {r} skipped it and waits in {_collective_text(elsewhere)}")
    if fr["mismatches"]:
        parts.append(_mismatch_text(fr["mismatches"][0]))
    resumed = rec.get("resumed_ns")
    return "Hang: " + ("; ".join(parts) if parts else "no rank finished a step") + \
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


def _mismatch_text(m: dict[str, Any], named: bool = True) -> str:
    """A mismatch in words: who departed and from what, or that nothing tells them apart
    (`named`: ending with the ranks that departed)."""
    head = f"mismatch at #{m['seq']} of {m['process_group']}: "
    calls = m["calls"]
    if m.get("decided_by") == "undecided":
        return head + "; ".join(f"rank {r} issued {c['op']} {_sizes(c)}"
                                for r, c in calls.items()) + \
            f" (nothing tells them apart: {_ranks_word(m['ranks'])} named)"
    odd = m["ranks"]
    issued = sorted({f"{calls[str(r)]['op']} {_sizes(calls[str(r)])}" for r in odd})
    others = sorted({f"{c['op']} {_sizes(c)}" for r, c in calls.items() if int(r) not in odd})
    text = head + f"{_ranks_word(odd)} issued {' / '.join(issued)} where " + \
        (f"the others issued {' / '.join(others)}" if others else "the others did not")
    if m.get("decided_by") == "history":
        exp = next((d.get("expected") for d in m["departures"].values()), None)
        text += " and every earlier step had " + (f"{exp['op']} {_sizes(exp)}" if exp
                                                  else "no collective") + " there"
    return text + (f" ({_ranks_word(odd)} departed)" if named else "")


def _sizes(c: dict[str, Any]) -> str:
    sizes = c.get("sizes") or []
    return "[" + ", ".join("x".join(map(str, s)) if isinstance(s, list) else str(s)
                           for s in sizes) + "]"


def _ranks_word(ranks: list[int]) -> str:
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# --- crashes ------------------------------------------------------------------------------------

CAUSE, SILENT, VICTIM = 0, 1, 2  # tiers of the first failure


def _failure_of(ev: RankEvidence, stopped_at: int | None, running: bool
                ) -> dict[str, Any] | None:
    """How the rank failed, or None: {rank, kind, tier, time_ns, ...}."""
    ending = [e for e in ev.exceptions if e.get("where") != "threading"]
    exc = ending[-1] if ending else None
    exit_row = min(ev.exits, key=lambda e: e.get("time_ns") or 0) if ev.exits else None
    out: dict[str, Any] = {"rank": ev.rank, "step": ev.last_step, "host": ev.meta.host,
                           "pid": ev.meta.pid}
    if exc is not None:
        text = f"{exc.get('type')}: {exc.get('message')}"
        frames = exc.get("frames") or []
        out.update(kind="exception", time_ns=exc.get("time_ns"),
                   tier=VICTIM if VICTIM_PATTERNS.search(text) else CAUSE,
                   exception={"type": exc.get("type"), "message": exc.get("message"),
                              "where": where(frames), "frames": frames,
                              "traceback": exc.get("traceback"), "thread": exc.get("thread")})
        if exc.get("last_step") is not None:
            out["step"] = exc["last_step"]
    elif ev.fatal is not None and ev.fatal.fatal is not None:
        sig = FATAL_SIGNALS.get(ev.fatal.fatal, ev.fatal.fatal)
        frames = main_of(ev.fatal)
        out.update(kind="signal", signal=sig, time_ns=ev.fatal.time_ns, tier=CAUSE,
                   stack=frames, where=where(frames), fatal=ev.fatal.fatal)
    elif exit_row is not None or (ev.fatal is not None and not ev.meta.finished):
        # a SIGTERM dump has no fatal header
        sig = exit_row.get("signal") if exit_row else "SIGTERM"
        out.update(kind="signal" if sig else "exit_code", signal=sig,
                   exitcode=exit_row.get("exitcode") if exit_row else None,
                   time_ns=(exit_row or {}).get("time_ns") or (ev.fatal and ev.fatal.time_ns),
                   tier=VICTIM if sig in ("SIGTERM", "SIGINT", "SIGHUP") else
                   CAUSE if sig else SILENT, seen_by=(exit_row or {}).get("source"))
        if ev.fatal is not None:
            frames = main_of(ev.fatal)
            out.update(stack=frames, where=where(frames))
    elif ev.meta.readable and not ev.meta.finished and not running:
        out.update(kind="stopped", time_ns=_last_sign_of_life(ev), tier=SILENT)
    else:
        return None
    if exit_row is not None and "exitcode" not in out:
        out.update(exitcode=exit_row.get("exitcode"), signal=out.get("signal") or
                   exit_row.get("signal"), seen_by=exit_row.get("source"))
    if stopped_at is not None and (out["kind"] == "stopped"
                                   or (out.get("time_ns") or stopped_at) >= stopped_at):
        return None  # ended by --on-hang stop, not a crash
    calls = ev.flight.get("exception", [])
    out["flight_recorder"] = [c.as_dict() for c in calls[-RECENT:]] or None
    return out


def _last_sign_of_life(ev: RankEvidence) -> int | None:
    times = [ev.last_step_end_ns]
    for p in (ev.meta.folder / "steps.jsonl", ev.meta.folder / "rank.json"):
        try:
            times.append(p.stat().st_mtime_ns)
        except OSError:
            pass
    return max((t for t in times if t), default=None)


def _crash_finding(ranks: dict[int, RankEvidence], stopped_at: int | None,
                   running: set[str]) -> Finding | None:
    failed = [f for ev in ranks.values()
              if (f := _failure_of(ev, stopped_at, ev.meta.node in running)) is not None]
    if not failed:
        return None
    failed.sort(key=lambda f: (f["tier"], f.get("time_ns") or 1 << 63, f["rank"]))
    first = failed[0]
    victims = [f for f in failed[1:] if f["tier"] == VICTIM or f["kind"] == "stopped"]
    others = [f for f in failed[1:] if f not in victims]
    for f in failed:
        f["role"] = "first" if f is first else "victim" if f in victims else "also_failed"
    title = f"Crash: rank {first['rank']} " + _failure_text(first)
    if first.get("step") is not None:
        title += f" (after step {first['step']})"
    if victims:
        title += f"; {_ranks_word(sorted(v['rank'] for v in victims))} failed after it (victims)"
    if others:
        title += f"; {_ranks_word(sorted(o['rank'] for o in others))} also failed"
    sites = _call_sites(failed)
    frontier = _frontier(ranks, "exception")
    mismatches = frontier["mismatches"]
    waits = [w for w in frontier["waits"] if first["rank"] not in w["ranks"]]
    others_in = max(waits, key=lambda w: len(w["ranks"])) if waits else None
    desync = _desync(ranks, first, frontier, sites)
    if desync is not None:
        title = _desync_title(desync, first, victims, others)
        for f in failed:
            if f["rank"] in desync["ranks"] and f is not first:
                f["role"] = "departed"
    elif mismatches:
        title += "; " + _mismatch_text(mismatches[0])
    elif len(sites) > 1:
        title += "; the ranks were in different collective calls (a collective mismatch?): " + \
            "; ".join(f"{_ranks_word(c['ranks'])} in {c['collective']} at {c['where']}"
                      for c in sites)
    steps = [first["step"] + 1] if first.get("step") is not None else []
    memory = _out_of_memory(first, ranks[first["rank"]])
    return Finding(
        kind="crash", severity="high", title=title + (memory.pop("words") if memory else ""),
        ranks=desync["ranks"] if desync else [first["rank"]], steps=steps,
        cause="desync" if desync else OUT_OF_MEMORY.key if memory else first["kind"],
        time_at_stake_ms=0.0,
        evidence={"moment_ns": first.get("time_ns"), "first": first, "victims": victims,
                  "desync": desync,
                  **({"memory": memory} if memory else {}),
                  "also_failed": others,
                  "others_waiting_in": others_in, "mismatches": mismatches,
                  "call_sites": sites,
                  "failed": [{k: f.get(k) for k in ("rank", "kind", "role", "time_ns",
                                                     "signal", "exitcode")} | {
                      "what": _failure_text(f)} for f in failed]},
        remedy=MISMATCH_REMEDY if desync else
        OUT_OF_MEMORY.remedy + " " + CRASH_REMEDY if memory else CRASH_REMEDY)

_DESYNC_TEXT = re.compile(r"mismatch|size doesn.t match", re.IGNORECASE)


def _desync(ranks: dict[int, RankEvidence], first: dict[str, Any], frontier: dict[str, Any],
            sites: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The desync a crash followed, or None: the first failure happened in a collective (an
    abort in it, a lost peer, a size mismatch), and the ranks had departed from one another.
    Who departed, from the best evidence there is: a mismatch in the Flight Recorder dumps;
    else each dumped rank's last step against what it and the others issued at that point of
    earlier steps (`history`), with the call sites placing the ranks without a dump; else the
    call sites alone, where the ranks at one site outnumber every other (`majority`); else
    every rank at a site is named (`undecided`)."""
    exc = first.get("exception") or {}
    frames = exc.get("frames") or first.get("stack") or []
    text = f"{exc.get('type')}: {exc.get('message')}" if exc else ""
    if not (frames and in_distributed(frames)) and not VICTIM_PATTERNS.search(text) \
            and not _DESYNC_TEXT.search(text):
        return None
    site_of = {r: i for i, c in enumerate(sites) for r in c["ranks"]}
    out: dict[str, Any] = {"call_sites": sites}
    if frontier["mismatches"]:
        m = frontier["mismatches"][0]
        out.update(ranks=m["ranks"], decided_by=m["decided_by"], mismatch=m,
                   departures=m["departures"])
        return out
    departed, consistent = _fr_departures(ranks, "exception")
    good = {site_of[r] for r in consistent if r in site_of}
    bad = {site_of[r] for r in departed if r in site_of}
    # a departed rank at the one site that outnumbers all others: the others may have departed
    # too (no dump of theirs says otherwise), so the call sites decide, as without dumps
    outvoted = not good and len(sites) > 1 and 0 in bad and \
        len(sites[0]["ranks"]) > len(sites[1]["ranks"])
    if good:  # the ranks without a dump at another site than the consistent ones
        more = {r for r, i in site_of.items() if r not in consistent and i not in good}
    else:  # no dumped rank kept to its usual step: those at a departed one's site
        more = {r for r, i in site_of.items() if i in bad}
    if (departed or more) and not outvoted:
        out.update(ranks=sorted(set(departed) | more), decided_by="history",
                   departures={str(r): d for r, d in sorted(departed.items())})
        return out
    if len(sites) < 2:
        return None
    if len(sites[0]["ranks"]) > len(sites[1]["ranks"]):
        out.update(ranks=sorted(r for c in sites[1:] for r in c["ranks"]),
                   decided_by="majority")
    else:
        out.update(ranks=sorted(site_of), decided_by="undecided")
    return out


def _fr_departures(ranks: dict[int, RankEvidence], reason: str
                   ) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """From the Flight Recorder dumps made for `reason`: the ranks whose last step departs
    from the usual step of a group (`_departs`, at its last collective), and those whose last
    step keeps to it in every group they had collectives in."""
    groups: dict[str, dict[int, list[Collective]]] = {}
    for r, ev in ranks.items():
        for c in ev.flight.get(reason, []):
            if not c.is_p2p:
                groups.setdefault(c.group, {}).setdefault(r, []).append(c)
    departed: dict[int, dict[str, Any]] = {}
    judged: set[int] = set()
    for g, per in groups.items():
        usual = _usual_step(ranks, per)
        if usual is None:
            continue
        for r, cs in per.items():
            d = _departs(r, cs[-1], usual)
            judged.add(r)
            if d is not None and r not in departed:
                departed[r] = {**d, "process_group": g}
    return departed, judged - set(departed)


def _desync_title(desync: dict[str, Any], first: dict[str, Any], victims: list[dict[str, Any]],
                  others: list[dict[str, Any]]) -> str:
    """A crash after a desync in one line: who departed and where, then how the first
    failure and the victims followed."""
    culprits = desync["ranks"]
    how = desync["decided_by"]
    title = "Crash after a collective desync: "
    if how == "undecided":
        title += f"{_ranks_word(culprits)} were in different collective calls and nothing " \
                 "tells which departed first"
    else:
        title += f"{_ranks_word(culprits)} departed first"
    where_of = {r: f"{c['collective']} at {c['where']}" for c in desync["call_sites"]
                for r in c["ranks"]}
    placed = [f"rank {r} in {where_of[r]}" for r in culprits if r in where_of]
    if desync.get("mismatch"):
        title += " (" + _mismatch_text(desync["mismatch"], named=False) + ")"
    elif how == "history" and not desync["departures"]:
        title += " (at another call site than the ranks whose last step was their usual one)"
    elif how == "history":
        d = next(iter(desync["departures"].values()))
        exp = d.get("expected")
        title += (f" (issued {d['issued']} {_sizes({'sizes': d.get('issued_sizes')})} "
                  f"#{d['seq']} of {d['process_group']} where its "
                  "earlier steps and the others' had "
                  + (f"{exp['op']} {_sizes(exp)}" if exp else "no collective") + ")")
    elif how == "majority":
        title += f" (the others were all in {desync['call_sites'][0]['collective']} at " \
                 f"{desync['call_sites'][0]['where']})"
    if placed:
        title += ": " + "; ".join(placed)
    title += f"; then rank {first['rank']} {_failure_text(first)}"
    if first.get("step") is not None:
        title += f" (after step {first['step']})"
    lost = sorted(v["rank"] for v in victims if v["rank"] not in culprits)
    if lost:
        title += f"; {_ranks_word(lost)} failed after it (victims)"
    also = sorted(o["rank"] for o in others if o["rank"] not in culprits)
    if also:
        title += f"; {_ranks_word(also)} also failed"
    return title


_OOM = re.compile(r"OutOfMemoryError|out of memory", re.IGNORECASE)
_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) (GiB|MiB|KiB|bytes|B)\b")
_UNIT = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "bytes": 1, "B": 1}


def _out_of_memory(first: dict[str, Any], ev: RankEvidence) -> dict[str, Any] | None:
    """The memory evidence of a first failure that is an out-of-memory error, or None: the
    device's size (rank.json), the request (the allocator's message), and from the step
    timeline the peak allocated and what was in use at the first and the last step (what
    grew). `words`: the part of the title it adds."""
    exc = first.get("exception") or {}
    if first.get("signal") == "SIGKILL" or first.get("kind") == "stopped":
        return _killed_near_full(first, ev)
    if first.get("kind") != "exception" or not _OOM.search(f"{exc.get('type')} "
                                                            f"{exc.get('message')}"):
        return None
    m = _REQUEST.search(str(exc.get("message") or ""))
    requested = int(float(m.group(1)) * _UNIT[m.group(2)]) if m else None
    rows = [r for r in read_step_timeline(ev.meta.folder).steps
            if isinstance(r.get("gpu_mem_bytes"), int)]
    peak = max((r.get("gpu_mem_peak_bytes") or 0 for r in rows), default=None) or None
    total = ev.meta.device.get("total_memory_bytes")
    out = {"device_total_bytes": total if isinstance(total, int) else None,
           "requested_bytes": requested, "peak_allocated_bytes": peak,
           "in_use_first_bytes": rows[0]["gpu_mem_bytes"] if rows else None,
           "in_use_last_bytes": rows[-1]["gpu_mem_bytes"] if rows else None,
           "steps_read": len(rows)}
    parts = []
    if requested is not None:
        parts.append(f"asked for {_gb(requested)}")
    if peak is not None:
        parts.append(f"peak allocated {_gb(peak)}"
                     + (f" of {_gb(out['device_total_bytes'])}" if out["device_total_bytes"]
                        else ""))
    if len(rows) > 1:
        grew = rows[-1]["gpu_mem_bytes"] - rows[0]["gpu_mem_bytes"]
        parts.append(f"in use between steps {_gb(rows[0]['gpu_mem_bytes'])} -> "
                     f"{_gb(rows[-1]['gpu_mem_bytes'])}"
                     + (" (growing: a leak?)" if grew > 0.1 * max(rows[0]["gpu_mem_bytes"], 1)
                        else " (steady)"))
    out["words"] = f"; out of memory: {', '.join(parts)}" if parts else "; out of memory"
    return out


def _killed_near_full(first: dict[str, Any], ev: RankEvidence) -> dict[str, Any] | None:
    """The host-memory evidence of a rank killed without a trace (SIGKILL, or no end recorded)
    while its host's memory was nearly full (`host_memory.py`: the kernel's OOM killer is the
    usual cause, suspected: uberprof cannot read the kernel's log); None otherwise."""
    at = first.get("time_ns") or _last_sign_of_life(ev)
    host = host_memory_at(ev.meta.folder.parent.parent, ev.meta.node, ev.rank, at)
    if host is None or not host["near_full"]:
        return None
    rss = (f", rank {ev.rank}'s process {_gb(host['rank_rss_bytes'])}"
           if host["rank_rss_bytes"] else "")
    return {**host, "killer": "suspected: the kernel's OOM killer",
            "words": f"; out of host memory (suspected): {host['host_used_pct']}% of "
                     f"{_gb(host['host_total_bytes'])} in use {host['sample_age_ms']:.0f} ms "
                     f"before{rss}"}


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _call_sites(failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the failed ranks were inside a collective when they ended: {collective, where,
    ranks} per distinct call site, the most common first."""
    sites: dict[tuple[str, str], list[int]] = {}
    for f in failed:
        frames = (f.get("exception") or {}).get("frames") or f.get("stack") or []
        if not frames or not in_distributed(frames):
            continue
        coll = next((x["function"] for x in reversed(frames)
                     if "torch/distributed" in str(x.get("file", ""))
                     and x.get("function") not in ("wrapper", "wait")), "?")
        sites.setdefault((coll, where(frames) or "?"), []).append(f["rank"])
    return [{"collective": c, "where": w, "ranks": sorted(r)}
            for (c, w), r in sorted(sites.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def _failure_text(f: dict[str, Any]) -> str:
    if f["kind"] == "exception":
        e = f["exception"]
        return (f"raised {e['type']}: {_short(e['message'])}"
                + (f" at {e['where']}" if e.get("where") else ""))
    if f["kind"] == "signal":
        how = f"died of {f.get('signal')}"
        if f.get("signal") == "SIGKILL":
            how += " (kill -9 or the OOM killer)"
        if f.get("fatal"):
            how += f" ({f['fatal']})"
        return how + (f" in {f['where']}" if f.get("where") else "")
    if f["kind"] == "exit_code":
        return f"exited with code {f.get('exitcode')}"
    return "stopped without a trace (killed by SIGKILL, e.g. the OOM killer, or its host died)"


def _short(text: Any, n: int = 160) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= n else s[:n - 3] + "..."


def run_failure_findings(facts: Facts) -> list[Finding]:
    """The producer: the hang and crash findings of a run directory (none for traces alone),
    from what the analysis already read of each step timeline."""
    ctx = facts.ctx
    if not ctx.is_run_dir:
        return []
    return failure_findings(ctx.root, ctx.run.step_tail)
