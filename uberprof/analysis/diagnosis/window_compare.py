"""What changed between the trace window before a change of the step time and the one after
it: `uberprof diff`'s comparison (`diff.compare`) of the two windows of one run, each reduced
to a `RunProfile` (`diff.profiles.profile_of`) from the run's own diagnosis and tables.

The windows compared: the nearest window before the onset, and after it the first window a
trigger opened (a slowdown's own window), else the first one. Each is profiled on its own
steps: the step time, the breakdown (compute, exposed communication, idle by cause, data
wait, ...), operators and kernels (from each rank's events over those steps), collectives and
counters; `compare` says whether the step time moved beyond the steps' own variation and what
moved with it, per step. The findings are the run's, made from every analysed window at once:
what the comparison tells apart is the measurements under them.

Reading operators over a window reads every compared rank's event table, so this runs only
where a change has a window on either side, and over at most `MAX_RANKS` ranks: the named
ranks first, then the lowest others.
"""

from __future__ import annotations

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


def compare_windows(ctx: RunContext, d: Diagnosis) -> None:
    """Fill `windows_compared` of every change in `d.run["timeline_changes"]` that has an
    analysed window on either side (None for the others)."""
    made: dict[tuple[int, int, tuple[int, ...]], dict[str, Any]] = {}
    for change in d.run["timeline_changes"]:
        pair = _pair(change, d)
        if pair is None:
            continue
        ranks = _ranks(change, d)
        key = (pair[0]["window"], pair[1]["window"], tuple(sorted(ranks)))
        if key not in made:  # two changes between the same windows: compared once
            before, after = (profile_of(ctx, d, ctx.root, ranks=ranks,
                                        steps=(w["steps"][0], w["steps"][1])) for w in pair)
            made[key] = windows_compared(compare(before, after, MIN_CHANGE_PCT), *pair)
        change["windows_compared"] = made[key]


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
           "moved": grew, "notes": c.notes}
    doc["sentence"] = _sentence(doc)
    return doc


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
    if doc["moved"]:
        out += "; moved most: " + ", ".join(
            f"{r['name']} {r['delta_ms']:+.1f} ms/step"
            + (f" ({r['share_pct']:.0f}% of the change)" if r["share_pct"] is not None else "")
            for r in doc["moved"][:3])
    return out


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"
