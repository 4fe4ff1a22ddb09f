"""Always-on straggler evidence from the Flight Recorder, on synthetic entries: what the rank
agent keeps of each dump, how the run directory reads it back, how arrivals become instances
(steps, clocks, completeness) and lateness, and the straggler test on that basis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uberprof.analysis.diagnosis.arrivals import arrival_instances, step_of
from uberprof.analysis.diagnosis.lateness import lateness
from uberprof.analysis.diagnosis.stragglers import (
    BASIS_FLIGHT_RECORDER,
    find_straggler,
    straggler_test,
)
from uberprof.collect.rank import flight_log as FL
from uberprof.collect.safety import AgentLog
from uberprof.rundir.flight_log import Arrival, read_flight_log
from uberprof.rundir.layout import FLIGHT_LOG_FILE

MS = 1_000_000
T0 = 1_795_000_000_000_000_000  # epoch ns


def _entry(rid: int, seq: int, t: int, op: str = "gloo:all_reduce", pg: str = "0",
           p2p: bool = False) -> dict[str, Any]:
    return {"record_id": rid, "collective_seq_id": seq, "process_group": [pg, "default_pg"],
            "profiling_name": op, "time_created_ns": t, "is_p2p": p2p}


# --- the rank side: what a dump keeps -----------------------------------------------------------

def test_a_dump_keeps_only_the_entries_newer_than_the_last_and_counts_the_lost() -> None:
    entries = [_entry(r, r + 1, T0 + r) for r in range(5, 10)]
    entries.append(_entry(10, 0, T0 + 10, op="gloo:send", p2p=True))
    rows, last, lost = FL.new_rows(entries, after=6)
    assert rows == [["0", 8, "all_reduce", T0 + 7], ["0", 9, "all_reduce", T0 + 8],
                    ["0", 10, "all_reduce", T0 + 9]]  # the p2p send is not a collective
    assert last == 10 and lost == 0
    # the ring wrapped past entries 3 and 4 before this dump read them
    _, _, lost = FL.new_rows(entries, after=2)
    assert lost == 2
    assert FL.new_rows(entries, after=10) == ([], 10, 0)


def test_dumps_come_often_enough_that_the_ring_never_wraps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 collectives per step and a ring of 100: half the ring is new every 5 steps."""
    made: list[dict[str, Any]] = []

    def ring() -> list[dict[str, Any]]:
        return made[-100:]

    monkeypatch.setattr(FL, "dump_entries", ring)
    log = FL.FlightLog(lambda: tmp_path / FLIGHT_LOG_FILE, AgentLog("test"), 100)
    dumped_at = []
    for step in range(60):
        made += [_entry(len(made) + i, len(made) + i + 1, T0 + step * MS + i) for i in range(10)]
        if log.step_ended(step) or (step == 19 and log.dump(step, "window")):
            dumped_at.append(step)
    assert dumped_at[:3] == [1, 6, 11] and 19 in dumped_at
    assert max(np.diff(dumped_at)) <= 5
    log.dump(59, "exit")
    back = read_flight_log(tmp_path)
    assert back is not None and back.lost == 0 and back.dumps == len(dumped_at) + 1
    assert [a.seq for a in back.arrivals] == list(range(1, 601))  # every call, once
    assert log.status()["dumps"] == back.dumps


