"""Which events of one scanned trace file go into the export, and what was left out.

Decided on the scan's arrays before anything is written: the rules first (invalid times,
Python function events unless asked for, outside the selected steps), then the size budget's
cut, then the flow arrows that lost an end. `Drops` counts what each left out, for the summary.
The budget's measuring pass calls the same rules (`keep_by_rule`) and samples the kept events'
re-encoded size per tier (`output_ratios`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uberprof.ingest.trace import TraceError
from uberprof.present.export.budget import Cut, describe_drops
from uberprof.present.export.source import (
    PH_FLOW,
    PH_M,
    PH_X,
    TIER_PYTHON,
    FileScan,
    scan_file,
)

__all__ = ["Drops", "keep_by_rule", "kept_events", "output_ratio", "output_ratios", "read_scan"]

RULE_DROPS = {
    "python": "Python function events (off by default: --with-python keeps them)",
    "steps": "complete events outside the selected steps",
    "invalid": "complete events without a usable time or with a negative duration "
               "(uberprof analyze leaves them out too)",
}


@dataclass
class Drops:
    """Events left out so far: by rule (reason -> [events, 0]) and by the size budget
    (tier -> [events, bytes])."""

    rules: dict[str, list[int]] = field(default_factory=dict)
    tiers: dict[int, list[int]] = field(default_factory=dict)

    def report(self, cut: Cut) -> list[dict[str, Any]]:
        """What was left out, one entry per reason, as the summary and the CLI say it."""
        out = [{"what": RULE_DROPS[k], "reason": k, "events": v[0]}
               for k, v in self.rules.items() if v[0]]
        return out + describe_drops(self.tiers, cut)


def read_scan(path: str, notes: list[str]) -> FileScan | None:
    """The scan of one trace file; one that cannot be read is a note, never the end of the
    export (the other ranks' files are still worth having)."""
    try:
        return scan_file(path)
    except TraceError as exc:
        notes.append(str(exc) + "; left out")
        return None
    except Exception as exc:  # noqa: BLE001 - one odd file never costs the other ranks
        notes.append(f"{path}: could not be read ({type(exc).__name__}: {exc}); left out "
                     "(please report this)")
        return None


def kept_events(scan: FileScan, window: tuple[int, int] | None, python: bool, cut: Cut,
                drops: Drops) -> np.ndarray:
    """The events of `scan` to write: by rule, then by the budget's cut, then the flows
    paired; what each left out is added to `drops`."""
    keep, rule_drops = keep_by_rule(scan, window, python)
    for k, v in rule_drops.items():
        drops.rules.setdefault(k, [0, 0])[0] += v
    by_budget = cut.drop_mask(scan, keep)
    if by_budget.any():
        for t in np.unique(scan.tier[by_budget]).tolist():
            m = by_budget & (scan.tier == t)
            c = drops.tiers.setdefault(int(t), [0, 0])
            c[0] += int(m.sum())
            c[1] += int(scan.size[m].sum())
        keep = keep & ~by_budget
    return _pair_flows(scan, keep)


def keep_by_rule(scan: FileScan, window: tuple[int, int] | None,
                 python: bool) -> tuple[np.ndarray, dict[str, int]]:
    """Events kept before the budget, and what was left out by rule (not by size)."""
    ph = scan.ph
    x = ph == PH_X
    valid = scan.ts_ok & (~x | (scan.dur_ns >= 0))
    keep = valid & (ph != PH_M)
    drops: dict[str, int] = {}
    bad = int((x & ~valid).sum())
    if bad:
        drops["invalid"] = bad
    if not python:
        py = keep & (scan.tier == TIER_PYTHON)
        if py.any():
            drops["python"] = int(py.sum())
            keep &= ~py
    if window is not None:
        lo, hi = window
        end = scan.ts_ns + np.where(x, np.maximum(scan.dur_ns, 0), 0)
        # overlapping the window (touching its edges is not), instants inside it
        inside = ((scan.ts_ns < hi) & (end > lo)) | ((end == scan.ts_ns) & (scan.ts_ns >= lo)
                                                     & (scan.ts_ns < hi))
        out = keep & ~inside
        if out.any():
            drops["steps"] = int((out & x).sum())
            keep &= inside
    return keep, drops


def output_ratio(scan: FileScan, keep: np.ndarray, sample: int = 2000) -> float:
    """Bytes the JSON export writes per byte of source text, from a sample of the file's kept
    events re-encoded compactly (Kineto indents and spaces its JSON; the export does not, and
    its timestamps are shorter)."""
    import msgspec
    import orjson

    idx = np.flatnonzero(keep & (scan.ph != PH_M))
    if idx.size == 0:
        return 1.0
    idx = idx[np.linspace(0, idx.size - 1, min(sample, idx.size)).astype(np.int64)]
    raws = [scan.raw.events[i] for i in idx.tolist()]
    evs = msgspec.json.decode(b"[" + b",".join(raws) + b"]")
    out = 0
    for e in evs:
        if isinstance(e, dict):
            e["ts"] = 1_234_567.89025  # a typical exported time: µs after the export's base
            out += len(orjson.dumps(e)) + 1
    src = sum(len(r) for r in raws) + len(raws)
    return min(max(out / src, 0.2), 1.5)


def output_ratios(scan: FileScan, keep: np.ndarray, sample: int = 2000) -> dict[int, float]:
    """`output_ratio` per usefulness tier (`scan.tier`), each from its own sample: the tiers
    re-encode differently (a device kernel's args carry more of its text than a host op's
    indentation does), and what the budget keeps is mostly one tier, so one ratio over every
    kept event misjudged the written size (2 ranks of 967 MiB: 680 MB written for a 500 MB
    budget). Key -1: the ratio over all kept events, for a tier without a sample."""
    out = {-1: output_ratio(scan, keep, sample)}
    for t in np.unique(scan.tier[keep]).tolist():
        out[int(t)] = output_ratio(scan, keep & (scan.tier == t), sample)
    return out


def _pair_flows(scan: FileScan, keep: np.ndarray) -> np.ndarray:
    """Flow arrows whose start or end (or the launch or kernel they bind to) is gone are
    dropped too: a viewer would draw them to nowhere, or to the wrong slice."""
    ph = scan.ph
    is_flow = ph == PH_FLOW
    if not is_flow.any():
        return keep
    gone_x = (ph == PH_X) & ~keep & (scan.correlation >= 0)
    if gone_x.any():
        orphan = is_flow & (scan.flow_int_id >= 0) & np.isin(scan.flow_int_id,
                                                             scan.correlation[gone_x])
        keep = keep & ~orphan
    live = keep & is_flow & (scan.flow >= 0)
    starts = np.unique(scan.flow[live & ~scan.flow_end])
    ends = np.unique(scan.flow[live & scan.flow_end])
    both = np.intersect1d(starts, ends, assume_unique=True)
    return keep & ~(is_flow & ~np.isin(scan.flow, both))
