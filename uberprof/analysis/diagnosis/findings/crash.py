"""The `crash` finding: which rank failed first, how, and who failed because of it.

A crash is a rank that ended abnormally: an uncaught exception (`exceptions.jsonl`), a fatal
signal (`fatal.txt`), an exit status the launcher saw (`exits-*.jsonl`), or no end recorded at
all. The *first failure* is found by kind, then by time: an exception, fatal signal or
non-SIGTERM signal is a cause; a rank that only lost its connection to a dead peer
("Connection reset by peer", ...) or was terminated by its launcher (SIGTERM) is a *victim*;
a rank that stopped without any record comes in between (SIGKILL, e.g. the OOM killer, leaves
none inside the rank). Ranks stopped by `--on-hang stop` are not crashes. A crash in a
collective after the ranks departed from one another is reported as that **desync**, naming the
rank that departed first (`_desync`), not the peer that happened to abort; an out-of-memory
error (or a rank killed while its host's memory was nearly full) carries the memory evidence.
"""

from __future__ import annotations

import re
from typing import Any

from uberprof.analysis.diagnosis.causes import CRASH_REMEDY, MISMATCH_REMEDY, OUT_OF_MEMORY
from uberprof.analysis.diagnosis.collective_sequence import (
    RECENT,
    mismatch_text,
    ranks_word,
    recorded_departures,
    sequence_frontier,
    sizes_text,
)
from uberprof.analysis.diagnosis.failure_evidence import (
    AT_FAILURE,
    RankEvidence,
    frames_lines,
    in_distributed,
    main_of,
    where,
)
from uberprof.analysis.diagnosis.findings.kind import failure_kind
from uberprof.analysis.diagnosis.host_memory import host_memory_at
from uberprof.analysis.diagnosis.model import Finding
from uberprof.rundir import RANK_FILE, STEPS_FILE
from uberprof.rundir.ranks import read_step_timeline
from uberprof.units import fmt_bytes

__all__ = ["CRASH", "FATAL_SIGNALS", "VICTIM_PATTERNS", "crash_finding"]


def evidence_sentence(f: Finding) -> str:
    """How many ranks failed, and how the first is chosen."""
    return (f"{len(f.evidence.get('failed') or [])} rank(s) failed; the first by kind and "
            "time first")


def details(f: Finding) -> list[str]:
    """The first failure's exception and stack, then every other failed rank's role and
    what it reported."""
    e = f.evidence
    first = e.get("first") or {}
    exc = first.get("exception") or {}
    out: list[str] = []
    if exc:
        out.append(f"exception: {exc.get('type')}: {exc.get('message')} at {exc.get('where')}")
    frames = exc.get("frames") or first.get("stack") or []
    if frames:
        out.append(f"rank {first.get('rank')} (first to fail):")
        out += frames_lines(frames)
    for v in e.get("failed") or []:
        if v.get("role") != "first":
            out.append(f"rank {v['rank']} ({v['role']}): {v.get('what')}")
    return out


CRASH = failure_kind("crash", evidence_sentence, details, "CRASH_REMEDY",
                     "a rank died: the first failure and its cause, the others as its victims")

VICTIM_PATTERNS = re.compile(
    r"connection reset by peer|connection closed by peer|broken pipe|connection refused|"
    r"connection timed out|socket timeout|read error|communicator was aborted|"
    r"nccl.*(abort|error|timeout)|watchdog caught collective operation timeout|"
    r"process group.*(destroyed|aborted)|peer .*(closed|disconnected)|"
    r"ProcessExitedException|detected a failure on another rank", re.IGNORECASE)


FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT",
                 "Floating point exception": "SIGFPE", "Bus error": "SIGBUS",
                 "Illegal instruction": "SIGILL"}


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
    calls = ev.flight.get(AT_FAILURE, [])
    out["flight_recorder"] = [c.as_dict() for c in calls[-RECENT:]] or None
    return out


def _last_sign_of_life(ev: RankEvidence) -> int | None:
    times = [ev.last_step_end_ns]
    for p in (ev.meta.folder / STEPS_FILE, ev.meta.folder / RANK_FILE):
        try:
            times.append(p.stat().st_mtime_ns)
        except OSError:
            pass
    return max((t for t in times if t), default=None)


