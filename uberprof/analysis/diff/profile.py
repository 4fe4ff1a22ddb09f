"""`profile_run(path)`: one run read by its path, analysed and diagnosed if needed (its saved
diagnosis otherwise), and reduced to a `RunProfile` (`profiles.py`, which holds the profile
itself and is what the diagnosis uses on its own trace windows)."""

from __future__ import annotations

import os

from uberprof.analysis.diagnosis.gaps import DEFAULT_THRESHOLD_NS
from uberprof.analysis.diagnosis.saved import load_or_diagnose
from uberprof.analysis.diff.profiles import (
    BREAKDOWN_PARTS,
    NothingToCompare,
    Progress,
    RunProfile,
    _ops,
    profile_of,
)
from uberprof.analysis.tables.context import load_context
from uberprof.rundir.damage import damage_problems

__all__ = ["BREAKDOWN_PARTS", "NothingToCompare", "RunProfile", "_ops", "profile_run"]


def profile_run(path: str | os.PathLike[str], ranks: set[int] | None = None,
                steps: tuple[int, int] | None = None, out: str | os.PathLike[str] | None = None,
                workers: int | None = None, progress: Progress | None = None,
                threshold_ns: int = DEFAULT_THRESHOLD_NS) -> RunProfile:
    """Analyse and diagnose `path` if needed, and keep what a comparison needs of it."""
    ctx = load_context(path, out=out, workers=workers, progress=progress)
    d = load_or_diagnose(ctx, threshold_ns=threshold_ns)
    # damaged run.json, node.json, flight logs, counters: named, as every command names them
    notes: list[str] = damage_problems(ctx.root) if ctx.is_run_dir else []
    return profile_of(ctx, d, path, ranks, steps, notes)
