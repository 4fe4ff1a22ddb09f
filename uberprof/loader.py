"""`uberprof.load(path)`: a run's analysis tables for notebooks, as pandas or Arrow."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import orjson
import pyarrow as pa

from uberprof.analysis.tables import derived as D
from uberprof.analysis.tables.pipeline import Analysis, analyze

__all__ = ["Run", "load"]

Format = Literal["pandas", "arrow"]


def load(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
         workers: int | None = None, force: bool = False) -> Run:
    """Analyse the traces under `path` (reusing what is already analysed) and return a `Run`.

    `path` is a uberprof run directory, a folder of Kineto traces or one trace file. Derived
    tables are written beside the data, in `out`, or (read-only data) in a cache folder.
    """
    return Run(analyze(path, out=out, workers=workers, force=force))


class Run:
    """The tables of one analysed run. Every method returns pandas unless `format="arrow"`.
    A thin facade: the tables are read by `uberprof.analysis.tables.derived`."""

    def __init__(self, analysis: Analysis) -> None:
        self._a = analysis

    def __repr__(self) -> str:
        return (f"<uberprof.Run {self._a.source}: {len(self.ranks)} ranks, "
                f"{len(self.problems)} problems>")

    @property
    def path(self) -> Path:
        return self._a.source

    @property
    def derived(self) -> Path:
        """The folder holding the Parquet tables (query them with DuckDB or pyarrow directly)."""
        return self._a.derived

    @property
    def ranks(self) -> list[int]:
        return [r["rank"] for r in self._a.ranks]

    @property
    def problems(self) -> list[str]:
        return list(self._a.summary["problems"])

    def summary(self) -> dict[str, Any]:
        """The `uberprof analyze --json` document."""
        return orjson.loads(orjson.dumps(self._a.summary))

    def breakdown(self, format: Format = "pandas") -> Any:
        """One row per rank: whole-trace breakdown in ns and percent (HTA-compatible)."""
        return _out(D.read_ranks(self.derived), format)

    def steps(self, rank: int | None = None, format: Format = "pandas") -> Any:
        """One row per rank and step: host and device windows and the step's breakdown."""
        return _out(D.read_run_steps(self.derived, rank), format)

    def collectives(self, rank: int | None = None, format: Format = "pandas") -> Any:
        """One row per collective instance: name, bytes, dtype, group, times, step."""
        return _out(D.read_collectives(self.derived, rank), format)

    def operators(self, rank: int | None = None, format: Format = "pandas") -> Any:
        """One row per rank, kind and name: operators' and kernels' calls, self and inclusive
        ns over the analysed steps (docs/operators.md), the numbers `report` ranks."""
        return _out(D.read_operators(self.derived, rank), format)

    def events(self, rank: int, format: Format = "pandas") -> Any:
        """Every event of one rank (all its trace files), sorted by start; times in ns."""
        try:
            t = D.read_rank_events(self.derived, self._a.inputs, rank)
        except KeyError:
            raise KeyError(f"rank {rank} is not in this run (ranks: {self.ranks})") from None
        return _out(t, format)


def _out(t: pa.Table, format: Format) -> Any:
    if format == "arrow":
        return t
    if format == "pandas":
        # Nullable integer columns: a null would otherwise turn int64 into float64, and epoch
        # nanoseconds (~1.8e18) do not survive float64.
        import pandas as pd

        mapping = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}
        return t.to_pandas(types_mapper=mapping.get)
    raise ValueError(f"format must be 'pandas' or 'arrow', not {format!r}")

