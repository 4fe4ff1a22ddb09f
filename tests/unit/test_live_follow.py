"""The dashboard's pages following a run while its job writes it (no browser: the app's `Live`
driven by hand on a synthetic run that is made to grow), and the straggler and data-stall
indications of the step timelines (`uberprof.analysis.diagnosis.step_signals`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._jobs import PY
from uberprof.analysis.diagnosis.step_signals import step_signals

ROOT = Path(__file__).resolve().parents[2]


def _series(ranks: int, steps: int, slow: int | None = None, data: int | None = None,
            seed: int = 0) -> tuple[list[Any], list[Any]]:
    """Step times (200 ms +- 2 ms) and data waits (< 0.1 ms) per rank; rank `slow` 30 ms
    slower, rank `data` waiting 60 ms more for data."""
    rng = np.random.default_rng(seed)
    times, waits = [], []
    for r in range(ranks):
        s = np.arange(steps)
        t = (200e6 + rng.normal(0, 2e6, steps)).astype(np.int64) + (30_000_000 if r == slow
                                                                     else 0)
        w = rng.integers(0, 100_000, steps) + (60_000_000 if r == data else 0)
        times.append((r, s, t))
        waits.append((r, s, w))
    return times, waits


def _kinds(found: list[Any]) -> dict[str, tuple[int, str]]:
    return {s.kind: (s.rank, s.confidence) for s in found}


def test_a_data_straggler_is_confirmed_with_enough_steps() -> None:
    found = step_signals(*_series(2, 20, data=1))
    assert _kinds(found) == {"straggler": (1, "confirmed"), "data_stall": (1, "confirmed")}
    straggler = next(s for s in found if s.kind == "straggler")
    # the diagnosis's test, with its numbers: 20 of 20 steps, corrected for 2 ranks
    assert straggler.test["name"].startswith("sole-last frequency")
    assert straggler.test["instances"] == 20 and straggler.test["p_value"] < 0.01
    assert "data wait" in straggler.title
    # its sentence counts steps of the step timelines, not collectives
    assert "alone the slowest at 20 of 20 steps, step timelines" in straggler.test["sentence"]
    assert "collectives" not in straggler.test["sentence"]


def test_few_steps_give_a_suspicion_or_nothing_never_a_verdict() -> None:
    # 2 ranks, 7 steps alone last: 2 x 2^-7 = 1.6%, not below the 1% false-alarm rate
    found = _kinds(step_signals(*_series(2, 7, data=1)))
    assert found["straggler"] == (1, "suspected")
    # 2 steps: chance alone does it half the time; the data stall is 2 steps: suspected
    found = _kinds(step_signals(*_series(2, 2, data=1)))
    assert "straggler" not in found and found["data_stall"] == (1, "suspected")
    assert "(suspected)" in step_signals(*_series(2, 2, data=1))[0].title


def test_a_slow_rank_among_many_and_a_healthy_run() -> None:
    assert _kinds(step_signals(*_series(8, 200, slow=3))) == {"straggler": (3, "confirmed")}
    assert step_signals(*_series(8, 200)) == []
    # only the latest steps every rank finished count: a rank behind holds the window back
    times, waits = _series(4, 300, slow=2)
    times[0] = (0, times[0][1][:150], times[0][2][:150])
    found = step_signals(times, waits)
    assert _kinds(found) == {"straggler": (2, "confirmed")}
    assert found[0].test["instances"] == 100  # WINDOW steps, all of them complete


def _synth(out: Path, steps: int, windows: str) -> Path:
    subprocess.run([PY, str(ROOT / "benchmarks" / "synth_run.py"), str(out), "--ranks", "4",
                    "--gpus-per-node", "2", "--steps", str(steps), "--trace-steps", windows,
                    "--straggler", "-1"], check=True, capture_output=True, timeout=300)
    return out


def _set_running(run: Path, running: bool, ended: dict[Path, str]) -> None:
    for node in (run / "nodes").iterdir():
        path = node / "node.json"
        if running:
            ended[path] = path.read_text()
            path.write_text(re.sub(r'"end_ns": \d+', '"end_ns": null', ended[path]))
        else:
            path.write_text(ended[path])


def test_pages_follow_a_growing_run_then_show_the_final_diagnosis(tmp_path: Path) -> None:
    """A run cut to its first 20 steps and one trace window, said to be running: the pages
    see it grow (steps, heat map, step picker); a second trace window appears and is analysed
    in the background, then selectable; at the end the whole run is diagnosed and shown."""
    from uberprof.dashboards.app import create_app
    from uberprof.dashboards.data import RunData
    from uberprof.dashboards.live import EXTENSION
    from uberprof.dashboards.pages import overview, steps
    from uberprof.dashboards.queries.overview import step_heatmap
    from uberprof.dashboards.ui import Selection

    run = _synth(tmp_path / "grow", 40, "5-6,30-31")
    full = {p: p.read_bytes() for p in run.glob("ranks/*/steps.jsonl")}
    later = tmp_path / "later"
    for trace in run.glob("ranks/*/traces/steps-000030-*"):
        (later / trace.parent.parent.name).mkdir(parents=True)
        shutil.move(trace, later / trace.parent.parent.name / trace.name)
    for p, text in full.items():
        p.write_bytes(b"".join(text.splitlines(keepends=True)[:20]))
    ended: dict[Path, str] = {}
    _set_running(run, True, ended)

    app = create_app(RunData(root=run).load(), warm=False)
    live = app.server.extensions[EXTENSION]
    first = live.current()
    assert first.all_steps()[-1] == 19 and first.traced_steps() == [5, 6]
    assert "live-recent" in str(steps.layout(first, Selection()))
    assert step_heatmap(first).x[-1] == 19

    for p, text in full.items():  # the job writes 20 more steps
        p.write_bytes(text)
    assert live.poll().running
    grown = live.current()
    assert grown is not first and grown.all_steps()[-1] == 39
    assert step_heatmap(grown).x[-1] == 39
    assert {o["value"] for o in steps.step_options(grown, None)} == set(range(40))
    assert live.generation == 0 and grown.traced_steps() == [5, 6]

    for rank in later.iterdir():  # a second trace window is written
        for trace in rank.iterdir():
            shutil.move(trace, run / "ranks" / rank.name / "traces" / trace.name)
    live.poll()
    assert "analysing" in live.status(live.state)
    assert live._worker is not None
    live._worker.join(300)
    assert live.generation == 1 and not live.final
    assert live.current().traced_steps() == [5, 6, 30, 31]
    assert live.current().follower is not None  # still following

    _set_running(run, False, ended)  # the job ends
    assert live.wait_final(300)
    assert live.generation == 2
    final = live.current()
    assert final.follower is None and final.diagnose() is not None
    assert live.status(live.poll()) == "ended (exit 0) · 40 steps · final diagnosis below"
    assert "live-recent" not in str(steps.layout(final, Selection()))
    page = str(overview.layout(final, Selection()))
    assert "card-findings" in page and "40" in page


@pytest.mark.parametrize("ranks", [1, 3])
def test_signals_need_every_rank_to_have_a_step(ranks: int) -> None:
    times, waits = _series(ranks, 30, data=0)
    found = _kinds(step_signals(times, waits))
    assert found.get("data_stall") == (0, "confirmed")
    assert ("straggler" in found) == (ranks > 1)
    assert step_signals([], []) == []


def _busy(ranks: int, steps: int, more: dict[int, float], seed: int = 0) -> list[Any]:
    """The training thread's CPU time per step (~150 ms, 1% noise), `more[r]` more on rank r."""
    rng = np.random.default_rng(seed)
    return [(r, np.arange(steps), (150e6 * (1 + more.get(r, 0.0))
                                   * (1 + 0.01 * rng.standard_normal(steps))).astype(np.int64))
            for r in range(ranks)]


