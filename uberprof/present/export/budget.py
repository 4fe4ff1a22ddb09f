"""The size budget: what to drop when the merged trace would not fit, least useful first.

Viewers load the whole JSON text (chrome://tracing stops near V8's 512 MB string limit, the
Perfetto UI slows down long before its own limit), so a run of many ranks must leave something
out. The order, least useful first: Python function events, forward-backward flow arrows and
profiler instants, then host operators and runtime calls from the shortest up, launch-to-kernel
arrows, and device kernels and copies from the shortest up. Step annotations, collectives,
synchronisations, data-loader and optimizer spans, uberprof's own findings and the counters are
never dropped. Within a duration-ordered tier the cut is a duration threshold, so what remains is
every event longer than it: the ones that matter for where the time went.

Sizes are the events' JSON text in the source, scaled per tier by what a sample of the tier
re-encodes to (`events.output_ratios`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uberprof.present.export.source import (
    TIER_DEVICE,
    TIER_HOST,
    TIER_LAUNCH_FLOWS,
    TIER_MINOR,
    TIER_PYTHON,
    FileScan,
)

__all__ = ["NEVER_DROPPED", "N_CATEGORIES", "TIER_NAMES", "Budget", "Cut", "categories"]

TIER_ORDER = (TIER_PYTHON, TIER_MINOR, TIER_HOST, TIER_LAUNCH_FLOWS, TIER_DEVICE)
TIER_NAMES = {
    TIER_PYTHON: "Python function events",
    TIER_MINOR: "forward-backward flow arrows and profiler instant events",
    TIER_HOST: "host operators and runtime calls",
    TIER_LAUNCH_FLOWS: "launch-to-kernel flow arrows",
    TIER_DEVICE: "device kernels, copies and memsets",
}
_BY_DURATION = frozenset({TIER_PYTHON, TIER_HOST, TIER_DEVICE})
# Duration buckets: 0 (< 100 ns), then x1.25 steps up to ~30 s.
EDGES_NS = np.concatenate([[0], np.geomspace(100, 3e10, 90)]).astype(np.int64)


# A tally by category: each droppable tier's duration buckets in TIER_ORDER, then one for the
# events never dropped (the last).
N_CATEGORIES = len(TIER_ORDER) * len(EDGES_NS) + 1
NEVER_DROPPED = N_CATEGORIES - 1
_TIER_POS = np.full(128, -1, dtype=np.int64)
_TIER_POS[list(TIER_ORDER)] = np.arange(len(TIER_ORDER))


def bucket_of(dur_ns: np.ndarray) -> np.ndarray:
    return np.searchsorted(EDGES_NS, np.maximum(dur_ns, 0), side="right") - 1


def categories(tier: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """Each event's category in a tally (`N_CATEGORIES`): its tier's bucket, as `Budget.hist`
    counts it (one bucket for a tier not cut by duration), or `NEVER_DROPPED`."""
    t = tier.astype(np.int64)
    pos = _TIER_POS[np.clip(t, 0, len(_TIER_POS) - 1)]
    by_dur = np.isin(t, list(_BY_DURATION))
    cat = pos * len(EDGES_NS) + np.where(by_dur, bucket, 0)
    return np.where(pos >= 0, cat, NEVER_DROPPED)


@dataclass
class Cut:
    """What the budget drops: whole tiers, and in one tier the events of a duration bucket
    or below."""

    full: frozenset[int] = frozenset()
    partial_tier: int | None = None
    partial_bucket: int = -1
    estimate_bytes: int = 0  # estimated size before the cut
    limit_bytes: int | None = None
    over_bytes: int = 0  # what remains over the limit with every droppable tier dropped

    @property
    def drops_anything(self) -> bool:
        return bool(self.full) or self.partial_tier is not None

    def threshold_ns(self) -> int | None:
        """Events of the partial tier shorter than this are dropped."""
        if self.partial_tier is None or self.partial_tier not in _BY_DURATION:
            return None
        return int(EDGES_NS[min(self.partial_bucket + 1, len(EDGES_NS) - 1)])

    def drop_mask(self, scan: FileScan, keep: np.ndarray) -> np.ndarray:
        """Which of the kept events of `scan` the cut removes."""
        drop = np.zeros(scan.n, dtype=bool)
        if not self.drops_anything:
            return drop
        if self.full:
            drop |= np.isin(scan.tier, list(self.full))
        if self.partial_tier is not None:
            in_tier = scan.tier == self.partial_tier
            if self.partial_tier in _BY_DURATION:
                in_tier &= bucket_of(scan.dur_ns) <= self.partial_bucket
            drop |= in_tier
        return drop & keep


@dataclass
class Budget:
    """Accumulates what the kept events weigh per tier and duration bucket, then decides."""

    limit_bytes: int
    fixed_bytes: int = 0
    other_bytes: int = 0
    hist: dict[int, np.ndarray] = field(default_factory=dict)
    # output bytes per source byte, per tier (-1: any other); none: sizes are the source's
    ratios: dict[int, float] = field(default_factory=dict)

    def add(self, scan: FileScan, keep: np.ndarray) -> None:
        self.add_weighed(*self.weigh(scan, keep))

    def weigh(self, scan: FileScan, keep: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kept events' tiers, output bytes (source text scaled by the tier's ratio) and
        duration buckets: what `add_weighed` counts, and what a per-step tally (stepfit.py)
        counts the same way."""
        tier = scan.tier[keep]
        size = scan.size[keep].astype(np.float64)
        if self.ratios:
            codes = np.unique(tier)
            factor = np.array([self.ratios.get(int(c), self.ratios.get(-1, 1.0))
                               for c in codes.tolist()])
            size *= factor[np.searchsorted(codes, tier)]
        return tier, np.rint(size).astype(np.int64), bucket_of(scan.dur_ns[keep])

    def add_weighed(self, tier: np.ndarray, size: np.ndarray, b: np.ndarray) -> None:
        self.other_bytes += int(size[~np.isin(tier, TIER_ORDER)].sum())
        for t in TIER_ORDER:
            m = tier == t
            if not m.any():
                continue
            h = self.hist.setdefault(t, np.zeros(len(EDGES_NS), dtype=np.int64))
            if t in _BY_DURATION:
                np.add.at(h, b[m], size[m])
            else:
                h[0] += int(size[m].sum())

    @classmethod
    def from_categories(cls, limit_bytes: int, weights: np.ndarray) -> Budget:
        """A budget over bytes already tallied by category (`categories`): a step window's."""
        nb = len(EDGES_NS)
        out = cls(limit_bytes, other_bytes=int(weights[NEVER_DROPPED]))
        for i, t in enumerate(TIER_ORDER):
            h = np.asarray(weights[i * nb:(i + 1) * nb], dtype=np.int64)
            if h.any():
                out.hist[t] = h.copy()
        return out

    def add_fixed(self, nbytes: int) -> None:
        self.fixed_bytes += int(nbytes)

    @property
    def total(self) -> int:
        return self.fixed_bytes + self.other_bytes + sum(int(h.sum()) for h in self.hist.values())

    def decide(self) -> Cut:
        total = self.total
        need = total - self.limit_bytes
        if need <= 0:
            return Cut(estimate_bytes=total, limit_bytes=self.limit_bytes)
        full: set[int] = set()
        for t in TIER_ORDER:
            h = self.hist.get(t)
            if h is None:
                continue
            weight = int(h.sum())
            if weight <= need:
                full.add(t)
                need -= weight
                if need <= 0:
                    break
                continue
            cum = np.cumsum(h)
            b = int(np.searchsorted(cum, need))
            if t not in _BY_DURATION:
                full.add(t)
                break
            return Cut(frozenset(full), t, b, total, self.limit_bytes)
        return Cut(frozenset(full), None, -1, total, self.limit_bytes, over_bytes=max(need, 0))


def describe_drops(counts: dict[int, list[int]], cut: Cut) -> list[dict[str, Any]]:
    """The budget's drops for the summary: per tier, events and (source) bytes."""
    out = []
    thr = cut.threshold_ns()
    for t in TIER_ORDER:
        n, nbytes = counts.get(t, [0, 0])
        if not n:
            continue
        entry: dict[str, Any] = {"what": TIER_NAMES[t], "reason": "size budget", "events": n,
                                 "mb": round(nbytes / 1e6, 2)}
        if t == cut.partial_tier and thr is not None:
            entry["what"] += f" shorter than {_us(thr)}"
            entry["shorter_than_us"] = thr / 1e3
        out.append(entry)
    return out


def _us(ns: int) -> str:
    return f"{ns / 1e3:.3g} µs" if ns < 1_000_000 else f"{ns / 1e6:.3g} ms"

