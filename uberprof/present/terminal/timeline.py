"""The report's story in time, near its top: where the step time changed level (the change the
analysis marked `lead` first, then the others), and what changed between the trace windows
on either side. The sentences are the analysis's own (`run.timeline_changes`,
analysis/diagnosis/timeline_changes.py); this only chooses which to print."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_OTHERS", "timeline_lines"]

MAX_OTHERS = 2  # other changes printed after the lead one


def timeline_lines(run: dict[str, Any]) -> list[tuple[str, bool]]:
    """(line, is the lead change's) to print near the top; [] where the step time held its
    level."""
    changes = run["timeline_changes"]
    lead = [c for c in changes if c["lead"]]
    others = [c for c in changes if not c["lead"]]
    out: list[tuple[str, bool]] = []
    for c in lead:
        out.append((c["summary"], True))
        if c["windows_compared"]:
            out.append((c["windows_compared"]["sentence"], True))
    out += [(f"also {c['summary']}", False) for c in others[:MAX_OTHERS]]
    if len(others) > MAX_OTHERS:
        more = f"{len(others) - MAX_OTHERS} more change(s) of level: --json (run.timeline_changes)"
        out.append((more, False))
    return out