def test_a_compute_straggler_shows_in_busy_time_while_step_times_are_alike() -> None:
    """A synchronous job: every rank's step ends at the same all-reduce, so step times say
    nothing; the rank that computes 30% more says so in its CPU time, under the same test."""
    times, waits = _series(4, 40)
    assert step_signals(times, waits) == []
    found = step_signals(times, waits, busy=_busy(4, 40, {2: 0.3}))
    assert _kinds(found) == {"straggler": (2, "confirmed")}
    assert "the longest CPU time in 40 of the last 40 steps" in found[0].title
    assert found[0].test["name"].startswith("sole-last frequency")
    assert step_signals(times, waits, busy=_busy(4, 40, {})) == []  # alike: nothing
    # busy time missing on a rank: no busy basis rather than a partial one
    assert step_signals(times, waits, busy=_busy(4, 40, {2: 0.3})[:3]) == []


def test_live_busy_time_outweighed_by_a_longer_wait_for_a_core_is_only_suspected() -> None:
    """The diagnosis's rule, live: a rank with 15% more CPU time a step (22 ms) that waits 30 ms
    a step longer than the others for a core is suspected, other load named; one that waits
    4 ms longer stays confirmed."""
    times, waits = _series(4, 40)
    busy = _busy(4, 40, {2: 0.15})

    def run_wait(extra: float) -> list[Any]:
        rng = np.random.default_rng(3)
        return [(r, np.arange(40), (2e6 + rng.normal(0, 1e5, 40)
                                    + (extra if r == 2 else 0)).astype(np.int64))
                for r in range(4)]

    found = step_signals(times, waits, busy=busy, run_wait=run_wait(30e6))
    assert _kinds(found) == {"straggler": (2, "suspected")}
    assert "its wait for a core is +30.0 ms a step over the others'" in found[0].title
    assert "other load on its host kept it from a core" in found[0].test["sentence"]
    assert _kinds(step_signals(times, waits, busy=busy, run_wait=run_wait(4e6))) == \
        {"straggler": (2, "confirmed")}
    assert _kinds(step_signals(times, waits, busy=busy)) == {"straggler": (2, "confirmed")}


