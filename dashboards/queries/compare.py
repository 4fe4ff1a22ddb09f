"""What `/compare` shows (`uberprof dashboard B --compare A`): this run against a baseline, as
`uberprof diff A B` compares them (`uberprof.analysis.read.compare_runs`, from each run's saved
diagnosis): the headline (step time A and B, their ratio and the significance test), where the
time moved, and the operators whose time changed most. `uberprof dashboard` makes the
comparison while it prepares the run and hands it to `RunData`.

With several runs (`--compare A --compare C ...`), or two of other world sizes, also their
scaling (`uberprof.analysis.read.scaling_of`, the `uberprof scaling --json` document): each
run's throughput per rank and efficiency against the smallest, and where the step time went."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from uberprof.dashboards.data import RunData

__all__ = ["Compared", "compare_with", "comparison", "scaling_with"]


@dataclass(frozen=True)
class Compared:
    """The comparison's document (`Comparison.to_json()`), or why there is none; and the
    scaling document of every run given (`uberprof scaling --json`), or why there is none
    (both None when the runs do not call for one)."""

    doc: dict[str, Any] | None
    error: str | None = None
    scaling: dict[str, Any] | None = None
    scaling_error: str | None = None


def compare_with(baseline: str | os.PathLike[str], run: str | os.PathLike[str],
                 out: str | os.PathLike[str] | None = None, workers: int | None = None,
                 others: tuple[str | os.PathLike[str], ...] = ()) -> Compared:
    """Run B (`run`, its tables in `out`) against run A (`baseline`): `read.compare_runs`;
    and, when more runs are given (`others`) or A and B have other world sizes, the scaling of
    all of them: `read.scaling_of` (runs of other jobs are compared anyway, the differences
    listed in the document)."""
    from uberprof.analysis.read import compare_runs
    from uberprof.ingest.discover import NoTraces

    try:
        doc: dict[str, Any] | None = compare_runs(baseline, run, out=out,
                                                  workers=workers).to_json()
        error = None
    except NoTraces as exc:
        doc, error = None, f"nothing to compare: {exc}"
    sizes = {doc[k]["world_size"] for k in ("a", "b")} if doc is not None else set()
    if not others and len(sizes) < 2:
        return Compared(doc, error)
    scaled, why = scaling_with([baseline, *others], run, out=out, workers=workers)
    return Compared(doc, error, scaled, why)


def scaling_with(runs: list[str | os.PathLike[str]], run: str | os.PathLike[str],
                 out: str | os.PathLike[str] | None = None, workers: int | None = None
                 ) -> tuple[dict[str, Any] | None, str | None]:
    """The scaling document of `runs` and this run (its tables in `out`), or why there is
    none (one line naming the run)."""
    from uberprof.analysis.read import scaling_of

    paths = [*runs, run]
    try:
        return scaling_of(paths, outs=[*([None] * len(runs)), out], force=True,
                          workers=workers), None
    except ValueError as exc:  # ScalingError: a run that cannot be analysed, named
        return None, f"no scaling: {exc}"


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
