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
**mismatch**. Without Flight Recorder data, ranks outside torch.distributed while others are
inside it are stuck; failing that, those with the fewest steps.

A **crash** is a rank that ended abnormally: an uncaught exception (`exceptions.jsonl`), a fatal
signal (`fatal.txt`), an exit status the launcher saw (`exits-*.jsonl`), or no end recorded at
all. The *first failure* is found by kind, then by time: an exception, fatal signal or
non-SIGTERM signal is a cause; a rank that only lost its connection to a dead peer
("Connection reset by peer", ...) or was terminated by its launcher (SIGTERM) is a *victim*;
a rank that stopped without any record comes in between (SIGKILL, e.g. the OOM killer, leaves
none inside the rank). Ranks stopped by `--on-hang stop` are not crashes.
"""

from __future__ import annotations

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
from uberprof.analysis.diagnosis.model import FAILURE_KINDS, Finding
from uberprof.rundir import RunDir, list_nodes
from uberprof.rundir.failures import (
    Collective,
)
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
    are pending in, who is behind, who skipped, and the mismatches at equal sequence numbers."""
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
        top = max(c.seq for cs in per.values() for c in cs)
        at_top = {r: next(c for c in cs if c.seq == top) for r, cs in per.items()
                  if any(c.seq == top for c in cs)}
        first = min(at_top.values(), key=lambda c: c.time_ns or 0)
        if not first.completed:
            waits.append({**first.as_dict(), "ranks": sorted(at_top),
                          "since_ns": min((c.time_ns for c in at_top.values() if c.time_ns),
                                          default=None)})
            for r in set(with_fr) - set(at_top):
                if r not in per and len(groups) > 1:
                    continue  # not a member of that group
                last = max((c for c in per.get(r, [])), key=lambda c: c.seq, default=None)
                other = pending_of.get(r)
                behind[r] = {"process_group": g, "missing_seq": top,
                             "last_seq": last.seq if last else None,
                             "pending_elsewhere": other.as_dict() if other is not None and
                             other.group != g else None}
        by_seq: dict[int, dict[int, Collective]] = {}
        for r, cs in per.items():
            for c in cs:
                by_seq.setdefault(c.seq, {})[r] = c
        for seq, calls in sorted(by_seq.items()):
            sig = {r: (c.op, _shape(c.sizes), _shape(c.dtypes)) for r, c in calls.items()}
            if len(set(sig.values())) > 1:
                counts: dict[Any, int] = {}
                for s in sig.values():
                    counts[s] = counts.get(s, 0) + 1
                common = max(counts, key=lambda s: counts[s])
                odd = sorted(r for r, s in sig.items() if s != common)
                what = [k for k, i in (("collective", 0), ("sizes", 1), ("dtypes", 2))
                        if any(sig[r][i] != common[i] for r in odd)]
                mismatches.append({"process_group": g, "seq": seq, "differs_in": what,
                                   "ranks": odd, "calls": {str(r): calls[r].as_dict()
                                                           for r in sorted(calls)}})
    return {"waits": waits, "behind": behind, "mismatches": mismatches}


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
    stuck = _stuck_ranks(ranks, state, fr, in_hang)
    rank_docs = _hang_rank_docs(ranks, state, in_hang, stuck)
    waits = fr["waits"]
    waiting_in = max(waits, key=lambda w: len(w["ranks"])) if waits else None
    since = (waiting_in or {}).get("since_ns") or rec.get("last_progress_ns")
    detected = rec.get("detected_ns")
    resumed = rec.get("resumed_ns")
    title = _hang_title(ranks, rec, fr, stuck, waiting_in, since)
    cause = "mismatch" if fr["mismatches"] else \
        "skipped_collective" if any(fr["behind"].get(r, {}).get("pending_elsewhere")
                                    for r in stuck) else "stuck_rank" if stuck else "unknown"
    stalled_ns = ((resumed or detected or 0) - (rec.get("last_progress_ns") or 0))
    steps = sorted({ev.last_step + 1 for r, ev in ranks.items()
                    if r in stuck and ev.last_step is not None})
    return Finding(
        kind="hang", severity="high", title=title, ranks=stuck, steps=steps, cause=cause,
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
            "waiting_in": waiting_in,
            "mismatches": fr["mismatches"],
            "ranks": rank_docs,
        },
        remedy=MISMATCH_REMEDY if fr["mismatches"] else HANG_REMEDY)


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


