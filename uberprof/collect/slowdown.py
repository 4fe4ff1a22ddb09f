"""The slowdown trigger (`uberprof run --trace-on-slowdown`): a trace window on every rank when
the job's step time rises beyond its own recent level.

It runs in the node agent, never in a rank: the hang watchdog (watchdog.py) already reads what
each local rank's step timeline grew by, and hands every step's host time to `SlowdownTrigger`.
A step's time is the median over the node's ranks that finished it (in a synchronous job every
rank's step lasts as long as the slowest rank's: one slow rank shows in all of them).

The change-point test (`SlowdownDetector`), robust to noise and to isolated spikes:
- level: the median of the last `recent` steps (20);
- baseline: the median and the MAD of up to `baseline` steps before them (200, at least 50);
- a slowdown: the level exceeds the baseline by more than `mad_k` (4) scaled MADs and by more
  than `min_rise` (20%) of it (the threshold), and at least two thirds of the recent steps are
  above half that rise (a lasting level, not a burst). A checkpoint,
  an evaluation pass or a garbage collection is one long step (steps are optimizer steps): a
  few of those among 20 move neither the median nor the two thirds.
- after a trigger the history is dropped, so the new level becomes the next baseline (a job
  that stays slow triggers once), and the budget bounds the rest: at most `max_per_run`
  windows (3) and `max_per_hour` (1) per hour.

On a slowdown it asks for a window exactly as `uberprof trace` does (collect/trace_request.py):
a request file in the run directory, with `trigger: "slowdown"`, naming a step ahead of the
job's last. Its name is the trigger's slot (`trace-slowdown-<n>.json`), created exclusively, so
on a shared run directory the node that sees the slowdown first asks for every rank and the
others' requests for the same slot are not written.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uberprof.collect.safety import AgentLog

MAD_SCALE = 1.4826  # MAD to standard deviation under normal noise
HOUR_NS = 3600 * 1_000_000_000


@dataclass(frozen=True)
class SlowdownSettings:
    recent: int = 20
    baseline: int = 200
    min_baseline: int = 50
    mad_k: float = 4.0
    min_rise: float = 0.2
    max_per_run: int = 3
    max_per_hour: int = 1
    window_steps: int = 5


@dataclass
class Slowdown:
    """A detected rise: at `step`, the level of the recent steps against the baseline's, and
    the step from which the recent ones stay above half the rise (`onset`)."""

    step: int
    onset: int
    baseline_s: float
    level_s: float
    threshold_s: float

    def words(self) -> str:
        return (f"step time rose from {self.baseline_s * 1e3:.0f} to {self.level_s * 1e3:.0f} ms "
                f"from step {self.onset} on")


class SlowdownDetector:
    """Feed it each step's time in order; `add` returns a `Slowdown` when the level rose (and
    the budget allows one), else None."""

    def __init__(self, settings: SlowdownSettings | None = None) -> None:
        self.s = settings or SlowdownSettings()
        self._steps: deque[tuple[int, float]] = deque(maxlen=self.s.baseline + self.s.recent)
        self.fired_ns: list[int] = []
        self.suppressed = 0  # slowdowns the budget left without a window

    def add(self, step: int, seconds: float, now_ns: int | None = None) -> Slowdown | None:
        self._steps.append((step, seconds))
        s = self.s
        if len(self._steps) < s.min_baseline + s.recent:
            return None
        values = [v for _, v in self._steps]
        base, recent = values[:-s.recent], values[-s.recent:]
        med = statistics.median(base)
        mad = statistics.median(abs(v - med) for v in base)
        threshold = med + max(s.mad_k * MAD_SCALE * mad, s.min_rise * med)
        level = statistics.median(recent)
        above = [v > (med + threshold) / 2 for v in recent]
        if level <= threshold or 3 * sum(above) < 2 * len(above):
            return None
        recent_steps = [st for st, _ in list(self._steps)[-s.recent:]]
        # the onset: where the recent steps turn above half the rise for good, the start that
        # maximises (steps above) - (steps below) from it on (a stray slow step before the rise
        # is not the onset)
        scores = [sum(1 if up else -1 for up in above[i:]) for i in range(len(above))]
        onset = recent_steps[scores.index(max(scores))]
        self._steps.clear()  # the new level is the next baseline: a job that stays slow fires once
        now = time.time_ns() if now_ns is None else now_ns
        if len(self.fired_ns) >= s.max_per_run or \
                sum(now - t < HOUR_NS for t in self.fired_ns) >= s.max_per_hour:
            self.suppressed += 1
            return None
        self.fired_ns.append(now)
        return Slowdown(step, onset, med, level, threshold)


@dataclass
class SlowdownTrigger:
    """The node agent's side: step times from the watchdog's reads, one per step once every
    local rank that is still running finished it, and a request when the detector fires."""

    run_root: Path
    log: AgentLog
    settings: SlowdownSettings = field(default_factory=SlowdownSettings)
    detections: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.detector = SlowdownDetector(self.settings)
        self._pending: dict[int, dict[Any, float]] = {}
        self._next = 0  # the next step to hand to the detector
        self._latest = -1  # the last step any local rank finished, as read so far

    def step_read(self, rank: Any, step: int, seconds: float, local_ranks: int) -> None:
        """Rank `rank` of this node finished `step` in `seconds`; never raises."""
        try:
            self._latest = max(self._latest, step)
            if step < self._next:
                return
            self._pending.setdefault(step, {})[rank] = seconds
            while self._pending:
                first = min(self._pending)
                times = self._pending[first]
                # complete when every local rank finished it, or when a later step is
                # complete on all (a rank gone: go on with the others)
                later_done = any(len(v) >= local_ranks for s, v in self._pending.items()
                                 if s > first)
                if len(times) < local_ranks and not later_done:
                    break
                del self._pending[first]
                self._next = first + 1
                found = self.detector.add(first, statistics.median(times.values()))
                if found is not None:
                    self._ask(found)
        except Exception as exc:  # noqa: BLE001 - the trigger is a courtesy, the job goes on
            self.log.error("the slowdown trigger", exc)

    def _ask(self, found: Slowdown) -> None:
        from uberprof.collect.trace_request import margin_steps, write_request

        n = len(self.detector.fired_ns)
        # ahead of the last step read on this node (the watchdog reads every few seconds: the
        # ranks may be well past the step the detector just saw)
        first = max(found.step, self._latest) + margin_steps(found.level_s)
        written = write_request(self.run_root, first=first, steps=self.settings.window_steps,
                                ranks=None, trigger="slowdown", name=f"slowdown-{n}",
                                expires_s=600.0, detail={"slowdown": found.words()})
        record = {"step": found.step, "onset": found.onset,
                  "baseline_ms": round(found.baseline_s * 1e3, 3),
                  "level_ms": round(found.level_s * 1e3, 3),
                  "window": [first, first + self.settings.window_steps - 1],
                  "requested": written is not None}
        self.detections.append(record)
        self.log.notice(f"{found.words()}: trace window on steps {first}-"
                        f"{first + self.settings.window_steps - 1} on every rank"
                        + ("" if written else " (another node asked first)"),
                        key=f"slowdown-{n}")
