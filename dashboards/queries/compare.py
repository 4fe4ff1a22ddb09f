"""What `/compare` shows (`uberprof dashboard B --compare A`): this run against a baseline, as
`uberprof diff A B` compares them (`uberprof.analysis.read.compare_runs`, from each run's saved
diagnosis): the headline (step time A and B, their ratio and the significance test), where the
time moved, and the operators whose time changed most. `uberprof dashboard` makes the
comparison while it prepares the run and hands it to `RunData`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from uberprof.dashboards.data import RunData

__all__ = ["Compared", "compare_with", "comparison"]


@dataclass(frozen=True)
class Compared:
    """The comparison's document (`Comparison.to_json()`), or why there is none."""

    doc: dict[str, Any] | None
    error: str | None = None


def compare_with(baseline: str | os.PathLike[str], run: str | os.PathLike[str],
                 out: str | os.PathLike[str] | None = None, workers: int | None = None
                 ) -> Compared:
    """Run B (`run`, its tables in `out`) against run A (`baseline`): `read.compare_runs`."""
    from uberprof.analysis.read import compare_runs
    from uberprof.ingest.discover import NoTraces

    try:
        return Compared(compare_runs(baseline, run, out=out, workers=workers).to_json())
    except NoTraces as exc:
        return Compared(None, f"nothing to compare: {exc}")


def comparison(run: RunData) -> Compared | None:
    """This run (B) against its baseline (A): the comparison `run` was given, else made once
    on first use; None without a baseline."""
    if run.baseline is None:
        return None
    if run.comparison is not None:
        return run.comparison
    baseline = run.baseline
    return run.once("comparison", lambda: compare_with(baseline, run.root, run.out,
                                                       run.workers))
