"""Evidence strength: the statistical test behind each verdict, its numbers and its words.

A verdict is only as good as the evidence for it. Every finding carries `confidence`
("confirmed" or "suspected") and `evidence["test"]`: the test's name, its statistic, the chance
of the observation for a healthy run (a p-value, where there is one), the instances it rests
on, the threshold it was held to, and one sentence a user can check against the numbers.

- **Frequency of being last** (stragglers): under "no straggler", each of the `n_i`
  participants of instance `i` is the sole last arrival with probability at most `1/n_i` (ties
  make it smaller, so the test is conservative). The number of instances a rank is sole last
  in is then at most Poisson-binomial; its upper tail is the p-value. The rank with the
  smallest p-value is the candidate, and since every rank was tested the p-value is multiplied
  by the number of ranks (Bonferroni). Confirmed at `FALSE_ALARM_RATE` (1% per run);
  suspected at `SUSPECT_RATE` (5% per run): the pattern is likely but the run's instances
  cannot rule chance out at 1%. A healthy run is thus suspected of a straggler at most 5% of
  the time and given a confirmed one at most 1% (fewer: materiality is required too).
- **Count of instances** (idle gaps, data stalls, bandwidth classes): a verdict from fewer
  than `MIN_INSTANCES` instances or `MIN_STEPS` steps is suspected and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FALSE_ALARM_RATE",
    "MIN_INSTANCES",
    "MIN_STEPS",
    "SUSPECT_RATE",
    "Test",
    "chance_words",
    "count_test",
    "poisson_binomial_sf",
    "trace_more_hint",
]

FALSE_ALARM_RATE = 0.01  # per run, after the correction for the ranks tested
SUSPECT_RATE = 0.05  # per run, corrected: a pattern worth confirming, not a verdict
MIN_INSTANCES = 8  # instances a per-class verdict (bandwidth) needs to be confirmed
MIN_STEPS = 3  # steps a per-rank verdict (idle gaps, data stalls) needs to be confirmed


@dataclass
class Test:
    """One test of one verdict (`as_dict` is `evidence["test"]`)."""

    name: str  # e.g. "sole-last frequency (Poisson-binomial, Bonferroni over ranks)"
    statistic: str  # what was counted or measured, in words with the numbers
    instances: int  # how many observations the test rests on
    threshold: str  # what the verdict was held to
    sentence: str  # the whole test in words a user can check
    p_value: float | None = None  # chance of this for a healthy run (corrected), if a p-value
    p_uncorrected: float | None = None
    decided_by: str | None = None  # which criterion decided (when several)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "statistic": self.statistic,
                               "instances": self.instances, "threshold": self.threshold,
                               "sentence": self.sentence}
        if self.p_value is not None:
            out["p_value"] = float(f"{self.p_value:.3g}")
            out["chance"] = chance_words(self.p_value)
        if self.p_uncorrected is not None:
            out["p_uncorrected"] = float(f"{self.p_uncorrected:.3g}")
        if self.decided_by is not None:
            out["decided_by"] = self.decided_by
        return out


def poisson_binomial_sf(k: int, p: np.ndarray | list[float]) -> float:
    """P(X >= k) where X counts successes of independent trials with probabilities `p`
    (exact, by dynamic programming over the trials)."""
    probs = np.asarray(p, dtype=np.float64)
    if k <= 0:
        return 1.0
    if k > probs.size:
        return 0.0
    dist = np.zeros(probs.size + 1)
    dist[0] = 1.0
    for i, q in enumerate(probs, 1):
        dist[1:i + 1] = dist[1:i + 1] * (1.0 - q) + dist[:i] * q
        dist[0] *= 1.0 - q
    return float(min(1.0, max(0.0, dist[k:].sum())))


def chance_words(p: float) -> str:
    """A probability as people read it: "< 0.1%", "0.4%", "5%"."""
    if p < 0.001:
        return "< 0.1%"
    if p < 0.01:
        return f"{100 * p:.1f}%"
    return f"{100 * p:.0f}%"


def trace_more_hint(steps: list[int], more: int = 20) -> str:
    """What would confirm a suspected verdict: a longer trace window after the analysed one."""
    first = max(0, min(steps)) if steps else 10
    return f"trace more steps: `uberprof run --trace-steps {first}-{first + more - 1} ...`"


def count_test(what: str, instances: int, steps: int, steps_needed: int = MIN_STEPS
               ) -> tuple[str, Test]:
    """Confidence of a verdict that rests on a count: `instances` observations over `steps`
    steps. Returns (confidence, test)."""
    confirmed = steps >= steps_needed
    sentence = (f"{what}: {instances} instance(s) over {steps} step(s)"
                + ("" if confirmed else f"; fewer than {steps_needed} steps cannot show it "
                   "persists"))
    return ("confirmed" if confirmed else "suspected",
            Test(name="persistence over steps", statistic=f"{instances} over {steps} steps",
                 instances=instances, threshold=f">= {steps_needed} steps", sentence=sentence))