def crash_finding(ranks: dict[int, RankEvidence], stopped_at: int | None,
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
        title += f"; {ranks_word(sorted(v['rank'] for v in victims))} failed after it (victims)"
    if others:
        title += f"; {ranks_word(sorted(o['rank'] for o in others))} also failed"
    sites = _call_sites(failed)
    frontier = sequence_frontier(ranks, AT_FAILURE)
    mismatches = frontier["mismatches"]
    waits = [w for w in frontier["waits"] if first["rank"] not in w["ranks"]]
    others_in = max(waits, key=lambda w: len(w["ranks"])) if waits else None
    desync = _desync(ranks, first, frontier, sites)
    if desync is not None:
        title = _desync_title(desync, first, victims, others)
        for f in failed:
            if f["rank"] in desync["ranks"] and f is not first:
                f["role"] = "departed"
        if first["rank"] not in desync["ranks"]:  # it met the departed call: a victim
            first["role"] = "aborted_on_mismatch" if _detected_mismatch(first) else "victim"
    elif mismatches:
        title += "; " + mismatch_text(mismatches[0])
    elif _detected_mismatch(first):
        title += (f" (the backend's own check of a collective mismatch: rank {first['rank']} "
                  "may only have met the rank that departed, which no rank's collectives "
                  "recorded tell)")
    elif len(sites) > 1:
        title += "; the ranks were in different collective calls (a collective mismatch?): " + \
            "; ".join(f"{ranks_word(c['ranks'])} in {c['collective']} at {c['where']}"
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
    """The desync a crash followed, or None. First from the ranks' own collective sequences
    (the Flight Recorder dumps each rank wrote when it raised or when its launcher saw a peer
    fail): a mismatch at one sequence number that history or a majority decides names who
    departed, before any failure is blamed. Otherwise only where the first failure happened in
    a collective (an abort in it, a lost peer, a size mismatch) and the ranks had departed from
    one another. Who departed, from the best evidence there is: an undecided mismatch;
    else each dumped rank's last step against what it and the others issued at that point of
    earlier steps (`history`), with the call sites placing the ranks without a dump; else the
    call sites alone, where the ranks at one site outnumber every other (`majority`); else
    every rank at a site is named (`undecided`)."""
    exc = first.get("exception") or {}
    frames = exc.get("frames") or first.get("stack") or []
    text = f"{exc.get('type')}: {exc.get('message')}" if exc else ""
    out: dict[str, Any] = {"call_sites": sites}
    # the ranks' own sequences first: a mismatch they tell apart names who departed, whatever
    # failed first (an abort on the mismatch, a lost peer, a rank ended without a record)
    decided = [m for m in frontier["mismatches"] if m["decided_by"] != "undecided"]
    if decided:
        m = decided[0]
        out.update(ranks=m["ranks"], decided_by=m["decided_by"], mismatch=m,
                   departures=m["departures"])
        return out
    if not (frames and in_distributed(frames)) and not VICTIM_PATTERNS.search(text) \
            and not _DESYNC_TEXT.search(text):
        return None
    site_of = {r: i for i, c in enumerate(sites) for r in c["ranks"]}
    if frontier["mismatches"]:
        m = frontier["mismatches"][0]
        out.update(ranks=m["ranks"], decided_by=m["decided_by"], mismatch=m,
                   departures=m["departures"])
        return out
    departed, consistent = recorded_departures(ranks, AT_FAILURE)
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


def _detected_mismatch(f: dict[str, Any]) -> bool:
    """Whether a failure is the backend's own check of a collective's sizes or kind (Gloo
    aborts in C++ with SIGABRT inside the collective: "Received data size doesn't match
    expected size"; NCCL's and c10d's checks raise "mismatch")."""
    exc = f.get("exception") or {}
    if exc:
        return bool(_DESYNC_TEXT.search(f"{exc.get('type')}: {exc.get('message')}"))
    frames = f.get("stack") or []
    return f.get("signal") == "SIGABRT" and bool(frames) and in_distributed(frames)


def _desync_title(desync: dict[str, Any], first: dict[str, Any], victims: list[dict[str, Any]],
                  others: list[dict[str, Any]]) -> str:
    """A crash after a desync in one line: who departed and where, then how the first
    failure and the victims followed."""
    culprits = desync["ranks"]
    how = desync["decided_by"]
    title = "Crash after a collective desync: "
    if how == "undecided":
        title += f"{ranks_word(culprits)} were in different collective calls and nothing " \
                 "tells which departed first"
    else:
        title += f"{ranks_word(culprits)} departed first"
    where_of = {r: f"{c['collective']} at {c['where']}" for c in desync["call_sites"]
                for r in c["ranks"]}
    placed = [f"rank {r} in {where_of[r]}" for r in culprits if r in where_of]
    if desync.get("mismatch"):
        title += " (" + mismatch_text(desync["mismatch"], named=False) + ")"
    elif how == "history" and not desync["departures"]:
        title += " (at another call site than the ranks whose last step was their usual one)"
    elif how == "history":
        d = next(iter(desync["departures"].values()))
        exp = d.get("expected")
        title += (f" (issued {d['issued']} {sizes_text({'sizes': d.get('issued_sizes')})} "
                  f"#{d['seq']} of {d['process_group']} where its "
                  "earlier steps and the others' had "
                  + (f"{exp['op']} {sizes_text(exp)}" if exp else "no collective") + ")")
    elif how == "majority":
        title += f" (the others were all in {desync['call_sites'][0]['collective']} at " \
                 f"{desync['call_sites'][0]['where']})"
    if placed:
        title += ": " + "; ".join(placed)
    if first["rank"] in culprits:
        title += f"; then rank {first['rank']} {_failure_text(first)}"
    else:
        title += f"; then rank {first['rank']}, which met it, {_failure_text(first)}"
    if first.get("step") is not None:
        title += f" (after step {first['step']})"
    if first["rank"] not in culprits:
        title += (": a victim that aborted on the mismatch it detected"
                  if _detected_mismatch(first) else ": a victim")
    lost = sorted(v["rank"] for v in victims if v["rank"] not in culprits)
    if lost:
        title += f"; {ranks_word(lost)} failed after it (victims)"
    also = sorted(o["rank"] for o in others if o["rank"] not in culprits)
    if also:
        title += f"; {ranks_word(also)} also failed"
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
    return fmt_bytes(n, spec=".2f")


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
