"""The slowdown trigger's change-point test on synthetic step series (no job): healthy noisy
series with checkpoint spikes never fire, a lasting rise fires once near its onset, the budget
bounds the windows, and a detection becomes a request file the ranks read like `uberprof
trace`'s, written once per slot."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from uberprof.collect.safety import AgentLog
from uberprof.collect.slowdown import (
    HOUR_NS,
    SlowdownDetector,
    SlowdownSettings,
    SlowdownTrigger,
    traces_bytes,
)
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


def _feed(trigger: SlowdownTrigger, steps: int, step_s: Callable[[int], float],
          cpu_s: Callable[[int, int], float], ranks: int = 2) -> None:
    """Every rank of a node finishing every step: the job's step time and each rank's CPU."""
    for step in range(steps):
        for rank in range(ranks):
            trigger.step_read(rank, step, step_s(step), ranks, cpu_s(rank, step))


def _noisy(seed: int) -> Callable[[int, int], float]:
    rng = random.Random(seed)
    return lambda rank, step: 0.05 * rng.lognormvariate(0, 0.05) * (3 if step % 100 == 99 else 1)


def test_a_rank_falling_behind_inside_slack_triggers_on_its_lateness(tmp_path: Path) -> None:
    """Rank 1's work grows by 60% from step 100, and the job's step time does not move (the
    others waited anyway): the lateness series fires, names rank 1 and asks every rank."""
    noise = _noisy(0)
    trigger = SlowdownTrigger(tmp_path, AgentLog("node"))
    _feed(trigger, 200, lambda step: 0.1,
          lambda rank, step: noise(rank, step) * (1.6 if rank == 1 and step >= 100 else 1))
    (found,) = trigger.detections
    assert found["trigger"] == "lateness" and found["involved"] == [1]
    assert 100 <= found["onset"] <= 105 and found["step"] <= 120 and found["requested"]
    req = json.loads((tmp_path / REQUESTS_DIR / "trace-slowdown-1.json").read_text())
    assert req["trigger"] == "lateness" and req["rank"] == 1 and req["involved"] == [1]
    assert req["ranks"] is None and "rank 1's work per step rose" in req["reason"]


def test_a_slower_step_names_the_rank_that_made_it_slower(tmp_path: Path) -> None:
    trigger = SlowdownTrigger(tmp_path, AgentLog("node"))
    rng = random.Random(1)
    _feed(trigger, 200, lambda step: 0.1 * rng.lognormvariate(0, 0.05) * (2 if step >= 100 else 1),
          lambda rank, step: 0.05 * (2 if rank == 1 and step >= 100 else 1))
    (found,) = trigger.detections
    assert found["trigger"] == "slowdown" and found["involved"] == [1]
    assert "step time rose" in found["reason"] and "rank 1's work per step" in found["reason"]


@pytest.mark.parametrize("seed", range(6))
def test_healthy_ranks_with_shared_phases_never_trigger(tmp_path: Path, seed: int) -> None:
    """Noise on every rank's CPU time and step time, and a checkpoint-like step every 100
    (on every rank, or on rank 0 alone): no detection over 1,000 steps of 4 ranks."""
    rng = random.Random(seed)
    noise = _noisy(seed)
    trigger = SlowdownTrigger(tmp_path, AgentLog("node"))
    _feed(trigger, 1000, lambda step: 0.1 * rng.lognormvariate(0, 0.1) *
          (10 if step % 100 == 50 else 1),
          lambda rank, step: noise(rank, step) * (5 if rank == 0 and step % 100 == 50 else 1),
          ranks=4)
    assert trigger.detections == []


@pytest.mark.parametrize("selected, window, reference", [
    ((0,), [0, 1], [0]),  # a selected healthy rank is the reference
    ((1,), None, None),  # only the late rank selected: the least late other rank joins
    ((1, 3), [1, 3], [3]),  # a selected rank measured healthy is preferred
])
def test_with_selected_ranks_the_window_is_on_the_late_rank_and_a_healthy_reference(
        tmp_path: Path, selected: tuple[int, ...], window: list[int] | None,
        reference: list[int] | None) -> None:
    noise = _noisy(2)
    trigger = SlowdownTrigger(tmp_path, AgentLog("node"), trace_ranks=selected)
    _feed(trigger, 200, lambda step: 0.1,
          lambda rank, step: noise(rank, step) * (2 if rank == 1 and step >= 100 else 1),
          ranks=4)
    (found,) = trigger.detections
    if reference is None:
        levels = {int(r): v for r, v in found["lateness"].items() if r != "1"}
        reference = [min(levels, key=levels.__getitem__)]
        window = sorted([1, *reference])
    assert found["involved"] == [1] and found["ranks"] == window
    assert found["reference"] == reference
    req = json.loads((tmp_path / REQUESTS_DIR / "trace-slowdown-1.json").read_text())
    assert req["ranks"] == window and req["reference"] == reference and req["involved"] == [1]


def test_a_rise_over_the_disk_budget_is_recorded_without_a_window(tmp_path: Path) -> None:
    traces = tmp_path / "ranks" / "0" / "traces"
    traces.mkdir(parents=True)
    (traces / "steps-10-19.pt.trace.json.gz").write_bytes(b"x" * 2000)
    said: list[int] = []
    trigger = SlowdownTrigger(tmp_path, AgentLog("node"), SlowdownSettings(disk_budget_bytes=1000),
                              on_detection=lambda: said.append(1))
    _feed(trigger, 200, lambda step: 0.1 * (2 if step >= 100 else 1), lambda rank, step: 0.05)
    (found,) = trigger.detections
    assert not found["requested"] and "over the disk budget" in found["refused"]
    assert not (tmp_path / REQUESTS_DIR).exists() and trigger.budget.suppressed == 1
    assert said == [1]  # node.json is rewritten with the refusal
    assert traces_bytes(tmp_path) == 2000


def test_the_cli_turns_the_trigger_on_unless_told_or_tracing_is_off(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from uberprof.cli import main

    def options(*args: str) -> dict[str, object]:
        res = CliRunner().invoke(main, ["run", "--out", str(tmp_path), "--run-id", args[0],
                                        "--counters", "none", *args[1:], "--", "true"])
        assert res.exit_code == 0, res.output
        (node,) = (tmp_path / args[0]).glob("nodes/*/node.json")
        return json.loads(node.read_text())["options"]

    default = options("a")
    assert default["trace_on_slowdown"] is True and isinstance(default["trace_disk_budget"], int)
    assert options("b", "--no-trace")["trace_on_slowdown"] is False
    assert options("c", "--no-trace-on-slowdown")["trace_on_slowdown"] is False
    on = options("d", "--no-trace", "--trace-on-slowdown", "--trace-disk-budget", "2GB")
    assert on["trace_on_slowdown"] is True and on["trace_disk_budget"] == 2 * 10**9


def test_info_lists_each_detection_with_its_window_or_its_refusal(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from rich.console import Console

    from uberprof.cli import main
    from uberprof.inventory import inventory
    from uberprof.present.terminal.info import render_info

    res = CliRunner().invoke(main, ["run", "--out", str(tmp_path), "--run-id", "r",
                                    "--counters", "none", "--", "true"])
    assert res.exit_code == 0, res.output
    (node,) = (tmp_path / "r").glob("nodes/*/node.json")
    trigger = SlowdownTrigger(tmp_path / "scratch", AgentLog("node"),
                              SlowdownSettings(max_per_run=1))
    for rise in (100, 300):  # the second is over the budget of one a run
        _feed(trigger, rise + 100, lambda step, at=rise: 0.1 * (2 ** (step >= at)),
              lambda rank, step: 0.05)
    meta = json.loads(node.read_text())
    meta["slowdowns"] = {"detected": trigger.detections, "suppressed": 1}
    node.write_text(json.dumps(meta))
    inv = inventory([tmp_path / "r"], check_traces=False)
    assert inv["nodes"][0]["slowdowns"]["detected"] == trigger.detections
    console = Console(record=True, width=300)
    render_info(inv, console)
    text = console.export_text()
    first, last = trigger.detections[0]["window"]
    assert f"slowdown at step {trigger.detections[0]['step']}" in text
    assert f"steps {first}-{last} on every rank" in text
    assert "no window: over the budget of 1 triggered windows a run" in text


def test_nodes_sharing_the_run_name_the_node_that_asked(tmp_path: Path) -> None:
    """Two nodes see the same rise; the second finds the slot taken and records the first
    node's request (its node, host and window), not a window of its own."""
    first = SlowdownTrigger(tmp_path, AgentLog("node"), node="n0", host="host-a")
    second = SlowdownTrigger(tmp_path, AgentLog("node"), node="n1", host="host-b")
    for t, late in ((first, 0), (second, 7)):  # the second node reads a few steps later
        for step, v in enumerate([0.1] * 100 + [0.3] * (20 + late)):
            t.step_read(0, step, v, local_ranks=1)
    (mine,), (theirs,) = first.detections, second.detections
    assert (mine["requested"], theirs["requested"]) == (True, False)
    assert mine["asked_by"] == theirs["asked_by"] == {"node": "n0", "host": "host-a"}
    assert theirs["window"] == mine["window"]
    req = json.loads((tmp_path / REQUESTS_DIR / "trace-slowdown-1.json").read_text())
    assert (req["node"], req["host"], req["first"]) == ("n0", "host-a", mine["window"][0])


