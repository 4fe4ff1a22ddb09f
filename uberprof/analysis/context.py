"""What the diagnosis reads: the tables of `uberprof analyze`, each rank's metadata (host, clock,
process groups) and the run directory's counters, gathered once behind one object.

The diagnosis never reads trace files itself: it works from the derived tables, so it runs in
seconds on runs whose traces took minutes to ingest, and it reruns `analyze` only for traces
that changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from uberprof.analysis.pipeline import INPUTS_DIR, analyze
from uberprof.analysis.rank import SUMMARY_FILE
from uberprof.loader import Run
from uberprof.rundir import RunDir, ranks_by_id

__all__ = ["RankInfo", "RunContext", "load_context"]


@dataclass(frozen=True)
class RankInfo:
    """One rank's identity as far as the run says: where it ran and what its clock was."""

    rank: int
    host: str | None  # None when neither rank.json nor the trace names it
    world_size: int | None
    local_rank: int | None
    backend: str | None
    mode: str  # "device" or "cpu"
    device_type: str
    clock: dict[str, Any]  # rank.json "clock" (online offset estimate), {} for plain traces
    process_groups: list[dict[str, Any]]  # from the trace's distributedInfo.pg_config
    window: tuple[int, int] | None = None  # whole-trace window (first to last activity), ns


@dataclass
class RunContext:
    """A run's analysis tables plus the metadata the cross-rank diagnosis needs."""

    run: Run
    root: Path
    is_run_dir: bool
    ranks: dict[int, RankInfo]
    problems: list[str] = field(default_factory=list)
    _cache: dict[str, pa.Table] = field(default_factory=dict, repr=False)

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    def steps(self) -> pa.Table:
        """RUN_STEP_SCHEMA rows (one per rank and step), Arrow."""
        if "steps" not in self._cache:
            self._cache["steps"] = self.run.steps(format="arrow")
        return self._cache["steps"]

    def collectives(self) -> pa.Table:
        """One row per collective instance on each rank, Arrow."""
        if "collectives" not in self._cache:
            self._cache["collectives"] = self.run.collectives(format="arrow")
        return self._cache["collectives"]

    def breakdown(self) -> pa.Table:
        """RANK_SCHEMA rows (whole-trace breakdown per rank), Arrow."""
        if "ranks" not in self._cache:
            self._cache["ranks"] = self.run.breakdown(format="arrow")
        return self._cache["ranks"]

    def events(self, rank: int) -> pa.Table:
        """Every event of one rank (not cached: a rank's table at a time bounds memory)."""
        return self.run.events(rank, format="arrow")

    def host_of(self, rank: int) -> str | None:
        info = self.ranks.get(rank)
        return info.host if info else None


Progress = Callable[[int, int, str], None]


def load_context(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 workers: int | None = None, progress: Progress | None = None,
                 force: bool = False) -> RunContext:
    """Analyse `path` (reusing up-to-date tables) and gather rank metadata for the diagnosis."""
    analysis = analyze(path, out=out, workers=workers, progress=progress, force=force)
    run = Run(analysis)
    root = Path(analysis.source)
    run_dir = RunDir(root)
    is_run = run_dir.is_run()
    meta = {r: m.raw for r, m in ranks_by_id(run_dir).items()} if is_run else {}
    summaries = _input_summaries(analysis.derived, analysis.inputs)
    ranks: dict[int, RankInfo] = {}
    for row in analysis.ranks:
        r = int(row["rank"])
        m = meta.get(r, {})
        s = summaries.get(r, {})
        ranks[r] = RankInfo(
            rank=r,
            host=_str(m.get("host")) or _str(row.get("host")) or _str(s.get("host")),
            world_size=_int(m.get("world_size")) or _int(s.get("world_size")),
            local_rank=_int(m.get("local_rank")),
            backend=_str(m.get("backend")) or _str(s.get("backend")),
            mode=str(row.get("mode") or "cpu"),
            device_type=str(row.get("device_type") or "cpu"),
            clock=m.get("clock") if isinstance(m.get("clock"), dict) else {},
            process_groups=list(s.get("process_groups") or []),
            window=_window(s),
        )
    return RunContext(run=run, root=root, is_run_dir=is_run, ranks=ranks,
                      problems=list(analysis.summary.get("problems") or []))


def _input_summaries(derived: Path, inputs: dict[str, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The first readable summary.json per rank (trace header facts: host, world, groups)."""
    out: dict[int, dict[str, Any]] = {}
    for entry in inputs.values():
        rank = entry.get("rank")
        if not isinstance(rank, int) or rank in out or entry.get("status") != "ok":
            continue
        try:
            doc = orjson.loads((derived / INPUTS_DIR / entry["key"] / SUMMARY_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError, KeyError):
            continue
        out[rank] = doc.get("summary") or {}
    return out


def _window(summary: dict[str, Any]) -> tuple[int, int] | None:
    lo, hi = _int(summary.get("window_start_ns")), _int(summary.get("window_end_ns"))
    return (lo, hi) if lo is not None and hi is not None and hi > lo else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
