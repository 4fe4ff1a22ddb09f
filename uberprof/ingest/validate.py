"""Range checks on decoded trace times: an event whose time cannot be true is left out and
counted, never turned into a figure.

Kineto writes `ts` and `dur` in µs as JSON numbers; a corrupt or hand-edited trace can hold
values whose nanoseconds overflow int64 (a median step of -9223372036854.775 ms, 100% idle) or
that lie days away from the rest of the trace (one event stretching the window to years). Both
readers of a trace, ingest and the export's scan, check their decoded columns here, once, before
converting them to integer nanoseconds, and share the conversions on either side: a JSON time
value to float µs (`as_float`), float µs to int64 ns (`us_to_ns`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["LIMIT_NS", "MAX_SPAN_NS", "TimeCheck", "as_float", "check_times", "us_to_ns"]

LIMIT_NS = 1 << 62
"""|ts| and dur in ns stay below this (146 years), so that ts + dur never overflows int64."""
MAX_SPAN_NS = 86_400 * 10**9
"""No event lasts longer, or lies further from the trace's median start, than a day: profiler
windows hold seconds to minutes of a job."""


@dataclass(frozen=True)
class TimeCheck:
    """Which events have times that can be true (`keep`, None when all do), the decoded
    columns with the others replaced by harmless values, and the problem to report."""

    ts_us: np.ndarray
    dur_us: np.ndarray
    keep: np.ndarray | None
    problem: str | None

    @property
    def dropped(self) -> int:
        return 0 if self.keep is None else int((~self.keep).sum())


def check_times(ts_us: np.ndarray, dur_us: np.ndarray, base_ns: int = 0,
                timed: np.ndarray | None = None) -> TimeCheck:
    """Check events' `ts`/`dur` (µs, float64; `base_ns` is added to ts, as the trace's
    baseTimeNanoseconds). `timed`: the events that have times at all (default: all); dur may
    be NaN for events without one. Never warns: non-finite values are compared, not cast."""
    ts_us = np.asarray(ts_us, dtype=np.float64)
    dur_us = np.asarray(dur_us, dtype=np.float64)
    timed = np.ones(ts_us.shape, bool) if timed is None else timed
    with np.errstate(invalid="ignore", over="ignore"):
        ts_ns = ts_us * 1000.0 + float(base_ns)
        dur_ns = dur_us * 1000.0
        ok = np.isfinite(ts_ns) & (np.abs(ts_ns) < LIMIT_NS)
        ok &= np.isnan(dur_ns) | ((dur_ns < MAX_SPAN_NS) & (dur_ns > -LIMIT_NS))
        if ok[timed].any():
            mid = float(np.median(ts_ns[timed & ok]))
            ok &= np.abs(ts_ns - mid) < MAX_SPAN_NS
        ok |= ~timed
    if ok.all():
        return TimeCheck(ts_us, dur_us, None, None)
    bad = ~ok
    fill = float(np.median(ts_us[ok])) if ok.any() else 0.0
    problem = (f"{int(bad.sum())} event(s) with a time out of range left out (ts or dur beyond "
               f"±{LIMIT_NS:.2e} ns, a duration over a day, or a day away from the other "
               f"events; first: ts={_num(ts_us[bad][0])} µs, dur={_num(dur_us[bad][0])} µs)")
    return TimeCheck(np.where(ok, ts_us, fill), np.where(ok, dur_us, 0.0), ok, problem)


def _num(v: float) -> str:
    return f"{v:.6g}"


def as_float(v: Any) -> float:
    """A `ts`/`dur` as the JSON has it (a number, a numeric string) as float; NaN otherwise."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return float("nan")
    return float("nan")


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs (float64) to integer ns without losing the sub-µs part of large epoch values."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)