def test_once_the_ring_is_too_full_to_dump_cheaply_only_the_trace_windows_dump(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full ring costs tens of ms to serialise: then only the windows' teardown pays for it.
    A ring of 100, 10 collectives per step, a budget of 50 entries."""
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(FL, "dump_entries", lambda: made[-100:])
    monkeypatch.setattr(FL, "CHEAP_ENTRIES", 50)
    log = FL.FlightLog(lambda: tmp_path / FLIGHT_LOG_FILE, AgentLog("test"), 100)
    dumped_at = []
    for step in range(40):
        made += [_entry(len(made) + i, len(made) + i + 1, T0 + step * MS + i) for i in range(10)]
        if log.step_ended(step) or (step in (19, 29) and log.dump(step, "window")):
            dumped_at.append(step)
    assert dumped_at == [1, 4, 19, 29]  # at step 4 the ring held 50: the last cheap dump
    assert log.dump(39, "exit") == 0 and not log.status()["within_budget"]
    back = read_flight_log(tmp_path)
    assert back is not None and back.dumps == 4 and back.lost == 50  # wrapped by step 19


def test_no_flight_log_when_the_recorder_is_off(tmp_path: Path) -> None:
    assert FL.ring_size({}) == 0 and FL.ring_size({"TORCH_FR_BUFFER_SIZE": "0"}) == 0
    assert FL.ring_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}) == 500
    log = FL.FlightLog(lambda: tmp_path / FLIGHT_LOG_FILE, AgentLog("test"), 0)
    assert log.step_ended(5) == 0 and log.dump(5, "window") == 0 and log.dump(5, "exit") == 0
    assert read_flight_log(tmp_path) is None


# --- reading it back ----------------------------------------------------------------------------

def test_reading_leaves_out_what_is_malformed_and_repeats_nothing(tmp_path: Path) -> None:
    lines = [
        {"reason": "window", "lost": 3, "entries": [["0", 1, "all_reduce", T0],
                                                     ["0", 2, "all_reduce", T0 + 5]]},
        {"reason": "exit", "lost": 0, "entries": [["0", 2, "all_reduce", T0 + 5],
                                                   ["0", "x", "all_reduce", T0], ["0", 3],
                                                   ["1", 1, "broadcast", T0 + 9]]},
        [1, 2],
    ]
    text = "\n".join(json.dumps(x) for x in lines) + '\n{"entries": [["0", 4'
    (tmp_path / FLIGHT_LOG_FILE).write_text(text)
    log = read_flight_log(tmp_path)
    assert log is not None
    assert [(a.group, a.seq, a.op) for a in log.arrivals] == [
        ("0", 1, "all_reduce"), ("0", 2, "all_reduce"), ("1", 1, "broadcast")]
    assert log.dumps == 2 and log.lost == 3
    assert log.skipped == 4  # two bad entries, a line that is no dump, the cut-off line


# --- arrivals -> instances -> lateness ----------------------------------------------------------

def _windows(steps: int, step_ns: int = 100 * MS) -> list[tuple[int, int, int]]:
    return [(s, T0 + s * step_ns, T0 + (s + 1) * step_ns) for s in range(steps)]


def _arrivals(late: np.ndarray, step_ns: int = 100 * MS, per_step: int = 2,
              skew: dict[int, int] | None = None) -> dict[int, list[Arrival]]:
    """late[i, r]: rank r's arrival at instance i after the instance's nominal time (ns);
    instance i is in step i // per_step. `skew`: a rank's clock error (ns)."""
    skew = skew or {}
    out: dict[int, list[Arrival]] = {}
    for i in range(late.shape[0]):
        base = T0 + (i // per_step) * step_ns + 20 * MS + (i % per_step) * 10 * MS
        for r in range(late.shape[1]):
            out.setdefault(r, []).append(
                Arrival("0", i + 1, "all_reduce", int(base + late[i, r] + skew.get(r, 0))))
    return out


def test_step_of_is_the_window_that_holds_the_time() -> None:
    w = _windows(3)
    starts, ends, steps = [x[1] for x in w], [x[2] for x in w], [x[0] for x in w]
    assert step_of(starts, ends, steps, T0 + 150 * MS) == 1
    assert step_of(starts, ends, steps, T0) == 0
    assert step_of(starts, ends, steps, T0 - 1) is None
    assert step_of(starts, ends, steps, T0 + 300 * MS) is None


def test_the_late_rank_is_last_in_every_instance_on_aligned_clocks() -> None:
    rng = np.random.default_rng(1)
    late = rng.uniform(0, 1 * MS, size=(20, 3))
    late[:, 2] += 5 * MS  # rank 2 arrives 5 ms after the others
    # rank 2's host clock runs 30 ms behind: unaligned, it would look early
    arr = _arrivals(late, skew={2: -30 * MS})
    inst, left = arrival_instances(arr, {r: _windows(10) for r in range(3)},
                                   offsets={2: 30 * MS})
    assert left == {} and inst.num_rows == 60
    assert set(inst.column("participants").to_pylist()) == {3}
    assert inst.column("end_ns").null_count == 60  # an arrival has no end
    lat = lateness(inst)
    mine = lat.filter(lat.column("rank").to_numpy() == 2)
    assert all(mine.column("sole_last").to_pylist())
    assert np.median(mine.column("lateness_ns").to_numpy()) >= 4 * MS
    assert sorted(set(lat.column("step").to_pylist())) == list(range(10))
    assert set(lat.column("name").to_pylist()) == {"allreduce"}


def test_left_out_instances_start_up_after_a_window_incomplete_and_outside_the_steps() -> None:
    late = np.zeros((20, 2))
    late[:, 1] = 2 * MS
    arr = _arrivals(late)
    arr[0] = [a for a in arr[0] if a.seq != 7]  # rank 0's ring lost its call 7 (step 3)
    arr[1].append(Arrival("0", 99, "barrier", T0 + 10_000 * MS))  # after the last step
    arr[0].append(Arrival("0", 99, "barrier", T0 + 10_000 * MS + 1))
    inst, left = arrival_instances(arr, {r: _windows(10) for r in range(2)},
                                   exclude={0, 5})
    assert left == {"not on every rank of its group": 1, "outside every step": 1,
                    "start-up, traced or after a trace window": 4}
    steps = set(inst.column("step").to_pylist())
    assert 0 not in steps and 5 not in steps and inst.num_rows == 2 * (20 - 1 - 4)


def test_a_group_of_one_rank_is_no_instance() -> None:
    arr = {0: [Arrival("1", 1, "all_reduce", T0 + 5)],
           1: [Arrival("2", 1, "all_reduce", T0 + 6)]}
    inst, left = arrival_instances(arr, {r: _windows(1) for r in range(2)})
    assert inst.num_rows == 0 and left == {}


# --- the straggler test on that basis -----------------------------------------------------------

def test_every_step_confirms_what_a_short_window_only_suspects() -> None:
    """4 ranks, a 1.3x straggler that is last 70% of the time among noisy arrivals: 6
    instances (a 3-step window) cannot rule chance out; 58 (29 steps) can."""
    rng = np.random.default_rng(7)
    late = rng.exponential(2 * MS, size=(58, 4))
    late[rng.random(58) < 0.7, 1] += 12 * MS
    arr = _arrivals(late)
    windows = {r: _windows(29) for r in range(4)}
    inst, _ = arrival_instances(arr, windows)
    fr = straggler_test(lateness(inst), 100 * MS, 29 * 100 * MS, BASIS_FLIGHT_RECORDER)
    short = lateness(inst.filter(np.isin(inst.column("step").to_numpy(), [10, 11, 12])))
    window = straggler_test(short, 100 * MS, 3 * 100 * MS)
    assert window is not None and window.decision != "confirmed"
    assert fr is not None and fr.rank == 1 and fr.decision == "confirmed"
    sentence = fr.as_test().sentence
    assert f"{fr.last} of 58 collectives over 29 step(s), Flight Recorder" in sentence
    assert "< 0.1%" in sentence and fr.as_dict()["basis"] == "flight_recorder"
    # the decision comes from every step; the cost from the analysed (traced) steps only
    s = find_straggler(short, 100 * MS, 3 * 100 * MS, test=fr, basis=lateness(inst))
    assert s is not None and s.rank == 1 and (s.last, s.instances) == (fr.last, 58)
    assert s.basis == BASIS_FLIGHT_RECORDER and s.delay_ns < fr.delay_ns
    assert set(s.steps) - {10, 11, 12}  # the steps it was last in: every step's


def test_healthy_arrivals_over_every_step_confirm_no_straggler() -> None:
    confirmed = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        late = rng.exponential(3 * MS, size=(58, 4))
        inst, _ = arrival_instances(_arrivals(late), {r: _windows(29) for r in range(4)})
        t = straggler_test(lateness(inst), 100 * MS, 29 * 100 * MS, BASIS_FLIGHT_RECORDER)
        confirmed += t is not None and t.decision == "confirmed"
    assert confirmed <= 1
