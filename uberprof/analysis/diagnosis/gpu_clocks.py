"""GPU clocks and throttle reasons per rank over the analysed window, from the NVML counters.

A GPU that is hot, power-capped or in hardware slowdown computes the same work more slowly: the
straggler's cause is `clock_throttle` rather than `compute` when its SM clock is clearly lower
than the others' or slowdown reasons are set on it and not on them, and a `throttle` finding
names any GPU that slowed down during the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uberprof.analysis.tables.context import RunContext

__all__ = [
    "CLOCK_DROP",
    "SLOWDOWN_FRACTION",
    "GpuClocks",
    "gpu_clocks",
    "throttled_vs_others",
]

SLOWDOWN_FRACTION = 0.1  # share of samples with a slowdown reason that counts as throttled
CLOCK_DROP = 0.05  # SM clock this much below the others' median counts as lower


@dataclass
class GpuClocks:
    rank: int
    node: str
    gpu: str
    samples: int
    sm_clock_mhz: float | None  # median over the window
    sm_clock_max_mhz: float | None
    slowdown_fraction: float  # share of samples with a slowdown reason set
    reasons: dict[str, float] = field(default_factory=dict)  # reason -> share of samples

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gpu": self.gpu, "samples": self.samples,
                "sm_clock_mhz": _round(self.sm_clock_mhz),
                "sm_clock_max_mhz": _round(self.sm_clock_max_mhz),
                "slowdown_pct": round(100 * self.slowdown_fraction, 1),
                "reasons": {k: round(100 * v, 1) for k, v in self.reasons.items() if v > 0}}


def gpu_clocks(ctx: RunContext, window: tuple[int, int] | None) -> dict[int, GpuClocks]:
    """Clocks of each rank's GPU between window[0] and window[1] (epoch ns); {} without NVML."""
    if not ctx.is_run_dir or window is None:
        return {}
    try:
        from uberprof.rundir.counters import counter_series, counters_table, rank_gpus

        mapping = rank_gpus(ctx.root)
    except Exception:  # noqa: BLE001 - counters are optional evidence
        return {}
    out: dict[int, GpuClocks] = {}
    nodes: dict[str, dict[str, dict[str, np.ndarray]]] = {}  # each node's table read once
    for rank, (node, gpu) in mapping.items():
        if node not in nodes:
            try:
                metrics = [r["metric"] for r in counter_series(ctx.root, node)
                           if r["source"] == "nvml" and _wanted(r["metric"])]
                nodes[node] = _series(counters_table(ctx.root, node, sources=["nvml"],
                                                     metrics=metrics, start_ns=window[0],
                                                     end_ns=window[1], label_ranks=False))
            except Exception:  # noqa: BLE001
                nodes[node] = {}
        series = nodes[node]
        if not series:  # no NVML rows in the window on that node
            continue
        mine = series.get(gpu, {})
        empty = np.zeros(0)
        sm, smax, slow = (mine.get(m, empty)
                          for m in ("clock.sm", "clock.sm_max", "clocks_slowdown"))
        reasons = {m.split(".", 1)[1]: float(v.mean()) if v.size else 0.0
                   for m, v in sorted(mine.items())
                   if m.startswith("clocks_event.") and m != "clocks_event.gpu_idle"}
        out[rank] = GpuClocks(rank=rank, node=node, gpu=gpu, samples=int(sm.size),
                              sm_clock_mhz=float(np.median(sm)) if sm.size else None,
                              sm_clock_max_mhz=float(smax.max()) if smax.size else None,
                              slowdown_fraction=float(slow.mean()) if slow.size else 0.0,
                              reasons=reasons)
    return out


def _wanted(metric: str) -> bool:
    """The NVML series the clocks read (a node holds 20-40 others: power, memory, links)."""
    return metric in ("clock.sm", "clock.sm_max", "clocks_slowdown") or (
        metric.startswith("clocks_event.") and metric != "clocks_event.gpu_idle")


def _series(t: Any) -> dict[str, dict[str, np.ndarray]]:
    """A node's counters table as device -> metric -> values (in time order), grouped in one
    sort: the node holds 8 GPUs x ~20 metrics x the window's samples."""
    import pyarrow.compute as pc

    if t.num_rows == 0:
        return {}
    dev, met = (pc.dictionary_encode(pc.fill_null(t.column(c), "")).combine_chunks()
                for c in ("device", "metric"))
    devs, mets = dev.dictionary.to_pylist(), met.dictionary.to_pylist()
    key = (dev.indices.to_numpy(zero_copy_only=False).astype(np.int64) * len(mets)
           + met.indices.to_numpy(zero_copy_only=False))
    order = np.argsort(key, kind="stable")
    key, val = key[order], t.column("value").to_numpy()[order]
    bounds = np.flatnonzero(np.diff(key)) + 1
    out: dict[str, dict[str, np.ndarray]] = {}
    for k, v in zip(key[np.r_[0, bounds]].tolist(), np.split(val, bounds), strict=True):
        out.setdefault(devs[k // len(mets)], {})[mets[k % len(mets)]] = v
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def throttled_vs_others(rank: int, clocks: dict[int, GpuClocks]) -> dict[str, Any]:
    """Whether `rank`'s GPU ran slower clocks or throttled more than the other ranks' GPUs."""
    me = clocks.get(rank)
    others = [c for r, c in clocks.items() if r != rank]
    if me is None or not others:
        return {"throttled": False, "available": me is not None}
    o_clock = [c.sm_clock_mhz for c in others if c.sm_clock_mhz]
    o_slow = float(np.median([c.slowdown_fraction for c in others]))
    lower = bool(me.sm_clock_mhz and o_clock
                 and me.sm_clock_mhz < (1 - CLOCK_DROP) * float(np.median(o_clock)))
    slowed = me.slowdown_fraction >= SLOWDOWN_FRACTION and o_slow < SLOWDOWN_FRACTION / 2
    return {"throttled": lower or slowed, "available": True, **me.as_dict(),
            "others_sm_clock_mhz": _round(float(np.median(o_clock))) if o_clock else None,
            "others_slowdown_pct": round(100 * o_slow, 1)}
