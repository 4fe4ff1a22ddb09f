"""The named straggler (`Straggler`: its verdict, its cost and its cause) and the delay it adds.

Its cost is the delay it alone adds (its lateness beyond the second-latest rank), per step the
largest over the step's collectives: every other participant waits that long. It is measured
on the basis that decided its verdict and applied to the analysed (traced) steps
(`Straggler.share_of`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uberprof.analysis.diagnosis.stragglers.rules import BASIS_TRACES

__all__ = ["Straggler", "delay_per_step"]


@dataclass
class Straggler:
    rank: int
    instances: int  # instances the rank took part in
    last: int  # instances where it alone arrived last (LATENESS_SCHEMA `sole_last`)
    steps: list[int]  # steps where it arrived last in at least one collective
    median_lateness_ns: int
    median_lead_ns: int  # over the others' median lateness in the same instance
    noise_ns: int  # robust sigma of the others' lateness
    delay_ns: int  # total wall-clock delay it added over the analysed steps
    others_wait_ns: int  # the same, summed over the ranks that waited
    steps_analysed: int
    cause: str | None = None
    factors: dict[str, int] = field(default_factory=dict)  # per-step excess over the others
    counters: dict[str, Any] = field(default_factory=dict)
    confidence: str = "confirmed"  # confirmed | suspected (StragglerTest.decision)
    test: dict[str, Any] = field(default_factory=dict)  # evidence.Test.as_dict()
    basis: str = BASIS_TRACES  # where `instances` and `last` come from (rules.BASIS_*)
    # the delay it adds as a share of the wall time of the steps its verdict read, where that
    # basis is not the traced window alone (None there): what its time at stake is measured by
    basis_share: float | None = None

    @property
    def last_fraction(self) -> float:
        return self.last / self.instances if self.instances else 0.0

    def share_of(self, wall_ns: float) -> float:
        """The share of the analysed (traced) steps' wall time `wall_ns` that it costs: the
        delay it added there, or, where its verdict read more steps than those, the share it
        added over them (a straggler confirmed at 52 of 58 collectives over 28 steps was not
        last in its two traced steps, and had cost nothing by the traced delay alone)."""
        if self.basis_share is not None:
            return min(1.0, self.basis_share)
        return self.delay_ns / wall_ns if wall_ns else 0.0


def delay_per_step(step: np.ndarray, delay: np.ndarray, n_part: np.ndarray
                   ) -> dict[int, tuple[int, int]]:
    """Per step, the largest delay one rank alone added to any of the step's collectives
    (every other participant waits that long), with that collective's participants."""
    per_step: dict[int, tuple[int, int]] = {}
    for s, d, m in zip(step.tolist(), delay.tolist(), n_part.tolist()):
        if d > per_step.get(s, (0, 0))[0]:
            per_step[s] = (d, m)
    return per_step
