"""Is a change in step time real? A seeded block bootstrap of the ratio of median step times.

scipy is not a dependency, so the test is a bootstrap with numpy. Step times of one run are
not independent draws: contention on the machine, the data loader or the network drifts over
seconds, so neighbouring steps are alike. A moving-block bootstrap (blocks of about n^(1/3)
consecutive steps, wrapped around) keeps that drift inside each resample, so the interval is
wider than an i.i.d. bootstrap's where steps drift, as it should be.

A change is *significant* when the 95 % interval of median(B) / median(A) excludes 1 **and**
the ratio is at least `min_change_pct` away from 1: within-run samples cannot see run-to-run
noise (another job on the node, a different host), so a tiny but "certain" shift is not
reported as a regression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MIN_SAMPLES", "ShiftTest", "block_length", "median_ratio_test", "quantile"]

MIN_SAMPLES = 3  # fewer steps in either run: no test, "not tested"
RESAMPLES = 2000
CONFIDENCE = 0.95
DEFAULT_MIN_CHANGE_PCT = 5.0
SEED = 0


@dataclass(frozen=True)
class ShiftTest:
    """The outcome of `median_ratio_test`, with what it assumed, for the report and JSON."""

    n_a: int
    n_b: int
    ratio: float | None  # median(B) / median(A)
    ci: tuple[float, float] | None  # CONFIDENCE interval of the ratio
    significant: bool
    verdict: str  # "slower", "faster", "no significant change" or "not tested"
    reason: str  # one sentence: why this verdict
    min_change_pct: float
    resamples: int
    block: int | None
    seed: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": "moving-block bootstrap of the ratio of median step times",
            "confidence": CONFIDENCE, "resamples": self.resamples, "block_steps": self.block,
            "seed": self.seed, "min_change_pct": self.min_change_pct,
            "n_a": self.n_a, "n_b": self.n_b,
            "ci": [round(self.ci[0], 4), round(self.ci[1], 4)] if self.ci else None,
            "verdict": self.verdict, "reason": self.reason,
        }


def quantile(values: np.ndarray | list[float], q: float) -> float | None:
    """The q-quantile (linear interpolation), None for no values."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.quantile(arr, q)) if arr.size else None


def block_length(n: int) -> int:
    """Block length for n consecutive samples: about n^(1/3), at least 1."""
    return max(1, math.ceil(n ** (1 / 3))) if n > 0 else 1


def _block_medians(x: np.ndarray, rng: np.random.Generator, resamples: int) -> tuple[np.ndarray, int]:
    n = x.size
    b = block_length(n)
    blocks = math.ceil(n / b)
    starts = rng.integers(0, n, size=(resamples, blocks))
    idx = (starts[:, :, None] + np.arange(b)[None, None, :]).reshape(resamples, -1)[:, :n] % n
    return np.median(x[idx], axis=1), b


def median_ratio_test(a: np.ndarray | list[float], b: np.ndarray | list[float],
                      min_change_pct: float = DEFAULT_MIN_CHANGE_PCT, resamples: int = RESAMPLES,
                      seed: int = SEED) -> ShiftTest:
    """Test whether B's step times differ from A's (samples in step order; see module doc)."""
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64)
    xa, xb = xa[np.isfinite(xa)], xb[np.isfinite(xb)]
    ma = float(np.median(xa)) if xa.size else None
    mb = float(np.median(xb)) if xb.size else None
    ratio = mb / ma if ma and mb is not None else None
    if xa.size < MIN_SAMPLES or xb.size < MIN_SAMPLES or ratio is None:
        return ShiftTest(int(xa.size), int(xb.size), ratio, None, False, "not tested",
                         f"fewer than {MIN_SAMPLES} steps in a run: no test of significance",
                         min_change_pct, 0, None, seed)
    rng = np.random.default_rng(seed)
    med_a, block = _block_medians(xa, rng, resamples)
    med_b, _ = _block_medians(xb, rng, resamples)
    ok = med_a > 0
    ratios = med_b[ok] / med_a[ok]
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = (float(v) for v in np.quantile(ratios, [alpha, 1 - alpha]))
    beyond_noise = lo > 1.0 or hi < 1.0
    large = abs(ratio - 1.0) * 100 >= min_change_pct
    pct = f"{abs(ratio - 1) * 100:.1f}%"
    if beyond_noise and large:
        verdict = "slower" if ratio > 1 else "faster"
        reason = (f"B is {pct} {verdict}; the {CONFIDENCE:.0%} interval of the ratio "
                  f"[{lo:.3f}, {hi:.3f}] excludes 1")
    elif beyond_noise:
        verdict = "no significant change"
        reason = (f"the ratio's {CONFIDENCE:.0%} interval [{lo:.3f}, {hi:.3f}] excludes 1, "
                  f"but the change ({pct}) is below the {min_change_pct:g}% that run-to-run "
                  "noise can reach")
    else:
        verdict = "no significant change"
        reason = (f"the {CONFIDENCE:.0%} interval of the ratio [{lo:.3f}, {hi:.3f}] "
                  "includes 1: the difference is within the steps' own variation")
    return ShiftTest(int(xa.size), int(xb.size), ratio, (lo, hi), verdict in ("slower", "faster"),
                     verdict, reason, min_change_pct, resamples, block, seed)
