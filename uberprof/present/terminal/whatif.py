"""The report's critical-path section and `uberprof whatif`'s output, as the analysis made them
(`run.critical_path`, `run.replay`, the projection of `diagnosis/whatif.py`; docs/whatif.md).
Formats only: every number is the document's."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from uberprof.units import fmt_num, shorten

__all__ = ["render_baseline", "render_critical_path", "render_whatif"]

def _ms(v: Any) -> str:
    return fmt_num(v, 1, missing="-")


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False)


def render_critical_path(run: dict[str, Any], console: Console) -> None:
    """A few lines: what sets the steps' length, the operators on it, and whether the replay
    reproduces the measured steps (nothing when the run has no graph)."""
    cp, rp = run["critical_path"], run["replay"]
    if not isinstance(cp, dict) or not cp.get("steps"):
        return
    console.print("[bold]critical path[/bold] (what sets each step's length; uberprof whatif "
                  "projects changes)")
    _say(console, f"  {cp.get('summary')}")
    pct = cp.get("by_kind_pct") or {}
    _say(console, "  by kind: " + ", ".join(f"{k} {v:.0f}%" for k, v in pct.items() if v >= 0.5))
    ops = cp.get("top_operators") or []
    if ops:
        _say(console, "  on it: " + ", ".join(f"{shorten(o['name'], 40)} {_ms(o['ms'])} ms"
                                             for o in ops[:3]) + " (over the steps)")
    if isinstance(rp, dict) and rp.get("median_error_pct") is not None:
        verdict = "fit" if rp.get("fit_for_projection") else "UNFIT"
        _say(console, f"  replay: median error {rp['median_error_pct']}% (max "
                      f"{rp['max_error_pct']}%) over {len(rp.get('steps') or [])} step(s): "
                      f"{verdict} for projection" +
                      ("" if rp.get("fit_for_projection") else f"; {rp.get('why')}"))
        for caveat in rp.get("caveats") or []:
            _say(console, f"  caution: {caveat}")


def render_baseline(doc: dict[str, Any], console: Console) -> None:
    """`uberprof whatif` with no change: each step measured and replayed, the replay error
    and the critical path, as the document holds them."""
    _say(console, "no change given: the baseline (the traced steps replayed as recorded; "
                  "--remove, --link-scale, --link-gbps, --balance-stages or --op project one)")
    if doc.get("steps"):
        t = Table(title=None, show_edge=False)
        for col in ("step", "measured ms", "replayed ms"):
            t.add_column(col, justify="right")
        for s in doc["steps"]:
            t.add_row(str(s["step"]), _ms(s["measured_ms"]), _ms(s["replayed_ms"]))
        console.print(t)
        _say(console, f"step time: measured {_ms(doc['baseline_step_ms'])} ms, replayed "
                      f"{_ms(doc['replayed_step_ms'])} ms; replay error "
                      f"{_ms(doc['replay_error_pct'])}% (median per step)")
    elif doc.get("why"):
        _say(console, f"nothing to replay: {doc.get('why')}")
    render_critical_path({"critical_path": doc.get("critical_path"),
                          "replay": doc.get("replay")}, console)


def render_whatif(doc: dict[str, Any], console: Console) -> None:
    """`uberprof whatif`: the changes, projected against measured, per step and in all."""
    if doc.get("baseline"):
        render_baseline(doc, console)
        return
    _say(console, "changes: " + "; ".join(c["change"] + _touched(c) for c in doc["changes"]))
    if any("rank" in c for c in doc["changes"]) and doc.get("straggler_basis"):
        _say(console, f"the straggler: {doc['straggler_basis']}")
    if doc.get("projected_step_ms") is None:
        _say(console, f"nothing to project: {doc.get('why')}")
        return
    t = Table(title=None, show_edge=False)
    for col in ("step", "measured ms", "replayed ms", "projected ms", "gain ms"):
        t.add_column(col, justify="right")
    for s in doc["steps"]:
        t.add_row(str(s["step"]), _ms(s["measured_ms"]), _ms(s["replayed_ms"]),
                  _ms(s["projected_ms"]), _ms(s["gain_ms"]))
    console.print(t)
    lo, hi = doc["interval_ms"]
    _say(console, f"step time: measured {_ms(doc['baseline_step_ms'])} ms (replayed "
                  f"{_ms(doc['replayed_step_ms'])} ms), projected {_ms(doc['projected_step_ms'])}"
                  f" ms ({_ms(lo)}-{_ms(hi)}, {doc['interval']}): {_ms(abs(doc['gain_ms']))} ms "
                  f"({abs(doc['gain_pct'] or 0)}%) "
                  + ("longer" if (doc['gain_ms'] or 0) < 0 else "shorter"))
    if doc.get("fit_for_projection"):
        _say(console, f"replay error {doc['replay_error_pct']}% (median per step): the graph "
                      "reproduces the measured steps")
    else:
        _say(console, f"UNFIT FOR PROJECTION: {doc['why']}")
    for caveat in doc.get("caveats") or []:
        _say(console, f"caution: {caveat}")
    sharing = doc.get("core_sharing")
    if sharing:
        hosts = ", ".join(f"{h['host']}: {h['cores']} core(s), {h['background_threads']} other "
                          "thread(s) runnable on average" for h in sharing["hosts"])
        _say(console, f"cores shared by the CPU ranks ({hosts}): each rank's work is slowed "
                      "by as many others running at once (processor sharing)")
    _say(console, "a projection keeps every recorded dependency and duration it was not told "
                  "to change" + (", slowed or sped only by the ranks' sharing of their cores"
                                 if sharing else "") +
                  ": it cannot know other contention, caches or a different schedule "
                  "(docs/whatif.md)")


def _touched(c: dict[str, Any]) -> str:
    if "transfers" in c and "latency_us" in c:  # --link-gbps
        return (f" ({c['transfers']} transfers: {_ms(c.get('transfer_ms'))} -> "
                f"{_ms(c.get('projected_transfer_ms'))} ms; latency {c['latency_us']} us, "
                f"{c.get('latency_basis')}" + (f"; {c['note']}" if c.get("note") else "") + ")")
    if c.get("note"):
        return f" ({c['note']})"
    if "unblocked_waits" in c:  # --remove exposed-comm
        return (f" ({c['unblocked_waits']} waits on {c['collectives']} collectives unblocked, "
                f"{_ms(c.get('transfer_ms'))} ms of their transfers)")
    if "device_idle_ms" in c:  # --remove launch
        return (f" ({_ms(c['device_idle_ms'])} ms of device idle waiting for launches, "
                f"{_ms(c.get('launch_overhead_ms'))} ms of launch overhead on the host)")
    if "stages" in c:  # --balance-stages
        return " (" + ", ".join(f"stage {s['stage']} {_ms(s['compute_ms'])} -> "
                                f"{_ms(s['balanced_ms'])} ms" for s in c["stages"]) + \
            " of compute over the steps)"
    if "rank" in c:
        return f" (rank {c['rank']}: {_ms(c.get('removed_ms'))} ms of work removed)"
    if "matched" in c:
        names = ", ".join(c["matched"][:3]) or "no operator of that name" + (
            f" (closest: {', '.join(c['closest'])})" if c.get("closest") else "")
        return f" ({names}: {_ms(c.get('operator_ms'))} ms in the steps)"
    if "removed_ms" in c:
        return f" ({_ms(c['removed_ms'])} ms in the steps)"
    return ""
