"""The slowdown trigger's change-point test on synthetic step series (no job): healthy noisy
series with checkpoint spikes never fire, a lasting rise fires once near its onset, the budget
bounds the windows, and a detection becomes a request file the ranks read like `uberprof
trace`'s, written once per slot."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from uberprof.collect.safety import AgentLog
from uberprof.collect.slowdown import HOUR_NS, SlowdownDetector, SlowdownSettings, SlowdownTrigger
from uberprof.rundir.layout import REQUESTS_DIR


def _series(seed: int, n: int, rise_at: int | None = None, factor: float = 1.5) -> list[float]:
    """0.1 s steps with 10% log-normal noise, a checkpoint step (x10) every 100 steps, an
    evaluation-like stretch (x3 for 3 steps) every 500, and from `rise_at` on `factor` slower."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        v = 0.1 * rng.lognormvariate(0, 0.1)
        if i and i % 100 == 0:
            v *= 10
        if i and i % 500 < 3:
            v *= 3
        if rise_at is not None and i >= rise_at:
            v *= factor
        out.append(v)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_a_healthy_series_with_spikes_never_fires(seed: int) -> None:
    d = SlowdownDetector()
    fired = [d.add(i, v, now_ns=i) for i, v in enumerate(_series(seed, 3000))]
    assert [f for f in fired if f is not None] == []


@pytest.mark.parametrize("seed", range(4))
def test_a_lasting_rise_fires_once_near_its_onset(seed: int) -> None:
    d = SlowdownDetector()
    fired = [f for i, v in enumerate(_series(seed, 2000, rise_at=700))
             if (f := d.add(i, v, now_ns=i * 10**8)) is not None]
    assert len(fired) == 1  # the new level becomes the baseline: it stays slow, no second
    (f,) = fired
    assert 700 <= f.onset <= 705 and f.step <= 700 + 20
    assert f.level_s > 1.3 * f.baseline_s


def test_the_budget_allows_one_window_an_hour_and_three_a_run() -> None:
    d = SlowdownDetector(SlowdownSettings(max_per_run=3, max_per_hour=1))
    t, fired, step = 0, [], 0
    for _ in range(6):  # six rises, 20 minutes apart
        for v in [0.1] * 100 + [0.2] * 40:
            if d.add(step, v, now_ns=t) is not None:
                fired.append(t)
            step += 1
        t += HOUR_NS // 3
        d._steps.clear()  # back to the old level: a fresh baseline for the next rise
    assert len(fired) == 2  # 0 h and 1 h; 20 and 40 minutes after each were over budget
    assert d.suppressed == 4


def test_a_detection_writes_one_request_per_slot(tmp_path: Path) -> None:
    trigger = SlowdownTrigger(tmp_path, AgentLog("node"))
    other = SlowdownTrigger(tmp_path, AgentLog("node"))  # another node sharing the run
    for t in (trigger, other):
        for step, v in enumerate([0.1] * 100 + [0.3] * 20):
            for rank in (0, 1):
                t.step_read(rank, step, v, local_ranks=2)
    (path,) = (tmp_path / REQUESTS_DIR).glob("trace-*.json")
    req = json.loads(path.read_text())
    assert path.name == "trace-slowdown-1.json" and req["trigger"] == "slowdown"
    assert req["ranks"] is None and req["steps"] == 5
    assert req["first"] > trigger.detections[0]["step"] >= 100
    assert [d["requested"] for d in trigger.detections + other.detections] == [True, False]
    assert trigger.detections[0]["onset"] == 100