def _hang_rank_docs(ranks: dict[int, RankEvidence], state: dict[int, dict[str, Any]],
                    in_hang: list[int], stuck: list[int]) -> list[dict[str, Any]]:
    """One document per rank of the hang (every rank where the record names none): its
    state, last step, stack and where it stopped, and its pending and recent collectives."""
    rank_docs = []
    for r in sorted(in_hang or ranks):
        ev = ranks[r]
        stack = ev.main_stack()
        calls = ev.flight.get("hang", [])
        pending = next((c for c in calls if not c.completed), None)
        rank_docs.append({
            "rank": r, "alive": state.get(r, {}).get("alive"), "last_step": ev.last_step,
            "last_step_end_ns": ev.last_step_end_ns,
            "state": "stuck" if r in stuck else "waiting" if pending else "unknown",
            "where": where(stack), "stack": stack,
            "collective": pending.as_dict() if pending is not None else None,
            "recent_collectives": [c.as_dict() for c in calls[-RECENT:]],
            "stacks_from": "helper" if ev.hang else "signal" if ev.stacks else None,
        })
    return rank_docs


def _hang_title(ranks: dict[int, RankEvidence], rec: dict[str, Any], fr: dict[str, Any],
                stuck: list[int], waiting_in: dict[str, Any] | None, since: int | None) -> str:
    """The hang in one line: where the stuck ranks stopped, the collective the others wait in
    and since when, a collective skipped, the first mismatch, and how long until it resumed."""
    stuck_where = {r: where(ranks[r].main_stack()) for r in stuck}
    parts = []
    if stuck:
        parts.append(", ".join(f"rank {r}" + (f" stopped in {stuck_where[r]}"
                                              if stuck_where[r] else "") for r in stuck))
    if waiting_in is not None:
        others = [r for r in waiting_in["ranks"] if r not in stuck]
        parts.append(f"{_ranks_word(others)} wait in {_collective_text(waiting_in)}"
                     + (f" since {_clock(since)}" if since else ""))
    for r in stuck:
        elsewhere = fr["behind"].get(r, {}).get("pending_elsewhere")
        if elsewhere:
            parts.append(f"rank {r} skipped it and waits in {_collective_text(elsewhere)}")
    if fr["mismatches"]:
        m = fr["mismatches"][0]
        parts.append(f"mismatch at #{m['seq']} of {m['process_group']}: "
                     f"{_ranks_word(m['ranks'])} issued a different {'/'.join(m['differs_in'])}")
    resumed = rec.get("resumed_ns")
    return "Hang: " + ("; ".join(parts) if parts else "no rank finished a step") + \
        (f" (resumed after {(resumed - rec['last_progress_ns']) / 1e9:.0f} s)"
         if isinstance(resumed, int) and isinstance(rec.get("last_progress_ns"), int) else "")


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
    if mismatches:
        m = mismatches[0]
        title += (f"; mismatch at #{m['seq']} of {m['process_group']}: "
                  f"{_ranks_word(m['ranks'])} issued a different {'/'.join(m['differs_in'])}")
    elif len(sites) > 1:
        title += "; the ranks were in different collective calls (a collective mismatch?): " + \
            "; ".join(f"{_ranks_word(c['ranks'])} in {c['collective']} at {c['where']}"
                      for c in sites)
    steps = [first["step"] + 1] if first.get("step") is not None else []
    memory = _out_of_memory(first, ranks[first["rank"]])
    return Finding(
        kind="crash", severity="high", title=title + (memory.pop("words") if memory else ""),
        ranks=[first["rank"]], steps=steps,
        cause=OUT_OF_MEMORY.key if memory else first["kind"], time_at_stake_ms=0.0,
        evidence={"moment_ns": first.get("time_ns"), "first": first, "victims": victims,
                  **({"memory": memory} if memory else {}),
                  "also_failed": others,
                  "others_waiting_in": others_in, "mismatches": mismatches,
                  "call_sites": sites,
                  "failed": [{k: f.get(k) for k in ("rank", "kind", "role", "time_ns",
                                                     "signal", "exitcode")} | {
                      "what": _failure_text(f)} for f in failed]},
        remedy=OUT_OF_MEMORY.remedy + " " + CRASH_REMEDY if memory else CRASH_REMEDY)


_OOM = re.compile(r"OutOfMemoryError|out of memory", re.IGNORECASE)
_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) (GiB|MiB|KiB|bytes|B)\b")
_UNIT = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "bytes": 1, "B": 1}


def _out_of_memory(first: dict[str, Any], ev: RankEvidence) -> dict[str, Any] | None:
    """The memory evidence of a first failure that is an out-of-memory error, or None: the
    device's size (rank.json), the request (the allocator's message), and from the step
    timeline the peak allocated and what was in use at the first and the last step (what
    grew). `words`: the part of the title it adds."""
    exc = first.get("exception") or {}
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
