"""What changed between the trace window before a change of the step time and the one after
it: each window diagnosed on its own, and the two compared as `uberprof diff` compares two
runs (`diff.compare`, on each window's `RunProfile`: `diff.profiles.profile_of`).

The windows compared: the nearest window before the onset, and after it the first window a
trigger opened (a slowdown's own window), else the first one. Each is diagnosed as the run
with only that window traced and only the steps of its own level (`RunContext.window`: the
window's steps and collectives, and the untraced steps from the change's `before`, or
`after`, stretch, whose Flight Recorder arrivals join the straggler test), so its findings
are its own: a straggler that began at the change is not found in the healthy window; then profiled: step time, breakdown (compute, exposed communication,
idle by cause, data wait, ...), operators and kernels (from each rank's events over those
steps), collectives and counters. `compare` says whether the step time moved beyond the steps'
own variation, which findings appeared, went or grew (time at stake per analysed step), and
what moved under them.

That is two more diagnoses and a read of each compared rank's events, so it runs only for the
lead change (`lead`, the one the report's head tells; another change between the same two
windows shares it), and reads operators over at most `MAX_RANKS` ranks: the named ranks first,
then the lowest others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from uberprof.analysis.diagnosis.model import Diagnosis
from uberprof.analysis.diff.compare import Comparison, compare
from uberprof.analysis.diff.profiles import profile_of
from uberprof.analysis.tables.context import RunContext

__all__ = ["MAX_RANKS", "MAX_ROWS", "compare_windows", "windows_compared"]

MAX_RANKS = 8
MAX_ROWS = 5  # rows of each kind kept: what moved most
MIN_CHANGE_PCT = 5.0  # `uberprof diff`'s default: what a compared step time must move by


def compare_windows(ctx: RunContext, d: Diagnosis,
                    diagnose: Callable[[RunContext], Diagnosis]) -> None:
    """Fill `windows_compared` of the lead change in `d.run["timeline_changes"]` (and of any
    other between the same windows) where it has an analysed window on either side;
    `diagnose` makes a window's diagnosis (the advisor's, without this step)."""
    changes = d.run["timeline_changes"]
    lead = next((c for c in changes if c["lead"]), None)
    pair = _pair(lead, d) if lead is not None else None
    if lead is None or pair is None:
        return
    ranks = _ranks(lead, d)
    sides = []
    for w, stretch in zip(pair, (lead["before"], lead["after"]), strict=True):
        first, last = w["steps"]
        # the window's diagnosis reads the steps of its own level only (the Flight
        # Recorder's arrivals among them): the healthy stretch's, or the changed one's
        span = (min(first, stretch["first_step"]), max(last, stretch["last_step"]))
        wctx = ctx.window(first, last, span)
        sides.append(profile_of(wctx, diagnose(wctx), ctx.root, ranks=ranks,
                                steps=(first, last)))
    doc = windows_compared(compare(sides[0], sides[1], MIN_CHANGE_PCT), *pair)
    for c in changes:
        if c is lead or _pair(c, d) == pair:
            c["windows_compared"] = doc


def _pair(change: dict[str, Any], d: Diagnosis) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The before and after windows to compare, both with analysed steps, or None."""
    analysed = set(d.steps.column("step").to_pylist()) if d.steps.num_rows else set()

    def has_steps(w: dict[str, Any]) -> bool:
        return any(w["steps"][0] <= s <= w["steps"][1] for s in analysed)

    before = [w for w in change["windows_before"] if has_steps(w)]
    after = [w for w in change["windows_after"] if has_steps(w)]
    if not before or not after:
        return None
    triggered = [w for w in after if w["trigger"] != "schedule"]
    return before[-1], (triggered or after)[0]


def _ranks(change: dict[str, Any], d: Diagnosis) -> set[int]:
    """The named ranks and the lowest others, `MAX_RANKS` in all."""
    have = sorted(set(pc.unique(d.steps.column("rank")).to_pylist()))
    named = [r for r in change["ranks"] if r in have]
    return set((named + [r for r in have if r not in named])[:max(MAX_RANKS, len(named))])


