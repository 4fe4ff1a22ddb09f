"""What `/compare` shows (`uberprof dashboard B --compare A`): this run against a baseline, by
`uberprof.analysis.diff` (the comparison `uberprof diff A B` makes, read from each run's saved
diagnosis): the headline (step time A and B, their ratio and the significance test), where the
time moved, and the operators whose time changed most."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from uberprof.dashboards.data import RunData

__all__ = ["Compared", "comparison"]


@dataclass(frozen=True)
class Compared:
    """The comparison's document (`Comparison.to_json()`), or why there is none."""

    doc: dict[str, Any] | None
    error: str | None = None


def comparison(run: RunData) -> Compared | None:
    """This run (B) against its baseline (A), computed once; None without a baseline."""
    if run.baseline is None:
        return None
    return run.once("comparison", lambda: _compare(run))


def _compare(run: RunData) -> Compared:
    from uberprof.analysis.diff import compare, profile_run
    from uberprof.ingest.discover import NoTraces

    assert run.baseline is not None
    try:
        a = profile_run(run.baseline, workers=run.workers)
        b = profile_run(run.root, out=run.out, workers=run.workers)
    except NoTraces as exc:
        return Compared(None, f"nothing to compare: {exc}")
    return Compared(compare(a, b).to_json())