def test_a_slot_taken_over_an_hour_ago_belongs_to_an_earlier_rise(tmp_path: Path) -> None:
    """Node b's first rise comes over an hour after node a asked (for a rise b never saw): b
    asks in the next slot rather than taking a's window for its own. Within the hour it
    would take a's (the test above)."""
    a = SlowdownTrigger(tmp_path, AgentLog("node"), node="n0", host="host-a")
    for step, v in enumerate([0.1] * 100 + [0.3] * 20):
        a.step_read(0, step, v, local_ranks=1)
    path = tmp_path / REQUESTS_DIR / "trace-slowdown-1.json"
    req = json.loads(path.read_text())
    path.write_text(json.dumps({**req, "created_ns": req["created_ns"] - 3601 * 10**9}))
    b = SlowdownTrigger(tmp_path, AgentLog("node"), node="n1", host="host-b")
    for step, v in enumerate([0.1] * 300 + [0.3] * 20):
        b.step_read(0, step, v, local_ranks=1)
    (found,) = b.detections
    assert found["requested"] and found["asked_by"]["node"] == "n1"
    assert (tmp_path / REQUESTS_DIR / "trace-slowdown-2.json").exists()


def test_with_one_rank_a_node_its_lateness_is_against_the_other_nodes_ranks(
        tmp_path: Path) -> None:
    """One rank on this node (rank 1), three on others read from the shared run directory:
    rank 1's work grows 60% from step 100 while the step time stays: lateness fires, against
    the other nodes' ranks. Without them it cannot (no peer on the node)."""
    for with_peers in (True, False):
        noise = _noisy(1)
        trigger = SlowdownTrigger(tmp_path / str(with_peers), AgentLog("node"))
        (tmp_path / str(with_peers) / REQUESTS_DIR).mkdir(parents=True)
        for step in range(200):
            if with_peers:
                for peer in (0, 2, 3):
                    trigger.peer_read(peer, step, noise(peer, step))
            trigger.step_read(1, step, 0.1, 1, noise(1, step) * (1.6 if step >= 100 else 1))
        if not with_peers:
            assert trigger.detections == []
            continue
        (found,) = trigger.detections
        assert found["trigger"] == "lateness" and found["involved"] == [1]
        assert 100 <= found["onset"] <= 105 and trigger.peer_ranks == {0, 2, 3}