def test_live_extra_cpu_time_under_a_tenth_of_the_others_is_only_suspected() -> None:
    """A rank with 8% more CPU time a step, in every step (what a slower core gives a healthy
    rank), is suspected; with 15% more, confirmed: the diagnosis's `busy.is_slight`."""
    times, waits = _series(4, 40)
    found = step_signals(times, waits, busy=_busy(4, 40, {2: 0.08}))
    assert _kinds(found) == {"straggler": (2, "suspected")}
    assert "of the others' CPU time, no more than a slower core" in found[0].title
    assert "it is late by its own work, but that work is under 10% more than the others'," \
        in found[0].test["sentence"]
    assert _kinds(step_signals(times, waits, busy=_busy(4, 40, {2: 0.15}))) == \
        {"straggler": (2, "confirmed")}


def test_the_follower_reads_cpu_time_and_a_device_run_has_no_busy_time(tmp_path: Path) -> None:
    import orjson

    from uberprof.analysis.diagnosis.busy import followed_busy, followed_run_wait
    from uberprof.rundir.follow import StepFollower

    path = tmp_path / "steps.jsonl"
    rows = [{"kind": "step", "step": s, "host_start_ns": 100 * s, "host_end_ns": 100 * s + 90,
             "data_wait_ns": 0} | ({"cpu_ns": 70 + s} if s >= 2 else {})
            | ({"run_wait_ns": 5 + s} if s >= 3 else {}) for s in range(6)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    f = StepFollower(path)
    assert f.poll() == 6
    assert f.cpu_ns.values.tolist() == [-1, -1, 72, 73, 74, 75]  # none for the first two steps
    assert f.run_wait_ns.values.tolist() == [-1, -1, -1, 8, 9, 10]  # -1: the row has none

    class Followed:  # RunFollower's reading side, for two ranks with these timelines
        gpu = False

        def series(self, column: str) -> list[Any]:
            return [(r, f.step.values, getattr(f, column).values) for r in (0, 1)]

        def gpu_times_seen(self) -> bool:
            return self.gpu

    busy = followed_busy(Followed(), window=100)
    assert busy is not None and [s.tolist() for _, s, _ in busy] == [[2, 3, 4, 5]] * 2
    waits = followed_run_wait(Followed(), window=100)
    assert [(s.tolist(), v.tolist()) for _, s, v in waits] == [([3, 4, 5], [8, 9, 10])] * 2
    device = Followed()
    device.gpu = True  # a device run: its CPU time is no busy time (analysis/diagnosis/busy.py)
    assert followed_busy(device, window=100) is None
