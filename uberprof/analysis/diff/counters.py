"""Counters of one run over its compared steps: one mean per (source, metric).

GPU clocks, power and utilisation (nvml, gpm, dcgm), host CPU and memory, NIC and InfiniBand
rates, read through `uberprof.rundir.counters`. Per-process rows (`proc`) are left out: their
devices are process ids, which never match between two runs. Samples come from the window of
the compared steps, or from the whole run when the window holds none (counters are sampled
every ~0.5 s, steps can be shorter).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from uberprof.rundir.counters import counters_table

__all__ = ["CounterStat", "counter_stats"]

SKIPPED_SOURCES = ("proc",)


@dataclass(frozen=True)
class CounterStat:
    source: str
    metric: str
    unit: str | None
    mean: float  # over devices and samples
    devices: int
    samples: int


def counter_stats(root: Path, window: tuple[int, int] | None) -> tuple[dict[tuple[str, str],
                                                                           CounterStat], str]:
    """Means per (source, metric), and which samples they are from ("steps" or "run")."""
    for span, label in ((window, "steps"), (None, "run")):
        if label == "steps" and span is None:
            continue
        table = counters_table(root, start_ns=span[0] if span else None,
                               end_ns=span[1] if span else None, label_ranks=False)
        if table.num_rows == 0:
            continue
        con = duckdb.connect()
        try:
            con.register("t", table)
            skipped = ", ".join(f"'{x}'" for x in SKIPPED_SOURCES)
            rows = con.sql(f"""
                SELECT source, metric, any_value(unit), avg(value), count(DISTINCT device),
                       count(*)
                FROM t WHERE source NOT IN ({skipped}) GROUP BY ALL ORDER BY 1, 2""").fetchall()
        finally:
            con.close()
        if rows:
            return {(s, m): CounterStat(s, m, u, float(v), int(nd), int(n))
                    for s, m, u, v, nd, n in rows}, label
    return {}, "none"