def test_a_run_directory_that_shows_fewer_ranks_than_the_world_is_said_not_shared(
        tmp_path: Path) -> None:
    from uberprof.collect.safety import AgentLog as Log

    log = Log("node")
    said: list[str] = []
    log.notice = lambda text, key=None: said.append(text)  # type: ignore[method-assign]
    trigger = SlowdownTrigger(tmp_path, log)
    trigger.scope(1, 2)
    assert trigger.shared is None  # no step yet: the other ranks may still be registering
    for step, v in enumerate([0.1] * 100 + [0.3] * 20):
        trigger.step_read(0, step, v, local_ranks=1)
        trigger.scope(1, 2)
    assert trigger.shared is False and len([s for s in said if "1 of the job's 2" in s]) == 1
    (found,) = trigger.detections
    assert found["scope"] == "node" and found["requested"]
    assert any("of this node (the run directory is not shared)" in s for s in said)


def test_the_node_agent_asks_past_the_last_step_of_the_whole_read(tmp_path: Path) -> None:
    """The watchdog reads every few seconds: a rise found at a row in the middle of a read
    must ask past the read's last row (the ranks are there already), not past that row."""
    trigger = SlowdownTrigger(tmp_path, AgentLog("node"), ask_at_poll_end=True)
    for step, v in enumerate([0.1] * 100 + [0.3] * 60):  # one read of 160 rows
        trigger.step_read(0, step, v, local_ranks=1)
    assert trigger.detections == [] and not (tmp_path / REQUESTS_DIR).exists()
    trigger.scope(1, 1)  # the read is through
    (found,) = trigger.detections
    assert found["step"] < 130 and found["window"][0] > 159 and found["requested"]


def test_a_later_rise_on_another_node_within_the_hour_is_over_the_jobs_budget(
        tmp_path: Path) -> None:
    """Node a asked for a rise at step 100; node b sees a rise of its own from step 300, its
    slot taken less than an hour ago for a window long over: b asks nothing and records why
    (the job's hourly budget), not a's window as its own."""
    a = SlowdownTrigger(tmp_path, AgentLog("node"), node="n0", host="host-a")
    b = SlowdownTrigger(tmp_path, AgentLog("node"), node="n1", host="host-b")
    for t, rise in ((a, 100), (b, 300)):
        for step, v in enumerate([0.1] * rise + [0.3] * 20):
            t.step_read(0, step, v, local_ranks=1)
    (found,) = b.detections
    assert not found["requested"] and found["asked_by"] is None
    assert "node host-a asked for steps" in found["refused"] and b.budget.suppressed == 1
    assert b.budget.fired_ns == [] and len(list((tmp_path / REQUESTS_DIR).iterdir())) == 1
