"""What `/counters` shows besides the counters themselves (`RunData.counter_series`): the
periods a GPU throttled (a clock slowdown reason set), the step boundaries of a rank on the
run's time axis, and which rank's steps to draw for a node."""

from __future__ import annotations

import numpy as np

from uberprof.analysis.read import sql_table
from uberprof.dashboards.data import RunData

__all__ = ["merge_spans", "rank_on_node", "step_boundaries", "throttle_spans"]


def throttle_spans(run: RunData, node: str, devices: list[str] | None = None
                   ) -> list[tuple[str, float, float]]:
    """(device, start s, end s) of the runs of samples with a clock slowdown reason set."""
    def build() -> list[tuple[str, float, float]]:
        t = run.counters(node, ["nvml"], ["clocks_slowdown"])
        if t is None or t.num_rows == 0:
            return []
        origin = run.time_origin_ns() or 0
        q = sql_table("""
            WITH o AS (
                SELECT device, ts_ns, value > 0 AS on_,
                       lead(ts_ns) OVER (PARTITION BY device ORDER BY ts_ns) AS nxt,
                       lag(value > 0) OVER (PARTITION BY device ORDER BY ts_ns) AS prev
                FROM t
            ), g AS (
                SELECT *, sum(CASE WHEN on_ AND coalesce(prev, false) = false THEN 1 ELSE 0 END)
                          OVER (PARTITION BY device ORDER BY ts_ns) AS run
                FROM o
            )
            SELECT device, min(ts_ns) AS s, max(coalesce(nxt, ts_ns)) AS e
            FROM g WHERE on_ GROUP BY device, run ORDER BY s
        """, t=t).to_pylist()
        return [(r["device"], (r["s"] - origin) / 1e9, (r["e"] - origin) / 1e9) for r in q]
    spans = run.once(f"throttle:{node}", build)
    return [s for s in spans if devices is None or s[0] in devices]


def merge_spans(spans: list[tuple[str, float, float]], limit: int = 200
                ) -> list[tuple[float, float]]:
    """Throttle periods of all GPUs as bands, joined across short breaks so that at most
    `limit` bands are drawn (a GPU that recovers for one sample is still throttling)."""
    if not spans:
        return []
    ivs = sorted((lo, hi) for _, lo, hi in spans)
    total = ivs[-1][1] - ivs[0][0]
    join = 0.0
    while True:
        out: list[list[float]] = []
        for lo, hi in ivs:
            if out and lo - out[-1][1] <= join:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        if len(out) <= limit or total <= 0:
            return [(a, b) for a, b in out]
        join = max(join * 2, total / 1000)


def step_boundaries(run: RunData, rank: int, max_lines: int = 400) -> tuple[np.ndarray, int]:
    """Start times (s from the run's origin) of a rank's steps, every k-th when there are
    more than `max_lines`; returns the times and k."""
    t = run.rank_steps(rank)
    starts = np.sort(t.column("host_start_ns").to_numpy(zero_copy_only=False).astype(np.float64))
    starts = starts[~np.isnan(starts)]
    k = max(1, -(-starts.size // max_lines))
    origin = run.time_origin_ns() or 0
    return (starts[::k] - origin) / 1e9, k


def rank_on_node(run: RunData, host: str, rank: int | None) -> int | None:
    """The rank whose step boundaries a node's panels show: the selected one when it ran on
    `host`, else the first that did (else the run's first rank)."""
    ranks = [r for r in run.ranks() if run.host_of(r) == host]
    if rank in ranks:
        return rank
    return ranks[0] if ranks else (run.ranks()[0] if run.ranks() else None)