def windows_compared(c: Comparison, before: dict[str, Any], after: dict[str, Any]
                     ) -> dict[str, Any]:
    """The saved comparison: the windows, the step time test and the rows that moved most
    (ms per step, each with its share of the change in mean step time), and a sentence."""
    st = c.step_time()
    grew = sorted([_row("breakdown", r["label"], r) for r in c.breakdown if r["device"]] +
                  [_row(r["kind"], r["name"], r) for r in c.ops] +
                  [_collective_row(r) for r in c.collectives],
                  key=lambda r: -abs(r["delta_ms"] or 0.0))
    grew = [r for r in grew if r["delta_ms"]][:MAX_ROWS]
    doc = {"before_window": before["window"], "after_window": after["window"],
           "ranks": c.b.ranks,
           "step_time_ms": {"before": st["a"]["median"], "after": st["b"]["median"],
                            "ratio": st["ratio"], "verdict": st["verdict"],
                            "reason": st["test"]["reason"]},
           "findings": _findings(c), "moved": grew, "notes": c.notes}
    doc["sentence"] = _sentence(doc)
    return doc


def _findings(c: Comparison) -> list[dict[str, Any]]:
    """The findings that appeared, grew, shrank or went, by their change in time at stake per
    analysed step (ms), largest first: `{change, kind, cause, title, before_ms, after_ms,
    delta_ms, before_severity, after_severity}`."""
    out = []
    for change, rows in (("appeared", c.findings["new"]), ("went", c.findings["gone"]),
                         ("changed", c.findings["changed"])):
        for r in rows:
            a, b = r["a_ms"], r["b_ms"]
            delta = (b or 0.0) - (a or 0.0)
            word = change if change != "changed" else "grew" if delta > 0 else "shrank"
            if word in ("grew", "shrank") and abs(delta) < 0.05:
                continue
            out.append({"change": word, "kind": r["kind"], "cause": r["cause"],
                        "title": r["title"], "before_ms": a, "after_ms": b,
                        "delta_ms": round(delta, 3), "before_severity": r["a_severity"],
                        "after_severity": r["b_severity"]})
    return sorted(out, key=lambda r: -abs(r["delta_ms"]))[:MAX_ROWS]


def _row(kind: str, name: str, r: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "name": name, "before_ms": r.get("a_ms"), "after_ms": r.get("b_ms"),
            "delta_ms": r.get("delta_ms"), "share_pct": r.get("share_pct")}


def _collective_row(r: dict[str, Any]) -> dict[str, Any]:
    size = f", {r['bytes'] / 2**20:.1f} MiB" if r["bytes"] else ""
    return {"kind": "collective", "name": f"{r['collective']} ({r['group']}{size})",
            "before_ms": (r["a"] or {}).get("time_ms"), "after_ms": (r["b"] or {}).get("time_ms"),
            "delta_ms": r["delta_ms"], "share_pct": None}


def _sentence(doc: dict[str, Any]) -> str:
    st = doc["step_time_ms"]
    out = (f"window {doc['after_window']} against window {doc['before_window']}: median step "
           f"{_n(st['before'])} -> {_n(st['after'])} ms ({st['verdict']})")
    if doc["findings"]:
        out += "; findings: " + ", ".join(_finding_words(r) for r in doc["findings"][:3])
    if doc["moved"]:
        out += "; moved most: " + ", ".join(
            f"{r['name']} {r['delta_ms']:+.1f} ms/step"
            + (f" ({r['share_pct']:.0f}% of the change)" if r["share_pct"] is not None else "")
            for r in doc["moved"][:3])
    return out


def _finding_words(r: dict[str, Any]) -> str:
    """"idle (host) grew 7.1 -> 22.0 ms/step", "straggler appeared (12.0 ms/step)"."""
    name = r["kind"] + (f" ({r['cause']})" if r["cause"] and r["cause"] != r["kind"] else "")
    if r["change"] in ("grew", "shrank"):
        return f"{name} {r['change']} {_n(r['before_ms'])} -> {_n(r['after_ms'])} ms/step"
    ms = r["after_ms"] if r["change"] == "appeared" else r["before_ms"]
    return f"{name} {r['change']} ({_n(ms)} ms/step)"


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"
