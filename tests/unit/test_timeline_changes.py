"""The story in time (`analysis/diagnosis/timeline_changes.py`, `level_shifts.py`) on real step
timelines: `samples/timelines/slowdown` is a 2-rank Gloo job (`samples/train_ddp.py --steps
400 --slow-rank 1 --slow-factor 2 --fault-steps 150-399` under `uberprof run
--trace-on-slowdown`) whose rank 1 computes twice as long from step 150, on a 2-core machine
shared with other work; `samples/timelines/healthy` is the same job for 300 steps without the
fault. Their rank.json, steps.jsonl and flight-recorder.jsonl are kept (not the traces)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from uberprof.analysis.diagnosis.busy import busy_times
from uberprof.analysis.diagnosis.level_shifts import level_changes, pettitt
from uberprof.analysis.diagnosis.timeline_changes import (
    RankSeries,
    TimelineWindow,
    episodes,
    levels,
    rank_moves,
    timeline_changes,
    windows_around,
)
from uberprof.analysis.tables.context import load_context
from uberprof.present.terminal.timeline import timeline_lines

TIMELINES = Path(__file__).resolve().parents[2] / "samples" / "timelines"
FAULT_FROM, SLOW_RANK = 150, 1


def _changes(tmp_path: Path, run: str) -> list[dict]:
    shutil.copytree(TIMELINES / run, tmp_path / run)
    ctx = load_context(tmp_path / run, workers=1)
    return timeline_changes(ctx, busy_times(ctx), {})


def _job_series(run: str) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the longest rank's host step time (ms), from the kept steps.jsonl files,
    without the first step and the traced steps 10-19 and the step after them."""
    walls: dict[int, float] = {}
    for f in sorted((TIMELINES / run / "ranks").glob("*/steps.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "step":
                ms = (row["host_end_ns"] - row["host_start_ns"]) / 1e6
                walls[row["step"]] = max(walls.get(row["step"], 0.0), ms)
    steps = np.array([s for s in sorted(walls) if s > 0 and not 10 <= s <= 20])
    return steps, np.array([walls[s] for s in steps])


@pytest.fixture(scope="module")
def slowdown(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _changes(tmp_path_factory.mktemp("slowdown"), "slowdown")


def test_the_onset_of_a_real_slowdown_is_found_within_a_few_steps(slowdown: list[dict]) -> None:
    (lead,) = [c for c in slowdown if c["lead"]]
    assert abs(lead["onset_step"] - FAULT_FROM) <= 5, lead["summary"]
    assert lead["direction"] == "slower" and lead["ratio"] > 1.5
    assert lead["confidence"] == "confirmed" and lead["test"]["verdict"] == "slower"
    assert lead["before"]["last_step"] < lead["onset_step"] == lead["after"]["first_step"]


def test_the_slow_rank_is_named_not_the_rank_that_waits_for_it(slowdown: list[dict]) -> None:
    (lead,) = [c for c in slowdown if c["lead"]]
    assert lead["ranks"] == [SLOW_RANK] and not lead["every_rank"]
    (moved,) = lead["rank_changes"]
    # its own measure changed at the injected step, sharper than the job's step time
    assert abs(moved["onset_step"] - FAULT_FROM) <= 2, moved
    assert moved["after_ms"] > 1.5 * moved["before_ms"]
    assert abs(moved["others_delta_ms"]) < 0.2 * moved["delta_ms"]
    assert f"rank {SLOW_RANK}" in lead["summary"] and f"from step {lead['onset_step']}" in \
        lead["summary"]


def test_a_healthy_run_reports_no_level_change(tmp_path: Path) -> None:
    assert _changes(tmp_path, "healthy") == []


def test_single_spikes_and_periodic_long_steps_are_no_level_change() -> None:
    _, ms = _job_series("healthy")
    spiky = ms.copy()
    spiky[::50] *= 10  # an evaluation every 50 steps
    spiky[[33, 77, 201]] *= 25  # a garbage collection, a checkpoint
    assert level_changes(ms) == [] and level_changes(spiky) == []


def test_periodic_long_steps_do_not_move_the_onset_of_a_real_slowdown() -> None:
    steps, ms = _job_series("slowdown")
    spiky = ms.copy()
    spiky[::40] *= 8
    plain, with_evals = ([int(steps[c.at]) for c in level_changes(v)] for v in (ms, spiky))
    nearest = min(plain, key=lambda s: abs(s - FAULT_FROM))
    assert abs(nearest - FAULT_FROM) <= 5, plain
    assert min(abs(s - nearest) for s in with_evals) <= 3, (plain, with_evals)


def test_pettitt_finds_no_split_in_noise_and_a_clear_one_at_a_step() -> None:
    rng = np.random.default_rng(1)
    noise = rng.normal(100, 10, 400)
    split = pettitt(noise)
    assert split is not None and split[1] > 0.01
    step = noise.copy()
    step[260:] += 40
    at, p = pettitt(step)
    assert abs(at - 260) <= 3 and p < 1e-6
    assert [c.at for c in level_changes(step)] == [at]


def test_a_rise_every_rank_shares_names_no_rank_and_says_so() -> None:
    steps = np.arange(100)
    ms = np.where(steps < 50, 100.0, 150.0)
    alike = {r: (steps, np.where(steps < 50, 40.0, 80.0)) for r in range(4)}
    (change,) = level_changes(ms)
    moves = rank_moves(change, steps, ms, [RankSeries("busy", alike)])
    assert moves == {"ranks": [], "every_rank": True, "rank_changes": []}
    one = {**{r: (steps, np.full(100, 40.0)) for r in range(4)},
           2: (steps, np.where(steps < 50, 40.0, 90.0))}
    moves = rank_moves(change, steps, ms, [RankSeries("busy", one)])
    assert moves["ranks"] == [2] and moves["rank_changes"][0]["onset_step"] == 50


def test_the_windows_either_side_are_those_at_the_level_left_and_the_level_reached() -> None:
    steps = np.arange(400)
    ms = np.select([steps < 40, steps < 150, steps < 300], [90.0, 60.0, 120.0], 60.0)
    changes = level_changes(ms)
    eps = episodes(changes, steps, ms, [])
    assert [(e.onset, e.slower) for e in eps] == [(40, False), (150, True), (300, False)]
    windows = [TimelineWindow(1, 10, 19, "schedule", [0, 1]),
               TimelineWindow(2, 200, 204, "slowdown", [0, 1]),
               TimelineWindow(3, 350, 359, "on demand", [0, 1])]
    level_at = levels(changes, steps, ms)
    # window 1 ran at 90 ms, before the job settled at 60: still below the 120 ms slowdown
    before, after = windows_around(eps[1], eps[2].onset, windows, level_at)
    assert [w.number for w in before] == [1] and [w.number for w in after] == [2]
    # the speed-up back to 60 ms departs from both (the comparison takes the nearest)
    before, after = windows_around(eps[2], 1 << 62, windows, level_at)
    assert [w.number for w in before] == [1, 2] and [w.number for w in after] == [3]
    # a window at a level the change does not depart from is no "before" of it
    flat = [TimelineWindow(1, 10, 19, "schedule", [0, 1])]
    assert windows_around(eps[1], 1 << 62, flat, lambda _: 110.0)[0] == []


def test_the_report_head_says_the_lead_change_and_the_windows_compared(
        slowdown: list[dict]) -> None:
    compared = {"sentence": "window 2 against window 1: median step 80 -> 250 ms (slower)"}
    changes = [{**c, "windows_compared": compared if c["lead"] else None} for c in slowdown]
    lines = timeline_lines({"timeline_changes": changes})
    lead = next(c for c in changes if c["lead"])
    assert lines[0] == (lead["summary"], True) and lines[1] == (compared["sentence"], True)
    assert timeline_lines({"timeline_changes": []}) == []
