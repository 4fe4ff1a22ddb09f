"""Selected ranks (`--trace-ranks`) and windows on demand (`uberprof trace`), without a job:
the rank side's choices on a `TraceWindows` (a real CPU torch.profiler where a window opens),
the request channel through a run directory made here, and what `info` reads of both."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from uberprof.collect.config import CollectConfig, TraceSchedule, describe_ranks
from uberprof.collect.rank import requests
from uberprof.collect.rank.requests import RequestInbox
from uberprof.collect.rank.windows import TraceWindows
from uberprof.collect.safety import AgentLog
from uberprof.collect.trace_request import CannotTrace, request_trace
from uberprof.inventory import inventory
from uberprof.rundir import trace_file_name, write_json_atomic
from uberprof.rundir.layout import REQUESTS_DIR, TRACE_ANSWERS_FILE


@pytest.fixture(autouse=True)
def _poll_at_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requests, "POLL_S", 0.0)


def test_trace_ranks_round_trip_through_the_environment_and_choose_ranks() -> None:
    config = CollectConfig(trace_ranks=(0, 7, 12, 13, 14, 15))
    back = CollectConfig.from_env({"UBERPROF_CONFIG": config.to_env()})
    assert back.trace_ranks == (0, 7, 12, 13, 14, 15)
    assert back.traces_rank(7) and not back.traces_rank(8)
    assert CollectConfig().traces_rank(8)  # default: every rank
    assert describe_ranks(back.trace_ranks) == "0, 7, 12-15" and describe_ranks(None) == "all"


def test_overlapping_finds_the_scheduled_window_that_shares_a_step() -> None:
    steps = TraceSchedule.parse_steps("10-19")
    assert steps.overlapping(20, 22) is None and steps.overlapping(5, 9) is None
    assert steps.overlapping(18, 21) == (10, 19) and steps.overlapping(8, 10) == (10, 19)
    every = TraceSchedule.periodic(50, 3)
    assert every.overlapping(53, 99) is None and every.overlapping(30, 49) is None
    assert every.overlapping(52, 60) == (50, 52) and every.overlapping(95, 100) == (100, 102)


def test_a_rank_left_out_by_trace_ranks_opens_no_scheduled_window(tmp_path: Path) -> None:
    config = CollectConfig(trace=TraceSchedule.parse_steps("3-4"), trace_ranks=(0,))
    windows = TraceWindows(config, tmp_path, AgentLog("rank"), rank=1)
    windows.step_started(3)
    assert not windows.active and not windows.selected
    assert windows.not_reached(1) == []  # nothing was due on it: nothing to say it missed


def _request(run: Path, first: int, steps: int = 2, ranks: list[int] | None = None,
             expires_s: float = 60.0, name: str = "a") -> str:
    rid = f"req-{name}"
    write_json_atomic(run / REQUESTS_DIR / f"trace-{rid}.json", {
        "kind": "trace", "id": rid, "trigger": "on demand", "first": first, "steps": steps,
        "ranks": ranks, "created_ns": time.time_ns(),
        "expires_ns": time.time_ns() + int(expires_s * 1e9)})
    return rid


def _rank(run: Path, rank: int, config: CollectConfig) -> tuple[TraceWindows, Path]:
    folder = run / "ranks" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    answers = folder / TRACE_ANSWERS_FILE
    inbox = RequestInbox(run / REQUESTS_DIR, lambda: answers, AgentLog("rank"))
    return TraceWindows(config, folder / "traces", AgentLog("rank"), rank, inbox=inbox), answers


def _answers(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_request_opens_the_window_on_its_steps_and_records_its_trigger(tmp_path: Path) -> None:
    import torch

    windows, answers = _rank(tmp_path, 0, CollectConfig(trace=TraceSchedule.off()))
    rid = _request(tmp_path, first=6, steps=2)
    windows.step_started(4)
    assert _answers(answers) == [{**_answers(answers)[0], "id": rid, "status": "accepted",
                                  "window": [6, 7], "late": False, "step": 4}]
    windows.step_ended(4)
    windows.step_started(5)
    assert not windows.active  # not before its first step
    windows.step_ended(5)
    for step in (6, 7):
        windows.step_started(step)
        assert windows.active
        torch.ones(8, 8) @ torch.ones(8, 8)
        windows.step_ended(step)
    assert not windows.active and windows.wait_for_export(60)
    assert windows.windows_written == [(6, 7)]
    assert windows.triggers == [{"first": 6, "last": 7, "trigger": "on demand", "request": rid}]
    assert (tmp_path / "ranks/0/traces" / (trace_file_name(6, 7) + ".gz")).exists()


def test_a_rank_past_the_first_step_starts_at_its_next_and_says_so(tmp_path: Path) -> None:
    windows, answers = _rank(tmp_path, 0, CollectConfig(trace=TraceSchedule.off()))
    _request(tmp_path, first=3, steps=2)
    windows.step_started(5)
    (answer,) = _answers(answers)
    assert answer["status"] == "accepted" and answer["late"] and answer["window"] == [5, 6]
    assert windows.active  # started at once, at step 5
    windows.close(5)


def test_requests_that_clash_are_refused_with_the_reason(tmp_path: Path) -> None:
    schedule = CollectConfig(trace=TraceSchedule.parse_steps("20-22"))
    windows, answers = _rank(tmp_path / "pending", 0, schedule)
    _request(tmp_path / "pending", first=10, name="a")
    windows.step_started(2)
    _request(tmp_path / "pending", first=12, name="b")  # the first one's window is to come
    windows.step_started(3)
    a, b = _answers(answers)
    assert a["status"] == "accepted"
    assert (b["status"], b["reason"]) == \
        ("refused", "a trace window is already requested (steps 10-11)")

    windows, answers = _rank(tmp_path / "clash", 0, schedule)
    _request(tmp_path / "clash", first=19, name="c")  # would share step 20 with the schedule
    windows.step_started(4)
    (c,) = _answers(answers)
    assert (c["status"], c["reason"]) == \
        ("refused", "it would overlap the scheduled trace window at steps 20-22")


def test_a_rank_ignores_requests_for_other_ranks_expired_or_malformed(tmp_path: Path) -> None:
    windows, answers = _rank(tmp_path, 1, CollectConfig(trace=TraceSchedule.off()))
    _request(tmp_path, first=10, ranks=[0], name="other")
    _request(tmp_path, first=10, expires_s=-1, name="old")
    (tmp_path / REQUESTS_DIR / "trace-bad.json").write_text('{"kind": "trace", "first": -1}')
    windows.step_started(2)
    windows.step_started(3)
    assert _answers(answers) == [] and not windows.active


def _fake_run(root: Path, world: int = 2, ended: bool = False, steps: int = 5) -> Path:
    write_json_atomic(root / "run.json", {"format_version": 1, "run_id": root.name})
    write_json_atomic(root / "nodes/n0/node.json", {
        "run_id": root.name, "node": "n0", "start_ns": 1, "end_ns": 2 if ended else None})
    t0 = time.time_ns() - steps * 100_000_000
    for r in range(world):
        write_json_atomic(root / f"ranks/{r}/rank.json", {"rank": r, "world_size": world,
                                                          "end_ns": None})
        rows = [{"kind": "step", "step": s, "host_start_ns": t0 + s * 100_000_000,
                 "host_end_ns": t0 + (s + 1) * 100_000_000} for s in range(steps)]
        (root / f"ranks/{r}/steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return root


def test_request_trace_names_a_step_ahead_and_gathers_the_answers(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run")

    def answer_as_rank_0() -> None:  # rank 1 never answers
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for f in (run / REQUESTS_DIR).glob("trace-*.json"):
                req = json.loads(f.read_text())
                line = {"id": req["id"], "status": "accepted", "late": False, "step": 5,
                        "window": [req["first"], req["first"] + req["steps"] - 1]}
                (run / "ranks/0" / TRACE_ANSWERS_FILE).write_text(json.dumps(line) + "\n")
                return
            time.sleep(0.05)

    t = threading.Thread(target=answer_as_rank_0)
    t.start()
    outcome = request_trace(run, 3, wait_s=2.0)
    t.join()
    # the last finished step is 4, 100 ms a step: 2 + ceil(1.5 s / 0.1 s) = 17 steps ahead
    assert (outcome.last_step, outcome.first, outcome.last) == (4, 21, 23)
    assert sorted(outcome.accepted) == [0] and outcome.silent == [1] and not outcome.ok


def test_request_trace_refuses_an_ended_job_an_unknown_rank_and_a_job_without_steps(
        tmp_path: Path) -> None:
    with pytest.raises(CannotTrace, match="the job ended"):
        request_trace(_fake_run(tmp_path / "ended", ended=True), 3)
    with pytest.raises(CannotTrace, match=r"no rank 5 in this run \(its ranks: 0-1\)"):
        request_trace(_fake_run(tmp_path / "two"), 3, ranks={5})
    with pytest.raises(CannotTrace, match="no rank has finished a step yet"):
        request_trace(_fake_run(tmp_path / "young", steps=0), 3)
    assert not (tmp_path / "two" / REQUESTS_DIR).exists()  # nothing asked of the job


def test_info_reads_untraced_ranks_as_chosen_and_each_window_with_its_trigger(
        tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run", world=3)
    for r, selected in ((0, True), (1, False), (2, True)):
        late = r == 2  # rank 2 read the request late: its window starts a step later
        triggers = [{"first": 10, "last": 12, "trigger": "schedule", "request": None},
                    {"first": 31 if late else 30, "last": 32 if late else 31,
                     "trigger": "on demand", "request": "x"}]
        write_json_atomic(run / f"ranks/{r}/rank.json", {
            "rank": r, "world_size": 3, "end_ns": 5, "exit": "exit",
            "trace": {"schedule": "steps 10-12", "ranks": "0, 2", "selected": selected,
                      "triggers": triggers if selected else []}})
        if selected:
            (run / f"ranks/{r}/traces").mkdir()
            for a, b in ((10, 12), (31, 32) if late else (30, 31)):
                (run / f"ranks/{r}/traces" / (trace_file_name(a, b) + ".gz")).write_bytes(b"")
    write_json_atomic(run / "nodes/n0/node.json", {"run_id": "run", "node": "n0", "start_ns": 1,
                                                   "end_ns": 2, "exit_code": 0})
    inv = inventory([run], check_traces=False)
    assert not any("different trace windows" in p or "rank 1" in p for p in inv["problems"]), \
        inv["problems"]
    assert inv["traced_ranks"] == "0, 2 of 3 (--trace-ranks 0,2)"
    by = {r["rank"]: r for r in inv["ranks"]}
    assert [(w["steps"], w["trigger"]) for w in by[0]["trace_windows"]] == \
        [([10, 12], "schedule"), ([30, 31], "on demand")]
    assert [r["trace_selected"] for r in inv["ranks"]] == [True, False, True]


def test_the_analysis_counts_ranks_without_a_window_of_their_own_as_chosen() -> None:
    from uberprof.analysis.tables.reduce import _left_out_by_choice
    from uberprof.rundir.ranks import RankMeta

    metas = [RankMeta(rank=0, folder=Path("0"), trace={"schedule": "steps 10-19",
                                                       "selected": True}),
             RankMeta(rank=1, folder=Path("1"), trace={"schedule": "steps 10-19",
                                                       "selected": False}),
             RankMeta(rank=2, folder=Path("2"), trace={"schedule": "off"}),  # --no-trace
             RankMeta(rank=3, folder=Path("3"), trace={"schedule": "steps 10-19"})]
    assert _left_out_by_choice(metas) == {1, 2}
