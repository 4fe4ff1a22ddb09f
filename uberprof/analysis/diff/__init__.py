"""`uberprof diff A B`: what changed between two runs, and whether it is beyond noise.

`profile_run(path) -> RunProfile` reads one run through its context and diagnosis;
`compare(a, b) -> Comparison` is pure; `diff_runs(a, b)` does both. Modules: `stats` (the
significance test), `operators`, `comm`, `counters`, `metadata` (one run each), `compare`.
"""

from __future__ import annotations

import os
from typing import Any

from uberprof.analysis.diff.compare import SCHEMA_VERSION, Comparison, compare
from uberprof.analysis.diff.profile import RunProfile, profile_run
from uberprof.analysis.diff.stats import DEFAULT_MIN_CHANGE_PCT, ShiftTest, median_ratio_test

__all__ = ["DEFAULT_MIN_CHANGE_PCT", "SCHEMA_VERSION", "Comparison", "RunProfile", "ShiftTest",
           "compare", "diff_runs", "median_ratio_test", "profile_run"]


def diff_runs(a: str | os.PathLike[str], b: str | os.PathLike[str],
              min_change_pct: float = DEFAULT_MIN_CHANGE_PCT, **options: Any) -> Comparison:
    """Profile A, then B (one after the other: they may share a derived folder), and compare.
    `options` go to `profile_run` (ranks, steps, workers, progress, threshold_ns)."""
    return compare(profile_run(a, **options), profile_run(b, **options),
                   min_change_pct=min_change_pct)
